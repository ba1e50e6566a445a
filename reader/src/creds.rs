//! Taking a user's credentials while keeping chosen capabilities: what the supervisor does
//! once at start and each worker does for the owner it reads for.
use rustix::thread::{self as t, CapabilitySet, CapabilitySets};

use crate::proto::Owner;

/// A call a process makes on itself (credentials, capabilities, limits, process
/// attributes) that the kernel refused: which one, and its answer.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct SyscallError {
    pub call: &'static str,
    pub source: rustix::io::Errno,
}

/// Names the call an `Errno` came from.
pub(crate) fn call(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> SyscallError {
    move |source| SyscallError { call, source }
}

/// Becomes `user` when given (groups, then gid, then uid), keeps `keep` of the capabilities
/// (permitted and effective; none inheritable or ambient), then makes the process not
/// dumpable (its new owner cannot inspect it) and unable to gain privileges by exec.
pub(crate) fn assume(user: Option<&Owner>, keep: CapabilitySet) -> Result<(), SyscallError> {
    if let Some(user) = user {
        // Keep the permitted set across the uid change (from or to 0 it would be cleared).
        t::set_keep_capabilities(true).map_err(call("PR_SET_KEEPCAPS"))?;
        let groups: Vec<rustix::fs::Gid> = user
            .groups
            .iter()
            .map(|g| rustix::fs::Gid::from_raw(*g))
            .collect();
        t::set_thread_groups(&groups).map_err(call("setgroups"))?;
        let gid = rustix::fs::Gid::from_raw(user.gid);
        t::set_thread_res_gid(gid, gid, gid).map_err(call("setresgid"))?;
        let uid = rustix::fs::Uid::from_raw(user.uid);
        t::set_thread_res_uid(uid, uid, uid).map_err(call("setresuid"))?;
        t::set_keep_capabilities(false).map_err(call("PR_SET_KEEPCAPS"))?;
    }
    t::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(call("capset"))?;
    let _ = t::clear_ambient_capability_set();
    // After the uid change: a change of credentials resets the dumpable flag.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(call("PR_SET_DUMPABLE"))?;
    t::set_no_new_privs(true).map_err(call("PR_SET_NO_NEW_PRIVS"))
}
