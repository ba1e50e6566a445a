//! `ethand record --pid PID --duration 10s -o FILE`: a timeline of one process tree, written
//! as Perfetto's native protobuf trace (`perfetto.rs`; the default: any FILE not ending in
//! .json, e.g. trace.pftrace) or as a Chrome JSON trace (`json.rs`: FILE.json). `-o` may be
//! given twice: both files are written from the same events.
//!
//! Standalone, like `ethand survey`: it loads the embedded object with every probe family
//! off and attaches only the recording programs (ebpf/ethand-ebpf/src/record.rs) for the
//! duration, so they cost nothing when nobody records. The kernel sends one `RecordEvent`
//! per scheduler slice, slow syscall, block request and GPU/NPU runtime call of the tree
//! through a ring buffer; this drains it every 20 ms, decodes each event once (`trace.rs`)
//! and streams it to every output.
//!
//! Streaming: each output writes to FILE.tmp as it goes, with bounded memory (JSON: a 4 MiB
//! buffer; Perfetto: a reorder window and one compressed chunk), whatever the duration or
//! the event rate, and stopping costs only the last drain, the closing bytes and an fsync. On
//! stop: the drop marker and the summary (counts known only then), fsync, then FILE.tmp is
//! renamed to FILE. If writing fails (a full disk, say), recording stops, the error names
//! FILE.tmp and how many events were written, FILE.tmp is removed and FILE is not created
//! (exit 1): a trace under FILE's name is always complete. `--max-size` ends the recording
//! once an output has reached that many bytes on disk.
//!
//! What is recorded (both formats): scheduler slices of each thread (running on a CPU,
//! blocked, preempted; the slice each thread was in at the end, cut there), syscalls at least
//! `--syscall-threshold-us` long, GPU/NPU runtime calls (nested around the syscalls they
//! make), block requests of the tree, CPU samples (`--cpu-sample-hz`: a CPU-clock perf event
//! on every CPU, user and kernel frames symbolized at every drain while the processes live: a
//! short-lived child's maps go with it) and Python samples (`--python-sample-hz`, the stacks
//! of the tree's Python threads read from outside, `python_samples.rs`), drops counted.
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
mod daemon_stream;
mod gpu_python;
mod gpu_tracks;
mod json;
mod launch_index;
mod perfetto;
mod samples;
mod trace;

use attach::*;
use gpu_python::GpuPython;
use gpu_tracks::GpuTracks;
#[cfg(test)]
use json::{push_i64, push_ts, push_u64, push_us};
use samples::*;
use trace::*;

/// Scheduler tracks: `tid = SCHED_TID_BASE + tid` (pid_max is at most 2^22).
pub const SCHED_TID_BASE: u64 = 1 << 30;
/// GPU tracks in the JSON output: `tid = GPU_TID_BASE + n`, n numbering the recording's
/// GPU tracks (a device's stream of a process) from 0.
pub const GPU_TID_BASE: u64 = 1 << 31;
const POLL: Duration = Duration::from_millis(20);
/// How often the recording checks whether any process of its tree is still alive.
const TREE_CHECK: Duration = Duration::from_millis(500);

/// The output's format, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Perfetto's TracePacket protobuf: any name not ending in .json (trace.pftrace).
    Perfetto,
    /// Chrome JSON trace events: a name ending in .json.
    Json,
}

impl Format {
    pub fn of(path: &Path) -> Self {
        match path.extension() {
            Some(e) if e.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Perfetto,
        }
    }
}

