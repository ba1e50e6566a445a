//! `ethand record --pid PID --duration 10s -o FILE`: a timeline of one process tree, written
//! in the Chrome JSON trace format (Perfetto and chrome://tracing open it).
//!
//! Standalone, like `ethand survey`: it loads the embedded object with every probe family
//! off and attaches only the recording programs (ebpf/ethand-ebpf/src/record.rs) for the
//! duration, so they cost nothing when nobody records. The kernel sends one `RecordEvent`
//! per scheduler slice, slow syscall, block request and GPU/NPU runtime call of the tree
//! through a ring buffer; this drains it every 20 ms and streams it to disk.
//!
//! Streaming: each drained event is converted and appended at once to FILE.tmp through a
//! 4 MiB buffer, so memory stays bounded (~50 MB resident, mostly the loaded object and the
//! ring buffer) whatever the duration or the event rate, and stopping costs only the last
//! drain, the closing bytes and an fsync. On stop: the drop marker, `metadata` (counts known
//! only then) and the closing bracket, fsync, then FILE.tmp is renamed to FILE. If writing
//! fails (a full disk, say), recording stops, the error names FILE.tmp and how many events
//! were written, FILE.tmp is removed and FILE is not created (exit 1): a trace under FILE's
//! name is always complete. While recording, FILE.tmp holds one trace event per line.
//!
//! Trace layout (`{"traceEvents":[...],"displayTimeUnit":"ns","metadata":{...}}`; times in
//! µs from the start of the recording, exact to the ns: three decimals):
//! - events in the order the kernel emitted them, i.e. as each ended, not sorted by start
//!   (Perfetto and chrome://tracing sort on import): a thread's scheduler slices come in
//!   order, but a runtime call comes after the syscalls it contains;
//! - one `pid` per process, one `tid` per thread, named from /proc (`ph: "M"`), written when
//!   the process or thread is first seen (those of the tree at the start come first);
//! - syscalls and GPU/NPU calls: complete events (`ph: "X"`) on the thread's own track
//!   (they nest: a runtime call contains the syscalls it makes);
//! - scheduler slices: complete events on a companion track of each thread,
//!   `tid = SCHED_TID_BASE + tid`, named "<thread> (sched)", placed right after the thread;
//!   `args.tid` gives the real thread id;
//! - block requests: async slices (`ph: "b"`/`"e"`, `cat: "block"`) of the submitting
//!   process (requests overlap, which complete events on one track cannot);
//! - CPU samples (`--cpu-sample-hz`, a CPU-clock perf event on every CPU): thread-scoped
//!   instant events (`ph: "i"`, `cat: "cpu_sample"`) on the thread's own track, named by the
//!   innermost frame, `args.stack` the user and kernel frames, innermost first. They are
//!   symbolized every half second while the processes are alive (a process that exits
//!   takes its maps with it) and written then, so memory stays bounded;
//! - Python samples (`--python-sample-hz`, the stacks of the tree's Python threads read from
//!   outside the processes, `python_samples.rs`): thread-scoped instants (`cat:
//!   "python_sample"`) on the thread's own track, named by the innermost Python frame
//!   ("train.py:41 in step()"), `args.stack` the Python frames innermost first, `args.active`
//!   (on a CPU or runnable) and `args.gil`;
//! - drops: in `metadata.dropped` and, when non-zero, a global instant event.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        BtfTracePoint, PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachPoint, UProbeScope},
    },
};
use ethand_common::{
    GpuOpDesc, RecordEvent, RecordThread, gpu_dtype, gpu_kind, record_cfg, record_drop,
    record_kind, record_off,
};
use ethand_userspace_probes::{catalog::CATALOG, discover};
use serde_json::{Value, json};

use crate::{
    commands::python_samples::{PySample, PythonSampler},
    config::Config,
    pipeline::{
        bpf_error::error_chain,
        loader,
        procinfo::monotonic_ns,
        reader::ReaderHandle,
        symbols, syscalls_table,
        uprobes::{self, LibraryLinks, Progs, UprobeError},
    },
};

/// Scheduler tracks: `tid = SCHED_TID_BASE + tid` (pid_max is at most 2^22).
pub const SCHED_TID_BASE: u64 = 1 << 30;
const POLL: Duration = Duration::from_millis(20);
/// How often the recording checks whether any process of its tree is still alive.
const TREE_CHECK: Duration = Duration::from_millis(500);

pub struct Options<'a> {
    pub pid: u32,
    pub duration: Duration,
    pub output: &'a Path,
    pub syscall_threshold_us: u64,
    pub cpu_sample_hz: u32,
    pub python_sample_hz: u32,
}

pub async fn run(cfg: &Config, o: Options<'_>) -> anyhow::Result<u8> {
    if !Path::new(&format!("/proc/{}", o.pid)).exists() {
        eprintln!("ethand: no process {}", o.pid);
        return Ok(3);
    }
    if o.duration > MAX_DURATION {
        return Err(crate::UsageError(format!(
            "--duration {:.0}s is longer than ethand record allows ({} h): record a shorter span",
            o.duration.as_secs_f64(),
            MAX_DURATION.as_secs() / 3600
        ))
        .into());
    }
    // Fail before recording if the output cannot be written. A random name beside FILE,
    // created exclusively: nothing planted there is followed (outfile.rs).
    let out = crate::commands::outfile::OutFile::create(o.output)
        .with_context(|| format!("cannot create a file beside {}", o.output.display()))?;
    let file = out
        .file()
        .try_clone()
        .context("duplicating the output file descriptor")?;
    let tmp = out.tmp_path().to_path_buf();
    // An error drops `out`, which removes the partial file.
    let code = record(cfg, &o, file, &tmp).await?;
    out.commit()
        .with_context(|| format!("cannot complete {}", o.output.display()))?;
    Ok(code)
}

