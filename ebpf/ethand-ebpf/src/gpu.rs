//! Uprobes on GPU/NPU runtime libraries (libcuda, libnccl, libascendcl, libhccl). Two generic
//! programs serve every probed symbol: the attach cookie carries the symbol's op id, and
//! `GPU_OPS[op]` (filled by userspace from the catalog) says how to read its arguments. Per
//! hit: one array lookup, one hash update with atomic adds; allocations, frees, syncs and
//! collectives add one more map operation. No strings. With `gpu.call_stacks` on, the calls
//! worth a call site (copies but device-to-device, allocations, syncs, collectives) also take
//! the user stack
//! (`bpf_get_stackid` into `GPU_STACKS`) and add to `GPU_SITES` per (process, symbol, stack).
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, StackTrace},
    programs::{ProbeContext, RetProbeContext, tracing::StackIdContext},
};
use ethand_common::{
    GPU_ARG_NONE, GPU_COOKIE_GEN_SHIFT, GPU_COOKIE_TIME, GPU_GEN_MASK, GPU_MAX_OPS, GPU_STACK_NONE,
    GPU_STACK_UNATTRIBUTED, GpuAlloc, GpuAllocKey, GpuCallKey, GpuCallStats, GpuInflight,
    GpuInflightKey, GpuOpDesc, GpuProcState, GpuSiteKey, GpuSiteStats, counter, gpu_dir, gpu_dtype,
    gpu_flags, gpu_kind, gpu_mem,
};

use crate::context::{current_ctx, proc_key};
use crate::maps::{atomic_add, bump, get_or_insert};
use crate::python::python_stack;

#[map]
pub static GPU_OPS: Array<GpuOpDesc> = Array::with_max_entries(GPU_MAX_OPS, 0);
#[map]
pub static GPU_CALLS: HashMap<GpuCallKey, GpuCallStats> = HashMap::with_max_entries(16384, 0);
/// LRU: a call whose return never comes (thread killed, longjmp) ages out.
#[map]
pub static GPU_INFLIGHT: LruHashMap<GpuInflightKey, GpuInflight> =
    LruHashMap::with_max_entries(16384, 0);
#[map]
pub static GPU_ALLOCS: HashMap<GpuAllocKey, GpuAlloc> = HashMap::with_max_entries(65536, 0);
#[map]
pub static GPU_PROC: HashMap<ethand_common::ProcKey, GpuProcState> =
    HashMap::with_max_entries(4096, 0);

/// 1: take call stacks (`gpu.call_stacks`); set by the loader.
#[unsafe(no_mangle)]
pub static GPU_CALL_STACKS: u32 = 0;
/// Most call sites one process may make (`maps.gpu_sites_per_process`); set by the loader.
/// Beyond it its calls take no stack and count under the unattributed site, so that one
/// process cannot fill GPU_STACKS and GPU_SITES for everyone else.
#[unsafe(no_mangle)]
pub static GPU_SITES_PER_PROCESS: u32 = 256;
/// Entry 0: the active generation of the runtime probes' links (see
/// `ethand_common::GPU_COOKIE_GEN_SHIFT`); written by userspace at each level switch.
#[map]
pub static GPU_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// Whether a probe of this cookie's generation counts now.
#[inline(always)]
fn active(cookie: u64) -> bool {
    let generation = (cookie >> GPU_COOKIE_GEN_SHIFT) & GPU_GEN_MASK;
    GPU_GEN
        .get(0)
        .is_some_and(|g| *g & GPU_GEN_MASK == generation)
}
/// User stacks at the entry of probed calls, by id (sized from `maps.gpu_stacks`).
#[map]
pub static GPU_STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);
/// Calls per (process, symbol, stack id) (sized from `maps.gpu_sites`).
#[map]
pub static GPU_SITES: HashMap<GpuSiteKey, GpuSiteStats> = HashMap::with_max_entries(16384, 0);

/// Kernel launches per process while a diagnosis samples them (`ethand snapshot` at a level
/// that does not count launches): the links are scoped to the sampled processes and live only
/// for the sample, and the counts stay apart from `GPU_CALLS` so that no cumulative counter
/// ever holds a partial launch count.
#[map]
pub static LAUNCH_SAMPLE: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

