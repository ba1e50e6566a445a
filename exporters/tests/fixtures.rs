//! Real snapshots and a real status from one H200 (tests/fixtures/gpu-h200: taken by
//! scripts/gpu-check.sh with the daemon running as the systemd unit runs it), through every
//! output CI can build without a GPU: they must still parse, render and compare, and the
//! status must show the least-privilege state the unit gives.
use std::path::Path;

use ethand_exporters::{html, report};
use ethand_snapshot::{ProbeState, SelfStatus, TreeSnapshot};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-h200")
        .join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// (workload, before, after) of every snapshot pair.
fn snapshots() -> Vec<(String, TreeSnapshot, TreeSnapshot)> {
    let v = fixture("gpu-check-snapshots.json");
    v.as_object()
        .expect("an object of workloads")
        .iter()
        .map(|(label, pair)| {
            let get = |k: &str| -> TreeSnapshot {
                serde_json::from_value(pair[k].clone())
                    .unwrap_or_else(|e| panic!("{label} {k}: not a TreeSnapshot: {e}"))
            };
            (label.clone(), get("before"), get("after"))
        })
        .collect()
}

#[test]
fn real_h200_snapshots_render_compare_and_count_gpu_calls() {
    let all = snapshots();
    assert_eq!(all.len(), 7, "workloads in the fixture");
    for (label, before, after) in &all {
        for t in [before, after] {
            let page = html::render_html(t);
            assert!(
                page.contains(&format!("pid {}", t.root_pid)),
                "{label}: HTML"
            );
            let csv = report::to_csv(t);
            assert!(csv.lines().count() > 10, "{label}: CSV");
            assert!(
                t.dropped_events.is_empty(),
                "{label}: losses on an idle H200"
            );
        }
        let c = report::compare(before, after);
        let json = serde_json::to_string(&c).expect("comparison serializes");
        // Every workload made runtime calls between its two snapshots (at level system none
        // are probed).
        let calls = |t: &TreeSnapshot| -> u64 {
            t.processes
                .iter()
                .filter_map(|p| p.gpu.as_ref())
                .flat_map(|g| &g.symbols)
                .map(|s| s.calls)
                .sum()
        };
        if label != "rust-driver-system" {
            assert!(
                json.contains("gpu"),
                "{label}: the comparison has no GPU figures"
            );
            assert!(
                calls(after) > calls(before),
                "{label}: {} -> {} runtime calls",
                calls(before),
                calls(after)
            );
        }
    }
}

#[test]
fn real_h200_status_shows_the_units_least_privilege() {
    let s: SelfStatus =
        serde_json::from_value(fixture("status-after-workloads.json")).expect("a SelfStatus");
    assert!(s.user.starts_with("ethand (uid "), "user {:?}", s.user);
    assert_eq!(
        s.capabilities,
        ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_PERFMON"]
    );
    let servers: Vec<&str> = s.servers.iter().map(|c| c.server.as_str()).collect();
    assert_eq!(servers, ["api", "metrics"]);
    let nvml = s
        .probes
        .iter()
        .find(|p| p.name == "collector_nvml")
        .expect("collector_nvml");
    assert_eq!(
        nvml.state,
        ProbeState::Attached,
        "NVML as user ethand: {nvml:?}"
    );
}
