//! The contract between ethand's producers (the daemon's model, the device collectors) and its
//! outputs (Prometheus, OTLP, the local API, the reports): the snapshot model, what the daemon
//! knows about the node at one instant, and what is computed once from it for every output
//! ([`selection`]: which processes get series). The daemon builds a snapshot once per interval;
//! every output reads it and nothing else.
//!
//! All counters are cumulative since ethand first saw the process (Prometheus counters);
//! `window` fields hold the change over the recent past. Durations are nanoseconds, sizes bytes.
//! Schema changes bump [`SCHEMA_VERSION`]; docs/snapshot-schema.md documents every field.
use serde::{Deserialize, Serialize};

pub mod devices;
pub mod diagnosis;
pub mod gpu;
pub mod kernels;
pub mod level;
pub mod memory;
pub mod selection;
pub mod stacks;

pub use level::GpuLevel;

pub const SCHEMA_VERSION: u32 = 1;
/// Number of log2 buckets in every histogram (bucket i: [2^i, 2^(i+1)) ns; 0 includes 0; the
/// last one also holds everything above, see `ethand_common::log2_bucket`).
pub const HIST_BUCKETS: usize = 32;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeSnapshot {
    pub schema_version: u32,
    pub hostname: String,
    /// Wall clock of the collection, ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    pub interval_ms: u64,
    pub processes: Vec<ProcessSnapshot>,
    /// Per cgroup totals of every process ever seen in it, exited ones included: these only
    /// grow (Prometheus counters), unlike sums over `processes`, which lose exited processes.
    pub cgroups: Vec<CgroupSnapshot>,
    /// Per device and op, all processes, exited ones included (only grows).
    pub block_devices: Vec<BlockStats>,
    /// Per process name (comm), every process ever seen with it, exited ones included (only
    /// grows): what short-lived processes without series of their own did.
    #[serde(default)]
    pub comms: Vec<CommSnapshot>,
    /// GPUs and NPUs as the device collectors (NVML, DCMI) report them, and their status.
    pub devices: crate::devices::DevicesSnapshot,
    pub ethand: SelfStatus,
}

/// Totals of every process with one name (comm), exited ones included. At most
/// [`COMMS_MAX`] names: the processes of later names are summed under [`COMM_OTHER`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CommSnapshot {
    pub comm: String,
    /// Processes with this name in the model now (alive, or exited within the grace period).
    pub processes: u64,
    /// Processes with this name that exited (and left the model) since ethand started.
    pub exited: u64,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
}

/// Most distinct names with per-comm totals; a name keeps its totals once it has them.
pub const COMMS_MAX: usize = 128;
/// The name the processes of names beyond [`COMMS_MAX`] are summed under (no comm has
/// brackets and a space: the kernel's are at most 15 bytes, but "[other names]" is 13, and
/// the space never appears in the names of the executables it was built for).
pub const COMM_OTHER: &str = "[other names]";

/// The cgroup series of cgroups beyond `prometheus.max_cgroups` (no cgroup v2 path starts
/// with a bracket).
pub const CGROUP_OTHER: &str = "[other cgroups]";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CgroupSnapshot {
    /// cgroup v2 path ("unknown" when the process's cgroup could not be read).
    pub cgroup: String,
    /// Processes of the cgroup in `processes` (alive, or exited within the grace period).
    pub processes: u64,
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub offcpu_preempted_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
    pub syscall_time_ns: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub net: NetStats,
    /// Container and pod of the cgroup, when its path names one (`job_id`, `rank`, `env` unset).
    #[serde(default)]
    pub workload: Option<WorkloadIdentity>,
}