/// Longest recording: a timeline of hours is gigabytes no viewer opens.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// "10", "10s", "500ms", "2m", "1.5s", "1h"; at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Duration::try_from_secs_f64(v * mult)
            .ok()
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(|| {
                format!(
                    "{s:?} is longer than ethand record allows ({} h)",
                    MAX_DURATION.as_secs() / 3600
                )
            }),
        _ => Err(format!("{s:?} is not a duration like 10s, 500ms or 2m")),
    }
}

/// A library file attached for recording.
struct GpuLib {
    path: String,
    symbols: usize,
    /// Held open: the probes are attached through it (the very file mapped).
    _file: fs::File,
}

async fn record(cfg: &Config, o: &Options<'_>, file: fs::File, tmp: &Path) -> anyhow::Result<u8> {
    // Symbols, Python frames and library files of the tree are read by the reader, as each
    // process's owner.
    let reader = ReaderHandle::start(cfg);
    let mut c = cfg.clone();
    c.probes.sched = false;
    c.probes.syscalls = false;
    c.probes.block = false;
    c.probes.net = false;
    c.probes.lifecycle = false;
    // Samples of a whole recording keep their stacks: room for many more than a snapshot's.
    c.maps.profile_stacks = RECORD_STACKS;
    let mut loaded = loader::load_with(&c, ethand_common::RECORD_RINGBUF_BYTES)?;
    let ebpf = &mut loaded.ebpf;
    let btf = Btf::from_sys_fs().context("kernel BTF (needed for the recording programs)")?;

    let mut rcfg: Array<MapData, u64> =
        Array::try_from(ebpf.take_map("RECORD_CFG").context("RECORD_CFG map")?)?;
    rcfg.set(
        record_cfg::SYSCALL_THRESHOLD_NS,
        &(o.syscall_threshold_us * 1000),
        0,
    )?;
    let mut ops: Array<MapData, GpuOpDesc> =
        Array::try_from(ebpf.take_map("GPU_OPS").context("GPU_OPS map")?)?;
    for (i, s) in CATALOG.iter().enumerate() {
        ops.set(i as u32, &s.desc, 0)?;
    }
    let mut pids_map: BpfHashMap<MapData, u32, u32> =
        BpfHashMap::try_from(ebpf.take_map("RECORD_PIDS").context("RECORD_PIDS map")?)?;
    let mut ring = RingBuf::try_from(
        ebpf.take_map("RECORD_EVENTS")
            .context("RECORD_EVENTS map")?,
    )?;
    let drops: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(ebpf.take_map("RECORD_DROPS").context("RECORD_DROPS map")?)?;
    let threads_map: BpfHashMap<MapData, u32, RecordThread> = BpfHashMap::try_from(
        ebpf.take_map("RECORD_THREADS")
            .context("RECORD_THREADS map")?,
    )?;
    let stacks: StackTraceMap<MapData> = StackTraceMap::try_from(
        ebpf.take_map("PROFILE_STACKS")
            .context("PROFILE_STACKS map")?,
    )?;
    let profile_drops: PerCpuArray<MapData, u64> = PerCpuArray::try_from(
        ebpf.take_map("PROFILE_DROPS")
            .context("PROFILE_DROPS map")?,
    )?;

    let t0 = monotonic_ns();
    // Fork first, then seed: a child forked meanwhile is caught by one or the other.
    attach_btf(ebpf, "record_fork", "sched_process_fork", &btf)?;
    let tree = process_tree(o.pid);
    for p in &tree {
        pids_map.insert(p, &1, 0)?;
    }
    attach_btf(ebpf, "record_sched_switch", "sched_switch", &btf)?;
    attach_btf(ebpf, "record_sys_enter", "sys_enter", &btf)?;
    attach_btf(ebpf, "record_sys_exit", "sys_exit", &btf)?;
    let mut warnings = Vec::new();
    // Block requests: the BTF programs (keyed by request address) where the kernel's BTF
    // has what they read, else the classic tracepoints (keyed by device and start sector).
    let blk = if loaded.blk_btf {
        [
            ("record_blk_start_btf", "block_io_start"),
            ("record_blk_complete_btf", "block_rq_complete"),
        ]
        .into_iter()
        .try_for_each(|(prog, tp)| attach_btf(ebpf, prog, tp, &btf).map_err(|e| format!("{e:#}")))
    } else {
        [
            ("record_blk_start", "block_start"),
            ("record_blk_complete", "block_complete"),
        ]
        .into_iter()
        .try_for_each(|(prog, probe)| attach_classic(ebpf, prog, &c, probe))
    };
    if let Err(e) = blk {
        eprintln!("ethand: warning: block IO not recorded: {e}");
        warnings.push(format!("block IO not recorded: {e}"));
    }
    let gpu_libs = attach_gpu(ebpf, &tree, &mut warnings, &reader);
    if o.cpu_sample_hz > 0
        && let Err(e) = attach_samples(ebpf, o.cpu_sample_hz)
    {
        eprintln!("ethand: warning: no CPU samples: {e}");
        warnings.push(format!("no CPU samples: {e}"));
    }
    eprintln!(
        "ethand: recording {} process(es) from pid {} for {:.1}s (syscalls >= {} us, {} GPU/NPU library file(s))...",
        tree.len(),
        o.pid,
        o.duration.as_secs_f64(),
        o.syscall_threshold_us,
        gpu_libs.len()
    );

    let mut python = match o.python_sample_hz {
        0 => None,
        hz => match PythonSampler::start(reader.clone(), o.pid, hz) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("ethand: warning: no Python samples: {e}");
                warnings.push(format!("no Python samples: {e}"));
                None
            }
        },
    };

    let mut tw = TraceWriter::new(file, tmp, t0);
    let mut samples = Samples::new(reader.clone());
    let mut python_written = 0u64;
    for p in &tree {
        tw.learn_process(*p).map_err(|e| tw.error(e))?;
    }
    let deadline = Instant::now() + o.duration;
    // SIGINT, SIGTERM (systemd, kill, a job scheduler) and SIGHUP (a closed terminal) all
    // end the recording early and keep the trace.
    let signal = |kind| tokio::signal::unix::signal(kind).context("installing the signal handlers");
    use tokio::signal::unix::SignalKind;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut ended = "duration";
    let mut next_tree_check = Instant::now() + TREE_CHECK;
    loop {
        tw.drain(&mut ring).map_err(|e| tw.error(e))?;
        if let Some(p) = &python {
            python_written +=
                write_python(&mut tw, p.samples.try_iter()).map_err(|e| tw.error(e))?;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        // Nothing more can happen once the whole tree has exited.
        if now >= next_tree_check {
            next_tree_check = now + TREE_CHECK;
            samples.write(&mut tw, &stacks).map_err(|e| tw.error(e))?;
            let alive = pids_map
                .keys()
                .filter_map(Result::ok)
                .any(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                ended = "tree_exited";
                eprintln!("ethand: every process of the tree has exited: recording ends");
                break;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL.min(deadline - now)) => {}
            _ = sigint.recv() => { ended = "interrupted"; break; }
            _ = sigterm.recv() => { ended = "interrupted"; break; }
            _ = sighup.recv() => { ended = "interrupted"; break; }
        }
    }
    let interrupted = ended == "interrupted";
    let t_end = monotonic_ns();
    let python_stats = match python.take() {
        Some(p) => {
            let (rest, stats) = p.stop();
            python_written += write_python(&mut tw, rest.try_iter()).map_err(|e| tw.error(e))?;
            Some(stats)
        }
        None => None,
    };
    // Detach everything (the programs go with the object), then take what was left.
    drop(loaded);
    tw.drain(&mut ring).map_err(|e| tw.error(e))?;
    tw.close_open_slices(&threads_map, t_end)
        .map_err(|e| tw.error(e))?;
    samples.write(&mut tw, &stacks).map_err(|e| tw.error(e))?;
    let dropped = drop_sum(&drops, record_drop::RINGBUF_FULL);
    let threads_full = drop_sum(&drops, record_drop::THREADS_FULL);
    let inflight_full = drop_sum(&drops, record_drop::INFLIGHT_FULL);
    // Processes that joined the tree while recording.
    let recorded_pids: BTreeSet<u32> = pids_map.keys().filter_map(Result::ok).collect();

    let events = tw.events;
    let meta = json!({
        "tool": "ethand record",
        "ethand_version": env!("CARGO_PKG_VERSION"),
        "root_pid": o.pid,
        "pids": recorded_pids,
        "duration_s": (t_end - t0) as f64 / 1e9,
        "interrupted": interrupted,
        // "duration", "interrupted" (a signal) or "tree_exited".
        "ended": ended,
        "syscall_threshold_us": o.syscall_threshold_us,
        "clock": "CLOCK_MONOTONIC",
        "start_monotonic_ns": t0,
        "events": events,
        "dropped": dropped,
        "dropped_threads_table_full": threads_full,
        "dropped_inflight_table_full": inflight_full,
        "sched_tid_base": SCHED_TID_BASE,
        "cpu_sample_hz": o.cpu_sample_hz,
        "cpu_samples": samples.written,
        "cpu_samples_dropped": tw.pending_dropped,
        // Samples without a stack: their slot in the stack map taken by another stack.
        "cpu_samples_stack_lost": drop_sum(&profile_drops, ethand_common::profile_drop::STACK_LOST),
        "python_sample_hz": o.python_sample_hz,
        // Absent when no Python sampling ran: not zero.
        "python_samples": python_stats.as_ref().map(|_| python_written),
        "python_samples_dropped": python_stats.as_ref().map(|s| s.dropped),
        "python_reads": python_stats.as_ref().map(|s| s.reads),
        "python_read_errors": python_stats.as_ref().map(|s| s.read_errors),
        "python_processes": python_stats.as_ref().map(|s| s.processes.clone()),
        "python_notes": python_stats.as_ref().map(|s| s.notes.clone()),
        "gpu_libraries": gpu_libs.iter().map(|l| json!({"path": l.path, "symbols": l.symbols})).collect::<Vec<_>>(),
        "warnings": warnings,
    });
    tw.finish(o.pid, t_end, dropped, &meta)?;
    crate::write_stdout(format!(
        "recorded {} events ({} dropped) to {}\n",
        events,
        dropped,
        o.output.display()
    ))?;
    if threads_full + inflight_full > 0 {
        eprintln!(
            "ethand: warning: {} thread(s) and {} block/GPU call(s) not recorded: tables full",
            threads_full, inflight_full
        );
    }
    Ok(0)
}

