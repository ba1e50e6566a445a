//! Loads the embedded BPF object and attaches its programs probe by probe. A probe that the
//! kernel cannot give us is reported (unsupported / failed, with the reason) and the rest
//! carry on: nothing here is fatal except being unable to create the maps at all.
use std::collections::BTreeMap;

use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{BtfTracePoint, ProgramError, TracePoint},
};
use ethand_common::{KernelOffsets, TracepointOffsets};
use ethand_snapshot::{ProbeState, ProbeStatus};
use tracing::{info, warn};

use crate::{
    config::{Plan, ProbeFamily, ProbePlan},
    pipeline::{
        bpf_error::{BpfFailure, Refusal, error_chain},
        kernel,
    },
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ethand"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading BPF maps and programs failed: {source}{hint}")]
    Load {
        source: aya::EbpfError,
        hint: &'static str,
    },
    #[error("kernel structure offsets: {0}")]
    Kernel(#[from] kernel::KernelError),
}

/// Probe families and their probes: (family, probe name, BTF program + BTF tracepoint,
/// classic program). A probe uses the BTF program when allowed and available, else the
/// classic tracepoint named by `probes.tracepoints.<probe name>`.
struct ProbeSpec {
    family: ProbeFamily,
    name: &'static str,
    btf: Option<(&'static str, &'static str)>,
    classic: Option<&'static str>,
}

