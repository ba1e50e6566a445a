//! docs/metrics.md is generated from the exporter's own catalog and must not go stale.
//! Regenerate with: UPDATE_DOCS=1 cargo test -p ethand-exporters --test metrics_doc
use std::path::Path;

fn render_doc() -> String {
    let mut s = String::from(
        "# Metrics\n\nGenerated from `ethand_exporters::prometheus::metric_catalog()` by\n\
         `UPDATE_DOCS=1 cargo test -p ethand-exporters --test metrics_doc`; a test fails when\n\
         this file and the code disagree.\n\n\
         Cardinality: per-process series (`pid`, `comm`) exist only for the top-N processes by CPU\n\
         (`prometheus.top_n`, default 20) plus the pids, comms and cgroups configured in\n\
         `[prometheus]`; every process, with or without its own series, is also counted in its cgroup's `ethand_cgroup_*` series, which keep the totals of exited processes and so only grow. Syscall\n\
         series keep the top 8 syscalls per process and put the rest in `syscall=\"other\"`.\n\
         Histograms use 32 log2 buckets of nanoseconds, exposed in seconds.\n\n\
         | name | type | help |\n|---|---|---|\n",
    );
    for (name, kind, help) in ethand_exporters::prometheus::metric_catalog() {
        s.push_str(&format!(
            "| `{name}` | {kind} | {} |\n",
            help.replace('|', "\\|")
        ));
    }
    s
}

#[test]
fn metrics_doc_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let want = render_doc();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md is stale: run UPDATE_DOCS=1 cargo test -p ethand-exporters --test metrics_doc"
    );
}