/// Stacks a recording can keep (`PROFILE_STACKS`, ~1 KiB each, preallocated: 16 MiB).
const RECORD_STACKS: u32 = 16384;
/// CPU samples held between two symbolization rounds (half a second): 99 samples a second
/// of 1,000 busy threads fit.
const MAX_PENDING_SAMPLES: usize = 100_000;

fn attach_samples(ebpf: &mut Ebpf, hz: u32) -> anyhow::Result<()> {
    let p: &mut PerfEvent = ebpf
        .program_mut("record_cpu_sample")
        .context("program record_cpu_sample")?
        .try_into()?;
    p.load()?;
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    for cpu in cpus {
        p.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(u64::from(hz)),
            false,
        )
        .with_context(|| format!("perf event on CPU {cpu}"))?;
    }
    Ok(())
}

/// Symbolizes the pending CPU samples and writes them as instants on their threads' tracks.
/// Frames are cached per (process, stack id): ids are stable for the recording (a stack
/// never replaces another in the map).
struct Samples {
    reader: ReaderHandle,
    kernel: Option<symbols::KernelSymbols>,
    /// (pid, user stack id) -> labels, innermost first.
    user_labels: HashMap<(u32, i64), Vec<String>>,
    kernel_labels: HashMap<i64, Vec<String>>,
    written: u64,
}

