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
    collections::BTreeSet,
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::{
    Btf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
};
use ethand_common::{GpuOpDesc, RecordThread, record_cfg, record_drop};
use ethand_userspace_probes::catalog::CATALOG;
use serde_json::json;

use crate::{
    commands::python_samples::PythonSampler,
    config::Config,
    pipeline::{loader, procinfo::monotonic_ns, reader::ReaderHandle},
};

mod attach;
mod samples;
mod trace;

use attach::*;
use samples::*;
use trace::*;

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

/// Why `--duration` was refused; `text` is the value as given, trimmed.
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    #[error(
        "{text:?} is longer than ethand record allows ({} h)",
        MAX_DURATION.as_secs() / 3600
    )]
    TooLong { text: String },
    /// Not a number (`source`), or not a positive finite one.
    #[error("{text:?} is not a duration like 10s, 500ms or 2m")]
    NotADuration {
        text: String,
        source: Option<std::num::ParseFloatError>,
    },
}

/// "10", "10s", "500ms", "2m", "1.5s", "1h"; at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
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
            .ok_or_else(|| DurationError::TooLong { text: s.into() }),
        parsed => Err(DurationError::NotADuration {
            text: s.into(),
            source: parsed.err(),
        }),
    }
}

/// The recording programs' maps, taken from the loaded object. Every one is held for the
/// whole recording, those only written at the start too: a map taken out of the object and
/// dropped is closed, and a program loaded after that no longer finds it.
struct RecordMaps {
    _cfg: Array<MapData, u64>,
    _ops: Array<MapData, GpuOpDesc>,
    pids: BpfHashMap<MapData, u32, u32>,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    threads: BpfHashMap<MapData, u32, RecordThread>,
    stacks: StackTraceMap<MapData>,
    profile_drops: PerCpuArray<MapData, u64>,
}

impl RecordMaps {
    /// Takes the maps and sets the recording's configuration and the runtime catalog.
    fn take(ebpf: &mut aya::Ebpf, o: &Options<'_>) -> anyhow::Result<Self> {
        let mut take =
            |name: &'static str| ebpf.take_map(name).with_context(|| format!("{name} map"));
        let mut rcfg: Array<MapData, u64> = Array::try_from(take("RECORD_CFG")?)?;
        rcfg.set(
            record_cfg::SYSCALL_THRESHOLD_NS,
            &(o.syscall_threshold_us * 1000),
            0,
        )?;
        let mut ops: Array<MapData, GpuOpDesc> = Array::try_from(take("GPU_OPS")?)?;
        for (i, s) in CATALOG.iter().enumerate() {
            ops.set(i as u32, &s.desc, 0)?;
        }
        Ok(Self {
            _cfg: rcfg,
            _ops: ops,
            pids: BpfHashMap::try_from(take("RECORD_PIDS")?)?,
            ring: RingBuf::try_from(take("RECORD_EVENTS")?)?,
            drops: PerCpuArray::try_from(take("RECORD_DROPS")?)?,
            threads: BpfHashMap::try_from(take("RECORD_THREADS")?)?,
            stacks: StackTraceMap::try_from(take("PROFILE_STACKS")?)?,
            profile_drops: PerCpuArray::try_from(take("PROFILE_DROPS")?)?,
        })
    }
}

/// What was attached: the tree at the start, the runtime library files, and what could not
/// be recorded.
struct Attached {
    tree: BTreeSet<u32>,
    gpu_libs: Vec<GpuLib>,
    warnings: Vec<String>,
}

/// Attaches the recording programs: fork first, then the tree is seeded (a child forked
/// meanwhile is caught by one or the other), then the rest.
fn attach_all(
    loaded: &mut loader::Loaded,
    cfg: &Config,
    o: &Options<'_>,
    pids: &mut BpfHashMap<MapData, u32, u32>,
    reader: &ReaderHandle,
    btf: &Btf,
) -> anyhow::Result<Attached> {
    let blk_btf = loaded.blk_btf;
    let ebpf = &mut loaded.ebpf;
    attach_btf(ebpf, "record_fork", "sched_process_fork", btf)?;
    let tree = process_tree(o.pid);
    for p in &tree {
        pids.insert(p, &1, 0)?;
    }
    attach_btf(ebpf, "record_sched_switch", "sched_switch", btf)?;
    attach_btf(ebpf, "record_sys_enter", "sys_enter", btf)?;
    attach_btf(ebpf, "record_sys_exit", "sys_exit", btf)?;
    let mut warnings = Vec::new();
    // Block requests: the BTF programs (keyed by request address) where the kernel's BTF
    // has what they read, else the classic tracepoints (keyed by device and start sector).
    let blk = if blk_btf {
        [
            ("record_blk_start_btf", "block_io_start"),
            ("record_blk_complete_btf", "block_rq_complete"),
        ]
        .into_iter()
        .try_for_each(|(prog, tp)| attach_btf(ebpf, prog, tp, btf).map_err(|e| format!("{e:#}")))
    } else {
        [
            ("record_blk_start", "block_start"),
            ("record_blk_complete", "block_complete"),
        ]
        .into_iter()
        .try_for_each(|(prog, probe)| attach_classic(ebpf, prog, cfg, probe))
    };
    if let Err(e) = blk {
        eprintln!("ethand: warning: block IO not recorded: {e}");
        warnings.push(format!("block IO not recorded: {e}"));
    }
    let gpu_libs = attach_gpu(ebpf, &tree, &mut warnings, reader);
    if o.cpu_sample_hz > 0
        && let Err(e) = attach_samples(ebpf, o.cpu_sample_hz)
    {
        eprintln!("ethand: warning: no CPU samples: {e}");
        warnings.push(format!("no CPU samples: {e}"));
    }
    Ok(Attached {
        tree,
        gpu_libs,
        warnings,
    })
}

