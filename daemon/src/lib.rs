//! The `ethand` daemon as a library: the binary (`main.rs`) parses flags and calls in here;
//! the fuzz targets (`fuzz/`) reach the parsers (config, tracefs formats, /proc, rules,
//! local API requests) through it.
//!
//! Folders by job, each importing only what is listed before it (ARCHITECTURE.md;
//! `xtask/tests/architecture.rs` checks it): `config/` (every setting); `privilege/`
//! (capabilities after start-up, the statistics helper); `pipeline/` (probes, map reads,
//! devices, the process model); `progress.rs` (a measurement's progress line); `diagnose/`
//! (rules over a tree snapshot); `serve/` (the daemon loop, the tree builder, the local API
//! and /metrics); `commands/` (snapshot, diagnose, record, survey, compare).
pub mod commands;
pub mod config;
pub mod diagnose;
pub mod pipeline;
pub mod privilege;
pub mod progress;
pub mod serve;

// The paths other crates (the fuzz targets) use.
pub use diagnose::expr;
pub use pipeline::{attribution, kernel, procinfo};
pub use serve::api;

/// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or configuration, 3 not found.
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_NOT_FOUND: u8 = 3;

/// A mistake in what the user asked for, found after the configuration was parsed (a missing
/// web-config file, a user that does not exist): exit code 2, like a bad key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Writes a command's output to stdout. A reader that went away (`ethand ... | head`) ends
/// the output quietly, as a finished one: print! would panic there.
pub fn write_stdout(out: impl AsRef<[u8]>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_ref()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write to standard output"))
        }
        _ => Ok(()),
    }
}

/// The exit code for an error: 2 when a [`UsageError`] or a broken diagnosis rule is among
/// its causes, else 1.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain()
        .any(|c| c.is::<UsageError>() || c.is::<diagnose::RuleError>())
    {
        EXIT_USAGE
    } else {
        EXIT_FAILURE
    }
}