impl Samples {
    fn new(reader: ReaderHandle) -> Self {
        Self {
            reader,
            kernel: symbols::Kallsyms::open().load(),
            user_labels: HashMap::new(),
            kernel_labels: HashMap::new(),
            written: 0,
        }
    }

    fn ips(stacks: &StackTraceMap<MapData>, id: i64) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        let st = stacks.get(&id, 0).ok()?;
        Some(st.frames().iter().map(|f| f.ip).collect())
    }

    fn write(
        &mut self,
        tw: &mut TraceWriter,
        stacks: &StackTraceMap<MapData>,
    ) -> std::io::Result<()> {
        let pending = std::mem::take(&mut tw.pending);
        if pending.is_empty() {
            return Ok(());
        }
        // New user stacks, per process, symbolized in one go each.
        let mut new: HashMap<u32, Vec<(i64, Vec<u64>)>> = HashMap::new();
        for e in &pending {
            let id = e.arg0 as i64;
            if !self.user_labels.contains_key(&(e.tgid, id))
                && !new
                    .get(&e.tgid)
                    .is_some_and(|v| v.iter().any(|(i, _)| *i == id))
            {
                let ips = Self::ips(stacks, id).unwrap_or_default();
                new.entry(e.tgid).or_default().push((id, ips));
            }
        }
        for (pid, list) in new {
            let stacks: Vec<Vec<u64>> = list.iter().map(|(_, ips)| ips.clone()).collect();
            let answer = self
                .reader
                .symbolize(pid, None, &stacks, false, false, false);
            for ((id, _), s) in list.into_iter().zip(answer.stacks) {
                self.user_labels
                    .insert((pid, id), s.frames.iter().map(|f| f.label()).collect());
            }
        }
        for e in &pending {
            let kid = e.arg1 as i64;
            if !self.kernel_labels.contains_key(&kid) {
                let ips = Self::ips(stacks, kid).unwrap_or_default();
                let labels = match &self.kernel {
                    Some(k) => k.frames(&ips).iter().map(|f| f.label()).collect(),
                    None => vec!["[kernel]".to_string(); ips.len()],
                };
                self.kernel_labels.insert(kid, labels);
            }
        }
        for e in &pending {
            tw.learn_thread(e.tgid, e.tid)?;
            let mut stack: Vec<&str> = self
                .kernel_labels
                .get(&(e.arg1 as i64))
                .map(|v| v.iter().map(String::as_str).collect())
                .unwrap_or_default();
            if let Some(u) = self.user_labels.get(&(e.tgid, e.arg0 as i64)) {
                stack.extend(u.iter().map(String::as_str));
            }
            let name = stack.first().copied().unwrap_or("(no stack)");
            let ts = tw.rel(e.start_ns);
            let v = json!({
                "name": name, "cat": "cpu_sample", "ph": "i", "s": "t", "ts": ts,
                "pid": e.tgid, "tid": e.tid, "args": {"stack": stack},
            });
            tw.value(&v)?;
            tw.events += 1;
            self.written += 1;
        }
        Ok(())
    }
}

