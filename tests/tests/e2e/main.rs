//! ethand end to end: a real daemon (root, BPF) measures workloads whose work is known
//! exactly, and each test compares what ethand reports with that ground truth.
//!
//! One test binary; every test holds `serial()` so that only one daemon and one workload run
//! at a time (timing figures on a small machine would suffer otherwise). Each test prints the
//! figures it observed (`cargo test -- --nocapture` shows them).
//!
//! Needs: root, a kernel with BPF and BTF, `cargo build --release -p ethand` (or ETHAND_BIN),
//! promtool on PATH for the /metrics test, setpriv for the capability test.
mod ancestry;
mod attribution;
mod badinput;
mod block;
mod churn;
mod cli;
mod compare;
mod cpu_profile;
mod dashboards;
mod diagnose;
mod disk_write;
mod escaping;
mod faults;
mod gpu;
mod gpu_activity;
mod gpu_diagnosis;
mod gpu_sites;
mod hostile;
mod html;
mod inflight;
mod launch_sites;
mod lifecycle;
mod memory;
mod metrics;
mod net;
mod nvml;
mod otlp;
mod privilege;
mod probes;
mod pyframes;
mod record;
mod record_gpu;
mod sched;
mod series;
mod service;
mod stacks;
mod syscalls;
mod untrusted;

use ethand_tests::Workload;

/// The workload binary of this crate.
pub fn workload(args: &[&str]) -> Workload {
    Workload::start(env!("CARGO_BIN_EXE_ethand-workload"), args)
}