const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        family: ProbeFamily::Sched,
        name: "sched_switch",
        btf: Some(("sched_switch_btf", "sched_switch")),
        classic: Some("sched_switch_tp"),
    },
    ProbeSpec {
        family: ProbeFamily::Sched,
        name: "sched_wakeup",
        btf: Some(("sched_wakeup_btf", "sched_wakeup")),
        classic: Some("sched_wakeup_tp"),
    },
    ProbeSpec {
        family: ProbeFamily::Sched,
        name: "sched_wakeup_new",
        btf: Some(("sched_wakeup_new_btf", "sched_wakeup_new")),
        classic: None,
    },
    ProbeSpec {
        family: ProbeFamily::Syscalls,
        name: "sys_enter",
        btf: Some(("sys_enter_btf", "sys_enter")),
        classic: Some("sys_enter_tp"),
    },
    ProbeSpec {
        family: ProbeFamily::Syscalls,
        name: "sys_exit",
        btf: Some(("sys_exit_btf", "sys_exit")),
        classic: Some("sys_exit_tp"),
    },
    ProbeSpec {
        family: ProbeFamily::Block,
        name: "block_start",
        btf: Some(("block_start_btf", "block_io_start")),
        classic: Some("block_start"),
    },
    ProbeSpec {
        family: ProbeFamily::Block,
        name: "block_issue",
        btf: Some(("block_issue_btf", "block_rq_issue")),
        classic: Some("block_issue"),
    },
    ProbeSpec {
        family: ProbeFamily::Block,
        name: "block_complete",
        btf: Some(("block_complete_btf", "block_rq_complete")),
        classic: Some("block_complete"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "sock_send_length",
        btf: Some(("sock_send_length_btf", "sock_send_length")),
        classic: Some("sock_send_length"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "sock_recv_length",
        btf: Some(("sock_recv_length_btf", "sock_recv_length")),
        classic: Some("sock_recv_length"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "inet_sock_set_state",
        btf: Some(("inet_sock_set_state_btf", "inet_sock_set_state")),
        classic: Some("inet_sock_set_state"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "tcp_retransmit_skb",
        btf: Some(("tcp_retransmit_skb_btf", "tcp_retransmit_skb")),
        classic: Some("tcp_retransmit_skb"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "tcp_send_reset",
        btf: Some(("tcp_send_reset_btf", "tcp_send_reset")),
        classic: Some("tcp_send_reset"),
    },
    ProbeSpec {
        family: ProbeFamily::Net,
        name: "tcp_receive_reset",
        btf: Some(("tcp_receive_reset_btf", "tcp_receive_reset")),
        classic: Some("tcp_receive_reset"),
    },
    ProbeSpec {
        family: ProbeFamily::Lifecycle,
        name: "sched_process_exec",
        btf: Some(("sched_process_exec_btf", "sched_process_exec")),
        classic: Some("sched_process_exec"),
    },
    ProbeSpec {
        family: ProbeFamily::Lifecycle,
        name: "sched_process_fork",
        btf: Some(("sched_process_fork_btf", "sched_process_fork")),
        classic: None,
    },
    ProbeSpec {
        family: ProbeFamily::Lifecycle,
        name: "sched_process_exit",
        btf: Some(("sched_process_exit_btf", "sched_process_exit")),
        classic: Some("sched_process_exit"),
    },
];

/// The loaded object plus what became of each probe.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub probes: Vec<ProbeStatus>,
    /// BPF program name -> probe name, for the cost table.
    pub program_probe: BTreeMap<String, String>,
    /// Why classic tracepoints cannot be used: tracefs missing and not mountable.
    pub tracefs_error: Option<String>,
    /// The kernel's BTF has every `struct request` member the BTF block programs read.
    pub blk_btf: bool,
    /// On-CPU time comes from the kernel's `se.sum_exec_runtime`: each thread entry holds
    /// its value at the last switch-out (`ThreadStats::exec_runtime_ns`).
    pub oncpu_from_task: bool,
    /// The CPU profile's programs (`cpu_profile.rs`) loaded, not attached; else why not.
    /// Ok(Some(why)): on-CPU samples only, the off-CPU program not loaded.
    pub profile_programs: Result<Option<String>, String>,
}

/// Fills the classic tracepoint offsets from tracefs. A tracepoint that is missing leaves
/// its fields ABSENT; its probe will be reported unsupported at attach time.
fn tracepoint_offsets(probes: &ProbePlan) -> TracepointOffsets {
    let mut o = TracepointOffsets::default();
    let tps = &probes.tracepoints;
    let get = |probe: &str| {
        tps.get(probe)
            .and_then(|tp| kernel::tracepoint_fields(tp).ok())
    };
    let off = |f: &std::collections::HashMap<String, kernel::Field>, name: &str| {
        f.get(name)
            .map(|x| x.offset)
            .unwrap_or(TracepointOffsets::ABSENT)
    };
    if let Some(f) = get("sched_switch") {
        o.sched_switch_prev_pid = off(&f, "prev_pid");
        o.sched_switch_prev_state = off(&f, "prev_state");
        o.sched_switch_next_pid = off(&f, "next_pid");
    }
    if let Some(f) = get("sched_wakeup") {
        o.sched_wakeup_pid = off(&f, "pid");
    }
    if let Some(f) = get("sys_enter") {
        o.sys_enter_id = off(&f, "id");
    }
    if let Some(f) = get("sys_exit") {
        o.sys_exit_id = off(&f, "id");
        o.sys_exit_ret = off(&f, "ret");
    }
    if let Some(f) = get("block_start") {
        o.blk_start_dev = off(&f, "dev");
        o.blk_start_sector = off(&f, "sector");
        o.blk_start_rwbs = off(&f, "rwbs");
        o.blk_start_bytes = off(&f, "bytes");
    }
    if let Some(f) = get("block_issue") {
        o.blk_issue_dev = off(&f, "dev");
        o.blk_issue_sector = off(&f, "sector");
    }
    if let Some(f) = get("block_complete") {
        o.blk_complete_dev = off(&f, "dev");
        o.blk_complete_sector = off(&f, "sector");
        o.blk_complete_nr_sector = off(&f, "nr_sector");
        o.blk_complete_rwbs = off(&f, "rwbs");
    }
    // send and recv share the record layout (sock_msg_length class).
    if let Some(f) = get("sock_send_length").or_else(|| get("sock_recv_length")) {
        o.sock_len_sk = off(&f, "sk");
        o.sock_len_family = off(&f, "family");
        o.sock_len_protocol = off(&f, "protocol");
        o.sock_len_ret = off(&f, "ret");
    }
    if let Some(f) = get("inet_sock_set_state") {
        o.set_state_sk = off(&f, "skaddr");
        o.set_state_oldstate = off(&f, "oldstate");
        o.set_state_newstate = off(&f, "newstate");
        o.set_state_protocol = off(&f, "protocol");
    }
    if let Some(f) = get("tcp_retransmit_skb") {
        o.tcp_retransmit_skaddr = off(&f, "skaddr");
    }
    if let Some(f) = get("tcp_send_reset") {
        o.tcp_send_reset_skaddr = off(&f, "skaddr");
    }
    if let Some(f) = get("tcp_receive_reset") {
        o.tcp_receive_reset_skaddr = off(&f, "skaddr");
    }
    if let Some(f) = get("sched_process_exec") {
        o.exec_pid = off(&f, "pid");
    }
    if let Some(f) = get("sched_process_exit") {
        o.exit_group_dead = off(&f, "group_dead");
    }
    o
}

/// Loads for the daemon: the `ethand record` ring buffer shrunk to one page (the daemon
/// never records; the kernel would otherwise lock 8 MiB for it).
pub fn load(plan: &Plan) -> Result<Loaded, LoadError> {
    load_with(plan, 4096)
}

/// Loads with the record ring buffer at `record_ring_bytes` (a power of two, >= one page).
pub fn load_with(plan: &Plan, record_ring_bytes: u32) -> Result<Loaded, LoadError> {
    let tracefs_error = match kernel::ensure_tracefs() {
        Ok(true) => {
            info!("tracefs was not mounted: mounted it at /sys/kernel/tracing");
            None
        }
        Ok(false) => None,
        Err(e) => {
            warn!(error = %e, "tracefs is not mounted and could not be mounted: classic tracepoints will be unsupported");
            Some(format!(
                "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {e}"
            ))
        }
    };
    let kbtf = kernel::vmlinux_btf()?;
    if let Some(why) = &kbtf.file_error {
        warn!(file = kernel::VMLINUX_BTF, error = %why, "kernel BTF file unusable: read the kernel's BTF through bpf(BPF_BTF_GET_FD_BY_ID) instead");
    }
    let mut koff: KernelOffsets = kernel::kernel_offsets(&kbtf)?;
    if !plan.probes.kernel_charges && (koff.oncpu_from_task == 1 || koff.runq_from_task == 1) {
        info!(
            "probes.kernel_charges = false: on-CPU time and run-queue waits are timed from sched_switch and sched_wakeup"
        );
        koff.oncpu_from_task = 0;
        koff.runq_from_task = 0;
        koff.offcpu_from_task = 0;
    }
    if koff.runq_from_task == 1 && !kernel::sched_info_live() {
        info!("the kernel keeps no sched_info: run-queue waits are timed from sched_wakeup");
        koff.runq_from_task = 0;
        koff.offcpu_from_task = 0;
    }
    let btf = match Btf::parse(&kbtf.bytes, aya::Endianness::default()) {
        Ok(b) => Some(b),
        Err(e) => {
            warn!(error = %e, "kernel BTF not parsed: BTF tracepoints unavailable, using classic tracepoints");
            None
        }
    };
    let tpoff = tracepoint_offsets(&plan.probes);
    let m = &plan.maps.configured;
    let mut loader = EbpfLoader::new();
    // The same BTF for relocations (EbpfLoader::new reads only the file).
    if let Some(b) = &btf {
        loader.btf(b);
    }
    let ebpf = loader
        .override_global("KOFF", &koff, true)
        .override_global("TPOFF", &tpoff, true)
        .override_global("GPU_CALL_STACKS", &u32::from(plan.gpu.call_stacks), true)
        .override_global("GPU_SITES_PER_PROCESS", &m.gpu_sites_per_process, true)
        .override_global(
            "SYSCALL_NUMBERS_PER_PROCESS",
            &u64::from(m.syscall_numbers_per_process),
            true,
        )
        .map_max_entries("SYSCALL_KEYS", plan.maps.syscall_keys)
        .map_max_entries("GPU_STACKS", m.gpu_stacks)
        .map_max_entries("GPU_SITES", m.gpu_sites)
        .override_global(
            "PROFILE_OFFCPU_MIN_NS",
            &plan.cpu_profile.map_or(0, |p| p.offcpu_min_ns),
            true,
        )
        .map_max_entries("PROFILE_STACKS", m.profile_stacks)
        .map_max_entries("THREADS", m.threads)
        .map_max_entries("SYSCALLS", m.syscalls)
        .map_max_entries("SYSCALL_HIST", m.syscall_hist)
        .map_max_entries("BLK_INFLIGHT", m.blk_inflight)
        .map_max_entries("BLK_STATS", m.blk_stats)
        .map_max_entries("NET_STATS", m.net_stats)
        .map_max_entries("SOCK_OWNER", m.sock_owner)
        .map_max_entries("RECORD_EVENTS", record_ring_bytes)
        .map_max_entries("CUPTI_EVENTS", cupti_ring_bytes(plan))
        .load(BPF_OBJECT)
        .map_err(|source| LoadError::Load {
            hint: permission_hint(&source),
            source,
        })?;
    // The object's 2 MB were read once, by the load: not kept resident for the daemon's life.
    forget_resident(BPF_OBJECT);
    let mut loaded = Loaded {
        ebpf,
        probes: Vec::new(),
        program_probe: BTreeMap::new(),
        tracefs_error,
        blk_btf: koff.blk_btf == 1,
        oncpu_from_task: koff.oncpu_from_task == 1,
        profile_programs: Ok(None),
    };
    let block_btf_refused = match (
        &btf,
        plan.probes.enabled(ProbeFamily::Block) && plan.probes.prefer_btf,
    ) {
        (Some(b), true) => block_btf_refused(&mut loaded.ebpf, &koff, b),
        _ => None,
    };
    let net_btf_refused = (koff.net_btf == 0).then(|| BpfFailure {
        refusal: Refusal::Unsupported,
        message: "kernel BTF lacks a u16 sock.sk_protocol, which the BTF socket programs read"
            .into(),
    });
    for spec in PROBES {
        let refused = match spec.name {
            _ if spec.family == ProbeFamily::Block => block_btf_refused.as_ref(),
            "sock_send_length" | "sock_recv_length" | "inet_sock_set_state" => {
                net_btf_refused.as_ref()
            }
            _ => None,
        };
        if spec.name == "sched_wakeup"
            && koff.runq_from_task == 1
            && plan.probes.enabled(ProbeFamily::Sched)
        {
            // Waits are the kernel's own run_delay, read at sched_switch: a program on every
            // wakeup would add its cost for nothing.
            info!(
                probe = spec.name,
                "not needed: run-queue waits come from the kernel's sched_info.run_delay"
            );
            loaded.probes.push(ProbeStatus {
                name: spec.name.into(),
                state: ProbeState::Disabled,
                detail: RUNQ_FROM_KERNEL.into(),
                ..Default::default()
            });
            continue;
        }
        let mut status = attach_probe(&mut loaded, &plan.probes, spec, btf.as_ref(), refused);
        // Say where the BTF of a tp_btf probe came from when it was not the usual file.
        if let (Some(why), true) = (&kbtf.file_error, status.attach_point.starts_with("tp_btf/")) {
            status.detail = format!(
                "kernel BTF read from the kernel: {} unusable ({why})",
                kernel::VMLINUX_BTF
            );
        }
        match status.state {
            ProbeState::Attached => info!(probe = spec.name, at = %status.attach_point, "attached"),
            ProbeState::Disabled => {}
            _ => {
                warn!(probe = spec.name, state = status.state.as_str(), detail = %status.detail, "probe not attached")
            }
        }
        loaded.probes.push(status);
    }
    set_syscall_batching(&mut loaded, &plan.probes);
    loaded.profile_programs = load_profile(&mut loaded.ebpf, plan, btf.as_ref());
    Ok(loaded)
}

/// Loads the CPU profile's programs for the snapshots to attach (`cpu_profile.rs`).
fn load_profile(ebpf: &mut Ebpf, plan: &Plan, btf: Option<&Btf>) -> Result<Option<String>, String> {
    if let Err(off) = plan.cpu_profile {
        return Err(off.to_string());
    }
    let p: &mut aya::programs::PerfEvent = ebpf
        .program_mut(crate::pipeline::cpu_profile::PROG_CPU)
        .ok_or("the BPF object has no CPU profile program")?
        .try_into()
        .map_err(|e: ProgramError| error_chain(&e))?;
    p.load().map_err(|e| BpfFailure::of(&e).message)?;
    let Some(btf) = btf else {
        return Ok(Some(
            "no kernel BTF (the off-CPU program is a BTF tracepoint)".into(),
        ));
    };
    Ok(load_btf(
        ebpf,
        crate::pipeline::cpu_profile::PROG_SWITCH,
        "sched_switch",
        btf,
    )
    .err()
    .map(|e| BpfFailure::of(&e).message))
}

/// Turns syscall batching on when configured and every probe that flushes a batch is
/// attached: sched_switch (a thread switched out) and sched_process_exit (a thread exits).
/// Without them a batch could sit in a CPU's context indefinitely.
fn set_syscall_batching(loaded: &mut Loaded, probes: &ProbePlan) {
    let attached = |name: &str| {
        loaded
            .probes
            .iter()
            .any(|p| p.name == name && p.state == ProbeState::Attached)
    };
    if !probes.syscall_batching || !attached("sys_exit") {
        return;
    }
    let missing: Vec<&str> = ["sched_switch", "sched_process_exit"]
        .into_iter()
        .filter(|p| !attached(p))
        .collect();
    if !missing.is_empty() {
        info!(
            ?missing,
            "syscall batching off: the probes that flush batches are not attached"
        );
        return;
    }
    let Some(map) = loaded.ebpf.map_mut("SYSCALL_BATCHING") else {
        warn!("syscall batching off: map SYSCALL_BATCHING missing");
        return;
    };
    match aya::maps::Array::<_, u32>::try_from(map).and_then(|mut a| a.set(0, &1, 0)) {
        Ok(()) => info!("syscall batching on"),
        Err(e) => warn!(error = %e, "syscall batching off: cannot set SYSCALL_BATCHING"),
    }
}

fn permission_hint(e: &aya::EbpfError) -> &'static str {
    if Refusal::of(e) == Refusal::Denied {
        " (missing capability CAP_BPF: run as root or grant CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH)"
    } else {
        ""
    }
}

/// The block programs share their requests in flight, keyed by address (BTF) or by start
/// sector (classic), so the three are of one kind: BTF when every one loads. Why not, or
/// None.
fn block_btf_refused(ebpf: &mut Ebpf, koff: &KernelOffsets, btf: &Btf) -> Option<BpfFailure> {
    if koff.blk_btf == 0 {
        return Some(BpfFailure {
            refusal: Refusal::Unsupported,
            message: "kernel BTF lacks a struct request member the BTF block programs read".into(),
        });
    }
    for spec in PROBES.iter().filter(|s| s.family == ProbeFamily::Block) {
        let (prog, tp) = spec.btf?;
        if let Err(e) = load_btf(ebpf, prog, tp, btf) {
            let f = BpfFailure::of(&e);
            return Some(BpfFailure {
                refusal: f.refusal,
                message: format!("tp_btf/{tp}: {f} (all three block probes use one kind)"),
            });
        }
    }
    None
}

/// `btf_refused`: why this probe may not use its BTF program (see [`block_btf_refused`]).
fn attach_probe(
    l: &mut Loaded,
    probes: &ProbePlan,
    spec: &ProbeSpec,
    btf: Option<&Btf>,
    btf_refused: Option<&BpfFailure>,
) -> ProbeStatus {
    let mut status = ProbeStatus {
        name: spec.name.into(),
        ..Default::default()
    };
    if !probes.enabled(spec.family) {
        status.state = ProbeState::Disabled;
        status.detail = format!("probes.{} = false", spec.family.as_str());
        return status;
    }
    let mut reasons = Vec::new();
    // The kernel denied the BTF program (a missing capability): a failure, not a kernel
    // without the hook.
    let mut denied = false;
    if let Some(why) = btf_refused {
        denied = why.refusal == Refusal::Denied;
        reasons.push(why.message.clone());
    } else if let (Some((prog, tp)), true, Some(btf)) =
        (spec.btf, probes.prefer_btf || spec.classic.is_none(), btf)
    {
        match attach_btf(&mut l.ebpf, prog, tp, btf) {
            Ok(()) => {
                status.state = ProbeState::Attached;
                status.attach_point = format!("tp_btf/{tp}");
                l.program_probe.insert(prog.into(), spec.name.into());
                return status;
            }
            Err(e) => {
                let f = BpfFailure::of(&e);
                denied = f.refusal == Refusal::Denied;
                reasons.push(format!("tp_btf/{tp}: {f}"));
            }
        }
    } else if spec.btf.is_some() && spec.classic.is_some() && !probes.prefer_btf {
        reasons.push("probes.prefer_btf = false".into());
    } else if spec.btf.is_some() && btf.is_none() {
        reasons.push("no kernel BTF".into());
    }
    let Some(prog) = spec.classic else {
        status.state = if denied {
            ProbeState::Failed
        } else {
            ProbeState::Unsupported
        };
        status.detail = reasons.join("; ");
        return status;
    };
    let Some(tp) = probes.tracepoints.get(spec.name) else {
        status.state = ProbeState::Unsupported;
        status.detail = format!("no probes.tracepoints.{} configured", spec.name);
        return status;
    };
    let (group, event) = tp.split_once('/').expect("validated as group/event");
    status.attach_point = format!("tracepoint/{tp}");
    if kernel::tracepoint_fields(tp).is_err() {
        status.state = ProbeState::Unsupported;
        reasons.push(match &l.tracefs_error {
            Some(e) => format!("tracepoint {tp}: {e}"),
            None => format!("tracepoint {tp} does not exist on this kernel"),
        });
        status.detail = reasons.join("; ");
        return status;
    }
    match attach_classic(&mut l.ebpf, prog, group, event) {
        Ok(()) => {
            status.state = ProbeState::Attached;
            status.detail = reasons.join("; ");
            l.program_probe.insert(prog.into(), spec.name.into());
            // The classic wakeup program also serves sched_wakeup_new.
            if spec.name == "sched_wakeup" {
                if let Err(e) = attach_classic(&mut l.ebpf, prog, "sched", "sched_wakeup_new") {
                    warn!(error = %error_chain(&e), "sched_wakeup_new classic attach failed");
                }
            }
        }
        Err(e) => {
            status.state = ProbeState::Failed;
            reasons.push(format!("tracepoint/{tp}: {}", BpfFailure::of(&e)));
            status.detail = reasons.join("; ");
        }
    }
    status
}

/// The detail of `sched_wakeup` where it is not attached because it is not needed.
pub const RUNQ_FROM_KERNEL: &str = "not needed: run-queue waits are the kernel's own \
     (sched_info.run_delay, read at each sched_switch)";

fn load_btf(ebpf: &mut Ebpf, prog: &str, tp: &str, btf: &Btf) -> Result<(), ProgramError> {
    let p: &mut BtfTracePoint = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()?;
    if p.fd().is_err() {
        p.load(tp, btf)?;
    }
    Ok(())
}

fn attach_btf(ebpf: &mut Ebpf, prog: &str, tp: &str, btf: &Btf) -> Result<(), ProgramError> {
    load_btf(ebpf, prog, tp, btf)?;
    let p: &mut BtfTracePoint = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()?;
    p.attach()?;
    Ok(())
}

fn attach_classic(
    ebpf: &mut Ebpf,
    prog: &str,
    group: &str,
    event: &str,
) -> Result<(), ProgramError> {
    let p: &mut TracePoint = ebpf
        .program_mut(prog)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    p.attach(group, event)?;
    Ok(())
}

/// The GPU activity ring (`CUPTI_EVENTS`): one page, no kernel memory to speak of, when the
/// feature is off (`gpu.cupti_dir` empty).
fn cupti_ring_bytes(plan: &Plan) -> u32 {
    if plan.gpu.cupti_dir.is_some() {
        ethand_common::CUPTI_RINGBUF_BYTES
    } else {
        4096
    }
}

/// Drops the pages of `bytes` (read-only data of the binary) from this process's resident
/// set: clean pages of the executable, read from it again if ever touched again.
pub fn forget_resident(bytes: &[u8]) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end > start {
        // SAFETY: whole pages inside a read-only, file-backed private mapping of the binary
        // that nothing wrote: MADV_DONTNEED only unmaps them; a later read faults them back
        // in from the file, unchanged.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}