/// Writes Python samples as instants on their threads' tracks; returns how many.
fn write_python(
    tw: &mut TraceWriter,
    samples: impl Iterator<Item = PySample>,
) -> std::io::Result<u64> {
    let mut n = 0;
    for s in samples {
        tw.learn_thread(s.pid, s.tid)?;
        let name = s.frames.first().map_or("(no Python frame)", String::as_str);
        let v = json!({
            "name": name, "cat": "python_sample", "ph": "i", "s": "t", "ts": tw.rel(s.ns),
            "pid": s.pid, "tid": s.tid,
            "args": {"stack": s.frames, "active": s.active, "gil": s.owns_gil},
        });
        tw.value(&v)?;
        tw.events += 1;
        n += 1;
    }
    Ok(n)
}

fn drop_sum(m: &PerCpuArray<MapData, u64>, idx: u32) -> u64 {
    m.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
}

fn attach_btf(ebpf: &mut Ebpf, prog: &str, tp: &str, btf: &Btf) -> anyhow::Result<()> {
    let p: &mut BtfTracePoint = ebpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} missing"))?
        .try_into()?;
    p.load(tp, btf)
        .map_err(|e| anyhow::anyhow!("loading {prog}: {}", error_chain(&e)))?;
    p.attach()
        .map_err(|e| anyhow::anyhow!("attaching {prog} to tp_btf/{tp}: {}", error_chain(&e)))?;
    Ok(())
}

fn attach_classic(ebpf: &mut Ebpf, prog: &str, cfg: &Config, probe: &str) -> Result<(), String> {
    let tp = cfg
        .probes
        .tracepoints
        .get(probe)
        .ok_or_else(|| format!("no probes.tracepoints.{probe} configured"))?;
    let (group, event) = tp
        .split_once('/')
        .ok_or_else(|| format!("bad tracepoint {tp}"))?;
    let p: &mut TracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("program {prog} missing"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| error_chain(&e))?;
    p.load()
        .map_err(|e| format!("loading {prog}: {}", error_chain(&e)))?;
    p.attach(group, event)
        .map_err(|e| format!("tracepoint/{tp}: {}", error_chain(&e)))?;
    Ok(())
}

/// Finds the runtime libraries the tree maps now and attaches the recording uprobes to each
/// distinct file (dev, inode), for every catalog symbol it exports.
fn attach_gpu(
    ebpf: &mut Ebpf,
    tree: &BTreeSet<u32>,
    warnings: &mut Vec<String>,
    reader: &ReaderHandle,
) -> Vec<GpuLib> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut libs = Vec::new();
    for pid in tree {
        let Ok(found) = discover(*pid) else {
            continue;
        };
        for lib in found {
            if seen.insert((lib.dev(), lib.inode)) {
                libs.push(lib);
            }
        }
    }
    if libs.is_empty() {
        return out;
    }
    let progs = Progs::record();
    for name in [progs.entry, progs.ret] {
        if let Err(e) = uprobes::load(ebpf, name) {
            let w = format!("GPU/NPU calls not recorded: loading {name}: {}", e.detail());
            eprintln!("ethand: warning: {w}");
            warnings.push(w);
            return out;
        }
    }
    // All processes: the tree grows while recording; the programs filter on RECORD_PIDS.
    let scope = UProbeScope::AllProcesses;
    for lib in libs {
        // The very file mapped (never a FIFO at its path), held open to attach through; its
        // symbols read by the reader.
        let file = match lib.open() {
            Ok(f) => f,
            Err(e) => {
                warnings.push(format!("{}: {e}", lib.path.display()));
                continue;
            }
        };
        let symbols = match &reader.reader {
            Ok(r) => r
                .elf_symbols(&lib, reader.symbolize_timeout)
                .map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        let resolved = match symbols {
            Ok((_, s, _)) => s.resolved,
            Err(e) => {
                warnings.push(format!("{}: {e}", lib.path.display()));
                continue;
            }
        };
        if resolved.is_empty() {
            continue;
        }
        let points = || -> Vec<UProbeAttachPoint<'static>> {
            resolved
                .iter()
                .map(|(op, off)| uprobes::at_offset(*off, Some(u64::from(*op))))
                .collect()
        };
        use std::os::fd::AsRawFd;
        let through = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        // Entry and return at every symbol; a return link that fails leaves the entry link
        // attached, until the recording ends.
        let r = LibraryLinks::default().attach(ebpf, progs, &through, points(), points(), scope);
        match r {
            Ok(()) => out.push(GpuLib {
                path: lib.path.display().to_string(),
                symbols: resolved.len(),
                _file: file,
            }),
            Err((_, e)) => {
                let e = match e {
                    UprobeError::Attach { prog, .. } => format!("{prog}: {}", e.detail()),
                    e => e.detail(),
                };
                let w = format!("{}: GPU/NPU calls not recorded: {e}", lib.path.display());
                eprintln!("ethand: warning: {w}");
                warnings.push(w);
            }
        }
    }
    out
}

/// `pid` and its descendants, from the ppid fields of /proc/*/stat.
fn process_tree(pid: u32) -> BTreeSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
                children.entry(ppid).or_default().push(p);
            }
        }
    }
    let mut tree = BTreeSet::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if tree.insert(p) {
            todo.extend(children.get(&p).into_iter().flatten().copied());
        }
    }
    tree
}

