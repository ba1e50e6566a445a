//! CPython frames walked in the kernel at a GPU call probe (docs/design/cpython-frames-in-ebpf.md):
//! the per-version layout both the eBPF walk and the reader (which turns a code object into
//! file, function and line) use, and what the walk stores.
//!
//! The calling thread's `PyThreadState` is found through the interpreter's gilstate TSS key
//! (`autoTSSkey`), which keeps the thread's state while the GIL is released around the GPU call
//! (`_Py_tss_tstate` of 3.12+ does not), in glibc's thread-specific data of the thread. Offsets
//! were taken from py-spy's per-version bindings (3.9-3.12), checked against `offsetof` in each
//! version's headers and CPython's `_Py_DebugOffsets` (3.13), and are checked in a running
//! interpreter by `tests/gpu/python_frames_check.py`.

/// Python frames kept per stack, innermost first (deeper frames are cut).
pub const PY_MAX_FRAMES: usize = 32;
/// [`PyLayout::cframe_frame`] of versions whose thread state points at the frame directly.
pub const PY_NO_CFRAME: u32 = u32::MAX;
/// [`PyLayout::frame_owner`] of versions without C-stack shim frames.
pub const PY_NO_OWNER: u32 = u32::MAX;
/// `_PyInterpreterFrame.owner` of a shim frame the interpreter pushes for a C call into
/// Python (`FRAME_OWNED_BY_CSTACK`, 3.12 and 3.13): not the user's code, skipped.
pub const PY_OWNER_CSTACK: u8 = 3;

/// glibc x86_64 thread-specific data (nptl/descr.h, `struct pthread` at the thread pointer,
/// which is the thread's fsbase): `specific_1stblock[32]` of `{seq, data}` pairs at 0x310,
/// then `specific[32]`, the second-level blocks, at 0x510. Checked against glibc 2.36's
/// `__pthread_getspecific` and its libthread_db descriptors (`_thread_db_pthread_specific`).
pub const GLIBC_TSD_FIRST_BLOCK: u64 = 0x310;
pub const GLIBC_TSD_SECOND_LEVEL: u64 = 0x510;
/// Keys per block (`PTHREAD_KEY_2NDLEVEL_SIZE`) and all keys (`PTHREAD_KEYS_MAX`).
pub const GLIBC_TSD_BLOCK_KEYS: u32 = 32;
pub const GLIBC_TSD_KEYS: u32 = 1024;

/// How a frame gives its position in the bytecode.
pub mod py_pos {
    /// `f_lasti`, an i32 (3.9: bytes; 3.10: code units).
    pub const LASTI: u32 = 0;
    /// A pointer to the current code unit (`prev_instr` 3.11/3.12, `instr_ptr` 3.13): the
    /// index is `(ptr - (code + code_units)) / 2`.
    pub const POINTER: u32 = 1;
}

/// Offsets of one CPython minor version (x86_64, default build).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// The version: 3.`minor`.
    pub minor: u32,
    /// `_PyRuntime` to its gilstate `Py_tss_t autoTSSkey` (`{int initialized; key}`).
    pub runtime_tss: u32,
    /// Thread state to its frame pointer (3.9/3.10 `frame`, 3.13 `current_frame`) or to its
    /// `cframe` (3.11/3.12).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`, or [`PY_NO_CFRAME`].
    pub cframe_frame: u32,
    /// Frame to its caller (`f_back` / `previous`).
    pub frame_back: u32,
    /// Frame to its code object (`f_code` / `f_executable`).
    pub frame_code: u32,
    /// Frame to its position (see [`py_pos`]).
    pub frame_pos: u32,
    pub pos_kind: u32,
    /// Frame to its owner byte, or [`PY_NO_OWNER`].
    pub frame_owner: u32,
    /// Code object to its bytecode (`co_code_adaptive`, == `PyCode_Type.tp_basicsize`); 0
    /// for the [`py_pos::LASTI`] versions.
    pub code_units: u32,
    /// Code object fields the reader reads: `co_filename`, the function's name
    /// (`co_qualname` where it exists, else `co_name`), `co_firstlineno` (an int) and the
    /// line table (`co_lnotab` 3.9, `co_linetable` later; a bytes object).
    pub code_filename: u32,
    pub code_name: u32,
    pub code_firstlineno: u32,
    pub code_linetable: u32,
    /// Where a compact str's characters start: ASCII (`sizeof(PyASCIIObject)`) and not
    /// (`sizeof(PyCompactUnicodeObject)`).
    pub str_ascii_data: u32,
    pub str_compact_data: u32,
}

const fn layout(
    minor: u32,
    runtime_tss: u32,
    frame: (u32, u32, u32, u32, u32, u32, u32),
    code: (u32, u32, u32, u32, u32),
    str_data: (u32, u32),
) -> PyLayout {
    PyLayout {
        minor,
        runtime_tss,
        tstate_frame: frame.0,
        cframe_frame: frame.1,
        frame_back: frame.2,
        frame_code: frame.3,
        frame_pos: frame.4,
        pos_kind: frame.5,
        frame_owner: frame.6,
        code_units: code.0,
        code_filename: code.1,
        code_name: code.2,
        code_firstlineno: code.3,
        code_linetable: code.4,
        str_ascii_data: str_data.0,
        str_compact_data: str_data.1,
    }
}

