//! The daemon's handle on the sandboxed reader (`ethand-reader`): every read of what another
//! user controls (symbols of mapped files, source lines, Python frames) goes through it. It is
//! started before the daemon drops its capabilities, as `ethand reader` (this binary's hidden
//! subcommand), as `daemon.user`, with `[reader]`'s bounds; without it those reads are not
//! made and the outputs say why.
use std::{process::Command, sync::Arc, time::Duration};

use ethand_reader::{Reader, SymbolizeOptions, Symbolized, supervisor::Args};
use tracing::{info, warn};

use crate::{config::ReaderPlan, privilege::RunAs};

/// The hidden subcommand that runs the supervisor.
pub const SUBCOMMAND: &str = "reader";

/// How long opening a Python process may take (py-spy parses its binary: ~10 ms).
pub const PYTHON_OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// The reader, or why there is none, and the deadlines of `[reader]`.
#[derive(Clone)]
pub struct ReaderHandle {
    pub reader: Result<Arc<Reader>, String>,
    pub symbolize_timeout: Duration,
    pub python_read_timeout: Duration,
}

impl ReaderHandle {
    /// Starts the supervisor as `daemon.user` (when set) with `[reader]`'s bounds.
    pub fn start(plan: &ReaderPlan) -> Self {
        let user = match RunAs::lookup(&plan.user) {
            Ok(u) => u.map(|u| (u.uid, u.gid, u.groups)),
            Err(e) => {
                return Self::unavailable(plan, e.to_string());
            }
        };
        let args = Args {
            user,
            limits: plan.limits.clone(),
        };
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(SUBCOMMAND);
        match Reader::spawn(cmd, &args) {
            Ok(reader) => {
                info!(
                    pid = reader.pid(),
                    "reader started (symbols, source lines, Python frames of other users' processes)"
                );
                Self {
                    reader: Ok(Arc::new(reader)),
                    ..Self::unavailable(plan, String::new())
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot start the reader: no symbols, source lines or Python frames");
                Self::unavailable(plan, format!("the reader could not be started: {e}"))
            }
        }
    }

    /// What `ethand status` shows of the reader.
    pub fn status(&self) -> ethand_snapshot::ReaderStatus {
        use std::sync::atomic::Ordering::Relaxed;
        match &self.reader {
            Ok(r) => ethand_snapshot::ReaderStatus {
                pid: Some(r.pid()),
                unavailable: None,
                sessions: r.stats.sessions.load(Relaxed),
                refused: r.stats.refused.load(Relaxed),
                timeouts: r.stats.timeouts.load(Relaxed),
                died: r.stats.died.load(Relaxed),
                blamed_files: r
                    .blamed()
                    .into_iter()
                    .map(|(f, how)| {
                        format!(
                            "{}:{} inode {} ({} bytes): {how}",
                            f.dev_major, f.dev_minor, f.inode, f.size
                        )
                    })
                    .collect(),
            },
            Err(why) => ethand_snapshot::ReaderStatus {
                unavailable: Some(why.clone()),
                ..Default::default()
            },
        }
    }

    /// A handle without a reader (tests, or a failed start).
    pub fn unavailable(plan: &ReaderPlan, why: String) -> Self {
        Self {
            reader: Err(why),
            symbolize_timeout: plan.symbolize_timeout,
            python_read_timeout: plan.python_read_timeout,
        }
    }

    /// Frames of user stacks of `pid` (see [`Reader::symbolize`]); without a reader, the
    /// raw addresses, each saying why.
    pub fn symbolize(
        &self,
        pid: u32,
        start_ticks: Option<u64>,
        stacks: &[Vec<u64>],
        code_info: bool,
        source_lines: bool,
        source_skip_first_module: bool,
    ) -> Symbolized {
        match &self.reader {
            Ok(r) => r.symbolize(
                pid,
                start_ticks,
                stacks,
                SymbolizeOptions {
                    code_info,
                    source_lines,
                    source_skip_first_module,
                    deadline: self.symbolize_timeout,
                },
            ),
            Err(why) => Symbolized {
                stacks: ethand_reader::client::unresolved(stacks, ethand_reader::client::NO_READER),
                notes: vec![why.clone()],
            },
        }
    }

    /// Mangled C++ names `pid` gave (CUDA kernel names), demangled by the reader as its
    /// owner: one answer per name, None where not (not mangled, not valid, no reader, or the
    /// worker failed on them).
    pub fn demangle(&self, pid: u32, names: &[String]) -> Vec<Option<String>> {
        let Ok(r) = &self.reader else {
            return vec![None; names.len()];
        };
        match r
            .session(pid, None)
            .and_then(|mut s| s.demangle(pid, names, self.symbolize_timeout))
        {
            Ok(mut v) => {
                v.resize(names.len(), None);
                v
            }
            Err(e) => {
                tracing::debug!(pid, error = %e, "kernel names not demangled");
                vec![None; names.len()]
            }
        }
    }
}
