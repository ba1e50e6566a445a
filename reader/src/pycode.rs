//! CPython code objects of a live process, for the frames the kernel walk stores (issue 41,
//! docs/design/cpython-frames-in-ebpf.md): the walk keeps (code object address, position)
//! pairs; this module tells the daemon what it needs to walk a process (its interpreter's
//! version and gilstate TSS key: [`PyRuntime`]) and turns code object addresses into file,
//! function and line table ([`PyCode`]), with the offsets of `ethand_common::PY_LAYOUTS`,
//! the same table the kernel walk reads.
//!
//! Everything read is the process's: every read is one `process_vm_readv` of a size bounded
//! before anything is allocated for it (names to [`MAX_NAME`], line tables to
//! [`MAX_LINE_TABLE`]), a fault is that code object's error, never a panic. An address the
//! walk stored may be freed and reused by the time it is read: each object's type is
//! compared with the interpreter's own `PyCode_Type`, `PyUnicode_Type` and `PyBytes_Type`
//! (from its symbols, where present), and its reference count must look live (a block pymalloc
//! freed holds its free-list link there: 0 or an address).
//!
//! For 3.13 the interpreter describes its own layout (`_Py_DebugOffsets`, the first member
//! of `_PyRuntime`): a process whose offsets differ from ethand's table is refused.
use std::collections::HashMap;

use ethand_common::{GLIBC_TSD_KEYS, PyLayout, py_layout};

pub use crate::proto::{MAX_CODES, PyCode, PyRuntime};
use crate::{
    owner,
    proto::{MAX_NAME, cut},
    python::{self, PythonError},
};

/// Longest line table read (bytes); CPython's own are a few per instruction.
pub const MAX_LINE_TABLE: usize = 1 << 20;
/// Estimated JSON bytes of one `PythonCode` reply before the rest are left for the next
/// request: with one more entry (a line table of at most 4 MiB as JSON numbers, two names)
/// it stays under `proto::MAX_MESSAGE`.
const REPLY_BUDGET: usize = 8 << 20;
/// Interpreters a worker keeps between requests.
const MAX_INTERPS: usize = 1024;

/// `PyObject` and `PyVarObject` fields, the same in 3.9-3.13 (default build, x86_64).
const OB_TYPE: usize = 8;
/// `ob_size` of a bytes object, `length` of a str.
const OB_SIZE: usize = 16;
/// `ob_sval` of a bytes object.
const BYTES_DATA: usize = 32;
/// `state` of a str (`PyASCIIObject`): interned 2 bits, kind 3, compact 1, ascii 1.
const STR_STATE: usize = 32;
/// `tp_name` of a type object.
const TP_NAME: u64 = 24;
/// Largest reference count taken as live: immortal objects (3.12+) hold 2^32 - 1.
const MAX_REFCNT: u64 = 1 << 40;
/// The code object fields read, in one read: no layout reaches past this.
const CODE_HEAD_MAX: usize = 256;

/// The memory of a process, one bounded read at a time.
pub trait Memory {
    /// Fills all of `buf` from `addr`, or fails.
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// Process `pid`'s memory, read with `process_vm_readv` (the process is not stopped).
pub struct ProcessMemory(pub u32);

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one local iovec over `buf`, which is valid for writes of its length.
        let n = unsafe { libc::process_vm_readv(self.0 as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{n} of {} bytes", buf.len()),
            ));
        }
        Ok(())
    }
}

/// Why an interpreter's runtime or code objects cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PyCodeError {
    #[error(transparent)]
    Python(#[from] PythonError),
    #[error(
        "process {pid} runs Python {version}: ethand walks the frames of CPython 3.9 to 3.13 only"
    )]
    Unsupported { pid: u32, version: String },
    #[error("process {0}: its python or libpython has no _PyRuntime symbol")]
    NoRuntime(u32),
    #[error("process {pid}: reading {what} at {addr:#x}: {source}")]
    Read {
        pid: u32,
        what: &'static str,
        addr: u64,
        source: std::io::Error,
    },
    #[error(
        "process {pid}: its interpreter's gilstate TSS key is not usable (initialized {initialized}, key {key}, glibc has {GLIBC_TSD_KEYS})"
    )]
    TssKey {
        pid: u32,
        initialized: i32,
        key: u32,
    },
    #[error("process {pid}: its _Py_DebugOffsets are not 3.13's ({why})")]
    DebugOffsets { pid: u32, why: String },
    #[error(
        "process {pid}: Python 3.{minor}'s layout differs from ethand's table: {field} is {theirs}, ethand reads {ours}"
    )]
    LayoutDiffers {
        pid: u32,
        minor: u32,
        field: &'static str,
        theirs: u64,
        ours: u64,
    },
    #[error("process {pid} runs Python 3.{runs}, not 3.{asked}")]
    OtherVersion { pid: u32, runs: u32, asked: u32 },
    #[error("{0} code objects asked at once; at most {MAX_CODES}")]
    TooMany(usize),
}

