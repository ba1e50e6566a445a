//! The one place where ethand reads what other users control: the files their processes map
//! (ELF, DWARF, compressed sections, demangled names), their memory (Python frames) and the
//! source files they name. None of it is parsed in the daemon. The daemon starts a
//! supervisor (`supervisor.rs`) before it drops its capabilities; for each process it asks
//! about, the supervisor forks a worker (`worker.rs`) that takes the credentials of that
//! process's owner, bounds itself and enters a seccomp filter (`sandbox.rs`), and answers
//! requests (`proto.rs`) on a socket of its own. The daemon's side (`client.rs`) never waits
//! past a request's deadline, so nothing a worker meets (a FIFO, a decompression bomb, a
//! frame chain thousands deep) can reach the collection loop, `/metrics` or the model lock:
//! the worker is killed, the answer says why, and the file that killed it is not parsed
//! again.
//!
//! docs/security.md ("What ethand reads of other users") states the whole boundary.
pub mod client;
mod creds;
/// C++ names a process gave (CUDA kernel names), demangled in the worker.
pub mod demangle;
mod elf;
pub mod owner;
pub mod proto;
/// Code objects of a live CPython process, for frames walked in the kernel (issue 41).
pub mod pycode;
/// Line tables of CPython code objects (for frames walked in the kernel: issue 41).
pub mod pyline;
pub mod python;
pub mod sandbox;
pub mod source;
pub mod supervisor;
mod symbolize;
mod worker;

pub use client::{Reader, ReaderError, Session, SymbolizeOptions, Symbolized};
pub use creds::SyscallError;
pub use proto::{FileId, Owner, PyCode, PyRuntime, SymStack, ThreadStack};
pub use sandbox::Limits;