pub struct Options<'a> {
    pub pid: u32,
    pub duration: Duration,
    /// Ring mode: keep the last this long (Perfetto outputs only).
    pub ring: Option<Duration>,
    /// One or two outputs (formats from their names).
    pub outputs: &'a [std::path::PathBuf],
    /// Stop once an output has this many bytes on disk.
    pub max_size: Option<u64>,
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
    if o.outputs.is_empty() {
        return Err(crate::UsageError("record needs an output: -o trace.pftrace".into()).into());
    }
    if o.ring.is_some()
        && let Some(j) = o.outputs.iter().find(|p| Format::of(p) == Format::Json)
    {
        return Err(crate::UsageError(format!(
            "--ring keeps Perfetto segments and drops the oldest; a JSON trace cannot lose its \
             beginning: write a .pftrace instead of {}",
            j.display()
        ))
        .into());
    }
    // Fail before recording if an output cannot be written. A random name beside FILE,
    // created exclusively: nothing planted there is followed (outfile.rs).
    let mut files = Vec::new();
    for path in o.outputs {
        let out = crate::commands::outfile::OutFile::create(path)
            .with_context(|| format!("cannot create a file beside {}", path.display()))?;
        files.push(out);
    }
    let mut sinks = Vec::new();
    // Ring segments: a private directory beside each output, removed at the end.
    let mut ring_dirs = Vec::new();
    for (out, path) in files.iter().zip(o.outputs) {
        let file = out
            .file()
            .try_clone()
            .context("duplicating the output file descriptor")?;
        let ring = match o.ring {
            Some(keep) => {
                let dir = crate::commands::outfile::ring_dir(path).with_context(|| {
                    format!(
                        "cannot create a directory for the ring beside {}",
                        path.display()
                    )
                })?;
                let r = ethand_perfetto::RingOptions {
                    dir: dir.path().to_path_buf(),
                    keep_ns: keep.as_nanos() as u64,
                    max_bytes: o.max_size,
                };
                ring_dirs.push(dir);
                Some(r)
            }
            None => None,
        };
        sinks.push(Sink {
            format: Format::of(path),
            file,
            tmp: out.tmp_path().to_path_buf(),
            ring,
        });
    }
    // An error drops the files (and the rings' directories), which removes the partial ones.
    let code = record(cfg, &o, sinks).await?;
    drop(ring_dirs);
    for (out, path) in files.into_iter().zip(o.outputs) {
        out.commit()
            .with_context(|| format!("cannot complete {}", path.display()))?;
    }
    Ok(code)
}

/// "100M", "2G", "512k", "1000000" (bytes; k, M, G are powers of 1024); at least 64 KiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                _ => return Err(format!("{t:?} is not a size like 100M, 2G or 512k")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{t:?} is not a size like 100M, 2G or 512k"))?;
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{t:?} is too large"))?;
    if bytes < 64 << 10 {
        return Err(format!("{t:?} is below 64k: no trace fits"));
    }
    Ok(bytes)
}

/// Longest recording: a timeline of hours is gigabytes no viewer opens.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// How long to record when `--duration` is not given: 10 s, or with a ring until stopped
/// (at most [`MAX_DURATION`]).
pub fn duration_or_default(given: Option<Duration>, ring: Option<Duration>) -> Duration {
    match (given, ring) {
        (Some(d), _) => d,
        (None, Some(_)) => MAX_DURATION,
        (None, None) => Duration::from_secs(10),
    }
}

/// An output and how it is written.
struct Sink {
    format: Format,
    file: fs::File,
    /// FILE.tmp, for error messages.
    tmp: std::path::PathBuf,
    /// Ring mode (Perfetto only).
    ring: Option<ethand_perfetto::RingOptions>,
}

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
    /// An output reached `--max-size`.
    MaxSize,
}

