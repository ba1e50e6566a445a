//! `ethand survey`: which exported functions of a runtime library a workload really calls.
//! A diagnostic for a library or framework version ethand has not met: it probes every
//! exported function whose name starts with a prefix (not just the catalog), counts calls per
//! process for a while, and prints the table. Standalone: it loads its own programs.
use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::{Context as _, bail};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::uprobe::{UProbeAttachPoint, UProbeScope},
};
use ethand_common::{GPU_ARG_NONE, GPU_MAX_OPS, GpuCallKey, GpuCallStats, GpuOpDesc, gpu_kind};
use ethand_userspace_probes::elf::SymbolTable;

use crate::{
    config::Config,
    pipeline::{
        loader,
        uprobes::{self, LibraryLinks, Progs, UprobeError},
    },
};

pub async fn run(
    cfg: &Config,
    library: &Path,
    prefix: &str,
    duration: Duration,
    pid: Option<u32>,
) -> anyhow::Result<u8> {
    let table = SymbolTable::read(library)?;
    let names = table.names_with_prefix(prefix);
    if names.is_empty() {
        bail!(
            "{} exports no function starting with {prefix:?}",
            library.display()
        );
    }
    let resolved: Vec<(String, u64)> = table
        .resolve(names.iter().map(String::as_str))
        .into_iter()
        .filter_map(|(n, r)| r.ok().map(|off| (n.to_string(), off)))
        .take(GPU_MAX_OPS as usize)
        .collect();
    // Only the uprobe programs are needed: every tracepoint family off.
    let mut c = cfg.clone();
    c.probes.turn_families_off();
    let mut loaded = loader::load(&crate::config::Plan::resolve(&c))?;
    let mut ops: Array<MapData, GpuOpDesc> =
        Array::try_from(loaded.ebpf.take_map("GPU_OPS").context("GPU_OPS map")?)?;
    let count_only = GpuOpDesc {
        kind: gpu_kind::COUNT,
        flags: 0,
        bytes_arg: GPU_ARG_NONE,
        aux_arg: GPU_ARG_NONE,
        aux2_arg: GPU_ARG_NONE,
        mem: 0,
        dir: 0,
        dtype_table: 0,
    };
    for i in 0..resolved.len() {
        ops.set(i as u32, &count_only, 0)?;
    }
    // Entry probes only, each counted under its index.
    let progs = Progs::detect();
    let points: Vec<UProbeAttachPoint<'static>> = resolved
        .iter()
        .enumerate()
        .map(|(i, (_, off))| uprobes::at_offset(*off, Some(i as u64)))
        .collect();
    uprobes::load(&mut loaded.ebpf, progs.entry).map_err(survey_error)?;
    LibraryLinks::default()
        .attach(
            &mut loaded.ebpf,
            progs,
            library,
            points,
            Vec::new(),
            UProbeScope::AllProcesses,
        )
        .map_err(|(_, e)| survey_error(e).context(format!("attaching to {}", library.display())))?;
    eprintln!(
        "ethand: probing {} functions of {} matching {prefix:?} for {:.0}s...",
        resolved.len(),
        library.display(),
        duration.as_secs_f64()
    );
    tokio::time::sleep(duration).await;
    let calls: BpfHashMap<MapData, GpuCallKey, GpuCallStats> =
        BpfHashMap::try_from(loaded.ebpf.take_map("GPU_CALLS").context("GPU_CALLS map")?)?;
    let mut rows: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for (k, v) in calls.iter().filter_map(Result::ok) {
        if pid.is_some_and(|p| p != k.tgid) {
            continue;
        }
        if let Some((name, _)) = resolved.get(k.op as usize) {
            *rows.entry((k.tgid, name.clone())).or_default() += v.calls;
        }
    }
    let mut rows: Vec<_> = rows.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = format!("{:<8} {:<40} {:>12}\n", "PID", "SYMBOL", "CALLS");
    for ((p, name), n) in &rows {
        out += &format!("{p:<8} {name:<40} {n:>12}\n");
    }
    if rows.is_empty() {
        out += "(no calls)\n";
    }
    crate::write_stdout(out)?;
    Ok(0)
}

/// A uprobe error as survey reports it: aya's error itself (its chain printed by `main`), or
/// that the object lacks the program.
fn survey_error(e: UprobeError) -> anyhow::Error {
    match e.into_program_error() {
        Some(error) => anyhow::Error::new(error),
        None => anyhow::anyhow!("uprobe program"),
    }
}