/// Who a process works for. Container and pod come from the cgroup v2 path and the container
/// runtime's on-disk metadata; job and rank from an allow-list of environment variables
/// (`attribution.env_allowlist`), the rank else from NCCL. Every field is unset when unknown.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct WorkloadIdentity {
    /// "containerd", "cri-o" or "docker".
    pub container_runtime: Option<String>,
    /// Full container id (64 hex digits), as the runtime and `kubectl` (after `://`) show it.
    pub container_id: Option<String>,
    /// Container name (Kubernetes container name, or Docker's name outside Kubernetes).
    pub container: Option<String>,
    /// Pod name and namespace.
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub pod_uid: Option<String>,
    /// "guaranteed", "burstable" or "besteffort".
    pub qos_class: Option<String>,
    /// Job identity (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...: `attribution.job_keys`).
    pub job_id: Option<String>,
    /// The environment variable `job_id` came from.
    pub job_id_source: Option<String>,
    /// Global rank (RANK, SLURM_PROCID, ...: `attribution.rank_keys`; else NCCL's).
    pub rank: Option<u32>,
    /// The environment variable `rank` came from, or "nccl".
    pub rank_source: Option<String>,
    /// The allow-listed environment variables the process has (nothing else is ever read).
    pub env: std::collections::BTreeMap<String, String>,
}

/// One process (thread group). Identity is (pid, start_time_ns): pid reuse never merges two.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub ppid: u32,
    /// Start of the process on the kernel's CLOCK_MONOTONIC (ns).
    pub start_time_ns: u64,
    /// Start of the process as /proc shows it: seconds since the Unix epoch (0: unknown).
    pub start_time_unix_s: u64,
    pub comm: String,
    /// The command line, at most 4 KiB of it (daemon/src/pipeline/procinfo.rs).
    pub cmdline: Vec<String>,
    /// True when the command line was longer and `cmdline` is its first 4 KiB.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cmdline_truncated: bool,
    pub exe: String,
    /// cgroup v2 path ("/" when at the root, "" when unknown).
    pub cgroup: String,
    pub uid: u32,
    /// False once the process has exited; it stays for the configured grace period.
    pub alive: bool,
    /// How long ethand has observed the process (ms): its counters cover this span.
    #[serde(default)]
    pub observed_ms: u64,
    pub sched: SchedStats,
    pub threads: Vec<ThreadSnapshot>,
    pub syscalls: SyscallStats,
    pub block: Vec<BlockStats>,
    pub net: NetStats,
    /// Calls into GPU/NPU runtime libraries (uprobes); None when it made none.
    pub gpu: Option<crate::gpu::GpuProcessStats>,
    /// What the device collectors (NVML, DCMI) report for the process, per device.
    pub devices: Vec<crate::gpu::ProcessDeviceUsage>,
    /// Critical XID events of GPUs the process held a context on when they happened, by
    /// (device, code), since ethand started watching; empty when none (or not watched: the
    /// nvml collector's status says which GPUs deliver XID events).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_xid_events: Vec<crate::gpu::ProcessXid>,
    /// Change of the main totals over `window.duration_ms` (from the history ring).
    pub window: Option<WindowStats>,
    /// Memory swapped out (`VmSwap` of /proc/PID/status) when the snapshot was taken; None
    /// when not read (exited, or an older file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_bytes: Option<u64>,
    /// Major page faults since the process started (/proc/PID/stat), when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Bytes the process caused to be written to storage since it started (`write_bytes` of
    /// /proc/PID/io: its own data, counted when its pages are dirtied; not the journal or
    /// metadata the filesystem adds, which the block figures include) when the snapshot was
    /// taken; None when not read (exited, unreadable, or an older file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_write_bytes: Option<u64>,
    /// Container, pod, job and rank (None: nothing known).
    #[serde(default)]
    pub workload: Option<WorkloadIdentity>,
    /// CPUs the process may run on (its affinity, which a cpuset cgroup bounds), when read
    /// (tree snapshots of live processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_allowed: Option<u32>,
    /// The tightest CFS bandwidth quota of its cgroup and those above it, in cores; None: no
    /// quota, or not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_cores: Option<f64>,
    /// Host memory: resident set by kind, swap, faults, and the window's peak and growth
    /// (daemon/src/pipeline/memory.rs); None when not read (exited, older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::memory::ProcessMemory>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SchedStats {
    pub oncpu_ns: u64,
    /// Off-CPU after blocking (sleep plus the run-queue wait after wakeup).
    pub offcpu_blocked_ns: u64,
    /// Off-CPU after being preempted (all of it is run-queue wait).
    pub offcpu_preempted_ns: u64,
    /// Runnable but waiting for a CPU.
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// log2 histogram of run-queue waits (HIST_BUCKETS counts).
    pub runq_wait_hist: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadSnapshot {
    pub tid: u32,
    pub comm: String,
    pub alive: bool,
    pub sched: SchedStats,
    /// What the thread was doing when the snapshot was taken (live threads of a tree
    /// snapshot; absent where it was not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<ThreadNow>,
}

