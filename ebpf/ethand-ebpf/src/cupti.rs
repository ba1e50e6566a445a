//! The uprobes on `libethand_cupti.so`'s three probe functions (cupti/ethand_cupti.h): each
//! copies what the library hands over (a batch of GPU activity records, a kernel name, a
//! window event) into the `CUPTI_EVENTS` ring buffer, with the caller's tgid from the kernel,
//! never from the arguments. Only processes the daemon opened a window for (`CUPTI_OPEN`,
//! tgid -> window id) get through: another process calling the functions costs a lookup.
//!
//! The launch programs (`launch_trace*`) are attached by the daemon, for a window's length,
//! to the launch symbols of the runtime libraries a recorded process maps (scoped to it): per
//! launch of a process inside its window they take the user stack and Python frames at the
//! entry and write one [`LaunchEvent`] at the return, so that each kernel can be joined to
//! the call that launched it.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{ProbeContext, RetProbeContext, tracing::StackIdContext},
};
use ethand_common::{
    CUPTI_RINGBUF_BYTES, CuptiBatchEvent, CuptiEventHeader, CuptiNameEvent, CuptiRec,
    CuptiWindowEntry, CuptiWindowEvent, GPU_STACK_UNATTRIBUTED, LAUNCH_RINGBUF_BYTES,
    LAUNCH_STACKS_MAX, LaunchEvent, LaunchInflight, cupti_drop, cupti_event,
};

use crate::context::current_ctx;
use crate::python::python_stack;

/// No preallocation: most nodes have no window open.
const NO_PREALLOC: u32 = 1;

#[map]
pub static CUPTI_OPEN: HashMap<u32, u64> = HashMap::with_max_entries(1024, NO_PREALLOC);
#[map]
pub static CUPTI_EVENTS: RingBuf = RingBuf::with_byte_size(CUPTI_RINGBUF_BYTES, 0);
#[map]
pub static CUPTI_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(cupti_drop::COUNT, 0);
#[map]
pub static LAUNCH_EVENTS: RingBuf = RingBuf::with_byte_size(LAUNCH_RINGBUF_BYTES, 0);
/// LRU: a launch whose return never comes (thread killed) ages out.
#[map]
pub static LAUNCH_INFLIGHT: LruHashMap<u32, LaunchInflight> = LruHashMap::with_max_entries(4096, 0);
/// Apart from `GPU_STACKS`: a window's launch stacks never take the room of the always-on
/// call sites.
#[map]
pub static LAUNCH_STACKS: StackTrace = StackTrace::with_max_entries(LAUNCH_STACKS_MAX, 0);

#[inline(always)]
fn drop_count(idx: u32) {
    if let Some(c) = CUPTI_DROPS.get_ptr_mut(idx) {
        unsafe { *c += 1 };
    }
}

/// The caller's tgid if the daemon opened a window for it.
#[inline(always)]
fn open_tgid() -> Option<u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    unsafe { CUPTI_OPEN.get(&tgid) }.map(|_| tgid)
}

/// `ethand_cupti_batch(const struct ethand_cupti_rec *recs, uint32_t n, uint64_t window_id)`.
/// The library's batch array is always `CUPTI_BATCH` records long, so the whole array is
/// copied (a constant size the verifier accepts) and `n` says how many count.
#[uprobe]
pub fn cupti_batch(ctx: ProbeContext) -> u32 {
    let _ = on_batch(&ctx);
    0
}

fn on_batch(ctx: &ProbeContext) -> Option<()> {
    let tgid = open_tgid()?;
    let recs: *const CuptiRec = ctx.arg(0)?;
    let n: u32 = ctx.arg(1)?;
    let window_id: u64 = ctx.arg(2)?;
    let Some(mut e) = CUPTI_EVENTS.reserve::<CuptiBatchEvent>(0) else {
        drop_count(cupti_drop::RINGBUF_FULL);
        return None;
    };
    let p = e.as_mut_ptr();
    let dst = unsafe {
        core::slice::from_raw_parts_mut(
            (&raw mut (*p).recs).cast::<u8>(),
            core::mem::size_of::<[CuptiRec; ethand_common::CUPTI_BATCH as usize]>(),
        )
    };
    let read = unsafe { bpf_probe_read_user_buf(recs.cast(), dst) }.is_ok();
    if !read {
        drop_count(cupti_drop::READ_FAILED);
    }
    unsafe {
        (&raw mut (*p).header).write(CuptiEventHeader {
            what: cupti_event::BATCH,
            tgid,
            n: if read { n } else { 0 },
            partial: u32::from(!read),
            window_id,
        });
    }
    e.submit(0);
    Some(())
}

/// `ethand_cupti_name(uint64_t window_id, uint32_t name_id, const char *name)`.
#[uprobe]
pub fn cupti_name(ctx: ProbeContext) -> u32 {
    let _ = on_name(&ctx);
    0
}

