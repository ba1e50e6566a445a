//! A worker: one forked process per session, boxed (`sandbox.rs`) as the owner of the
//! process it was opened for, answering requests on its socket until the daemon closes it.
//! Every request runs under a deadline the kernel enforces (SIGALRM ends the worker), and a
//! request naming a process of another owner is refused.
use std::os::unix::net::UnixStream;

use crate::{
    owner,
    proto::{self, FileId, MAX_LINES, Owner, Reply, Request},
    python::Pythons,
    sandbox::{self, Limits},
    source::{self, Roots},
    symbolize,
};

/// Longest deadline a request may ask for.
pub const MAX_DEADLINE_MS: u64 = 60_000;

/// Serves `session` as `owner`, never returning: the worker exits when the daemon closes the
/// session, and is killed when a request outlasts its deadline or its limits.
pub fn run(mut session: UnixStream, owner: Owner, limits: &Limits) -> ! {
    use std::os::fd::AsRawFd;
    let entered = match sandbox::enter(&owner, limits, session.as_raw_fd()) {
        Ok(e) => e,
        Err(e) => {
            let _ = proto::send(
                &mut session,
                &Reply::Error(format!("the reader could not enter its sandbox: {e}")),
                None,
            );
            exit(1);
        }
    };
    let mut pythons = Pythons::default();
    loop {
        let req: Request = match proto::recv(&mut session, None) {
            Ok(r) => r,
            Err(_) => exit(0),
        };
        let reply = serve(req, &owner, entered.as_owner, &mut pythons, &mut session);
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
fn check(pid: u32, start: Option<u64>, owner: &Owner) -> Result<(), String> {
    owner::check_start(pid, start)?;
    match owner::owner_of(pid) {
        Ok(o) if o == *owner => Ok(()),
        Ok(_) => Err(format!(
            "process {pid} belongs to another user than this reader's"
        )),
        Err(e) => Err(format!("process {pid}: {e}")),
    }
}

fn serve(
    req: Request,
    owner: &Owner,
    as_owner: bool,
    pythons: &mut Pythons,
    session: &mut UnixStream,
) -> Reply {
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
            if let Err(e) = check(pid, start_ticks, owner) {
                return Reply::Error(e);
            }
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
            match symbolize::run(job, &mut tell) {
                Ok((stacks, notes)) => Reply::Symbolized { stacks, notes },
                Err(e) => Reply::Error(e),
            }
        }
        Request::SourceLines {
            pid,
            start_ticks,
            lines,
            deadline_ms,
        } => {
            arm(deadline_ms);
            if let Err(e) = check(pid, start_ticks, owner) {
                return Reply::Error(e);
            }
            if !as_owner {
                return Reply::Lines(vec![None; lines.len().min(MAX_LINES)]);
            }
            let Ok(roots) = Roots::of(pid) else {
                return Reply::Error(format!("cannot open the root of process {pid}"));
            };
            Reply::Lines(
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
            )
        }
        Request::PythonOpen {
            pid,
            start_ticks,
            deadline_ms,
        } => {
            arm(deadline_ms);
            if let Err(e) = check(pid, start_ticks, owner) {
                return Reply::Error(e);
            }
            match pythons.open(pid) {
                Ok(version) => Reply::PythonOpened { version },
                Err(e) => Reply::Error(e),
            }
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
            if pid != 0
                && let Err(e) = check(pid, None, owner)
            {
                return Reply::Error(e);
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
            match crate::elf::catalog_symbols(pid, &vma, runtime) {
                Ok((file, symbols, functions)) => Reply::ElfSymbols {
                    file,
                    symbols,
                    functions,
                },
                Err(e) => Reply::Error(e),
            }
        }
        Request::PythonStacks { pid, deadline_ms } => {
            arm(deadline_ms);
            match pythons.stacks(pid) {
                Ok(s) => Reply::PythonStacks(s),
                Err(e) => Reply::Error(e),
            }
        }
    }
}