use py_pos::{LASTI, POINTER};
const NC: u32 = PY_NO_CFRAME;
const NO: u32 = PY_NO_OWNER;

/// The versions walked, 3.9 to 3.13 (the table of docs/design/cpython-frames-in-ebpf.md §2).
/// Frame: (tstate_frame, cframe_frame, back, code, pos, pos_kind, owner); code: (units,
/// filename, name, firstlineno, linetable).
pub const PY_LAYOUTS: [PyLayout; 5] = [
    layout(
        9,
        584,
        (24, NC, 24, 32, 104, LASTI, NO),
        (0, 104, 112, 40, 120),
        (48, 72),
    ),
    layout(
        10,
        584,
        (24, NC, 24, 32, 96, LASTI, NO),
        (0, 104, 112, 40, 120),
        (48, 72),
    ),
    layout(
        11,
        592,
        (56, 8, 48, 32, 56, POINTER, NO),
        (184, 112, 128, 72, 136),
        (48, 72),
    ),
    layout(
        12,
        1544,
        (56, 0, 8, 0, 56, POINTER, 70),
        (192, 112, 128, 68, 136),
        (40, 56),
    ),
    layout(
        13,
        2160,
        (72, NC, 8, 0, 56, POINTER, 70),
        (200, 112, 128, 68, 136),
        (40, 56),
    ),
];

/// The layout of CPython 3.`minor`, where it is walked.
pub fn py_layout(minor: u32) -> Option<(u32, &'static PyLayout)> {
    let i = PY_LAYOUTS.iter().position(|l| l.minor == minor)?;
    Some((i as u32, &PY_LAYOUTS[i]))
}

/// A Python process the walk serves (`PY_PROCS`, by tgid): its interpreter's TSS key and
/// its layout's index in [`PY_LAYOUTS`] (`PY_LAYOUT` in the kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// The process's start time, so that a reused tgid is not walked with another's key; 0
    /// where the registrant follows the tgid itself (`ethand record`, whose tree is kept by
    /// tgid).
    pub proc_start_ns: u64,
    pub tss_key: u32,
    pub layout: u32,
}

/// One Python frame as the walk saw it: its code object's address and the position in it
/// (see [`py_pos`]; for the pointer kinds already turned into a code-unit index).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PyFrameRef {
    pub code: u64,
    pub pos: u32,
    pub _pad0: u32,
}

/// Where a stack is kept (`PY_STACKS`): the process and the hash of its frames, which is
/// [`GpuSiteKey::py_stack`](crate::GpuSiteKey). The tgid keeps one process's stacks from
/// standing for another's: two processes whose different frames hash alike (made so on
/// purpose, say) keep their own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyStackKey {
    pub tgid: u32,
    pub _pad0: u32,
    pub hash: u64,
}

/// The Python frames of one call, innermost first (`PY_STACKS`, by [`PyStackKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyStack {
    pub len: u32,
    /// 1: the walk stopped at [`PY_MAX_FRAMES`] with frames left.
    pub truncated: u32,
    pub frames: [PyFrameRef; PY_MAX_FRAMES],
}

impl Default for PyStack {
    fn default() -> Self {
        Self {
            len: 0,
            truncated: 0,
            frames: [PyFrameRef::default(); PY_MAX_FRAMES],
        }
    }
}

/// FNV-1a over a stack's frames: the key of `PY_STACKS` (0 is "no Python stack", so a hash
/// of 0 is taken as 1).
#[inline(always)]
pub fn py_stack_hash_step(h: u64, v: u64) -> u64 {
    let mut h = h;
    let mut i = 0;
    while i < 8 {
        h ^= (v >> (8 * i)) & 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
        i += 1;
    }
    h
}

pub const PY_STACK_HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_found_by_minor_and_only_for_walked_versions() {
        assert_eq!(
            py_layout(11).map(|(i, l)| (i, l.runtime_tss)),
            Some((2, 592))
        );
        assert_eq!(py_layout(13).map(|(_, l)| l.tstate_frame), Some(72));
        assert!(py_layout(8).is_none() && py_layout(14).is_none());
        for l in &PY_LAYOUTS {
            assert_eq!(l.pos_kind == POINTER, l.code_units != 0, "3.{}", l.minor);
        }
    }

    #[test]
    fn the_hash_is_fnv1a_over_little_endian_bytes() {
        // FNV-1a of the 8 bytes 01 00 .. 00, computed byte by byte.
        let mut h = PY_STACK_HASH_SEED;
        for b in [1u8, 0, 0, 0, 0, 0, 0, 0] {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(py_stack_hash_step(PY_STACK_HASH_SEED, 1), h);
    }
}
