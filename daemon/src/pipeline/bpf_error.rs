//! What the kernel's answer to loading or attaching a BPF program means: the error told in
//! one line (aya keeps the verifier log in the source chain), and classified by the errno
//! the kernel returned, never by its text. Also the one error of taking a map out of the
//! object ([`MapSetupError`]), shared by the subsystems that own maps.
use std::error::Error;

/// A map of the BPF object that a subsystem could not take or set up.
#[derive(Debug, thiserror::Error)]
pub enum MapSetupError {
    #[error("the BPF object has no {0} map")]
    Missing(&'static str),
    /// aya refused the map (another type or size) or the kernel refused a write.
    #[error("{}", error_chain(source))]
    Map {
        #[from]
        source: aya::maps::MapError,
    },
}

/// Takes the map `name` out of the object (a map is taken once, by its owner).
pub fn take_map(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<aya::maps::Map, MapSetupError> {
    ebpf.take_map(name).ok_or(MapSetupError::Missing(name))
}

/// Why a program could not be loaded or attached, by the kernel's errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// EPERM or EACCES: a capability or a security module said no. A failure of the
    /// deployment, not a kernel without the hook.
    Denied,
    /// ENOENT, EOPNOTSUPP, ENOTSUPP: the kernel has no such hook or program type.
    Unsupported,
    /// Anything else (the verifier's EINVAL, E2BIG, ...).
    Failed,
}

/// ENOTSUPP (the kernel's internal 524, which leaks from BPF syscalls): not in libc.
const ENOTSUPP: i32 = 524;

impl Refusal {
    /// The errno of the first OS error in `e`'s source chain decides.
    pub fn of(e: &(dyn Error + 'static)) -> Self {
        let mut cur: Option<&(dyn Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(code) = err
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
            {
                return match code {
                    libc::EPERM | libc::EACCES => Refusal::Denied,
                    libc::ENOENT | libc::EOPNOTSUPP | ENOTSUPP => Refusal::Unsupported,
                    _ => Refusal::Failed,
                };
            }
            cur = err.source();
        }
        Refusal::Failed
    }
}

/// A load or attach error, classified and told in one line with the capability hint when the
/// kernel denied it.
#[derive(Clone, Debug)]
pub struct BpfFailure {
    pub refusal: Refusal,
    pub message: String,
}

impl BpfFailure {
    pub fn of(e: &(dyn Error + 'static)) -> Self {
        let refusal = Refusal::of(e);
        let mut message = error_chain(e);
        if refusal == Refusal::Denied {
            message
                .push_str(" (missing capability: tracing programs need CAP_BPF and CAP_PERFMON)");
        }
        Self { refusal, message }
    }
}

impl std::fmt::Display for BpfFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An error with its sources, one line (aya keeps the verifier log in the source chain).
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let t = src.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = src.source();
    }
    // Verifier logs are long: keep the first line and the last few.
    if s.len() > 600 {
        let head: String = s.chars().take(300).collect();
        let tail: String = s
            .chars()
            .rev()
            .take(280)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        s = format!("{head} ... {tail}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("attaching x")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn refusals_come_from_the_errno_in_the_chain() {
        let of = |code: i32| Refusal::of(&Wrapped(std::io::Error::from_raw_os_error(code)));
        assert_eq!(of(libc::EPERM), Refusal::Denied);
        assert_eq!(of(libc::EACCES), Refusal::Denied);
        assert_eq!(of(libc::ENOENT), Refusal::Unsupported);
        assert_eq!(of(libc::EOPNOTSUPP), Refusal::Unsupported);
        assert_eq!(of(ENOTSUPP), Refusal::Unsupported);
        assert_eq!(of(libc::EINVAL), Refusal::Failed);
        // No OS error anywhere: a failure, whatever the text says.
        let text = std::io::Error::other("Operation not permitted");
        assert_eq!(Refusal::of(&text), Refusal::Failed);
    }

    #[test]
    fn a_denied_load_names_the_capabilities() {
        let e = Wrapped(std::io::Error::from_raw_os_error(libc::EPERM));
        let f = BpfFailure::of(&e);
        assert_eq!(f.refusal, Refusal::Denied);
        assert!(
            f.message
                .starts_with("attaching x: Operation not permitted")
                && f.message.ends_with("need CAP_BPF and CAP_PERFMON)"),
            "{}",
            f.message
        );
        let e = Wrapped(std::io::Error::from_raw_os_error(libc::EINVAL));
        assert!(!BpfFailure::of(&e).message.contains("CAP_BPF"));
    }

    /// A map error keeps aya's error, and so the errno, as its source.
    #[test]
    fn map_errors_keep_their_source() {
        let e = MapSetupError::from(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_update_elem",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        }));
        assert_eq!(Refusal::of(&e), Refusal::Denied);
        assert_eq!(e.to_string(), error_chain(&e));
        assert_eq!(
            MapSetupError::Missing("GPU_OPS").to_string(),
            "the BPF object has no GPU_OPS map"
        );
    }

    /// aya's errors keep the OS error in their chain (`SyscallError`'s `io_error`), which is
    /// what the classification reads.
    #[test]
    fn aya_errors_carry_their_errno() {
        let e = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        assert_eq!(Refusal::of(&e), Refusal::Denied);
    }
}
