//! `ethand record --pid PID --duration 10s -o FILE`: a timeline of one process tree, written
//! in the Chrome JSON trace format (Perfetto and chrome://tracing open it).
//!
//! Standalone, like `ethand survey`: it loads the embedded object with every probe family
//! off and attaches only the recording programs (ebpf/ethand-ebpf/src/record.rs) for the
//! duration, so they cost nothing when nobody records. The kernel sends one `RecordEvent`
//! per scheduler slice, slow syscall, block request and GPU/NPU runtime call of the tree
//! through a ring buffer; this drains it every 20 ms and converts at the end.
//!
//! Trace layout (times in µs as floats from the start of the recording; ns kept as
//! fractions):
//! - one `pid` per process, one `tid` per thread, named from /proc (`ph: "M"`);
//! - syscalls and GPU/NPU calls: complete events (`ph: "X"`) on the thread's own track
//!   (they nest: a runtime call contains the syscalls it makes);
//! - scheduler slices: complete events on a companion track of each thread,
//!   `tid = SCHED_TID_BASE + tid`, named "<thread> (sched)", placed right after the thread;
//!   `args.tid` gives the real thread id;
//! - block requests: async slices (`ph: "b"`/`"e"`, `cat: "block"`) of the submitting
//!   process (requests overlap, which complete events on one track cannot);
//! - drops: in `metadata.dropped` and, when non-zero, a global instant event.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        BtfTracePoint, TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use ethand_common::{
    GpuOpDesc, RecordEvent, RecordThread, gpu_dtype, gpu_kind, record_cfg, record_drop,
    record_kind, record_off,
};
use ethand_userspace_probes::{catalog::CATALOG, elf::SymbolTable, parse_maps};
use serde_json::{Value, json};

use crate::{config::Config, loader, loader::error_chain, syscalls_table};

/// Scheduler tracks: `tid = SCHED_TID_BASE + tid` (pid_max is at most 2^22).
pub const SCHED_TID_BASE: u64 = 1 << 30;
const POLL: Duration = Duration::from_millis(20);

pub struct Options<'a> {
    pub pid: u32,
    pub duration: Duration,
    pub output: &'a Path,
    pub syscall_threshold_us: u64,
}

pub async fn run(cfg: &Config, o: Options<'_>) -> anyhow::Result<u8> {
    if !Path::new(&format!("/proc/{}", o.pid)).exists() {
        eprintln!("ethand: no process {}", o.pid);
        return Ok(3);
    }
    // Fail before recording if the output cannot be written.
    let tmp = tmp_path(o.output);
    fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = record(cfg, &o, &tmp).await;
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// "10", "10s", "500ms", "2m", "1.5s".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v * mult)),
        _ => Err(format!("{s:?} is not a duration like 10s, 500ms or 2m")),
    }
}

fn tmp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A library file attached for recording.
struct GpuLib {
    path: String,
    symbols: usize,
}