static ZERO_PROC: GpuProcState = GpuProcState {
    live_bytes: [0; gpu_mem::COUNT],
    peak_bytes: [0; gpu_mem::COUNT],
    frees: [0; gpu_mem::COUNT],
    freed_bytes: [0; gpu_mem::COUNT],
    untracked_frees: 0,
    rank: u32::MAX,
    nranks: 0,
    comm_lib: 0,
    sites: 0,
};

#[uprobe]
pub fn gpu_enter(ctx: ProbeContext) -> u32 {
    let _ = on_enter(&ctx);
    0
}

#[uretprobe]
pub fn gpu_return(ctx: RetProbeContext) -> u32 {
    let _ = on_return(&ctx);
    0
}

// The same programs for uprobe_multi links (kernel >= 6.6): one link per library file
// instead of one perf event per symbol, and detaching it waits for one grace period, not
// one per symbol (seconds for a whole library otherwise).
#[uprobe(multi)]
pub fn gpu_enter_multi(ctx: ProbeContext) -> u32 {
    let _ = on_enter(&ctx);
    0
}

#[uretprobe(multi)]
pub fn gpu_return_multi(ctx: RetProbeContext) -> u32 {
    let _ = on_return(&ctx);
    0
}

#[uprobe]
pub fn gpu_launch_sample(_ctx: ProbeContext) -> u32 {
    count_launch();
    0
}

#[uprobe(multi)]
pub fn gpu_launch_sample_multi(_ctx: ProbeContext) -> u32 {
    count_launch();
    0
}

#[inline(always)]
fn count_launch() {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(n) = LAUNCH_SAMPLE.get_ptr_mut(&tgid) {
        atomic_add(n, 1);
        return;
    }
    // BPF_NOEXIST: a racing first launch on another CPU wins and this one adds to it.
    if LAUNCH_SAMPLE.insert(&tgid, &1, 1).is_err() {
        if let Some(n) = LAUNCH_SAMPLE.get_ptr_mut(&tgid) {
            atomic_add(n, 1);
        }
    }
}

/// The six integer argument registers, read once with constant offsets: the verifier
/// refuses a context access at a computed offset, which is what a `match` on the index
/// compiles to if the loads are left to the optimizer.
struct Args([u64; 6]);

impl Args {
    #[inline(always)]
    fn read(ctx: &ProbeContext) -> Self {
        let r = ctx.regs;
        unsafe {
            Self([
                core::ptr::read_volatile(&raw const (*r).rdi),
                core::ptr::read_volatile(&raw const (*r).rsi),
                core::ptr::read_volatile(&raw const (*r).rdx),
                core::ptr::read_volatile(&raw const (*r).rcx),
                core::ptr::read_volatile(&raw const (*r).r8),
                core::ptr::read_volatile(&raw const (*r).r9),
            ])
        }
    }

    #[inline(always)]
    fn get(&self, i: u8) -> u64 {
        match i {
            0 => self.0[0],
            1 => self.0[1],
            2 => self.0[2],
            3 => self.0[3],
            4 => self.0[4],
            5 => self.0[5],
            _ => 0,
        }
    }
}

/// CUmemorytype pair to direction (HOST 1, DEVICE 2, ARRAY 3, UNIFIED 4).
#[inline(always)]
fn dir_2d(src: u32, dst: u32) -> u32 {
    let dev = |t: u32| t == 2 || t == 3;
    (if src == 1 && dev(dst) {
        gpu_dir::HOST_TO_DEVICE
    } else if dev(src) && dst == 1 {
        gpu_dir::DEVICE_TO_HOST
    } else if dev(src) && dev(dst) {
        gpu_dir::DEVICE_TO_DEVICE
    } else if src == 1 && dst == 1 {
        gpu_dir::HOST_TO_HOST
    } else {
        gpu_dir::DEFAULT
    }) as u32
}

#[inline(always)]
fn read_user_u64(p: u64) -> u64 {
    unsafe { bpf_probe_read_user(p as *const u64) }.unwrap_or(0)
}