/// A live thread's state at the snapshot, from /proc and the probes' in-flight syscall.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadNow {
    /// As ps names it: "running", "sleeping", "disk sleep", "stopped", "tracing stop",
    /// "zombie", "idle".
    pub state: String,
    /// The syscall it is blocked in; absent when it is running or asleep outside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<InFlightSyscall>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InFlightSyscall {
    pub nr: u32,
    pub name: String,
    /// How long it has been in it, from the probes' entry time; absent when it entered
    /// before the probes were attached (then `elapsed_at_least_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ns: Option<u64>,
    /// It entered before ethand first saw the process: at least this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_at_least_ns: Option<u64>,
    /// The descriptor it waits on (the first argument of the syscalls that take one) and
    /// what it refers to: a path, "pipe:[INODE]", "socket:[INODE]", "anon_inode:[eventpoll]".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fd: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// A wait the thread chose rather than one for a peer: a timed sleep (nanosleep,
    /// clock_nanosleep), a wait for signals (pause, sigsuspend), or an event loop's wait for
    /// any of its descriptors (select, poll, epoll): the thread is idle, not stalled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// Who is at the other end of `file`, where the kernel can tell: the processes holding a
    /// pipe open for writing ("pid 12 (sleep) holds it for writing"), the process holding the
    /// other end of a local Unix socket, a TCP connection's remote address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

impl InFlightSyscall {
    /// Its duration so far: exact, else the lower bound.
    pub fn blocked_ns(&self) -> Option<u64> {
        self.elapsed_ns.or(self.elapsed_at_least_ns)
    }

