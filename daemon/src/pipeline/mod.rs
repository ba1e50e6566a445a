//! The measuring pipeline: loads and attaches the probes, reads the kernel maps every
//! interval, polls the device collectors, and keeps the one model of every process that
//! snapshots are built from. Data flows one way: probes -> maps -> collector -> model.
pub mod attribution;
pub mod bpf_batch;
pub mod bpf_error;
pub mod collector;
pub mod cpu_limits;
pub mod cpu_profile;
pub mod devices;
pub mod drop_history;
pub mod gpu;
pub mod gpu_activity;
pub mod inflight;
pub mod kernel;
pub mod launch_sample;
pub mod loader;
pub mod memory;
pub mod model;
pub mod peers;
pub mod proc_io;
pub mod procinfo;
pub mod python_readers;
pub mod reader;
pub mod stack_sample;
pub mod symbols;
pub mod syscalls_table;
pub mod uprobes;
pub mod xid;
