//! A worker: one forked process per session, boxed (`sandbox.rs`) as the owner of the
//! process it was opened for, answering requests on its socket until the daemon closes it.
//! Every request runs under a deadline the kernel enforces (SIGALRM ends the worker), and a
//! request naming a process of another owner is refused.
use std::os::unix::net::UnixStream;

use crate::{
    elf::CatalogError,
    owner::{self, ProcessError},
    proto::{self, FileId, MAX_LINES, Owner, Reply, Request},
    pycode::{PyCodeError, PyCodes},
    python::{PythonError, Pythons},
    sandbox::{self, Limits, SandboxError},
    source::{self, Roots},
    symbolize,
};

/// Why a worker answers a request with an error. It crosses to the daemon as
/// [`Reply::Error`] holding its text (the daemon's `ReaderError::Failed`).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The worker's first and last answer.
    #[error("the reader could not enter its sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Source lines asked of a process whose root cannot be opened.
    #[error("cannot open the root of process {pid}")]
    SourceRoot { pid: u32, source: std::io::Error },
    #[error(transparent)]
    Python(#[from] PythonError),
    #[error(transparent)]
    PyCode(#[from] PyCodeError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// Longest deadline a request may ask for.
pub const MAX_DEADLINE_MS: u64 = 60_000;

/// Serves `session` as `owner`, never returning: the worker exits when the daemon closes the
/// session, and is killed when a request outlasts its deadline or its limits.
pub fn run(mut session: UnixStream, owner: Owner, limits: &Limits) -> ! {
    use std::os::fd::AsRawFd;
    let entered = match sandbox::enter(&owner, limits, session.as_raw_fd()) {
        Ok(e) => e,
        Err(e) => {
            let e = WorkerError::from(e);
            let _ = proto::send(&mut session, &Reply::Error(e.to_string()), None);
            exit(1);
        }
    };
    let mut pythons = Pythons::default();
    let mut codes = PyCodes::default();
    loop {
        let req: Request = match proto::recv(&mut session, None) {
            Ok(r) => r,
            Err(_) => exit(0),
        };
        let reply = serve(
            req,
            &owner,
            entered.as_owner,
            &mut pythons,
            &mut codes,
            &mut session,
        )
        .unwrap_or_else(|e| Reply::Error(e.to_string()));
        sandbox::deadline(None);
        if proto::send(&mut session, &reply, None).is_err() {
            exit(0);
        }
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: ends the worker at once: nothing of it needs flushing or unwinding.
    unsafe { libc::_exit(code) }
}

/// Checks that `pid` is the process asked about and belongs to this worker's owner.
fn check(pid: u32, start: Option<u64>, owner: &Owner) -> Result<(), ProcessError> {
    owner::check_start(pid, start)?;
    match owner::owner_of(pid) {
        Ok(o) if o == *owner => Ok(()),
        Ok(_) => Err(ProcessError::OtherOwner(pid)),
        Err(source) => Err(ProcessError::Owner { pid, source }),
    }
}

fn serve(
    req: Request,
    owner: &Owner,
    as_owner: bool,
    pythons: &mut Pythons,
    codes: &mut PyCodes,
    session: &mut UnixStream,
) -> Result<Reply, WorkerError> {
    let arm = |ms: u64| sandbox::deadline(Some(ms.clamp(1, MAX_DEADLINE_MS)));
    match req {
        Request::Symbolize {
            pid,
            start_ticks,
            stacks,
            code_info,
            source_lines,
            source_skip_first_module,
            skip,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, start_ticks, owner)?;
            let job = symbolize::Job {
                pid,
                stacks,
                code_info,
                source_lines,
                source_skip_first_module,
                skip: &skip,
                as_owner,
            };
            let mut tell = |file: FileId, name: &str| {
                let _ = proto::send(
                    session,
                    &Reply::Parsing {
                        file,
                        name: name.to_string(),
                    },
                    None,
                );
            };
            let (stacks, notes) = symbolize::run(job, &mut tell)?;
            Ok(Reply::Symbolized { stacks, notes })
        }
        Request::SourceLines {
            pid,
            start_ticks,
            lines,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, start_ticks, owner)?;
            if !as_owner {
                return Ok(Reply::Lines(vec![None; lines.len().min(MAX_LINES)]));
            }
            let roots = Roots::of(pid).map_err(|source| WorkerError::SourceRoot { pid, source })?;
            Ok(Reply::Lines(
                lines
                    .iter()
                    .take(MAX_LINES)
                    .map(|(file, line)| {
                        // Only Python sources: a frame's file name is the process's to choose.
                        file.ends_with(".py")
                            .then(|| source::line(&roots, file, *line))
                            .flatten()
                    })
                    .collect(),
            ))
        }
        Request::PythonOpen {
            pid,
            start_ticks,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, start_ticks, owner)?;
            let version = pythons.open(pid)?;
            Ok(Reply::PythonOpened { version })
        }
        Request::ElfSymbols {
            pid,
            path,
            dev_major,
            dev_minor,
            inode,
            runtime,
            deadline_ms,
        } => {
            arm(deadline_ms);
            if pid != 0 {
                check(pid, None, owner)?;
            }
            let vma = ethand_userspace_probes::procmaps::Vma {
                start: 0,
                end: 0,
                offset: 0,
                dev_major,
                dev_minor,
                inode,
                executable: true,
                name: path,
            };
            let (file, symbols, functions) = crate::elf::catalog_symbols(pid, &vma, runtime)?;
            Ok(Reply::ElfSymbols {
                file,
                symbols,
                functions,
            })
        }
        Request::Demangle {
            pid,
            names,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, None, owner)?;
            Ok(Reply::Demangled(
                names
                    .iter()
                    .take(crate::demangle::MAX_NAMES)
                    .map(|n| crate::demangle::short(n))
                    .collect(),
            ))
        }
        Request::PythonStacks { pid, deadline_ms } => {
            arm(deadline_ms);
            Ok(Reply::PythonStacks(pythons.stacks(pid)?))
        }
        Request::PythonRuntime {
            pid,
            start_ticks,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, start_ticks, owner)?;
            Ok(Reply::PythonRuntime(codes.runtime(pid)?))
        }
        Request::PythonCode {
            pid,
            start_ticks,
            minor,
            codes: addrs,
            deadline_ms,
        } => {
            arm(deadline_ms);
            check(pid, start_ticks, owner)?;
            Ok(Reply::PythonCode(codes.codes(pid, minor, &addrs)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_of_another_owner_is_refused_with_the_same_text() {
        let me = std::process::id();
        let mine = owner::owner_of(me).unwrap();
        assert!(check(me, owner::start_ticks(me), &mine).is_ok());
        let other = Owner {
            uid: mine.uid.wrapping_add(1),
            ..mine.clone()
        };
        let e = check(me, None, &other).unwrap_err();
        assert!(matches!(e, ProcessError::OtherOwner(p) if p == me), "{e:?}");
        assert_eq!(
            WorkerError::from(e).to_string(),
            format!("process {me} belongs to another user than this reader's")
        );
    }
}
