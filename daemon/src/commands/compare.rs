//! `ethand compare BEFORE.json AFTER.json [--json | --csv]`: two `ethand snapshot --json`
//! files of a workload (e.g. before and after a change), compared by
//! `ethand_exporters::report::compare`. Needs no daemon and no privileges.
//!
//! A metric one snapshot did not measure (kernel launches below GPU level `process`) is
//! shown as not measured on that side, never as a change from 0 (`ComparedRow::not_measured`).
//! Files written before launches became optional say 0 there; [`load`] reads that 0 as not
//! measured.
use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
};

use ethand_exporters::report;
use ethand_snapshot::{GpuLevel, TreeSnapshot};

/// Output format of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Terminal table (colors when stdout is a terminal and NO_COLOR is unset).
    Text,
    Json,
    Csv,
}

/// Largest snapshot file read (a snapshot is a few KB per process).
const MAX_FILE: u64 = 256 << 20;

/// Why a saved snapshot file could not be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {} MiB: not an ethand snapshot", .path.display(), MAX_FILE >> 20)]
    TooLarge { path: PathBuf },
    /// Not JSON, or JSON of another shape; serde's error has the line and column.
    #[error(
        "{} is not an ethand snapshot (the output of `ethand snapshot --pid PID --json`): {source}",
        .path.display()
    )]
    NotSnapshot {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{} has snapshot schema version {found}; this ethand reads version {} and older",
        .path.display(),
        ethand_snapshot::SCHEMA_VERSION
    )]
    NewerSchema { path: PathBuf, found: u32 },
}

/// Reads one snapshot file ("-": standard input), at most [`MAX_FILE`] bytes.
pub fn load(path: &Path) -> Result<TreeSnapshot, SnapshotFileError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(MAX_FILE + 1).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut bytes))
    };
    read.map_err(|source| SnapshotFileError::Read {
        path: path.into(),
        source,
    })?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(SnapshotFileError::TooLarge { path: path.into() });
    }
    let t: TreeSnapshot =
        serde_json::from_slice(&bytes).map_err(|source| SnapshotFileError::NotSnapshot {
            path: path.into(),
            source,
        })?;
    if t.schema_version > ethand_snapshot::SCHEMA_VERSION {
        return Err(SnapshotFileError::NewerSchema {
            path: path.into(),
            found: t.schema_version,
        });
    }
    let mut t = t;
    launches_zero_as_not_measured(&mut t);
    Ok(t)
}

/// Older files carry kernel launches as 0 where the GPU level (`system`, `calls`) did not count
/// them; newer ones leave them out. Reads such a 0 as what it meant: not measured. (At those
/// levels no launch is ever counted, so a 0 there never was a measurement.)
fn launches_zero_as_not_measured(t: &mut TreeSnapshot) {
    if !matches!(t.gpu_level, Some(GpuLevel::System | GpuLevel::Calls)) {
        return;
    }
    fn zero(n: &mut Option<u64>) {
        if *n == Some(0) {
            *n = None;
        }
    }
    let gpus = t
        .processes
        .iter_mut()
        .filter_map(|p| p.gpu.as_mut())
        .chain(t.total.gpu.as_mut());
    for g in gpus {
        zero(&mut g.launches);
        zero(&mut g.graph_launches);
    }
    for w in t.processes.iter_mut().filter_map(|p| p.window.as_mut()) {
        zero(&mut w.gpu_launches);
    }
    for p in &mut t.timeline {
        zero(&mut p.gpu_launches);
    }
    if let Some(d) = t.total.gpu_derived.as_mut()
        && d.launches_per_second == Some(0.0)
    {
        d.launches_per_second = None;
    }
}

/// As [`run`], and when `html` is given also writes the comparison there as HTML.
pub fn run_with_html(
    html: Option<&Path>,
    before: &Path,
    after: &Path,
    format: Format,
) -> anyhow::Result<u8> {
    if let Some(out) = html
        && let (Ok(b), Ok(a)) = (load(before), load(after))
    {
        let page = ethand_exporters::html::render_comparison_html(&comparison(&b, &a));
        crate::commands::outfile::write(out, page.as_bytes())
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
        eprintln!("ethand: comparison written to {}", out.display());
    }
    run(before, after, format)
}

/// The outcomes a comparison leads with: diagnosis signals that measure what the tree got
/// done, in this order (those neither side measures are left out).
const OUTCOMES: &[&str] = &[
    "cpu.cores_used",
    "cpu.demand_cores",
    "gpu.sm_busy_ratio",
    "gpu.sm_activity_ratio",
    "gpu.device_utilization_ratio",
    "gpu.launches_per_second",
    "gpu.syncs_per_second",
    "gpu.host_copy_bytes_per_second",
    "gpu.collective_ratio",
    "io.block_read_bytes_per_second",
    "io.block_write_bytes_per_second",
    "net.tx_bytes_per_second",
    "net.rx_bytes_per_second",
    "mem.rss_bytes",
    "cpu.runq_wait_ratio",
];

/// The comparison of two snapshots, led by their outcomes: each figure computed by the
/// signal catalog, as the snapshot's own findings compute it.
pub fn comparison(b: &TreeSnapshot, a: &TreeSnapshot) -> report::Comparison {
    let mut c = report::compare(b, a);
    let (sb, sa) = (crate::diagnose::signals(b), crate::diagnose::signals(a));
    c.outcomes = OUTCOMES
        .iter()
        .filter_map(|name| {
            let (before, after) = (sb.get(*name).copied(), sa.get(*name).copied());
            let unit = crate::diagnose::signals::find(name)?.unit.as_str();
            (before.is_some() || after.is_some())
                .then(|| report::compared("outcome", name, unit, before, after))
        })
        .collect();
    c
}