    /// "read() on pipe:[123]" / "futex()", with the peer where known: "read() on
    /// pipe:[123] (pid 12 (sleep) holds it for writing)".
    pub fn describe(&self) -> String {
        let mut s = match &self.file {
            Some(f) => format!("{}() on {}", self.name, f),
            None => format!("{}()", self.name),
        };
        if let Some(p) = &self.peer {
            s.push_str(&format!(" ({p})"));
        }
        s
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallStats {
    pub count: u64,
    pub errors: u64,
    pub time_ns: u64,
    /// Per syscall number, sorted by time_ns descending.
    pub by_nr: Vec<SyscallRow>,
    /// Latency histograms of the blocking classes.
    pub latency: Vec<SyscallClassHist>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallRow {
    pub nr: u32,
    pub name: String,
    pub count: u64,
    pub errors: u64,
    pub time_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SyscallClassHist {
    /// read_write, futex, poll, sleep, io_uring, open_close_sync, net.
    pub class: String,
    pub count: u64,
    pub buckets: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BlockStats {
    /// "major:minor".
    pub device: String,
    /// Kernel name of the device ("vda") where known, else the major:minor.
    pub device_name: String,
    /// read, write, flush, discard, other.
    pub op: String,
    pub ops: u64,
    pub bytes: u64,
    pub queue_ns: u64,
    pub service_ns: u64,
    pub queue_hist: Vec<u64>,
    pub service_hist: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NetStats {
    pub tcp_tx_bytes: u64,
    pub tcp_rx_bytes: u64,
    pub udp_tx_bytes: u64,
    pub udp_rx_bytes: u64,
    pub tcp_retransmits: u64,
    pub tcp_active_opens: u64,
    pub tcp_closes: u64,
    pub tcp_resets_sent: u64,
    pub tcp_resets_received: u64,
}

impl SchedStats {
    /// Adds `o`; histograms of different lengths add over the common buckets.
    pub fn add(&mut self, o: &SchedStats) {
        self.oncpu_ns += o.oncpu_ns;
        self.offcpu_blocked_ns += o.offcpu_blocked_ns;
        self.offcpu_preempted_ns += o.offcpu_preempted_ns;
        self.runq_wait_ns += o.runq_wait_ns;
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
        for (a, b) in self.runq_wait_hist.iter_mut().zip(&o.runq_wait_hist) {
            *a += b;
        }
    }
}

impl NetStats {
    pub fn add(&mut self, o: &NetStats) {
        self.tcp_tx_bytes += o.tcp_tx_bytes;
        self.tcp_rx_bytes += o.tcp_rx_bytes;
        self.udp_tx_bytes += o.udp_tx_bytes;
        self.udp_rx_bytes += o.udp_rx_bytes;
        self.tcp_retransmits += o.tcp_retransmits;
        self.tcp_active_opens += o.tcp_active_opens;
        self.tcp_closes += o.tcp_closes;
        self.tcp_resets_sent += o.tcp_resets_sent;
        self.tcp_resets_received += o.tcp_resets_received;
    }

    /// Bytes sent over TCP and UDP.
    pub fn tx_bytes(&self) -> u64 {
        self.tcp_tx_bytes + self.udp_tx_bytes
    }

    /// Bytes received over TCP and UDP.
    pub fn rx_bytes(&self) -> u64 {
        self.tcp_rx_bytes + self.udp_rx_bytes
    }
}

impl ProcessSnapshot {
    /// Bytes of the process's block requests of kind `op` ("read", "write", ...) on every
    /// device.
    pub fn block_bytes(&self, op: &str) -> u64 {
        self.block
            .iter()
            .filter(|b| b.op == op)
            .map(|b| b.bytes)
            .sum()
    }
}

/// Change over the recent past, for "what is it doing now".
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WindowStats {
    pub duration_ms: u64,
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub offcpu_preempted_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
    pub syscall_time_ns: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_bytes: u64,
    /// None: launches not counted at the GPU level in force (see `TreeSnapshot::launch_sample`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_launches: Option<u64>,
    pub gpu_sync_ns: u64,
    /// Synchronization calls (stream, context, event, device).
    #[serde(default)]
    pub gpu_sync_calls: u64,
    /// Host-to-device and device-to-host copy calls (every copy symbol, sync and async).
    #[serde(default)]
    pub gpu_copy_h2d_calls: u64,
    #[serde(default)]
    pub gpu_copy_d2h_calls: u64,
    /// On-CPU time of the process's main thread (tid = pid) over the window; None in older
    /// files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_thread_oncpu_ns: Option<u64>,
    /// Time in the read family of syscalls (read, pread64, readv, preadv, preadv2) over the
    /// window, and in the write family with the syncs (write, pwrite64, writev, pwritev,
    /// pwritev2, fsync, fdatasync, sync_file_range); None in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_read_syscall_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_write_syscall_ns: Option<u64>,
    pub gpu_copy_h2d_bytes: u64,
    pub gpu_copy_d2h_bytes: u64,
    pub gpu_copy_other_bytes: u64,
    pub collective_calls: u64,
    pub collective_ns: u64,
    /// Growth of live GPU/NPU memory over the window (0 when it shrank).
    pub gpu_memory_growth_bytes: u64,
    /// Frees that hand device or pinned host memory back to the driver (cuMemFree_v2,
    /// cuMemFreeHost, cuMemHostUnregister, aclrtFree, aclrtFreeHost; not the stream-ordered
    /// cuMemFreeAsync, which returns it to a pool): each waits for the device, and a caching
    /// allocator makes them rare. None in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_blocking_frees: Option<u64>,
}

/// What ethand measures and what it costs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SelfStatus {
    pub version: String,
    pub pid: u32,
    pub started_at_unix_ms: u64,
    pub probes: Vec<ProbeStatus>,
    pub maps: Vec<MapFill>,
    pub programs: Vec<ProgramCost>,
    /// Events that could not be accounted (map full, ring buffer full) or informational
    /// mismatches (see `loss`).
    pub dropped: Vec<DropCounter>,
    /// "sampled", "always" or "off" (daemon.bpf_stats): when `programs` counts.
    pub bpf_stats: String,
    /// How long the kernel's BPF statistics have been on: `programs` covers this time.
    pub bpf_stats_enabled_ms: u64,
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// Process entries the model dropped because it was at `max_processes`.
    pub processes_overflow: u64,
    pub tracked_processes: u64,
    /// GPU/NPU probing level ("system", "calls", "process" or "op"); "" (None) before the
    /// first collection round.
    #[serde(with = "level::or_empty")]
    pub gpu_level: Option<GpuLevel>,
    /// Every runtime library file found mapped, and what was attached in it.
    pub gpu_libraries: Vec<GpuLibraryStatus>,
    /// OTLP metrics export (`[otlp]`); None when it is off.
    #[serde(default)]
    pub otlp: Option<OtlpStatus>,
    /// Who may use the local API socket: "root and group ethand (gid N), mode 0660", or
    /// root only and why.
    #[serde(default)]
    pub socket_access: String,
    /// Capabilities kept after start-up (docs/security.md); every other one was dropped from
    /// every thread's effective, permitted and bounding sets.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// The user the daemon runs as after start-up ("ethand (uid 998)"), or what it stayed
    /// and why; empty in older files.
    #[serde(default)]
    pub user: String,
    /// Connections of the servers (/metrics, the local API): open, caps, refused.
    #[serde(default)]
    pub servers: Vec<ServerConnections>,
    /// When the latest collection round ended (Unix ms); 0 in older files.
    #[serde(default)]
    pub last_round_unix_ms: u64,
    /// How long before this answer that was (set when the answer is made: a collection that
    /// stopped shows here). None in older files and in the node snapshot itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_round_age_ms: Option<u64>,
    /// The sandboxed reader of other users' files and memory: running or why not, and what
    /// it met (daemon/src/pipeline/reader.rs). None in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader: Option<ReaderStatus>,
}

/// The reader's state for `ethand status`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ReaderStatus {
    /// The supervisor's pid; None when it is not running.
    pub pid: Option<u32>,
    /// Why there is no reader.
    pub unavailable: Option<String>,
    /// Workers started, refused (at `reader.max_workers`), late, and ended by a limit or fault.
    pub sessions: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub died: u64,
    /// Files that made a worker fail, not parsed again: "device:inode (size bytes): how".
    pub blamed_files: Vec<String>,
}

/// One server's connections (daemon/src/serve/connlimit.rs). Counters since the daemon started.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ServerConnections {
    /// "metrics" or "api".
    pub server: String,
    /// Open now.
    pub open: u64,
    /// Caps in force (the configured ones, lowered to fit the descriptor limit).
    pub max: u64,
    pub max_per_peer: u64,
    /// Closed at once: the server had `max` open.
    pub refused_limit: u64,
    /// Closed at once: that peer (address, and user for a local one) had `max_per_peer` open.
    pub refused_peer_limit: u64,
    /// Closed for sending a request too slowly, idling, or not reading a reply.
    pub timed_out: u64,
    /// accept(2) failures (out of descriptors, say), each followed by a pause.
    pub accept_errors: u64,
}

/// How the OTLP export is doing (docs/otlp.md). Counters since the daemon started.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct OtlpStatus {
    pub endpoint: String,
    /// "grpc" or "http/protobuf".
    pub protocol: String,
    /// Export requests the endpoint accepted.
    pub exports_ok: u64,
    /// Export requests that failed (each retry counts); a failed batch is retried within the
    /// export interval.
    pub exports_failed: u64,
    /// Batches given up after their retries ran out of time: those points never left. Counters
    /// are cumulative, so the next batch that arrives carries the totals again.
    pub dropped_batches: u64,
    /// When an export last succeeded (ms since the Unix epoch; 0: never).
    pub last_success_unix_ms: u64,
    /// The last failure ("" when none).
    pub last_error: String,
    /// How long the last successful export request took (microseconds; 0: none yet): encoding
    /// the batch, sending it and the endpoint's answer.
    pub last_export_duration_us: u64,
    /// Points summed into a metric's `otel.metric.overflow` point because the metric had more
    /// than `otlp.max_points_per_metric` (counted per batch, so a process over the limit for
    /// ten batches counts ten times per metric).
    pub overflow_points: u64,
}

/// One runtime library file (device + inode), probed once for every process that maps it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GpuLibraryStatus {
    /// "cuda", "nccl", "ascendcl", "hccl".
    pub runtime: String,
    /// The path as the first process that mapped it sees it.
    pub path: String,
    /// The same file from ethand's mount namespace (`/proc/PID/root/...`).
    pub host_path: String,
    pub dev: String,
    pub inode: u64,
    /// The process in which it was found first.
    pub found_in_pid: u32,
    pub state: ProbeState,
    /// Symbols probed (entry, and return where timed).
    pub symbols_attached: Vec<String>,
    /// Catalog symbols this file does not offer, with the reason ("not exported ...").
    pub symbols_missing: Vec<String>,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeStatus {
    /// Stable name, e.g. "sched_switch".
    pub name: String,
    /// What it is attached to, e.g. "tp_btf/sched_switch" or "tracepoint/sched/sched_switch".
    pub attach_point: String,
    pub state: ProbeState,
    /// Why it is not attached (empty when attached).
    pub detail: String,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProbeState {
    Attached,
    /// The kernel lacks the hook (no such tracepoint, no BTF...).
    #[default]
    Unsupported,
    /// Turned off in the config, or not needed on this kernel (its data comes from elsewhere;
    /// the detail says where).
    Disabled,
    /// The hook exists but attaching failed (permissions, verifier).
    Failed,
    /// Nothing to attach to yet: no process has loaded the library (GPU/NPU runtimes).
    Waiting,
}

impl ProbeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Attached => "attached",
            Self::Unsupported => "unsupported",
            Self::Disabled => "disabled",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MapFill {
    pub name: String,
    pub entries: u64,
    pub capacity: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramCost {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DropCounter {
    pub reason: String,
    pub count: u64,
    /// True when the count means lost data; false for informational mismatches.
    pub loss: bool,
}

/// log2 bucket upper bounds in seconds for a Prometheus histogram: bucket i's upper bound
/// is 2^(i+1) ns. The last bucket is open-ended: expose it as +Inf, not as the 2^32 ns here.
pub fn bucket_upper_bounds_seconds() -> Vec<f64> {
    (0..HIST_BUCKETS)
        .map(|i| (1u64 << (i + 1)) as f64 / 1e9)
        .collect()
}

/// Who measured a tree snapshot; serialized as "daemon" or "standalone".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotSource {
    /// The running daemon (counters since it first saw each process).
    #[default]
    Daemon,
    /// ethand attached its own probes for `measured_ms` (counters over that time).
    Standalone,
}

impl SnapshotSource {
    pub const fn as_str(self) -> &'static str {
        match self {
            SnapshotSource::Daemon => "daemon",
            SnapshotSource::Standalone => "standalone",
        }
    }
}

/// `ethand snapshot --pid PID --json`: one process and its descendants.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TreeSnapshot {
    pub schema_version: u32,
    pub source: SnapshotSource,
    pub root_pid: u32,
    pub taken_at_unix_ms: u64,
    pub measured_ms: u64,
    /// The root first, then its descendants (breadth-first).
    pub processes: Vec<ProcessSnapshot>,
    /// Sums over all processes of the tree.
    pub total: TreeTotals,
    pub probes: Vec<ProbeStatus>,
    /// What the diagnosis rules concluded, highest impact first; empty for a healthy tree.
    #[serde(default)]
    pub findings: Vec<crate::diagnosis::Finding>,
    /// The GPU/NPU probing level the numbers were taken at ("system", "calls", "process",
    /// "op"); None when unknown (older files). Below "process" kernel launches are not
    /// counted: their 0 means "not measured".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_level: Option<GpuLevel>,
    /// Per collection interval over the window, oldest first (daemon only).
    #[serde(default)]
    pub timeline: Vec<crate::diagnosis::TimelinePoint>,
    /// Device readings at the time of the snapshot (GPUs/NPUs the tree uses first).
    #[serde(default)]
    pub devices: crate::devices::DevicesSnapshot,
    /// Events lost node-wide (a kernel map or ring buffer full, or processes the model could
    /// not track) while this tree's figures were taken: since the earliest of its processes
    /// was first seen, or during a standalone measurement. The counters are node-wide: any
    /// of these may have been this tree's, so its counts may be low. Empty: none lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_events: Vec<DropCounter>,
    /// Kernel launches counted for this snapshot only, when the GPU level does not count them
    /// (`calls`, the default): see [`crate::gpu::LaunchSample`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_sample: Option<crate::gpu::LaunchSample>,
    /// What the GPU ran during this snapshot's window, for processes started with
    /// `libethand_cupti.so`: see [`crate::kernels::GpuActivity`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_activity: Option<crate::kernels::GpuActivity>,
    /// Python frames of the tree's threads sampled for this snapshot: where GPU/NPU calls
    /// come from and where the threads' time goes (see [`crate::stacks::StackSample`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_sample: Option<crate::stacks::StackSample>,
    /// The tree's threads profiled natively for this snapshot: on-CPU samples with user and
    /// kernel stacks, and where they block (see [`crate::stacks::CpuProfile`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_profile: Option<crate::stacks::CpuProfile>,
    /// Rules that could not be evaluated on this tree: which signal is missing and how to get
    /// it. A tree with no findings and entries here was not found healthy: it was not fully
    /// examined.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_evaluated: Vec<crate::diagnosis::NotEvaluated>,
    /// CPUs available on the host that took the snapshot (so that a saved file is diagnosed
    /// against its own machine); None in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_cpus: Option<u32>,
    /// The processes outside the tree that used the most CPU over the same window, busiest
    /// first (at most [`MAX_NEIGHBOURS`]): who the tree shares the CPUs with. Empty where not
    /// measured (a saved file of an older version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<CpuNeighbour>,
    /// All the processes outside the tree together, in cores over the window; None where
    /// not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbours_cores: Option<f64>,
    /// The memory cgroups of the tree's live processes (at most 16), with their limits and
    /// OOM kills; empty when none could be read (older files, no memory controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_cgroups: Vec<crate::memory::CgroupMemory>,
    /// The node's memory (/proc/meminfo) when the snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_memory: Option<crate::memory::NodeMemory>,
    /// Why the window is not the length asked for (`--window`), when it is not: "5.0 s
    /// asked: the tree's processes started 3.2 s ago"; None when it is (or standalone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_note: Option<String>,
}

/// Most neighbours a tree snapshot names.
pub const MAX_NEIGHBOURS: usize = 5;

/// A process outside a tree and the CPU it used over the tree's window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuNeighbour {
    pub pid: u32,
    pub comm: String,
    pub cgroup: String,
    /// On-CPU seconds per second of the window.
    pub cores: f64,
    /// CPUs it may run on, when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_allowed: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TreeTotals {
    pub processes: u64,
    pub threads: u64,
    pub sched: SchedStats,
    pub syscalls: u64,
    pub syscall_errors: u64,
    pub syscall_time_ns: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub block_read_ops: u64,
    pub block_write_ops: u64,
    /// The sum of the live processes' `ProcessSnapshot::proc_write_bytes` (their own data
    /// sent to storage, /proc/PID/io) beside `block_write_bytes` (every block-layer write the
    /// tree submitted, journal and metadata included); None when none could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_write_bytes: Option<u64>,
    pub net: NetStats,
    /// Sum of the processes' GPU/NPU runtime figures; None when none made a probed call.
    pub gpu: Option<crate::gpu::GpuProcessStats>,
    /// Diagnosis signals over the window (daemon) or the measurement (standalone).
    pub gpu_derived: Option<crate::gpu::GpuDerived>,
    /// Highest resident set of the tree's processes together over the window: their samples
    /// summed at each sampling instant (daemon only; None without samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_rss_bytes: Option<u64>,
}