/// Why one code object cannot be read: the text of its entry in the reply.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("cannot read {len} bytes of the {what} at {addr:#x}: {source}")]
    Fault {
        what: &'static str,
        addr: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("the {0} is a null pointer")]
    Null(&'static str),
    #[error("the {what} at {addr:#x} is not live (reference count {refcnt:#x}): freed")]
    NotLive {
        what: &'static str,
        addr: u64,
        refcnt: u64,
    },
    #[error("the {what} at {addr:#x} is not one (its type is at {found:#x}, not {want:#x})")]
    Type {
        what: &'static str,
        addr: u64,
        found: u64,
        want: u64,
    },
    #[error("the {what} at {addr:#x} has length {length}")]
    StrLength {
        what: &'static str,
        addr: u64,
        length: i64,
    },
    #[error("the {what} at {addr:#x} is not a compact str (state {state:#x})")]
    StrForm {
        what: &'static str,
        addr: u64,
        state: u32,
    },
    #[error("the line table at {addr:#x} has {size} bytes (at most {MAX_LINE_TABLE} are read)")]
    TableSize { addr: u64, size: i64 },
    #[error("co_firstlineno is {0}")]
    FirstLine(i32),
    #[error("the layout reaches past the fields ethand reads")]
    Layout,
    #[error("not read: this reply is full (ask again)")]
    Budget,
}

/// Addresses of the interpreter's type objects, where its symbols name them: an object
/// whose type is not the one expected is not read as one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyTypes {
    pub code: Option<u64>,
    pub str: Option<u64>,
    pub bytes: Option<u64>,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn read(
    mem: &impl Memory,
    what: &'static str,
    base: u64,
    off: u64,
    buf: &mut [u8],
) -> Result<(), CodeError> {
    let len = buf.len();
    let fault = |source| CodeError::Fault {
        what,
        addr: base,
        len,
        source,
    };
    let addr = base
        .checked_add(off)
        .ok_or_else(|| fault(std::io::ErrorKind::InvalidInput.into()))?;
    mem.read(addr, buf).map_err(fault)
}

/// A live object of type `want` (when known), by its header.
fn check_object(
    what: &'static str,
    addr: u64,
    head: &[u8],
    want: Option<u64>,
) -> Result<(), CodeError> {
    let refcnt = u64_at(head, 0);
    if refcnt == 0 || refcnt > MAX_REFCNT {
        return Err(CodeError::NotLive { what, addr, refcnt });
    }
    let found = u64_at(head, OB_TYPE);
    match want {
        Some(want) if want != found => Err(CodeError::Type {
            what,
            addr,
            found,
            want,
        }),
        _ => Ok(()),
    }
}

/// One code object's file, function, first line and line table.
pub fn read_code(
    mem: &impl Memory,
    layout: &PyLayout,
    types: &PyTypes,
    addr: u64,
) -> Result<PyCode, CodeError> {
    let [file_at, name_at, table_at, line_at] = [
        layout.code_filename,
        layout.code_name,
        layout.code_linetable,
        layout.code_firstlineno,
    ]
    .map(|o| o as usize);
    let len = [
        file_at + 8,
        name_at + 8,
        table_at + 8,
        line_at + 4,
        OB_TYPE + 8,
    ]
    .into_iter()
    .max()
    .unwrap_or(CODE_HEAD_MAX);
    let mut buf = [0u8; CODE_HEAD_MAX];
    let head = buf.get_mut(..len).ok_or(CodeError::Layout)?;
    read(mem, "code object", addr, 0, head)?;
    check_object("code object", addr, head, types.code)?;
    let first_line = u32_at(head, line_at) as i32;
    let name = if layout.minor >= 11 {
        "co_qualname str"
    } else {
        "co_name str"
    };
    Ok(PyCode {
        file: read_str(mem, layout, types, "co_filename str", u64_at(head, file_at))?,
        function: read_str(mem, layout, types, name, u64_at(head, name_at))?,
        first_line: u32::try_from(first_line).map_err(|_| CodeError::FirstLine(first_line))?,
        line_table: read_bytes(mem, types, u64_at(head, table_at))?,
    })
}