/// Takes the user stack (and a Python process's Python frames) and counts the call at its
/// site; returns the site's stack id ([`GPU_STACK_UNATTRIBUTED`] when the stack could not be
/// taken, [`GPU_STACK_NONE`] when the site could not be counted), the caller's return address
/// and the Python stack's key.
#[inline(always)]
fn count_site(
    ctx: &ProbeContext,
    tgid: u32,
    proc_start_ns: u64,
    op: u32,
    state: Option<*mut GpuProcState>,
) -> (u32, u64, u64) {
    // A process at its limit of call sites takes no more stacks: one process cannot fill the
    // stack and site maps for the others.
    let limit = unsafe { core::ptr::read_volatile(&raw const GPU_SITES_PER_PROCESS) };
    let over = state.is_some_and(|s| unsafe { (*s).sites } >= limit);
    // At the probed function's first instruction the return address is on top of the stack.
    let sp = unsafe { core::ptr::read_volatile(&raw const (*ctx.regs).rsp) };
    let (stack_id, caller, py_stack) = if over {
        bump(counter::GPU_SITES_OVER_LIMIT);
        (GPU_STACK_UNATTRIBUTED, 0, 0)
    } else {
        let caller = read_user_u64(sp);
        let py_stack = python_stack(tgid, proc_start_ns);
        match ctx.get_stackid(&GPU_STACKS, u64::from(BPF_F_USER_STACK)) {
            Ok(id) => (id as u32, caller, py_stack),
            Err(_) => {
                bump(counter::GPU_STACK_LOST);
                (GPU_STACK_UNATTRIBUTED, caller, py_stack)
            }
        }
    };
    let key = GpuSiteKey {
        tgid,
        op,
        proc_start_ns,
        stack_id,
        _pad0: 0,
        caller,
        py_stack,
    };
    if let Some(site) = GPU_SITES.get_ptr_mut(&key) {
        unsafe { atomic_add(&raw mut (*site).calls, 1) };
        return (stack_id, caller, py_stack);
    }
    match get_or_insert(
        &GPU_SITES,
        &key,
        &GpuSiteStats::default(),
        counter::GPU_SITES_FULL,
    ) {
        Some(site) => {
            unsafe { atomic_add(&raw mut (*site).calls, 1) };
            if let Some(s) = state {
                // Racy (no CAS): concurrent first calls may pass the limit by a few.
                unsafe { (*s).sites = (*s).sites.wrapping_add(1) };
            }
            (stack_id, caller, py_stack)
        }
        None => (GPU_STACK_NONE, 0, 0),
    }
}

#[inline(always)]
fn proc_state(key: &ethand_common::ProcKey) -> Option<*mut GpuProcState> {
    get_or_insert(&GPU_PROC, key, &ZERO_PROC, counter::GPU_PROC_FULL)
}

/// What the entry reads of one call: its copy direction and bytes, and for an allocation the
/// out-pointer and size that its return records.
struct Call {
    dir: u32,
    bytes: u64,
    ptr: u64,
    size: u64,
}

fn on_enter(ctx: &ProbeContext) -> Option<()> {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    if !active(cookie) {
        return None;
    }
    let op = (cookie & 0xffff) as u32;
    let d: GpuOpDesc = *GPU_OPS.get(op)?;
    let args = Args::read(ctx);
    let c = current_ctx()?;
    let pk = proc_key(c);
    let call = read_call(&d, &args, c.tgid, &pk);
    let key = GpuCallKey {
        tgid: c.tgid,
        op: op as u16,
        dir: call.dir as u16,
        proc_start_ns: c.proc_start_ns,
    };
    let st = get_or_insert(
        &GPU_CALLS,
        &key,
        &GpuCallStats::default(),
        counter::GPU_CALLS_FULL,
    )?;
    unsafe {
        atomic_add(&raw mut (*st).calls, 1);
        if call.bytes != 0 {
            atomic_add(&raw mut (*st).bytes, call.bytes);
        }
    }
    let stacks = unsafe { core::ptr::read_volatile(&raw const GPU_CALL_STACKS) } == 1;
    // Not for launches and group calls (kind COUNT), device-to-device copies (both made per
    // kernel or per tensor, probed from level `process` on: ~1 us more each would cost a
    // launch-bound step), frees and communicator creations.
    let site = d.kind != gpu_kind::COUNT
        && d.kind != gpu_kind::FREE
        && d.kind != gpu_kind::COMM_INIT
        && !(d.kind == gpu_kind::COPY && d.dir == gpu_dir::DEVICE_TO_DEVICE);
    let (stack_id, caller, py_stack) = if stacks && site {
        count_site(ctx, c.tgid, c.proc_start_ns, op, proc_state(&pk))
    } else {
        (GPU_STACK_NONE, 0, 0)
    };
    if d.flags & (gpu_flags::TIMED | gpu_flags::RET) != 0 || cookie & GPU_COOKIE_TIME != 0 {
        let ik = GpuInflightKey {
            tid: bpf_get_current_pid_tgid() as u32,
            op,
        };
        let v = GpuInflight {
            start_ns: unsafe { bpf_ktime_get_ns() },
            ptr: call.ptr,
            size: call.size,
            dir: call.dir,
            stack_id,
            caller,
            py_stack,
        };
        if GPU_INFLIGHT.insert(&ik, &v, 0).is_err() {
            bump(counter::GPU_INFLIGHT_FULL);
        }
    }
    Some(())
}