/// Process and thread names, read from /proc when first seen (a thread that exits before
/// it is seen keeps a numbered name).
fn comm(path: &str) -> Option<String> {
    // Bytes: a name is not always UTF-8 (invalid sequences become U+FFFD, as in the daemon).
    fs::read(path).ok().map(|b| {
        String::from_utf8_lossy(&b)
            .trim_end_matches('\n')
            .to_string()
    })
}

/// Bytes a GPU/NPU call moved or allocated, where the catalog says which argument holds them.
fn gpu_bytes(d: &GpuOpDesc, arg1: u64, arg2: u64) -> Option<u64> {
    match d.kind {
        gpu_kind::COPY | gpu_kind::ALLOC | gpu_kind::REGISTER => Some(arg1),
        gpu_kind::COLLECTIVE => Some(arg1.wrapping_mul(gpu_dtype::size(d.dtype_table, arg2))),
        _ => None,
    }
}

fn rwbs_str(v: u64) -> String {
    v.to_le_bytes()
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect()
}

/// A syscall's name as a JSON string.
fn quoted_syscall(nr: u64) -> String {
    serde_json::to_string(&syscalls_table::name(nr as u32)).unwrap_or_default()
}

/// Decimal digits of `v` (the hot path formats integers without `fmt`).
fn push_u64(l: &mut Vec<u8>, mut v: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    l.extend_from_slice(&d[i..]);
}

fn push_i64(l: &mut Vec<u8>, v: i64) {
    if v < 0 {
        l.push(b'-');
    }
    push_u64(l, v.unsigned_abs());
}

/// ns as µs, exact (three decimals).
fn push_us(l: &mut Vec<u8>, ns: u64) {
    push_u64(l, ns / 1000);
    let f = (ns % 1000) as u16;
    l.extend_from_slice(&[
        b'.',
        b'0' + (f / 100) as u8,
        b'0' + (f / 10 % 10) as u8,
        b'0' + (f % 10) as u8,
    ]);
}

/// µs from the start of the recording (negative for what started before).
fn push_ts(l: &mut Vec<u8>, ns: u64, t0: u64) {
    if ns < t0 {
        l.push(b'-');
        push_us(l, t0 - ns);
    } else {
        push_us(l, ns - t0);
    }
}

/// Size of the output buffer: few large writes.
const WRITE_BUF: usize = 4 << 20;

/// Writes the trace to FILE.tmp while recording: each drained event is converted and
/// appended at once (one trace event per line), so memory stays bounded by the per-thread
/// state (names, which tracks were named), whatever the duration. Metadata records (`ph:
/// "M"`) are written when a process, thread or scheduler track is first seen; the closing
/// part (drop marker, `metadata`) at the end. Events are in the order the kernel emitted
/// them (when each ended), not sorted: trace viewers sort on import.
struct TraceWriter {
    w: BufWriter<fs::File>,
    tmp: PathBuf,
    t0: u64,
    /// Trace events written so far (a block request is two).
    entries: u64,
    /// Recorded events written so far (what `recorded N events` says).
    events: u64,
    block_id: u64,
    procs: HashMap<u32, String>,
    threads: HashMap<(u32, u32), String>,
    sched_threads: HashSet<(u32, u32)>,
    /// Syscall names by number as JSON strings, looked up once.
    syscall_names: Vec<Option<String>>,
    /// The event being formatted.
    line: Vec<u8>,
    /// CPU samples waiting for their stacks to be symbolized (see [`Samples`]), and those
    /// lost with it full.
    pending: Vec<RecordEvent>,
    pending_dropped: u64,
}

impl TraceWriter {
    fn new(file: fs::File, tmp: &Path, t0: u64) -> Self {
        Self {
            w: BufWriter::with_capacity(WRITE_BUF, file),
            tmp: tmp.to_path_buf(),
            t0,
            entries: 0,
            events: 0,
            block_id: 0,
            procs: HashMap::new(),
            threads: HashMap::new(),
            sched_threads: HashSet::new(),
            syscall_names: Vec::new(),
            line: Vec::with_capacity(512),
            pending: Vec::new(),
            pending_dropped: 0,
        }
    }