/// A str's first [`MAX_NAME`] characters, cut to [`MAX_NAME`] bytes of UTF-8. Only compact
/// strs (their characters follow the header) are read: code objects' names are.
fn read_str(
    mem: &impl Memory,
    layout: &PyLayout,
    types: &PyTypes,
    what: &'static str,
    addr: u64,
) -> Result<String, CodeError> {
    if addr == 0 {
        return Err(CodeError::Null(what));
    }
    let mut head = [0u8; STR_STATE + 4];
    read(mem, what, addr, 0, &mut head)?;
    check_object(what, addr, &head, types.str)?;
    let length = u64_at(&head, OB_SIZE) as i64;
    let length = u64::try_from(length).map_err(|_| CodeError::StrLength { what, addr, length })?;
    let state = u32_at(&head, STR_STATE);
    let (kind, compact, ascii) = ((state >> 2) & 7, state & 1 << 5 != 0, state & 1 << 6 != 0);
    let (data, width) = match (compact, ascii, kind) {
        (true, true, 1) => (layout.str_ascii_data, 1),
        (true, false, 1 | 2 | 4) => (layout.str_compact_data, kind as usize),
        _ => return Err(CodeError::StrForm { what, addr, state }),
    };
    // Each character is at least one byte of UTF-8: no more are needed.
    let chars = length.min(MAX_NAME as u64) as usize;
    let mut buf = vec![0u8; chars * width];
    read(mem, what, addr, data.into(), &mut buf)?;
    let text: String = match width {
        1 if ascii => String::from_utf8_lossy(&buf).into_owned(),
        // UCS1: Latin-1, each byte its code point.
        1 => buf.iter().map(|&b| char::from(b)).collect(),
        2 => buf
            .as_chunks::<2>()
            .0
            .iter()
            .map(|c| char::from_u32(u16::from_le_bytes(*c).into()))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => buf
            .as_chunks::<4>()
            .0
            .iter()
            .map(|c| char::from_u32(u32::from_le_bytes(*c)))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    };
    Ok(cut(text, MAX_NAME))
}

/// A bytes object's contents, at most [`MAX_LINE_TABLE`] of them.
fn read_bytes(mem: &impl Memory, types: &PyTypes, addr: u64) -> Result<Vec<u8>, CodeError> {
    const WHAT: &str = "line table";
    if addr == 0 {
        return Err(CodeError::Null(WHAT));
    }
    let mut head = [0u8; BYTES_DATA];
    read(mem, WHAT, addr, 0, &mut head)?;
    check_object(WHAT, addr, &head, types.bytes)?;
    let size = u64_at(&head, OB_SIZE) as i64;
    let len = usize::try_from(size)
        .ok()
        .filter(|n| *n <= MAX_LINE_TABLE)
        .ok_or(CodeError::TableSize { addr, size })?;
    let mut table = vec![0u8; len];
    read(mem, WHAT, addr, BYTES_DATA as u64, &mut table)?;
    Ok(table)
}

/// Each code object of `addrs`, or why not, in order; those past the reply's budget say so.
pub fn read_codes(
    mem: &impl Memory,
    layout: &PyLayout,
    types: &PyTypes,
    addrs: &[u64],
) -> Vec<Result<PyCode, String>> {
    let mut spent = 0usize;
    addrs
        .iter()
        .map(|&addr| {
            let r = if spent > REPLY_BUDGET {
                Err(CodeError::Budget)
            } else {
                read_code(mem, layout, types, addr)
            };
            let r = r.map_err(|e| e.to_string());
            // JSON: up to 4 bytes a line table byte, 6 a name byte (escapes), and the frame.
            spent += match &r {
                Ok(c) => 64 + 4 * c.line_table.len() + 6 * (c.file.len() + c.function.len()),
                Err(e) => 64 + 6 * e.len(),
            };
            r
        })
        .collect()
}