async fn record(cfg: &Config, o: &Options<'_>, tmp: &Path) -> anyhow::Result<u8> {
    let mut c = cfg.clone();
    c.probes.sched = false;
    c.probes.syscalls = false;
    c.probes.block = false;
    c.probes.net = false;
    c.probes.lifecycle = false;
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

    let t0 = monotonic_ns();
    // Fork first, then seed: a child forked meanwhile is caught by one or the other.
    attach_btf(ebpf, "record_fork", "sched_process_fork", &btf)?;
    let tree = process_tree(o.pid);
    for p in &tree {
        pids_map.insert(p, &1, 0)?;
    }
    let mut names = Names::default();
    for p in &tree {
        names.learn_process(*p);
    }
    attach_btf(ebpf, "record_sched_switch", "sched_switch", &btf)?;
    attach_btf(ebpf, "record_sys_enter", "sys_enter", &btf)?;
    attach_btf(ebpf, "record_sys_exit", "sys_exit", &btf)?;
    let mut warnings = Vec::new();
    for (prog, probe) in [
        ("record_blk_start", "block_start"),
        ("record_blk_complete", "block_complete"),
    ] {
        if let Err(e) = attach_classic(ebpf, prog, &c, probe) {
            eprintln!("ethand: warning: block IO not recorded: {e}");
            warnings.push(format!("block IO not recorded: {e}"));
            break;
        }
    }
    let gpu_libs = attach_gpu(ebpf, &tree, &mut warnings);
    eprintln!(
        "ethand: recording {} process(es) from pid {} for {:.1}s (syscalls >= {} us, {} GPU/NPU library file(s))...",
        tree.len(),
        o.pid,
        o.duration.as_secs_f64(),
        o.syscall_threshold_us,
        gpu_libs.len()
    );

    let mut events: Vec<RecordEvent> = Vec::new();
    let deadline = Instant::now() + o.duration;
    let mut interrupted = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        drain(&mut ring, &mut events, &mut names);
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL.min(deadline - now)) => {}
            _ = &mut ctrl_c => { interrupted = true; break; }
        }
    }
    let t_end = monotonic_ns();
    // Detach everything (the programs go with the object), then take what was left.
    drop(loaded);
    drain(&mut ring, &mut events, &mut names);
    close_open_slices(&threads_map, t_end, &mut events);
    let dropped = drop_sum(&drops, record_drop::RINGBUF_FULL);
    let threads_full = drop_sum(&drops, record_drop::THREADS_FULL);
    let inflight_full = drop_sum(&drops, record_drop::INFLIGHT_FULL);
    // Processes that joined the tree while recording.
    let recorded_pids: BTreeSet<u32> = pids_map.keys().filter_map(Result::ok).collect();

    let meta = json!({
        "tool": "ethand record",
        "ethand_version": env!("CARGO_PKG_VERSION"),
        "root_pid": o.pid,
        "pids": recorded_pids,
        "duration_s": (t_end - t0) as f64 / 1e9,
        "interrupted": interrupted,
        "syscall_threshold_us": o.syscall_threshold_us,
        "clock": "CLOCK_MONOTONIC",
        "start_monotonic_ns": t0,
        "events": events.len(),
        "dropped": dropped,
        "dropped_threads_table_full": threads_full,
        "dropped_inflight_table_full": inflight_full,
        "sched_tid_base": SCHED_TID_BASE,
        "gpu_libraries": gpu_libs.iter().map(|l| json!({"path": l.path, "symbols": l.symbols})).collect::<Vec<_>>(),
        "warnings": warnings,
    });
    let trace = build_trace(&events, &names, t0, t_end, dropped, meta);
    write_atomically(tmp, o.output, &trace)?;
    println!(
        "recorded {} events ({} dropped) to {}",
        events.len(),
        dropped,
        o.output.display()
    );
    if threads_full + inflight_full > 0 {
        eprintln!(
            "ethand: warning: {} thread(s) and {} block/GPU call(s) not recorded: tables full",
            threads_full, inflight_full
        );
    }
    Ok(0)
}

/// The slice each live recorded thread was in when recording stopped (running, or off CPU),
/// cut at the end, so that the timeline does not stop at each thread's last switch.
fn close_open_slices(
    threads: &BpfHashMap<MapData, u32, RecordThread>,
    t_end: u64,
    events: &mut Vec<RecordEvent>,
) {
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
        events.push(RecordEvent {
            kind,
            tgid: t.tgid,
            tid,
            cpu: u32::MAX,
            start_ns: start,
            dur_ns: t_end - start,
            arg0,
            ..Default::default()
        });
    }
}

fn drop_sum(m: &PerCpuArray<MapData, u64>, idx: u32) -> u64 {
    m.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
}

