//! Taking a user's credentials while keeping chosen capabilities: what the supervisor does
//! once at start and each worker does for the owner it reads for.
use rustix::thread::{self as t, CapabilitySet, CapabilitySets};

use crate::proto::Owner;

/// Becomes `user` when given (groups, then gid, then uid), keeps `keep` of the capabilities
/// (permitted and effective; none inheritable or ambient), then makes the process not
/// dumpable (its new owner cannot inspect it) and unable to gain privileges by exec.
pub(crate) fn assume(user: Option<&Owner>, keep: CapabilitySet) -> Result<(), String> {
    if let Some(user) = user {
        // Keep the permitted set across the uid change (from or to 0 it would be cleared).
        t::set_keep_capabilities(true).map_err(|e| format!("PR_SET_KEEPCAPS: {e}"))?;
        let groups: Vec<rustix::fs::Gid> = user
            .groups
            .iter()
            .map(|g| rustix::fs::Gid::from_raw(*g))
            .collect();
        t::set_thread_groups(&groups).map_err(|e| format!("setgroups: {e}"))?;
        let gid = rustix::fs::Gid::from_raw(user.gid);
        t::set_thread_res_gid(gid, gid, gid).map_err(|e| format!("setresgid: {e}"))?;
        let uid = rustix::fs::Uid::from_raw(user.uid);
        t::set_thread_res_uid(uid, uid, uid).map_err(|e| format!("setresuid: {e}"))?;
        t::set_keep_capabilities(false).map_err(|e| format!("PR_SET_KEEPCAPS: {e}"))?;
    }
    t::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| format!("capset: {e}"))?;
    let _ = t::clear_ambient_capability_set();
    // After the uid change: a change of credentials resets the dumpable flag.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("PR_SET_DUMPABLE: {e}"))?;
    t::set_no_new_privs(true).map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))
}