/// `_Py_DebugOffsets` of 3.13 (Include/internal/pycore_runtime.h; every field a u64): the
/// fields ethand's walk and this module read, at their offsets in it, and ethand's value.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";
const DEBUG_VERSION: usize = 8;
const DEBUG_FREE_THREADED: usize = 16;
const DEBUG_LEN: usize = 568;
type OursFn = fn(&PyLayout) -> u64;
const DEBUG_FIELDS: [(&str, usize, OursFn); 16] = [
    ("thread_state.current_frame", 184, |l| l.tstate_frame.into()),
    ("interpreter_frame.previous", 232, |l| l.frame_back.into()),
    ("interpreter_frame.executable", 240, |l| l.frame_code.into()),
    ("interpreter_frame.instr_ptr", 248, |l| l.frame_pos.into()),
    ("interpreter_frame.owner", 264, |l| l.frame_owner.into()),
    ("code_object.filename", 280, |l| l.code_filename.into()),
    ("code_object.qualname", 296, |l| l.code_name.into()),
    ("code_object.linetable", 304, |l| l.code_linetable.into()),
    ("code_object.firstlineno", 312, |l| {
        l.code_firstlineno.into()
    }),
    ("code_object.co_code_adaptive", 344, |l| l.code_units.into()),
    ("pyobject.ob_type", 360, |_| OB_TYPE as u64),
    ("bytes_object.ob_size", 520, |_| OB_SIZE as u64),
    ("bytes_object.ob_sval", 528, |_| BYTES_DATA as u64),
    ("unicode_object.state", 544, |_| STR_STATE as u64),
    ("unicode_object.length", 552, |_| OB_SIZE as u64),
    ("unicode_object.asciiobject_size", 560, |l| {
        l.str_ascii_data.into()
    }),
];

/// Refuses a 3.13 interpreter whose own description of its layout is not ethand's table.
fn check_debug_offsets(
    pid: u32,
    mem: &impl Memory,
    runtime: u64,
    layout: &PyLayout,
) -> Result<(), PyCodeError> {
    let mut d = [0u8; DEBUG_LEN];
    mem.read(runtime, &mut d)
        .map_err(|source| PyCodeError::Read {
            pid,
            what: "_Py_DebugOffsets",
            addr: runtime,
            source,
        })?;
    let why = |why: String| PyCodeError::DebugOffsets { pid, why };
    if d[..8] != DEBUG_COOKIE[..] {
        return Err(why(format!(
            "cookie {:?}",
            String::from_utf8_lossy(&d[..8])
        )));
    }
    let version = u64_at(&d, DEBUG_VERSION);
    if version >> 16 != 0x030d {
        return Err(why(format!("version {version:#x}")));
    }
    if u64_at(&d, DEBUG_FREE_THREADED) != 0 {
        return Err(why("a free-threaded build".into()));
    }
    for (field, at, ours) in DEBUG_FIELDS {
        let (theirs, ours) = (u64_at(&d, at), ours(layout));
        if theirs != ours {
            return Err(PyCodeError::LayoutDiffers {
                pid,
                minor: layout.minor,
                field,
                theirs,
                ours,
            });
        }
    }
    Ok(())
}

/// What a worker knows of one interpreter: its version, `_PyRuntime` and type objects.
struct Interp {
    start_ticks: Option<u64>,
    layout: &'static PyLayout,
    runtime: u64,
    types: PyTypes,
}

impl Interp {
    /// Reads `pid`'s interpreter's symbols and version with py-spy (after the checks
    /// `python.rs` makes before py-spy may open a process's libpython).
    fn open(pid: u32) -> Result<Self, PyCodeError> {
        use py_spy::python_process_info::{PythonProcessInfo, get_python_version};
        if !python::looks_like_python(pid) {
            return Err(PythonError::NotPython(pid).into());
        }
        python::check_libraries(pid)?;
        let start_ticks = owner::start_ticks(pid);
        let open = |source| PyCodeError::from(PythonError::Open { pid, source });
        let process = remoteprocess::Process::new(pid as remoteprocess::Pid)
            .map_err(|e| open(anyhow::anyhow!("{e}")))?;
        let info = PythonProcessInfo::new(&process).map_err(open)?;
        let version = get_python_version(&info, &process).map_err(open)?;
        let layout = u32::try_from(version.minor)
            .ok()
            .filter(|_| version.major == 3)
            .and_then(py_layout)
            .map(|(_, l)| l)
            .ok_or_else(|| PyCodeError::Unsupported {
                pid,
                version: cut(version.to_string(), 64),
            })?;
        // py-spy's symbols are addresses in the process (its load bias added).
        let runtime = *info
            .get_symbol("_PyRuntime")
            .ok_or(PyCodeError::NoRuntime(pid))?;
        let symbol = |name| info.get_symbol(name).copied();
        Ok(Self {
            start_ticks,
            layout,
            runtime,
            types: PyTypes {
                code: symbol("PyCode_Type"),
                str: symbol("PyUnicode_Type"),
                bytes: symbol("PyBytes_Type"),
            },
        })
    }

