//! The one way ethand puts uprobes on a GPU/NPU runtime library, for the daemon (`gpu`,
//! `launch_sample`), `ethand record` and `ethand survey`: which programs to use (uprobe_multi
//! links where the kernel has them, else one uprobe per point: aya decides by how the program
//! was loaded), the catalog's symbols of a runtime resolved in one library file with what was
//! found and what was not, and the attach and detach of an entry/return program pair at a set
//! of file offsets. Callers word the errors for their own output.
use std::path::Path;

use aya::{
    Ebpf,
    programs::{
        ProgramError, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};

use crate::pipeline::bpf_error::{MapSetupError, error_chain};

pub const ENTRY_PROG: &str = "gpu_enter";
pub const RETURN_PROG: &str = "gpu_return";
pub const ENTRY_PROG_MULTI: &str = "gpu_enter_multi";
pub const RETURN_PROG_MULTI: &str = "gpu_return_multi";
const RECORD_ENTRY_PROG: &str = "record_gpu_enter";
const RECORD_RETURN_PROG: &str = "record_gpu_return";
const RECORD_ENTRY_PROG_MULTI: &str = "record_gpu_enter_multi";
const RECORD_RETURN_PROG_MULTI: &str = "record_gpu_return_multi";

/// The (entry, return) programs in use: uprobe_multi links where the kernel has them.
#[derive(Clone, Copy, Debug)]
pub struct Progs {
    pub entry: &'static str,
    pub ret: &'static str,
    multi: bool,
}

impl Progs {
    /// The daemon's counting programs (`gpu_enter`, `gpu_return`).
    pub fn detect() -> Self {
        Self::pick(
            (ENTRY_PROG, RETURN_PROG),
            (ENTRY_PROG_MULTI, RETURN_PROG_MULTI),
        )
    }

    /// `ethand record`'s programs (`record_gpu_enter`, `record_gpu_return`).
    pub fn record() -> Self {
        Self::pick(
            (RECORD_ENTRY_PROG, RECORD_RETURN_PROG),
            (RECORD_ENTRY_PROG_MULTI, RECORD_RETURN_PROG_MULTI),
        )
    }

    /// The launch probes of GPU activity windows (`launch_trace`, `launch_trace_return`).
    pub fn launch_trace(multi: bool) -> Self {
        if multi {
            Self {
                entry: "launch_trace_multi",
                ret: "launch_trace_return_multi",
                multi: true,
            }
        } else {
            Self {
                entry: "launch_trace",
                ret: "launch_trace_return",
                multi: false,
            }
        }
    }

    fn pick(single: (&'static str, &'static str), multi: (&'static str, &'static str)) -> Self {
        match aya::sys::is_uprobe_multi_supported(aya::sys::UProbeMultiFeature::LinkCreation) {
            Ok(true) => Self {
                entry: multi.0,
                ret: multi.1,
                multi: true,
            },
            _ => Self {
                entry: single.0,
                ret: single.1,
                multi: false,
            },
        }
    }

    pub fn multi(self) -> bool {
        self.multi
    }
}

/// Why a uprobe program could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum UprobeError {
    /// The BPF object has no program of that name.
    #[error("program {0} missing")]
    Missing(&'static str),
    /// The program is not a uprobe program.
    #[error("{}", error_chain(.0))]
    NotUprobe(#[source] ProgramError),
    #[error("loading {prog}: {}", error_chain(error))]
    Load {
        prog: &'static str,
        #[source]
        error: ProgramError,
    },
    #[error("{prog}: {}", error_chain(error))]
    Attach {
        prog: &'static str,
        #[source]
        error: ProgramError,
    },
}

/// Why a subsystem on uprobes (the GPU probes, the launch sample) could not set up its
/// programs and maps at start-up.
#[derive(Debug, thiserror::Error)]
pub enum UprobeSetupError {
    #[error(transparent)]
    Map(#[from] MapSetupError),
    #[error(transparent)]
    Program(#[from] UprobeError),
}

impl From<aya::maps::MapError> for UprobeSetupError {
    fn from(source: aya::maps::MapError) -> Self {
        Self::Map(source.into())
    }
}

impl UprobeError {
    /// What went wrong without the program's name: "program missing", or aya's error chain.
    pub fn detail(&self) -> String {
        match self {
            Self::Missing(_) => "program missing".into(),
            Self::NotUprobe(error) | Self::Load { error, .. } | Self::Attach { error, .. } => {
                error_chain(error)
            }
        }
    }

    /// aya's error, for callers that keep it as an error's source.
    pub fn into_program_error(self) -> Option<ProgramError> {
        match self {
            Self::Missing(_) => None,
            Self::NotUprobe(error) | Self::Load { error, .. } | Self::Attach { error, .. } => {
                Some(error)
            }
        }
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, prog: &'static str) -> Result<&'a mut UProbe, UprobeError> {
    ebpf.program_mut(prog)
        .ok_or(UprobeError::Missing(prog))?
        .try_into()
        .map_err(UprobeError::NotUprobe)
}

/// Loads the uprobe program `prog` of the object.
pub fn load(ebpf: &mut Ebpf, prog: &'static str) -> Result<(), UprobeError> {
    uprobe(ebpf, prog)?
        .load()
        .map_err(|error| UprobeError::Load { prog, error })
}

/// A probe at a file offset of the library, with the cookie its program reads (the op id
/// for the catalog's programs).
pub fn at_offset(offset: u64, cookie: Option<u64>) -> UProbeAttachPoint<'static> {
    UProbeAttachPoint {
        location: UProbeAttachLocation::AbsoluteOffset(offset),
        cookie,
    }
}

/// Attaches the loaded program `prog` to the library file at `path`, at every point: one
/// uprobe_multi link for a multi program, one uprobe per point otherwise.
pub fn attach(
    ebpf: &mut Ebpf,
    prog: &'static str,
    path: &Path,
    points: Vec<UProbeAttachPoint<'static>>,
    scope: UProbeScope,
) -> Result<UProbeLinkId, UprobeError> {
    uprobe(ebpf, prog)?
        .attach(points, path, scope)
        .map_err(|error| UprobeError::Attach { prog, error })
}

/// Which program of the pair an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Entry,
    Return,
}

/// The links of an entry/return program pair on one library file.
#[derive(Debug, Default)]
pub struct LibraryLinks {
    pub entry: Option<UProbeLinkId>,
    pub ret: Option<UProbeLinkId>,
}

impl LibraryLinks {
    /// Attaches `progs` to the library file at `path`: the entry program at `entry`, then the
    /// return program at `ret` (not at all when `ret` is empty). On an error the link made
    /// before it stays here: [`LibraryLinks::detach`] removes it.
    pub fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        progs: Progs,
        path: &Path,
        entry: Vec<UProbeAttachPoint<'static>>,
        ret: Vec<UProbeAttachPoint<'static>>,
        scope: UProbeScope,
    ) -> Result<(), (Side, UprobeError)> {
        self.entry =
            Some(attach(ebpf, progs.entry, path, entry, scope).map_err(|e| (Side::Entry, e))?);
        if !ret.is_empty() {
            self.ret =
                Some(attach(ebpf, progs.ret, path, ret, scope).map_err(|e| (Side::Return, e))?);
        }
        Ok(())
    }

    /// Detaches whatever is attached.
    pub fn detach(&mut self, ebpf: &mut Ebpf, progs: Progs) {
        for (prog, link) in [
            (progs.entry, self.entry.take()),
            (progs.ret, self.ret.take()),
        ] {
            let Some(link) = link else { continue };
            if let Some(p) = ebpf.program_mut(prog)
                && let Ok(p) = <&mut UProbe>::try_from(p)
            {
                let _ = p.detach(link);
            }
        }
    }
}

pub use ethand_userspace_probes::catalog::CatalogSymbols;