/// Reads the call's arguments as its op's kind says; a free and a communicator creation
/// also update the process's state here.
#[inline(always)]
fn read_call(d: &GpuOpDesc, args: &Args, tgid: u32, pk: &ethand_common::ProcKey) -> Call {
    let mut call = Call {
        dir: 0,
        bytes: 0,
        ptr: 0,
        size: 0,
    };
    match d.kind {
        gpu_kind::COPY => {
            call.bytes = args.get(d.bytes_arg);
            call.dir = if d.dir == gpu_dir::FROM_ACL_KIND {
                match args.get(d.aux_arg) {
                    0 => gpu_dir::HOST_TO_HOST,
                    1 => gpu_dir::HOST_TO_DEVICE,
                    2 => gpu_dir::DEVICE_TO_HOST,
                    3 => gpu_dir::DEVICE_TO_DEVICE,
                    _ => gpu_dir::DEFAULT,
                }
            } else {
                d.dir
            } as u32;
        }
        gpu_kind::COPY_2D => {
            // CUDA_MEMCPY2D: srcMemoryType @16, dstMemoryType @72, WidthInBytes @112, Height @120.
            let p = args.get(0);
            if p != 0 {
                let w = read_user_u64(p + 112);
                let h = read_user_u64(p + 120);
                call.bytes = w.wrapping_mul(h);
                let src = unsafe { bpf_probe_read_user((p + 16) as *const u32) }.unwrap_or(0);
                let dst = unsafe { bpf_probe_read_user((p + 72) as *const u32) }.unwrap_or(0);
                call.dir = dir_2d(src, dst);
            }
        }
        gpu_kind::COLLECTIVE => {
            call.bytes = args
                .get(d.bytes_arg)
                .wrapping_mul(gpu_dtype::size(d.dtype_table, args.get(d.aux_arg)));
        }
        gpu_kind::ALLOC | gpu_kind::REGISTER => {
            call.ptr = args.get(d.aux_arg);
            call.size = args.get(d.bytes_arg);
        }
        gpu_kind::FREE => {
            let p = args.get(d.aux_arg);
            if p != 0 {
                call.bytes = on_free(p, tgid, pk);
            }
        }
        gpu_kind::COMM_INIT => on_comm_init(d, args, pk),
        _ => {}
    }
    call
}

/// Forgets the allocation at `ptr` and takes its size off the process's live bytes; returns
/// the bytes freed (0 for an allocation ethand did not see).
#[inline(always)]
fn on_free(ptr: u64, tgid: u32, pk: &ethand_common::ProcKey) -> u64 {
    let ak = GpuAllocKey {
        tgid,
        _pad0: 0,
        ptr,
    };
    let found = unsafe { GPU_ALLOCS.get(&ak) }.copied();
    match found {
        Some(a) => {
            let _ = GPU_ALLOCS.remove(&ak);
            if let Some(s) = proc_state(pk) {
                let m = (a.mem as usize) & (gpu_mem::COUNT - 1);
                unsafe {
                    atomic_add(&raw mut (*s).live_bytes[m], a.size.wrapping_neg());
                    atomic_add(&raw mut (*s).frees[m], 1);
                    atomic_add(&raw mut (*s).freed_bytes[m], a.size);
                }
            }
            a.size
        }
        None => {
            if let Some(s) = proc_state(pk) {
                unsafe { atomic_add(&raw mut (*s).untracked_frees, 1) };
            }
            0
        }
    }
}