    /// The gilstate key (and, for 3.13, the check of its layout).
    fn runtime(&self, pid: u32, mem: &impl Memory) -> Result<PyRuntime, PyCodeError> {
        // The symbol's value is the process's files' to choose: no overflow.
        let at = self
            .runtime
            .wrapping_add(u64::from(self.layout.runtime_tss));
        let mut tss = [0u8; 8];
        mem.read(at, &mut tss).map_err(|source| PyCodeError::Read {
            pid,
            what: "_PyRuntime's autoTSSkey",
            addr: at,
            source,
        })?;
        // Py_tss_t: {int _is_initialized; pthread_key_t _key}.
        let (initialized, key) = (u32_at(&tss, 0) as i32, u32_at(&tss, 4));
        if initialized != 1 || key >= GLIBC_TSD_KEYS {
            return Err(PyCodeError::TssKey {
                pid,
                initialized,
                key,
            });
        }
        // 3.13 describes its layout; 3.14 changes that description (and is not walked).
        if self.layout.minor == 13 {
            check_debug_offsets(pid, mem, self.runtime, self.layout)?;
        }
        Ok(PyRuntime {
            minor: self.layout.minor,
            tss_key: key,
        })
    }

    /// Still the process and the mapping this was read from: an exec keeps the pid and
    /// the start time but maps another interpreter, where `PyCode_Type` is elsewhere.
    fn current(&self, pid: u32, mem: &impl Memory) -> bool {
        if self.start_ticks != owner::start_ticks(pid) {
            return false;
        }
        let Some(code_type) = self.types.code else {
            return true;
        };
        let mut name_at = [0u8; 8];
        let mut name = [0u8; 5];
        mem.read(code_type.wrapping_add(TP_NAME), &mut name_at)
            .is_ok()
            && mem.read(u64_at(&name_at, 0), &mut name).is_ok()
            && &name == b"code\0"
    }
}

/// The interpreters a worker has read, by pid, for the session's next requests.
#[derive(Default)]
pub struct PyCodes {
    interps: HashMap<u32, Interp>,
}

impl PyCodes {
    /// What the kernel walk needs of `pid`'s interpreter, read anew (the daemon asks after
    /// an exec).
    pub fn runtime(&mut self, pid: u32) -> Result<PyRuntime, PyCodeError> {
        self.interps.remove(&pid);
        let interp = Interp::open(pid)?;
        let runtime = interp.runtime(pid, &ProcessMemory(pid))?;
        self.keep(pid, interp);
        Ok(runtime)
    }

    /// The code objects at `addrs` in `pid`, an interpreter of 3.`minor`.
    pub fn codes(
        &mut self,
        pid: u32,
        minor: u32,
        addrs: &[u64],
    ) -> Result<Vec<Result<PyCode, String>>, PyCodeError> {
        if addrs.len() > MAX_CODES {
            return Err(PyCodeError::TooMany(addrs.len()));
        }
        let mem = ProcessMemory(pid);
        if !self.interps.get(&pid).is_some_and(|i| i.current(pid, &mem)) {
            self.interps.remove(&pid);
            let interp = Interp::open(pid)?;
            self.keep(pid, interp);
        }
        let interp = &self.interps[&pid];
        if interp.layout.minor != minor {
            return Err(PyCodeError::OtherVersion {
                pid,
                runs: interp.layout.minor,
                asked: minor,
            });
        }
        Ok(read_codes(&mem, interp.layout, &interp.types, addrs))
    }

    fn keep(&mut self, pid: u32, interp: Interp) {
        if self.interps.len() >= MAX_INTERPS {
            self.interps.clear();
        }
        self.interps.insert(pid, interp);
    }
}

#[cfg(test)]
mod tests;
