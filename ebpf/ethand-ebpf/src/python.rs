//! The calling thread's CPython frames, walked at a GPU call probe (issue 41; the offsets and
//! why this path: ethand_common's `python` module and docs/design/cpython-frames-in-ebpf.md).
//!
//! Only processes the daemon registered in `PY_PROCS` are walked (an interpreter it has read
//! the version and gilstate key of). From the thread pointer (`task->thread.fsbase`): glibc's
//! thread-specific slot of the key -> the thread's `PyThreadState` -> its current frame ->
//! callers, at most [`PY_MAX_FRAMES`] frames (shim frames skipped), each as (code object
//! address, position). The stack goes into `PY_STACKS` under a hash of its frames; the call
//! site keys on that hash. A thread with no Python state (CUDA's, the autograd engine's)
//! has no Python stack; a read that faults keeps the frames read before it.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_loop, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use ethand_common::{
    GLIBC_TSD_BLOCK_KEYS, GLIBC_TSD_FIRST_BLOCK, GLIBC_TSD_KEYS, GLIBC_TSD_SECOND_LEVEL,
    PY_LAYOUTS, PY_MAX_FRAMES, PY_NO_CFRAME, PY_NO_OWNER, PY_OWNER_CSTACK, PY_STACK_HASH_SEED,
    PyLayout, PyProc, PyStack, PyStackKey, counter, py_pos, py_stack_hash_step,
};

use crate::koff;
use crate::maps::bump;

/// The layouts of [`PY_LAYOUTS`], by index (filled by the loader).
#[map]
pub static PY_LAYOUT: Array<PyLayout> = Array::with_max_entries(PY_LAYOUTS.len() as u32, 0);
/// Python processes to walk, by tgid (written by the daemon once it has read the
/// interpreter).
#[map]
pub static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(4096, 0);
/// Python stacks by process and the hash of their frames (sized like `GPU_STACKS`).
#[map]
pub static PY_STACKS: HashMap<PyStackKey, PyStack> = HashMap::with_max_entries(8192, 0);
/// Where a stack is built: 520 bytes do not fit the program's stack.
#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Frames looked at per walk, shim frames included: twice the frames kept.
const PY_MAX_STEPS: usize = 2 * PY_MAX_FRAMES;
/// Bytes of a frame read at once: every field the walk needs, in every version (3.9's
/// `f_lasti` ends at 108), a power of two so that a masked index stays inside. One read per
/// frame instead of four: a 50-deep stack was 8.8 us per call with four reads a frame.
const FRAME_READ: usize = 128;
/// Where a frame is read into (per CPU: it does not fit the walk's share of the stack).
#[map]
static PY_FRAMEBUF: PerCpuArray<[u8; FRAME_READ]> = PerCpuArray::with_max_entries(1, 0);

/// The little-endian u64 at `off` of `b`, where it fits.
#[inline(always)]
fn buf_u64(b: &[u8; FRAME_READ], off: u32) -> Option<u64> {
    let off = off as usize;
    if off > FRAME_READ - 8 {
        return None;
    }
    let mut v = 0u64;
    let mut i = 0;
    while i < 8 {
        v |= u64::from(b[(off + i) & (FRAME_READ - 1)]) << (8 * i);
        i += 1;
    }
    Some(v)
}

/// The frame's (code, position, caller, is a shim) from one read of it; None where the read
/// faulted (a frame at the end of its mapping: the fields are then read one by one).
#[inline(always)]
fn frame_fields(frame: u64, l: &PyLayout) -> Option<(u64, u32, u64, bool)> {
    let b = unsafe { &mut *PY_FRAMEBUF.get_ptr_mut(0)? };
    unsafe { aya_ebpf::helpers::bpf_probe_read_user_buf(frame as *const u8, b) }.ok()?;
    let code = buf_u64(b, l.frame_code)?;
    let back = buf_u64(b, l.frame_back)?;
    let shim = l.frame_owner != PY_NO_OWNER
        && (l.frame_owner as usize) < FRAME_READ
        && b[(l.frame_owner as usize) & (FRAME_READ - 1)] == PY_OWNER_CSTACK;
    let raw = buf_u64(b, l.frame_pos)?;
    let pos = if l.pos_kind == py_pos::LASTI {
        (raw as u32 as i32).max(0) as u32
    } else {
        let base = code + u64::from(l.code_units);
        (raw.saturating_sub(base) / 2).min(u64::from(u32::MAX)) as u32
    };
    Some((code, pos, back, shim))
}