fn drain(ring: &mut RingBuf<MapData>, out: &mut Vec<RecordEvent>, names: &mut Names) {
    while let Some(item) = ring.next() {
        if item.len() < size_of::<RecordEvent>() {
            continue;
        }
        // SAFETY: the kernel wrote a RecordEvent (repr(C), integers only); unaligned read.
        let e: RecordEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        names.learn_thread(e.tgid, e.tid);
        out.push(e);
    }
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
fn attach_gpu(ebpf: &mut Ebpf, tree: &BTreeSet<u32>, warnings: &mut Vec<String>) -> Vec<GpuLib> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut libs = Vec::new();
    for pid in tree {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        for lib in parse_maps(*pid, &text) {
            if seen.insert((lib.dev.clone(), lib.inode)) {
                libs.push(lib);
            }
        }
    }
    if libs.is_empty() {
        return out;
    }
    let progs = crate::gpu::Progs::detect();
    let (entry, ret) = if progs.multi() {
        ("record_gpu_enter_multi", "record_gpu_return_multi")
    } else {
        ("record_gpu_enter", "record_gpu_return")
    };
    for name in [entry, ret] {
        let r = (|| -> anyhow::Result<()> {
            let p: &mut UProbe = ebpf
                .program_mut(name)
                .context("program missing")?
                .try_into()?;
            p.load()
                .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
            Ok(())
        })();
        if let Err(e) = r {
            let w = format!("GPU/NPU calls not recorded: loading {name}: {e:#}");
            eprintln!("ethand: warning: {w}");
            warnings.push(w);
            return out;
        }
    }
    // All processes: the tree grows while recording; the programs filter on RECORD_PIDS.
    let scope = UProbeScope::AllProcesses;
    for lib in libs {
        let table = match SymbolTable::read(&lib.host_path) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!("{}: {e}", lib.path.display()));
                continue;
            }
        };
        let wanted: Vec<(u16, &str)> = CATALOG
            .iter()
            .enumerate()
            .filter(|(_, s)| s.runtime == lib.runtime)
            .map(|(i, s)| (i as u16, s.name))
            .collect();
        let resolved: Vec<(u16, u64)> = wanted
            .iter()
            .zip(table.resolve(wanted.iter().map(|(_, n)| *n)))
            .filter_map(|((op, _), (_, r))| r.ok().map(|off| (*op, off)))
            .collect();
        if resolved.is_empty() {
            continue;
        }
        let points = || -> Vec<UProbeAttachPoint> {
            resolved
                .iter()
                .map(|(op, off)| UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(*off),
                    cookie: Some(u64::from(*op)),
                })
                .collect()
        };
        let r = (|| -> anyhow::Result<()> {
            for name in [entry, ret] {
                let p: &mut UProbe = ebpf
                    .program_mut(name)
                    .context("program missing")?
                    .try_into()?;
                p.attach(points(), &lib.host_path, scope)
                    .map_err(|e| anyhow::anyhow!("{name}: {}", error_chain(&e)))?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => out.push(GpuLib {
                path: lib.path.display().to_string(),
                symbols: resolved.len(),
            }),
            Err(e) => {
                let w = format!("{}: GPU/NPU calls not recorded: {e:#}", lib.path.display());
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
#[derive(Default)]
struct Names {
    procs: BTreeMap<u32, String>,
    threads: BTreeMap<(u32, u32), String>,
}

fn comm(path: &str) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end().to_string())
}

impl Names {
    fn learn_process(&mut self, pid: u32) {
        if !self.procs.contains_key(&pid) {
            if let Some(n) = comm(&format!("/proc/{pid}/comm")) {
                self.procs.insert(pid, n);
            }
        }
        if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) {
            for e in dir.flatten() {
                if let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                    self.learn_thread(pid, tid);
                }
            }
        }
    }

    fn learn_thread(&mut self, pid: u32, tid: u32) {
        if self.threads.contains_key(&(pid, tid)) {
            return;
        }
        if !self.procs.contains_key(&pid) {
            let n = comm(&format!("/proc/{pid}/comm")).unwrap_or_else(|| format!("pid {pid}"));
            self.procs.insert(pid, n);
        }
        let n =
            comm(&format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_else(|| format!("tid {tid}"));
        self.threads.insert((pid, tid), n);
    }
}

fn us(ns: i128) -> f64 {
    ns as f64 / 1000.0
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

fn build_trace(
    events: &[RecordEvent],
    names: &Names,
    t0: u64,
    t_end: u64,
    dropped: u64,
    metadata: Value,
) -> Value {
    let mut out: Vec<Value> = Vec::with_capacity(events.len() + 2 * names.threads.len() + 4);
    let rel = |ns: u64| us(ns as i128 - t0 as i128);
    let mut sched_threads: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut pids: BTreeSet<u32> = names.procs.keys().copied().collect();
    let mut threads: BTreeSet<(u32, u32)> = names.threads.keys().copied().collect();
    let mut sorted: Vec<&RecordEvent> = events.iter().collect();
    sorted.sort_by_key(|e| (e.start_ns, std::cmp::Reverse(e.dur_ns)));
    let mut block_id = 0u64;
    for e in sorted {
        pids.insert(e.tgid);
        threads.insert((e.tgid, e.tid));
        let ts = rel(e.start_ns);
        let dur = e.dur_ns as f64 / 1000.0;
        match e.kind {
            record_kind::ON_CPU | record_kind::OFF_CPU => {
                sched_threads.insert((e.tgid, e.tid));
                let name = match (e.kind, e.arg0) {
                    (record_kind::ON_CPU, _) => "running",
                    (_, record_off::BLOCKED) => "blocked",
                    (_, record_off::PREEMPTED) => "preempted",
                    _ => "off-cpu",
                };
                let mut args = json!({"tid": e.tid});
                if e.cpu == u32::MAX {
                    // Still in this state when recording stopped: cut at the end.
                    args["cut_at_end"] = json!(true);
                } else if e.kind == record_kind::ON_CPU {
                    args["cpu"] = json!(e.cpu);
                } else {
                    args["woken_on_cpu"] = json!(e.cpu);
                }
                out.push(json!({
                    "name": name, "cat": "sched", "ph": "X", "ts": ts, "dur": dur,
                    "pid": e.tgid, "tid": SCHED_TID_BASE + e.tid as u64, "args": args,
                }));
            }
            record_kind::SYSCALL => {
                let ret = e.arg1 as i64;
                let mut args = json!({"nr": e.arg0, "ret": ret, "cpu": e.cpu});
                if (-4095..0).contains(&ret) {
                    args["errno"] = json!(-ret);
                }
                out.push(json!({
                    "name": syscalls_table::name(e.arg0 as u32), "cat": "syscall", "ph": "X",
                    "ts": ts, "dur": dur, "pid": e.tgid, "tid": e.tid, "args": args,
                }));
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
                out.push(json!({
                    "name": name, "cat": "gpu", "ph": "X", "ts": ts, "dur": dur,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }));
            }
            record_kind::BLOCK => {
                block_id += 1;
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
                let args = json!({
                    "dev": format!("{}:{}", dev >> 20, dev & 0xfffff), "sector": e.arg1,
                    "bytes": e.arg2, "rwbs": rwbs, "tid": e.tid, "dur_us": dur,
                });
                let name = format!("block {op}");
                out.push(json!({
                    "name": name, "cat": "block", "ph": "b", "id": block_id, "ts": ts,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }));
                out.push(json!({
                    "name": name, "cat": "block", "ph": "e", "id": block_id, "ts": ts + dur,
                    "pid": e.tgid, "tid": e.tid,
                }));
            }
            _ => {}
        }
    }
    let mut meta_events: Vec<Value> = Vec::new();
    for p in &pids {
        let n = names
            .procs
            .get(p)
            .cloned()
            .unwrap_or_else(|| format!("pid {p}"));
        meta_events.push(
            json!({"name": "process_name", "ph": "M", "pid": p, "tid": p, "args": {"name": n}}),
        );
        meta_events.push(json!({"name": "process_sort_index", "ph": "M", "pid": p, "tid": p, "args": {"sort_index": p}}));
    }
    for (p, t) in &threads {
        let n = names
            .threads
            .get(&(*p, *t))
            .cloned()
            .unwrap_or_else(|| format!("tid {t}"));
        meta_events.push(json!({"name": "thread_name", "ph": "M", "pid": p, "tid": t, "args": {"name": format!("{n} ({t})")}}));
        meta_events.push(json!({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": t, "args": {"sort_index": 2 * *t as u64}}));
        if sched_threads.contains(&(*p, *t)) {
            let st = SCHED_TID_BASE + *t as u64;
            meta_events.push(json!({"name": "thread_name", "ph": "M", "pid": p, "tid": st, "args": {"name": format!("{n} ({t}) sched")}}));
            meta_events.push(json!({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": st, "args": {"sort_index": 2 * *t as u64 + 1}}));
        }
    }
    if dropped > 0 {
        let root = metadata["root_pid"].clone();
        out.push(json!({
            "name": format!("ethand: {dropped} events dropped (ring buffer full)"),
            "cat": "ethand", "ph": "i", "s": "g", "ts": rel(t_end), "pid": root, "tid": root,
            "args": {"dropped": dropped},
        }));
    }
    meta_events.extend(out);
    json!({"traceEvents": meta_events, "displayTimeUnit": "ns", "metadata": metadata})
}

fn write_atomically(tmp: &Path, out: &Path, trace: &Value) -> anyhow::Result<()> {
    let r = (|| -> std::io::Result<()> {
        let f = fs::File::create(tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        serde_json::to_writer(&mut w, trace)?;
        w.write_all(b"\n")?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(tmp, out)
    })();
    if let Err(e) = r {
        let _ = fs::remove_file(tmp);
        bail!("cannot write {}: {e}", out.display());
    }
    Ok(())
}
