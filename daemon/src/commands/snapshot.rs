//! `ethand snapshot --pid PID`: the daemon's snapshot of a process tree, or, with no daemon
//! (or `--standalone`), a measurement of its own; written as text, JSON, CSV or HTML.
use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use ethand_exporters::terminal;
use ethand_snapshot::TreeSnapshot;

use crate::{
    EXIT_NOT_FOUND,
    config::Config,
    pipeline::procinfo,
    serve::{api, daemon, tree::Samples},
};

pub struct SnapshotFormat {
    pub json: bool,
    pub csv: bool,
    pub html: Option<PathBuf>,
}

#[allow(clippy::too_many_arguments)]
pub async fn run(
    cfg: Config,
    pid: u32,
    format: SnapshotFormat,
    window: u64,
    duration: u64,
    force_standalone: bool,
    samples: Samples,
    timeout: Duration,
) -> anyhow::Result<u8> {
    let SnapshotFormat { json, csv, html } = format;
    // The daemon may sample launches and stacks (at once) for diagnosis.launch_sample_ms and
    // stack_sample_ms: wait for that too.
    let plan = crate::config::Plan::resolve(&cfg);
    let timeout = timeout
        + plan
            .launch_sample
            .unwrap_or_default()
            .max(plan.stack_window())
            * 2;
    let answer = if force_standalone {
        Err(api::CallError::NoDaemon {
            path: cfg.daemon.socket.display().to_string(),
            source: std::io::Error::other("--standalone"),
        })
    } else {
        api::call(
            &cfg.daemon.socket,
            &api::Request::Snapshot {
                pid,
                window_s: window,
                launch_sample: Some(samples.launches),
                stack_sample: Some(samples.stacks),
                cpu_profile: samples.profile,
            },
            timeout,
        )
        .await
    };
    let tree: TreeSnapshot = match answer {
        Ok(api::Response::Ok(v)) => serde_json::from_value(v)?,
        Ok(api::Response::NotFound(m)) => {
            eprintln!("ethand: {}", terminal::clean(&m));
            return Ok(EXIT_NOT_FOUND);
        }
        Ok(api::Response::Error(m)) => anyhow::bail!(m),
        // A daemon that is there but refused, timed out or answered nonsense: say so. Only
        // with no daemon at all does ethand measure on its own.
        Err(api::CallError::NoDaemon { .. }) => {
            // No daemon: measure ourselves.
            if !procinfo::exists(pid) {
                eprintln!("ethand: no process with pid {pid}");
                return Ok(EXIT_NOT_FOUND);
            }
            if force_standalone {
                eprintln!("ethand: attaching probes for {duration}s (standalone measurement)");
            } else {
                eprintln!(
                    "ethand: no daemon at {}; attaching probes for {duration}s (standalone measurement)",
                    cfg.daemon.socket.display()
                );
            }
            let measure = Duration::from_secs(duration);
            let mut progress =
                crate::progress::Progress::new(format!("measuring pid {pid}"), measure);
            let tree =
                daemon::standalone_snapshot(&cfg, pid, measure, samples, |e| progress.show(e))
                    .await?;
            drop(progress);
            match tree {
                Some(t) => t,
                None => {
                    eprintln!("ethand: process {pid} was not seen during the measurement");
                    return Ok(EXIT_NOT_FOUND);
                }
            }
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(path) = &html {
        crate::commands::outfile::write(
            path,
            ethand_exporters::html::render_html(&tree).as_bytes(),
        )
        .with_context(|| format!("cannot write the HTML report to {}", path.display()))?;
        eprintln!("ethand: HTML report written to {}", path.display());
    }
    if json {
        crate::write_stdout(serde_json::to_string_pretty(&tree)? + "\n")?;
    } else if csv {
        crate::write_stdout(ethand_exporters::report::to_csv(&tree))?;
    } else {
        crate::write_stdout(terminal::snapshot(&tree))?;
    }
    Ok(0)
}