/// Drains the ring buffer and the samples into the trace until the duration passes, a
/// signal comes or the whole tree has exited.
async fn record_until_done(
    o: &Options<'_>,
    maps: &mut RecordMaps,
    tw: &mut TraceWriter,
    samples: &mut Samples,
    (gpu_python, gpu_tracks): (&mut GpuPython, &mut GpuTracks),
    (python, python_written): (Option<&PythonSampler>, &mut u64),
    signals: &mut Signals,
) -> anyhow::Result<Ended> {
    let deadline = Instant::now() + o.duration;
    let mut next_tree_check = Instant::now() + TREE_CHECK;
    loop {
        tw.drain(&mut maps.ring).map_err(|e| tw.error(e))?;
        gpu_python.write(tw).map_err(|e| tw.error(e))?;
        gpu_tracks.write(tw).map_err(|e| tw.error(e))?;
        // Symbolized at each drain (20 ms), while their processes still live: a short-lived
        // child's /proc/PID/maps is gone soon after, and its samples would stay addresses.
        // New stacks only (cached per process and stack id): one reader call per process
        // with new stacks.
        samples.write(tw, &maps.stacks).map_err(|e| tw.error(e))?;
        if let Some(p) = python {
            *python_written += write_python(tw, p.samples.try_iter()).map_err(|e| tw.error(e))?;
        }
        // A ring keeps itself under --max-size by dropping its oldest segments.
        if o.ring.is_none() && o.max_size.is_some_and(|m| tw.written_bytes() >= m) {
            eprintln!("ethand: the output reached --max-size: recording ends");
            return Ok(Ended::MaxSize);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Ended::Duration);
        }
        // Nothing more can happen once the whole tree has exited.
        if now >= next_tree_check {
            next_tree_check = now + TREE_CHECK;
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
            _ = signals.0.recv() => return Ok(Ended::Interrupted),
            _ = signals.1.recv() => return Ok(Ended::Interrupted),
            _ = signals.2.recv() => return Ok(Ended::Interrupted),
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from the recording's start.
type Signals = (
    tokio::signal::unix::Signal,
    tokio::signal::unix::Signal,
    tokio::signal::unix::Signal,
);

/// SIGINT, SIGTERM (systemd, kill, a job scheduler) and SIGHUP (a closed terminal) all end
/// the recording early and keep the trace; caught before anything is attached, so that one
/// arriving while the recording sets up ends it at its first round, not the process.
fn catch_signals() -> anyhow::Result<Signals> {
    let signal = |kind| tokio::signal::unix::signal(kind).context("installing the signal handlers");
    use tokio::signal::unix::SignalKind;
    Ok((
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
        signal(SignalKind::hangup())?,
    ))
}

async fn record(cfg: &Config, o: &Options<'_>, sinks: Vec<Sink>) -> anyhow::Result<u8> {
    let mut signals = catch_signals()?;
    // Symbols, Python frames and library files of the tree are read by the reader, as each
    // process's owner.
    let mut c = cfg.clone();
    c.probes.turn_families_off();
    // Samples of a whole recording keep their stacks: room for many more than a snapshot's.
    c.maps.profile_stacks = RECORD_STACKS;
    let plan = crate::config::Plan::resolve(&c);
    let reader = ReaderHandle::start(&plan.reader);
    let mut loaded = loader::load_with(&plan, ethand_common::RECORD_RINGBUF_BYTES)?;
    let mut maps = RecordMaps::take(&mut loaded.ebpf, o)?;
    let mut gpu_python = GpuPython::new(&mut loaded.ebpf, plan.gpu.python_frames, reader.clone());
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
    // The libraries' windows open last: the GPU work they record is the recording's.
    let mut gpu_tracks = GpuTracks::start(
        &mut loaded.ebpf,
        (plan.gpu.cupti_dir.as_deref(), &cfg.daemon.socket),
        &tree,
        o.duration,
        reader.clone(),
        &mut warnings,
    );
    let mut tw = trace_writer(sinks, t0, gpu_tracks.recording())?;
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
        (&mut gpu_python, &mut gpu_tracks),
        (python.as_ref(), &mut python_written),
        &mut signals,
    )
    .await?;
    let t_end = monotonic_ns();
    // Before the programs go: the libraries' last records come through them (and the launch
    // calls of their kernels are all in).
    tw.drain(&mut maps.ring).map_err(|e| tw.error(e))?;
    let gpu_activity = gpu_tracks.finish(&mut tw).map_err(|e| tw.error(e))?;
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
    gpu_python.finish(&mut tw).map_err(|e| tw.error(e))?;
    samples
        .write(&mut tw, &maps.stacks)
        .map_err(|e| tw.error(e))?;
    let dropped = drop_sum(&maps.drops, record_drop::RINGBUF_FULL);
    let threads_full = drop_sum(&maps.drops, record_drop::THREADS_FULL);
    let inflight_full = drop_sum(&maps.drops, record_drop::INFLIGHT_FULL);
    // Processes that joined the tree while recording.
    let recorded_pids: BTreeSet<u32> = maps.pids.keys().filter_map(Result::ok).collect();
    let events = tw.events;
    // What the ring kept, fixed from here on (the summary says it).
    let ring = tw.stop_rotating(t_end)?;
    let mut meta = json!({
        "tool": "ethand record",
        "ethand_version": env!("CARGO_PKG_VERSION"),
        "root_pid": o.pid,
        "pids": recorded_pids,
        "duration_s": (t_end - t0) as f64 / 1e9,
        "interrupted": ended == Ended::Interrupted,
        "max_size": o.max_size,
        "ended": ended,
        // Ring mode: what was kept of the recording; absent without a ring.
        "ring_s": o.ring.map(|r| r.as_secs_f64()),
        "ring_kept_from_monotonic_ns": ring.and_then(|r| r.kept_from_ns),
        "ring_segments_kept": ring.map(|r| r.segments_kept),
        "ring_segments_dropped": ring.map(|r| r.segments_dropped),
        "ring_events_dropped": ring.map(|r| r.events_dropped),
        "ring_slices_begun_again": ring.map(|r| r.slices_begun_again),
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
        "warnings": warnings,
    });
    gpu_metadata(&mut meta, &gpu_libs, &gpu_python, gpu_activity);
    tw.finish(&Ending {
        root: o.pid,
        t_end,
        dropped,
        meta: &meta,
    })?;
    say_recorded(o, events, dropped, ring)?;
    if threads_full + inflight_full > 0 {
        eprintln!(
            "ethand: warning: {} thread(s) and {} block/GPU call(s) not recorded: tables full",
            threads_full, inflight_full
        );
    }
    Ok(0)
}

/// The summary's GPU part: the runtime library files attached, the Python walks at their
/// probes, and what the GPU tracks hold per injected process (gpu_tracks.rs) or why none.
fn gpu_metadata(
    meta: &mut serde_json::Value,
    libs: &[GpuLib],
    python: &GpuPython,
    activity: serde_json::Value,
) {
    let m = meta.as_object_mut().expect("an object");
    m.insert(
        "gpu_libraries".into(),
        libs.iter()
            .map(|l| json!({"path": l.path, "symbols": l.symbols}))
            .collect(),
    );
    // Python frames walked at the GPU probes: per process, whether (and why not).
    m.insert("python_walks".into(), json!(python.walks()));
    m.insert(
        "gpu_calls_with_python_frames".into(),
        json!(python.with_frames),
    );
    m.insert(
        "gpu_calls_with_python_frames_partly_read".into(),
        json!(python.partly_read),
    );
    m.insert("gpu_activity".into(), activity);
}

/// An encoder per output, streaming to its file; `launches`: whether the launch calls are
/// kept (GPU tracks are recorded: their kernels' flows).
fn trace_writer(sinks: Vec<Sink>, t0: u64, launches: bool) -> anyhow::Result<TraceWriter> {
    let mut outputs: Vec<Box<dyn Encoder>> = Vec::new();
    let mut tmps = Vec::new();
    for Sink {
        format,
        file,
        tmp,
        ring,
    } in sinks
    {
        outputs.push(match format {
            Format::Json => Box::new(json::JsonEncoder::new(file, t0)),
            Format::Perfetto => Box::new(
                perfetto::PerfettoEncoder::new(file, ring)
                    .with_context(|| format!("cannot write {}", tmp.display()))?,
            ),
        });
        tmps.push(tmp);
    }
    let mut tw = TraceWriter::new(outputs, tmps);
    if launches {
        tw.launches = Some(launch_index::LaunchIndex::default());
    }
    Ok(tw)
}

/// "recorded N events (D dropped) to FILE", and what a ring left out.
fn say_recorded(
    o: &Options<'_>,
    events: u64,
    dropped: u64,
    ring: Option<ethand_perfetto::RingStats>,
) -> anyhow::Result<()> {
    let names: Vec<String> = o.outputs.iter().map(|p| p.display().to_string()).collect();
    let kept = match (ring, o.ring) {
        (Some(r), Some(keep)) if r.segments_dropped > 0 => format!(
            "; the ring kept the last {:.1}s, {} events before them left out",
            keep.as_secs_f64(),
            r.events_dropped
        ),
        _ => String::new(),
    };
    crate::write_stdout(format!(
        "recorded {} events ({} dropped) to {}{kept}\n",
        events,
        dropped,
        names.join(" and ")
    ))
}

#[cfg(test)]
mod tests;