fn on_name(ctx: &ProbeContext) -> Option<()> {
    let tgid = open_tgid()?;
    let window_id: u64 = ctx.arg(0)?;
    let name_id: u32 = ctx.arg(1)?;
    let name: *const u8 = ctx.arg(2)?;
    let Some(mut e) = CUPTI_EVENTS.reserve::<CuptiNameEvent>(0) else {
        drop_count(cupti_drop::RINGBUF_FULL);
        return None;
    };
    let p = e.as_mut_ptr();
    let buf = unsafe { &mut *(&raw mut (*p).name) };
    buf[0] = 0;
    let read = unsafe { aya_ebpf::helpers::bpf_probe_read_user_str_bytes(name, buf) }.is_ok();
    if !read {
        drop_count(cupti_drop::READ_FAILED);
        buf[0] = 0;
    }
    unsafe {
        (&raw mut (*p).header).write(CuptiEventHeader {
            what: cupti_event::NAME,
            tgid,
            n: name_id,
            partial: u32::from(!read),
            window_id,
        });
    }
    e.submit(0);
    Some(())
}

/// `ethand_cupti_window(const struct ethand_cupti_window_event *ev)`.
#[uprobe]
pub fn cupti_window(ctx: ProbeContext) -> u32 {
    let _ = on_window(&ctx);
    0
}

fn on_window(ctx: &ProbeContext) -> Option<()> {
    let tgid = open_tgid()?;
    let ev: *const CuptiWindowEvent = ctx.arg(0)?;
    let (event, read) = match unsafe { bpf_probe_read_user(ev) } {
        Ok(v) => (v, true),
        Err(_) => {
            drop_count(cupti_drop::READ_FAILED);
            (CuptiWindowEvent::default(), false)
        }
    };
    let Some(mut e) = CUPTI_EVENTS.reserve::<CuptiWindowEntry>(0) else {
        drop_count(cupti_drop::RINGBUF_FULL);
        return None;
    };
    e.write(CuptiWindowEntry {
        header: CuptiEventHeader {
            what: cupti_event::WINDOW,
            tgid,
            n: 0,
            partial: u32::from(!read),
            window_id: event.window_id,
        },
        event,
    });
    e.submit(0);
    Some(())
}

#[uprobe]
pub fn launch_trace(ctx: ProbeContext) -> u32 {
    let _ = on_launch_entry(&ctx);
    0
}

#[uprobe(multi)]
pub fn launch_trace_multi(ctx: ProbeContext) -> u32 {
    let _ = on_launch_entry(&ctx);
    0
}

#[uretprobe]
pub fn launch_trace_return(_ctx: RetProbeContext) -> u32 {
    let _ = on_launch_return();
    0
}

#[uretprobe(multi)]
pub fn launch_trace_return_multi(_ctx: RetProbeContext) -> u32 {
    let _ = on_launch_return();
    0
}

fn on_launch_entry(ctx: &ProbeContext) -> Option<()> {
    // Outside a window (the links outlive it by up to a collection round): a lookup.
    open_tgid()?;
    let entry_ns = unsafe { bpf_ktime_get_ns() };
    let c = current_ctx()?;
    let (tid, tgid, proc_start_ns) = (c.tid, c.tgid, c.proc_start_ns);
    // At the launch symbol's first instruction the return address is on top of the stack.
    let sp = unsafe { core::ptr::read_volatile(&raw const (*ctx.regs).rsp) };
    let caller = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    let stack_id = match ctx.get_stackid(&LAUNCH_STACKS, u64::from(BPF_F_USER_STACK)) {
        Ok(id) => id as u32,
        Err(_) => {
            drop_count(cupti_drop::LAUNCH_STACK_LOST);
            GPU_STACK_UNATTRIBUTED
        }
    };
    let v = LaunchInflight {
        entry_ns,
        stack_id,
        _pad0: 0,
        caller,
        py_stack: python_stack(tgid, proc_start_ns),
    };
    let _ = LAUNCH_INFLIGHT.insert(&tid, &v, 0);
    Some(())
}

fn on_launch_return() -> Option<()> {
    let return_ns = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let inf: LaunchInflight = unsafe { *LAUNCH_INFLIGHT.get(&tid)? };
    let _ = LAUNCH_INFLIGHT.remove(&tid);
    let tgid = (pid_tgid >> 32) as u32;
    let window_id = unsafe { *CUPTI_OPEN.get(&tgid)? };
    let Some(mut e) = LAUNCH_EVENTS.reserve::<LaunchEvent>(0) else {
        drop_count(cupti_drop::LAUNCH_RINGBUF_FULL);
        return None;
    };
    e.write(LaunchEvent {
        tgid,
        tid,
        window_id,
        entry_ns: inf.entry_ns,
        return_ns,
        stack_id: inf.stack_id,
        _pad0: 0,
        caller: inf.caller,
        py_stack: inf.py_stack,
    });
    e.submit(0);
    Some(())
}
