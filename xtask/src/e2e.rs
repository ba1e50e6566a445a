//! `cargo xtask e2e`: the tests that need root, a BPF-capable kernel and a built daemon (the
//! `ethand-tests` crate: end-to-end runs of real workloads against a running ethand, the
//! package, the deployment files, the recorded GPU scenarios). Plain `cargo test` leaves that
//! crate out, so it passes as any user; `scripts/test.sh` runs both.
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct E2eArgs {
    /// Arguments for the test binaries after `--` (a name filter, `--nocapture`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    test_args: Vec<String>,
}

pub fn run(args: E2eArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!(
            "the e2e tests load BPF programs, run the daemon and install its package: they need \
             root (uid 0), this is uid {euid}; run `sudo -E cargo xtask e2e`, or plain \
             `cargo test` for the tests that need no privilege"
        );
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "test",
            "--release",
            "--locked",
            "--no-fail-fast",
            "--package",
            "ethand-tests",
            "--",
        ])
        .args(&args.test_args)
        .status()
        .with_context(|| format!("running {cargo} test"))?;
    if !status.success() {
        bail!("e2e tests failed ({status})");
    }
    Ok(())
}