    /// What went wrong while writing, naming the file and what it had written. The caller
    /// removes FILE.tmp: nothing half-written is left behind under FILE's name.
    fn error(&self, e: std::io::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "cannot write {}: {e} ({} events written before the error; recording stopped, \
             the partial file removed)",
            self.tmp.display(),
            self.events
        )
    }

    /// Separator and start of the next trace event.
    fn begin(&mut self) -> std::io::Result<()> {
        let sep: &[u8] = if self.entries == 0 {
            b"{\"traceEvents\":[\n"
        } else {
            b",\n"
        };
        self.entries += 1;
        self.w.write_all(sep)
    }

    fn value(&mut self, v: &Value) -> std::io::Result<()> {
        self.begin()?;
        serde_json::to_writer(&mut self.w, v)?;
        Ok(())
    }

    fn learn_process(&mut self, pid: u32) -> std::io::Result<()> {
        if !self.procs.contains_key(&pid)
            && let Some(n) = comm(&format!("/proc/{pid}/comm"))
        {
            self.new_process(pid, n)?;
        }
        if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) {
            for e in dir.flatten() {
                if let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                    self.learn_thread(pid, tid)?;
                }
            }
        }
        Ok(())
    }

    fn new_process(&mut self, pid: u32, name: String) -> std::io::Result<()> {
        self.value(
            &json!({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}}),
        )?;
        self.value(&json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": pid, "args": {"sort_index": pid}}))?;
        self.procs.insert(pid, name);
        Ok(())
    }

    fn learn_thread(&mut self, pid: u32, tid: u32) -> std::io::Result<()> {
        if self.threads.contains_key(&(pid, tid)) {
            return Ok(());
        }
        if !self.procs.contains_key(&pid) {
            let n = comm(&format!("/proc/{pid}/comm")).unwrap_or_else(|| format!("pid {pid}"));
            self.new_process(pid, n)?;
        }
        let n =
            comm(&format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_else(|| format!("tid {tid}"));
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": format!("{n} ({tid})")}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": 2 * u64::from(tid)}}))?;
        self.threads.insert((pid, tid), n);
        Ok(())
    }

    /// Names the scheduler track of a thread, placed right after the thread.
    fn learn_sched(&mut self, pid: u32, tid: u32) -> std::io::Result<()> {
        if !self.sched_threads.insert((pid, tid)) {
            return Ok(());
        }
        let n = self
            .threads
            .get(&(pid, tid))
            .cloned()
            .unwrap_or_else(|| format!("tid {tid}"));
        let st = SCHED_TID_BASE + u64::from(tid);
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": st, "args": {"name": format!("{n} ({tid}) sched")}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": st, "args": {"sort_index": 2 * u64::from(tid) + 1}}))
    }

    /// Takes every event the ring buffer holds and writes it.
    fn drain(&mut self, ring: &mut RingBuf<MapData>) -> std::io::Result<()> {
        while let Some(item) = ring.next() {
            if item.len() < size_of::<RecordEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a RecordEvent (repr(C), integers only); unaligned read.
            let e: RecordEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            drop(item);
            self.event(&e)?;
        }
        Ok(())
    }

    /// One recorded event: one trace event (two for a block request).
    fn event(&mut self, e: &RecordEvent) -> std::io::Result<()> {
        if e.kind == record_kind::CPU_SAMPLE {
            // Written once symbolized, by `Samples::write` (at most half a second later).
            if self.pending.len() < MAX_PENDING_SAMPLES {
                self.pending.push(*e);
            } else {
                self.pending_dropped += 1;
            }
            return Ok(());
        }
        self.learn_thread(e.tgid, e.tid)?;
        self.events += 1;
        match e.kind {
            record_kind::ON_CPU | record_kind::OFF_CPU => {
                self.learn_sched(e.tgid, e.tid)?;
                let name: &[u8] = match (e.kind, e.arg0) {
                    (record_kind::ON_CPU, _) => b"running",
                    (_, record_off::BLOCKED) => b"blocked",
                    (_, record_off::PREEMPTED) => b"preempted",
                    _ => b"off-cpu",
                };
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":\"");
                l.extend_from_slice(name);
                l.extend_from_slice(b"\",\"cat\":\"sched\",\"ph\":\"X\",\"ts\":");
                push_ts(l, e.start_ns, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, e.dur_ns);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, e.tgid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, SCHED_TID_BASE + u64::from(e.tid));
                l.extend_from_slice(b",\"args\":{\"tid\":");
                push_u64(l, e.tid.into());
                if e.cpu == u32::MAX {
                    // Still in this state when recording stopped: cut at the end.
                    l.extend_from_slice(b",\"cut_at_end\":true}}");
                } else {
                    l.extend_from_slice(if e.kind == record_kind::ON_CPU {
                        b",\"cpu\":"
                    } else {
                        b",\"woken_on_cpu\":"
                    });
                    push_u64(l, e.cpu.into());
                    l.extend_from_slice(b"}}");
                }
                self.begin()?;
                self.w.write_all(&self.line)
            }
            record_kind::SYSCALL => {
                let ret = e.arg1 as i64;
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":");
                let nr = e.arg0;
                if nr < 4096 {
                    let i = nr as usize;
                    if i >= self.syscall_names.len() {
                        self.syscall_names.resize(i + 1, None);
                    }
                    let n = self.syscall_names[i].get_or_insert_with(|| quoted_syscall(nr));
                    l.extend_from_slice(n.as_bytes());
                } else {
                    l.extend_from_slice(quoted_syscall(nr).as_bytes());
                }
                l.extend_from_slice(b",\"cat\":\"syscall\",\"ph\":\"X\",\"ts\":");
                push_ts(l, e.start_ns, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, e.dur_ns);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, e.tgid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, e.tid.into());
                // "nr" right before "ret": the bench counts `"nr":39,"ret":`.
                l.extend_from_slice(b",\"args\":{\"nr\":");
                push_u64(l, nr);
                l.extend_from_slice(b",\"ret\":");
                push_i64(l, ret);
                l.extend_from_slice(b",\"cpu\":");
                push_u64(l, e.cpu.into());
                if (-4095..0).contains(&ret) {
                    l.extend_from_slice(b",\"errno\":");
                    push_i64(l, -ret);
                }
                l.extend_from_slice(b"}}");
                self.begin()?;
                self.w.write_all(&self.line)
            }
            record_kind::GPU => {
                let op = e.arg0 as usize;
                let (name, mut args) = match CATALOG.get(op) {
                    Some(s) => {
                        let mut a = json!({
                            "op": op, "library": s.runtime.library(),
                            "category": s.category.as_str(), "ret": e.arg3 as i64 as i32,
                        });
                        if let Some(b) = gpu_bytes(&s.desc, e.arg1, e.arg2) {
                            a["bytes"] = json!(b);
                        }
                        (s.name.to_string(), a)
                    }
                    None => (format!("op {op}"), json!({"op": op})),
                };
                args["cpu"] = json!(e.cpu);
                let rel = self.rel(e.start_ns);
                self.value(&json!({
                    "name": name, "cat": "gpu", "ph": "X", "ts": rel,
                    "dur": e.dur_ns as f64 / 1000.0,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }))
            }
            record_kind::BLOCK => {
                self.block_id += 1;
                let dev = e.arg0 as u32;
                let rwbs = rwbs_str(e.arg3);
                let op = if rwbs.contains('D') {
                    "discard"
                } else if rwbs.contains('W') {
                    "write"
                } else if rwbs.contains('R') {
                    "read"
                } else if rwbs.contains('F') {
                    "flush"
                } else {
                    "other"
                };
                let dur = e.dur_ns as f64 / 1000.0;
                let ts = self.rel(e.start_ns);
                let args = json!({
                    "dev": format!("{}:{}", dev >> 20, dev & 0xfffff), "sector": e.arg1,
                    "bytes": e.arg2, "rwbs": rwbs, "tid": e.tid, "dur_us": dur,
                });
                let name = format!("block {op}");
                let id = self.block_id;
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "b", "id": id, "ts": ts,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }))?;
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "e", "id": id, "ts": self.rel(e.start_ns + e.dur_ns),
                    "pid": e.tgid, "tid": e.tid,
                }))
            }
            _ => Ok(()),
        }
    }

    fn rel(&self, ns: u64) -> f64 {
        (i128::from(ns) - i128::from(self.t0)) as f64 / 1000.0
    }

    /// The slice each live recorded thread was in when recording stopped (running, or off
    /// CPU), cut at the end, so that the timeline does not stop at each thread's last switch.
    fn close_open_slices(
        &mut self,
        threads: &BpfHashMap<MapData, u32, RecordThread>,
        t_end: u64,
    ) -> std::io::Result<()> {
        for (tid, t) in threads.iter().filter_map(Result::ok) {
            if !Path::new(&format!("/proc/{}/task/{tid}", t.tgid)).exists() {
                continue; // exited: its last slice was emitted at its last switch-out
            }
            let (kind, start, arg0) = if t.on_ns != 0 {
                (record_kind::ON_CPU, t.on_ns, 0)
            } else if t.off_ns != 0 {
                (record_kind::OFF_CPU, t.off_ns, u64::from(t.off_reason))
            } else {
                continue;
            };
            if start >= t_end {
                continue;
            }
            self.event(&RecordEvent {
                kind,
                tgid: t.tgid,
                tid,
                cpu: u32::MAX,
                start_ns: start,
                dur_ns: t_end - start,
                arg0,
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Closes the trace (drop marker, metadata) and flushes it; the caller renames it.
    fn finish(mut self, root: u32, t_end: u64, dropped: u64, meta: &Value) -> anyhow::Result<()> {
        let r = (|| -> std::io::Result<()> {
            if dropped > 0 {
                let ts = self.rel(t_end);
                self.value(&json!({
                    "name": format!("ethand: {dropped} events dropped (ring buffer full)"),
                    "cat": "ethand", "ph": "i", "s": "g", "ts": ts, "pid": root, "tid": root,
                    "args": {"dropped": dropped},
                }))?;
            }
            if self.entries == 0 {
                self.w.write_all(b"{\"traceEvents\":[")?;
            }
            self.w
                .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"metadata\":")?;
            serde_json::to_writer(&mut self.w, meta)?;
            self.w.write_all(b"}\n")?;
            self.w.flush()?;
            self.w.get_ref().sync_all()
        })();
        r.map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_within_an_hour() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), MAX_DURATION);
        for bad in [
            "0",
            "-1",
            "x",
            "nan",
            "inf",
            "1e300",
            "18446744073709551615",
            "61m",
            "2h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut l = Vec::new();
        f(&mut l);
        String::from_utf8(l).unwrap()
    }

    #[test]
    fn numbers_are_formatted_exactly() {
        assert_eq!(s(|l| push_u64(l, 0)), "0");
        assert_eq!(s(|l| push_u64(l, u64::MAX)), u64::MAX.to_string());
        assert_eq!(s(|l| push_i64(l, -38)), "-38");
        assert_eq!(s(|l| push_i64(l, i64::MIN)), i64::MIN.to_string());
        assert_eq!(s(|l| push_us(l, 0)), "0.000");
        assert_eq!(s(|l| push_us(l, 1_234_005)), "1234.005");
        assert_eq!(s(|l| push_ts(l, 1_500, 2_000)), "-0.500");
        assert_eq!(s(|l| push_ts(l, 2_000_070, 1_000)), "1999.070");
    }
}