/// Records the process's rank and communicator size from a communicator creation.
#[inline(always)]
fn on_comm_init(d: &GpuOpDesc, args: &Args, pk: &ethand_common::ProcKey) {
    let nranks = if d.aux2_arg == GPU_ARG_NONE {
        0
    } else {
        args.get(d.aux2_arg) as u32
    };
    let rank = if d.aux_arg == GPU_ARG_NONE {
        u32::MAX
    } else {
        args.get(d.aux_arg) as u32
    };
    if nranks > 0 {
        if let Some(s) = proc_state(pk) {
            // Keep the largest communicator: the world, not a sub-group (the first of equal
            // size).
            unsafe {
                if nranks > (*s).nranks {
                    (*s).nranks = nranks;
                    (*s).rank = rank;
                    (*s).comm_lib = d.dtype_table as u32;
                }
            }
        }
    }
}

fn on_return(ctx: &RetProbeContext) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // Old and new links fire together while a level switch overlaps them: the inactive
    // generation's return leaves the call to the active one (the entry pairs with either).
    if !active(cookie) {
        return None;
    }
    let op = (cookie & 0xffff) as u32;
    let ik = GpuInflightKey {
        tid: bpf_get_current_pid_tgid() as u32,
        op,
    };
    // Entered before ethand attached (or the entry was lost): nothing to pair with.
    let inf: GpuInflight = unsafe { *GPU_INFLIGHT.get(&ik)? };
    let _ = GPU_INFLIGHT.remove(&ik);
    let d: GpuOpDesc = *GPU_OPS.get(op)?;
    let c = current_ctx()?;
    let key = GpuCallKey {
        tgid: c.tgid,
        op: op as u16,
        dir: inf.dir as u16,
        proc_start_ns: c.proc_start_ns,
    };
    let st = GPU_CALLS.get_ptr_mut(&key)?;
    // CUresult, ncclResult_t, aclError and HcclResult are all int, 0 on success.
    let rc: u64 = ctx.ret();
    let ok = rc as u32 == 0;
    let took = now.saturating_sub(inf.start_ns);
    unsafe {
        if !ok {
            atomic_add(&raw mut (*st).errors, 1);
        }
        atomic_add(&raw mut (*st).time_ns, took);
        atomic_add(&raw mut (*st).timed_calls, 1);
    }
    if inf.stack_id != GPU_STACK_NONE {
        let sk = GpuSiteKey {
            tgid: c.tgid,
            op,
            proc_start_ns: c.proc_start_ns,
            stack_id: inf.stack_id,
            _pad0: 0,
            caller: inf.caller,
            py_stack: inf.py_stack,
        };
        if let Some(site) = GPU_SITES.get_ptr_mut(&sk) {
            unsafe {
                atomic_add(&raw mut (*site).time_ns, took);
                atomic_add(&raw mut (*site).timed_calls, 1);
            }
        }
    }
    if ok && (d.kind == gpu_kind::ALLOC || d.kind == gpu_kind::REGISTER) {
        let ptr = if d.kind == gpu_kind::ALLOC {
            read_user_u64(inf.ptr)
        } else {
            inf.ptr
        };
        if ptr == 0 {
            return Some(());
        }
        let ak = GpuAllocKey {
            tgid: c.tgid,
            _pad0: 0,
            ptr,
        };
        let a = GpuAlloc {
            size: inf.size,
            mem: d.mem as u32,
            _pad0: 0,
        };
        if GPU_ALLOCS.insert(&ak, &a, 0).is_err() {
            bump(counter::GPU_ALLOCS_FULL);
        }
        unsafe { atomic_add(&raw mut (*st).bytes, inf.size) };
        let pk = proc_key(c);
        if let Some(s) = proc_state(&pk) {
            let m = (d.mem as usize) & (gpu_mem::COUNT - 1);
            unsafe {
                atomic_add(&raw mut (*s).live_bytes[m], inf.size);
                // Racy max (BPF's generic CPU target has neither CAS nor fetch-add): a
                // concurrent free or allocation between the add and this read can shift the
                // peak by that call's size; live bytes stay exact.
                let live = core::ptr::read_volatile(&raw const (*s).live_bytes[m]);
                if live as i64 > (*s).peak_bytes[m] as i64 {
                    (*s).peak_bytes[m] = live;
                }
            }
        }
    }
    Some(())
}