/// Why a recording ended (`metadata.ended`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Ended {
    /// `--duration` passed.
    Duration,
    /// SIGINT, SIGTERM or SIGHUP.
    Interrupted,
    /// Every process of the tree exited.
    TreeExited,
}

/// Drains the ring buffer and the samples into the trace until the duration passes, a
/// signal comes or the whole tree has exited.
async fn record_until_done(
    o: &Options<'_>,
    maps: &mut RecordMaps,
    tw: &mut TraceWriter,
    samples: &mut Samples,
    python: Option<&PythonSampler>,
    python_written: &mut u64,
) -> anyhow::Result<Ended> {
    let deadline = Instant::now() + o.duration;
    // SIGINT, SIGTERM (systemd, kill, a job scheduler) and SIGHUP (a closed terminal) all
    // end the recording early and keep the trace.
    let signal = |kind| tokio::signal::unix::signal(kind).context("installing the signal handlers");
    use tokio::signal::unix::SignalKind;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut next_tree_check = Instant::now() + TREE_CHECK;
    loop {
        tw.drain(&mut maps.ring).map_err(|e| tw.error(e))?;
        if let Some(p) = python {
            *python_written += write_python(tw, p.samples.try_iter()).map_err(|e| tw.error(e))?;
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Ended::Duration);
        }
        // Nothing more can happen once the whole tree has exited.
        if now >= next_tree_check {
            next_tree_check = now + TREE_CHECK;
            samples.write(tw, &maps.stacks).map_err(|e| tw.error(e))?;
            let alive = maps
                .pids
                .keys()
                .filter_map(Result::ok)
                .any(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                eprintln!("ethand: every process of the tree has exited: recording ends");
                return Ok(Ended::TreeExited);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL.min(deadline - now)) => {}
            _ = sigint.recv() => return Ok(Ended::Interrupted),
            _ = sigterm.recv() => return Ok(Ended::Interrupted),
            _ = sighup.recv() => return Ok(Ended::Interrupted),
        }
    }
}

async fn record(cfg: &Config, o: &Options<'_>, file: fs::File, tmp: &Path) -> anyhow::Result<u8> {
    // Symbols, Python frames and library files of the tree are read by the reader, as each
    // process's owner.
    let reader = ReaderHandle::start(cfg);
    let mut c = cfg.clone();
    c.probes.turn_families_off();
    // Samples of a whole recording keep their stacks: room for many more than a snapshot's.
    c.maps.profile_stacks = RECORD_STACKS;
    let mut loaded = loader::load_with(&c, ethand_common::RECORD_RINGBUF_BYTES)?;
    let mut maps = RecordMaps::take(&mut loaded.ebpf, o)?;
    let btf = Btf::from_sys_fs().context("kernel BTF (needed for the recording programs)")?;
    let t0 = monotonic_ns();
    let Attached {
        tree,
        gpu_libs,
        mut warnings,
    } = attach_all(&mut loaded, &c, o, &mut maps.pids, &reader, &btf)?;
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
    let ended = record_until_done(
        o,
        &mut maps,
        &mut tw,
        &mut samples,
        python.as_ref(),
        &mut python_written,
    )
    .await?;
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
    tw.drain(&mut maps.ring).map_err(|e| tw.error(e))?;
    tw.close_open_slices(&maps.threads, t_end)
        .map_err(|e| tw.error(e))?;
    samples
        .write(&mut tw, &maps.stacks)
        .map_err(|e| tw.error(e))?;
    let dropped = drop_sum(&maps.drops, record_drop::RINGBUF_FULL);
    let threads_full = drop_sum(&maps.drops, record_drop::THREADS_FULL);
    let inflight_full = drop_sum(&maps.drops, record_drop::INFLIGHT_FULL);
    // Processes that joined the tree while recording.
    let recorded_pids: BTreeSet<u32> = maps.pids.keys().filter_map(Result::ok).collect();
    let events = tw.events;
    let meta = json!({
        "tool": "ethand record",
        "ethand_version": env!("CARGO_PKG_VERSION"),
        "root_pid": o.pid,
        "pids": recorded_pids,
        "duration_s": (t_end - t0) as f64 / 1e9,
        "interrupted": ended == Ended::Interrupted,
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
        "cpu_samples_stack_lost": drop_sum(&maps.profile_drops, ethand_common::profile_drop::STACK_LOST),
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

#[cfg(test)]
mod tests;
