//! The log filter in force: ethand's own crates at the level asked for, everything else
//! (py-spy and its process reader, blazesym, aya, hyper, h2, opentelemetry...) at warn, so
//! that a Python snapshot does not write the reader's INFO lines into the daemon's log.
use tracing_subscriber::filter::LevelFilter;

/// The workspace's crates (tracing targets are crate names with `_`).
const OWN_TARGETS: &[&str] = &[
    "ethand",
    "ethand_common",
    "ethand_exporters",
    "ethand_reader",
    "ethand_snapshot",
    "ethand_userspace_probes",
];

/// Third-party crates log at most this much unless the filter names them.
const THIRD_PARTY: LevelFilter = LevelFilter::WARN;

/// `filter` (daemon.log or the CLI's level: EnvFilter syntax) with its bare level applied to
/// ethand's own crates only: "info" becomes "warn,ethand=info,ethand_reader=info,...";
/// a bare level stricter than warn stays global. Directives naming a target are kept as given
/// (EnvFilter lets the more specific one win), so `py_spy=debug` still shows py-spy.
pub fn with_quiet_dependencies(filter: &str) -> String {
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let bare: Option<LevelFilter> = directives
        .iter()
        .filter(|d| !d.contains('='))
        .filter_map(|d| d.parse().ok())
        .next_back();
    let Some(level) = bare else {
        return filter.to_string();
    };
    // LevelFilter orders by verbosity: OFF < ERROR < WARN < INFO ...
    let global = level.min(THIRD_PARTY);
    let mut out = vec![global.to_string().to_lowercase()];
    if level > global {
        out.extend(
            OWN_TARGETS
                .iter()
                .map(|t| format!("{t}={}", level.to_string().to_lowercase())),
        );
    }
    out.extend(
        directives
            .iter()
            .filter(|d| d.contains('='))
            .map(|d| d.to_string()),
    );
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::with_quiet_dependencies as f;

    #[test]
    fn own_crates_keep_the_level_dependencies_warn() {
        assert_eq!(
            f("info"),
            "warn,ethand=info,ethand_common=info,ethand_exporters=info,ethand_reader=info,ethand_snapshot=info,ethand_userspace_probes=info"
        );
        // Named by the user: kept, and more specific than the default.
        assert!(f("debug,py_spy=info").ends_with(",py_spy=info"));
        assert!(f("debug,py_spy=info").starts_with("warn,ethand=debug,"));
        // Stricter than warn: global as asked.
        assert_eq!(f("error"), "error");
        assert_eq!(f("warn"), "warn");
        // No bare level: as given.
        assert_eq!(f("ethand=debug"), "ethand=debug");
        // Every result is a filter EnvFilter accepts.
        for s in ["info", "debug,py_spy=info", "trace", "off"] {
            tracing_subscriber::EnvFilter::builder()
                .parse(f(s))
                .expect("a valid filter");
        }
    }
}