#[inline(always)]
fn user_u64(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The address of the current thread's slot for pthread key `key` (glibc x86_64).
#[inline(always)]
fn tsd_slot(fsbase: u64, key: u32) -> Option<u64> {
    // Each slot is {seq, data}: 16 bytes, the data at +8.
    if key < GLIBC_TSD_BLOCK_KEYS {
        return Some(fsbase + GLIBC_TSD_FIRST_BLOCK + 16 * u64::from(key) + 8);
    }
    if key >= GLIBC_TSD_KEYS {
        return None;
    }
    let block =
        user_u64(fsbase + GLIBC_TSD_SECOND_LEVEL + 8 * u64::from(key / GLIBC_TSD_BLOCK_KEYS))?;
    (block != 0).then(|| block + 16 * u64::from(key % GLIBC_TSD_BLOCK_KEYS) + 8)
}

/// The current thread's innermost Python frame, or None (no Python state on this thread).
#[inline(always)]
fn current_frame(p: &PyProc, l: &PyLayout) -> Option<u64> {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let fsbase = unsafe {
        bpf_probe_read_kernel(task.add(koff!(task_thread_fsbase) as usize) as *const u64)
    }
    .ok()?;
    let tstate = user_u64(tsd_slot(fsbase, p.tss_key)?)?;
    if tstate == 0 {
        return None;
    }
    let mut frame = user_u64(tstate + u64::from(l.tstate_frame))?;
    if l.cframe_frame != PY_NO_CFRAME && frame != 0 {
        frame = user_u64(frame + u64::from(l.cframe_frame))?;
    }
    (frame != 0).then_some(frame)
}

/// The position of `frame` in `code` (see `py_pos`).
#[inline(always)]
fn position(frame: u64, code: u64, l: &PyLayout) -> Option<u32> {
    let at = frame + u64::from(l.frame_pos);
    if l.pos_kind == py_pos::LASTI {
        let lasti = unsafe { bpf_probe_read_user(at as *const i32) }.ok()?;
        return Some(lasti.max(0) as u32);
    }
    let ptr = user_u64(at)?;
    let base = code + u64::from(l.code_units);
    Some((ptr.saturating_sub(base) / 2).min(u64::from(u32::MAX)) as u32)
}

/// The walk's state between steps (on the program's stack; `bpf_loop` hands it to each).
#[repr(C)]
struct Walk {
    frame: u64,
    n: u64,
    hash: u64,
    l: PyLayout,
}

/// One step of the walk: the frame at `w.frame` into the scratch stack (unless a shim), then
/// on to its caller. 1 stops the loop. A `bpf_loop` callback: the verifier checks it once,
/// where an unrolled or bounded loop of 64 steps inlined into the probe was over its limit.
#[inline(never)]
extern "C" fn walk_step(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    let w = unsafe { &mut *(ctx as *mut Walk) };
    if w.frame == 0 {
        return 1;
    }
    let Some(st) = PY_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    let st = unsafe { &mut *st };
    if w.n >= PY_MAX_FRAMES as u64 {
        st.truncated = 1;
        return 1;
    }
    let l = &w.l;
    if let Some((code, pos, back, shim)) = frame_fields(w.frame, l) {
        if !shim && code != 0 {
            let f = &mut st.frames[(w.n as usize) & (PY_MAX_FRAMES - 1)];
            f.code = code;
            f.pos = pos;
            w.hash = py_stack_hash_step(py_stack_hash_step(w.hash, code), u64::from(pos));
            w.n += 1;
        }
        w.frame = back;
        return 0;
    }
    let shim = l.frame_owner != PY_NO_OWNER
        && unsafe { bpf_probe_read_user((w.frame + u64::from(l.frame_owner)) as *const u8) }
            .is_ok_and(|o| o == PY_OWNER_CSTACK);
    if !shim {
        let Some(code) = user_u64(w.frame + u64::from(l.frame_code)) else {
            bump(counter::PY_WALK_FAULT);
            return 1;
        };
        let Some(pos) = position(w.frame, code, l) else {
            bump(counter::PY_WALK_FAULT);
            return 1;
        };
        if code != 0 {
            let f = &mut st.frames[(w.n as usize) & (PY_MAX_FRAMES - 1)];
            f.code = code;
            f.pos = pos;
            w.hash = py_stack_hash_step(py_stack_hash_step(w.hash, code), u64::from(pos));
            w.n += 1;
        }
    }
    match user_u64(w.frame + u64::from(l.frame_back)) {
        Some(back) => {
            w.frame = back;
            0
        }
        None => {
            bump(counter::PY_WALK_FAULT);
            1
        }
    }
}

/// Walks the calling thread's Python frames of registered process `tgid` (started at
/// `proc_start_ns`) and stores them; the hash of the stack's [`PyStackKey`], or 0 (not
/// walked, no frames, not stored).
#[inline(always)]
pub fn python_stack(tgid: u32, proc_start_ns: u64) -> u64 {
    if koff!(py_walk) == 0 {
        return 0;
    }
    let Some(p) = (unsafe { PY_PROCS.get(&tgid) }).copied() else {
        return 0;
    };
    if p.proc_start_ns != 0 && p.proc_start_ns != proc_start_ns {
        return 0;
    }
    let Some(l) = PY_LAYOUT.get(p.layout).copied() else {
        return 0;
    };
    let Some(frame) = current_frame(&p, &l) else {
        return 0;
    };
    let Some(st) = PY_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    unsafe {
        (*st).len = 0;
        (*st).truncated = 0;
    }
    let mut w = Walk {
        frame,
        n: 0,
        hash: PY_STACK_HASH_SEED,
        l,
    };
    unsafe {
        bpf_loop(
            PY_MAX_STEPS as u32,
            walk_step as *mut core::ffi::c_void,
            (&raw mut w).cast(),
            0,
        )
    };
    if w.n == 0 {
        return 0;
    }
    // Frames past `len` may be an earlier walk's: user space reads `len` frames.
    let Some(st) = PY_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let st = unsafe { &mut *st };
    st.len = w.n as u32;
    let hash = if w.hash == 0 { 1 } else { w.hash };
    let key = PyStackKey {
        tgid,
        _pad0: 0,
        hash,
    };
    // BPF_NOEXIST: the same stack stored before is the same frames.
    match PY_STACKS.insert(&key, st, 1) {
        Ok(()) => hash,
        Err(e) if e == -17 => hash,
        Err(_) => {
            bump(counter::PY_STACKS_FULL);
            0
        }
    }
}
