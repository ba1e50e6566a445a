//! Attaching the recording programs: the scheduler, syscall and block tracepoints, the
//! GPU/NPU runtime libraries the tree maps, and the CPU-sample perf events.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs,
};

use anyhow::Context as _;
use aya::{
    Btf, Ebpf,
    programs::{
        BtfTracePoint, PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachPoint, UProbeScope},
    },
};
use ethand_userspace_probes::discover;

use crate::{
    config::Config,
    pipeline::{
        bpf_error::error_chain,
        reader::ReaderHandle,
        uprobes::{self, LibraryLinks, Progs, UprobeError},
    },
};

/// A library file attached for recording.
pub(super) struct GpuLib {
    pub(super) path: String,
    pub(super) symbols: usize,
    /// Held open: the probes are attached through it (the very file mapped).
    pub(super) _file: fs::File,
}

/// Stacks a recording can keep (`PROFILE_STACKS`, ~1 KiB each, preallocated: 16 MiB).
pub(super) const RECORD_STACKS: u32 = 16384;
pub(super) fn attach_samples(ebpf: &mut Ebpf, hz: u32) -> anyhow::Result<()> {
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

pub(super) fn attach_btf(ebpf: &mut Ebpf, prog: &str, tp: &str, btf: &Btf) -> anyhow::Result<()> {
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

pub(super) fn attach_classic(
    ebpf: &mut Ebpf,
    prog: &str,
    cfg: &Config,
    probe: &str,
) -> Result<(), String> {
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
pub(super) fn attach_gpu(
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
pub(super) fn process_tree(pid: u32) -> BTreeSet<u32> {
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
