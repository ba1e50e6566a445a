//! Who a process is: its filesystem credentials (whose files it may read) and its start time
//! (so that a reused pid is never taken for the process asked about). Read from the kernel's
//! own text in /proc, bounded.
use std::io::Read;

use crate::proto::Owner;

/// Why a process cannot be read or asked about: it is gone, another's, or the kernel would
/// not show it. The same text reaches the daemon from the supervisor (a refused session) and
/// from a worker (a refused request).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process {0} has exited (its pid was reused)")]
    PidReused(u32),
    #[error("process {0} has exited")]
    Exited(u32),
    /// Its credentials could not be read ([`owner_of`]).
    #[error("process {pid}: {source}")]
    Owner { pid: u32, source: std::io::Error },
    #[error("process {0} belongs to another user than this reader's")]
    OtherOwner(u32),
    #[error("cannot read the mappings of process {pid}: {source}")]
    Mappings { pid: u32, source: std::io::Error },
    #[error("cannot open the root of process {pid}: {source}")]
    Root { pid: u32, source: std::io::Error },
}

/// Most supplementary groups a worker takes on (fewer than the process has only narrows what
/// the worker may read).
pub const MAX_GROUPS: usize = 1024;

fn read_bounded(path: &str, max: u64) -> std::io::Result<String> {
    let mut s = String::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut s)?;
    Ok(s)
}

/// The filesystem uid and gid of `pid` and its supplementary groups.
pub fn owner_of(pid: u32) -> std::io::Result<Owner> {
    parse_status(&read_bounded(&format!("/proc/{pid}/status"), 1 << 20)?)
        .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/status has no credentials")))
}

/// Uid and Gid lines ("real effective saved filesystem"), and Groups.
pub fn parse_status(text: &str) -> Option<Owner> {
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key));
    let fs = |key: &str| -> Option<u32> { field(key)?.split_whitespace().nth(3)?.parse().ok() };
    let groups = field("Groups:")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .take(MAX_GROUPS)
                .collect()
        })
        .unwrap_or_default();
    Some(Owner {
        uid: fs("Uid:")?,
        gid: fs("Gid:")?,
        groups,
    })
}

/// The start time of `pid` (clock ticks since boot, field 22 of /proc/PID/stat).
pub fn start_ticks(pid: u32) -> Option<u64> {
    parse_start(&read_bounded(&format!("/proc/{pid}/stat"), 4096).ok()?)
}

/// Field 22 of a stat line; the command name (field 2) may hold spaces and parentheses.
pub fn parse_start(stat: &str) -> Option<u64> {
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Checks that `pid` is still the process that started at `start` (when given).
pub fn check_start(pid: u32, start: Option<u64>) -> Result<(), ProcessError> {
    let Some(want) = start else { return Ok(()) };
    match start_ticks(pid) {
        Some(t) if t == want => Ok(()),
        Some(_) => Err(ProcessError::PidReused(pid)),
        None => Err(ProcessError::Exited(pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_the_filesystem_ids_and_groups() {
        let s =
            "Name:\tx\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\nGroups:\t4 24 27 \n";
        assert_eq!(
            parse_status(s),
            Some(Owner {
                uid: 1001,
                gid: 101,
                groups: vec![4, 24, 27]
            })
        );
        assert_eq!(parse_status("Name:\tx\n"), None);
        let me = owner_of(std::process::id()).unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(me.uid, unsafe { libc::getuid() });
    }

    #[test]
    fn start_time_survives_hostile_names() {
        let s = "42 (a) b) (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 12345 99 0";
        assert_eq!(parse_start(s), Some(12345));
        let me = std::process::id();
        assert!(check_start(me, start_ticks(me)).is_ok());
        assert!(matches!(
            check_start(me, Some(1)),
            Err(ProcessError::PidReused(p)) if p == me
        ));
        assert_eq!(
            ProcessError::PidReused(7).to_string(),
            "process 7 has exited (its pid was reused)"
        );
        assert!(check_start(me, None).is_ok());
    }
}
