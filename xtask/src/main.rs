//! `cargo xtask`: the one entry for chores (alias in `.cargo/config.toml`).
//!
//! - `bench`: what ethand costs the workloads it watches, against no tracing and against
//!   bpftrace doing the same accounting; writes `docs/performance.md`.
//! - `deb`: the Debian package (binary, systemd unit, default config, rules, dashboards,
//!   alert rules, man page, shell completions) in target/debian.

mod bench;
mod deb;
mod e2e;
mod trace_compare;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "ethand's chores", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure ethand's overhead per event (syscall, context switch, IO op, TCP send) against
    /// no tracing and bpftrace; print the table and write it to docs/performance.md.
    Bench(bench::BenchArgs),
    /// Build the Debian package: target/debian/ethand_VERSION_amd64.deb.
    Deb(deb::DebArgs),
    /// Run the tests that need root and BPF (the `ethand-tests` crate), which plain
    /// `cargo test` leaves out. Arguments after it go to the test binaries.
    E2e(e2e::E2eArgs),
    /// Check that the Perfetto and JSON outputs of one `ethand record` hold the same events
    /// (the Perfetto trace decoded with Perfetto's definitions, its import rules checked).
    TraceCompare(trace_compare::TraceCompareArgs),
    /// Run one benchmark workload and print its result line (the bench runs these as child
    /// processes).
    #[command(hide = true)]
    Workload(bench::workloads::WorkloadArgs),
    /// Attach empty BPF programs to ethand's syscall and scheduler hooks and hold them until
    /// a signal (the bench's `floor` modes: the kernel's own cost per event).
    #[command(hide = true)]
    FloorProbes(bench::floor::FloorArgs),
    /// Time whole-map batch reads of BPF hash maps shaped like ethand's (the kernel's cost
    /// per entry read).
    #[command(hide = true)]
    MapReadCost(bench::map_read::MapReadArgs),
    /// Run the scale suite's load (1,000 processes, 100 births/s) until SIGINT or SIGTERM.
    #[command(hide = true)]
    ScaleLoad(bench::scale::ScaleLoadArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Deb(args) => deb::run(args),
        Command::E2e(args) => e2e::run(args),
        Command::TraceCompare(args) => trace_compare::run(args),
        Command::Workload(args) => bench::workloads::run(args),
        Command::FloorProbes(args) => bench::floor::run(args),
        Command::ScaleLoad(args) => bench::scale::run_load(args),
        Command::MapReadCost(args) => bench::map_read::run(args),
    }
}