/// Runs the command; returns the exit code (0, or 2 when a file is missing or not a snapshot).
pub fn run(before: &Path, after: &Path, format: Format) -> anyhow::Result<u8> {
    let (b, a) = match (load(before), load(after)) {
        (Ok(b), Ok(a)) => (b, a),
        (b, a) => {
            for e in [b.err(), a.err()].into_iter().flatten() {
                eprintln!("ethand: error: {e}");
            }
            return Ok(crate::EXIT_USAGE);
        }
    };
    let c = comparison(&b, &a);
    let out = match format {
        Format::Json => serde_json::to_string_pretty(&c)? + "\n",
        Format::Csv => report::comparison_to_csv(&c),
        Format::Text => {
            let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            report::render_comparison(&c, color)
        }
    };
    crate::write_stdout(out)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, v: &serde_json::Value) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
        p
    }

    /// Each refusal names the file; serde's and the OS's errors stay as the source.
    #[test]
    fn refusals_name_the_file_and_keep_the_cause() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let newer = serde_json::to_value(TreeSnapshot {
            schema_version: ethand_snapshot::SCHEMA_VERSION + 1,
            ..Default::default()
        })
        .unwrap();
        let p = write(dir.path(), "newer.json", &newer);
        assert_eq!(
            load(&p).unwrap_err().to_string(),
            format!(
                "{} has snapshot schema version {}; this ethand reads version {} and older",
                p.display(),
                ethand_snapshot::SCHEMA_VERSION + 1,
                ethand_snapshot::SCHEMA_VERSION
            )
        );
        let p = dir.path().join("garbage.json");
        std::fs::write(&p, "not json").unwrap();
        let e = load(&p).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "{} is not an ethand snapshot (the output of `ethand snapshot --pid PID --json`): expected",
                p.display()
            )),
            "{e}"
        );
        assert!(e.source().unwrap().is::<serde_json::Error>());
        let p = dir.path().join("missing.json");
        let e = load(&p).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read {}: ", p.display())),
            "{e}"
        );
        assert!(e.source().unwrap().is::<std::io::Error>());
    }

    /// A file from before launches were optional (0 at level `calls`) against one at level
    /// `process`: the launches are not measured before, not a change from 0.
    #[test]
    fn an_older_zero_at_level_calls_is_not_measured() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = |launches: u64| {
            serde_json::json!({
                "launches": launches, "graph_launches": 0, "copies": [],
                "sync": {"calls": 4, "time_ns": 10, "timed_calls": 4},
                "memory": [], "untracked_frees": 0, "collectives": [],
                "groups": {"calls": 0, "time_ns": 0, "timed_calls": 0},
                "comm_inits": 0, "comm": null, "errors": 0, "symbols": []
            })
        };
        let tree = |level: GpuLevel, launches: u64| {
            let mut t = serde_json::to_value(TreeSnapshot {
                schema_version: 1,
                source: ethand_snapshot::SnapshotSource::Standalone,
                root_pid: 1,
                measured_ms: 1000,
                gpu_level: Some(level),
                ..Default::default()
            })
            .unwrap();
            t["total"]["gpu"] = gpu(launches);
            t["total"]["gpu_derived"] = serde_json::json!({
                "window_ms": 1000, "launches_per_second": launches as f64,
                "sync_blocked_ratio": 0.0, "collective_ratio": 0.0,
                "copy_bytes_per_second": [], "device_utilization_ratio": null,
                "device_idle_ratio": null
            });
            t["timeline"] = serde_json::json!([{
                "t_unix_ms": 1, "interval_ms": 1000, "oncpu_ns": 0, "offcpu_blocked_ns": 0,
                "runq_wait_ns": 0, "syscalls": 0, "block_read_bytes": 0,
                "block_write_bytes": 0, "net_tx_bytes": 0, "net_rx_bytes": 0,
                "gpu_launches": launches, "gpu_sync_ns": 0, "gpu_copy_bytes": 0,
                "collective_ns": 0, "gpu_memory_live_bytes": 0
            }]);
            t
        };
        let before = load(&write(dir.path(), "before.json", &tree(GpuLevel::Calls, 0))).unwrap();
        let g = before.total.gpu.as_ref().unwrap();
        assert_eq!((g.launches, g.graph_launches), (None, None));
        assert_eq!(
            before
                .total
                .gpu_derived
                .as_ref()
                .unwrap()
                .launches_per_second,
            None
        );
        assert_eq!(before.timeline[0].gpu_launches, None);
        assert_eq!(g.sync.calls, 4, "other figures kept");

        // At level process a 0 is a measurement.
        let after = load(&write(
            dir.path(),
            "after.json",
            &tree(GpuLevel::Process, 0),
        ))
        .unwrap();
        assert_eq!(after.total.gpu.as_ref().unwrap().launches, Some(0));
        assert_eq!(after.timeline[0].gpu_launches, Some(0));

        let c = report::compare(&before, &after);
        let row = c.rows.iter().find(|r| r.metric == "gpu.launches").unwrap();
        assert_eq!((row.before, row.after), (None, Some(0.0)));
        assert_eq!(row.not_measured.as_deref(), Some("before"));
        let text = report::render_comparison(&c, false);
        assert!(
            text.contains("not compared, not measured in before"),
            "{text}"
        );
    }
}
