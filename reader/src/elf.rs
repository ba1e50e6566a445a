//! The catalog's symbols of a runtime library file a process maps (libcuda, libnccl, ...), for
//! the daemon's uprobes, inside a worker: anyone can map a file named `libcuda.so`, so its
//! bytes are parsed here, from a read-only mapping (not counted in the worker's memory
//! limit), keeping only the catalog's names however many the file claims.
use ethand_userspace_probes::{
    Runtime,
    catalog::CatalogSymbols,
    elf::{self, SymbolTable},
    procmaps::{self, Vma},
};

use crate::{owner::ProcessError, proto::FileId, symbolize::file_id};

/// Why a library file's catalog symbols were not read.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Open(#[from] procmaps::OpenError),
    #[error("cannot stat the file")]
    Stat,
    #[error("file too large")]
    TooLarge(#[source] std::num::TryFromIntError),
    #[error("the file is empty")]
    Empty,
    #[error("cannot map the file: {0}")]
    Map(#[source] rustix::io::Errno),
    #[error("not a 64-bit ELF shared object: {0}")]
    Parse(#[source] elf::ParseError),
}

/// (the file read, its catalog symbols, defined functions in it) of the file `vma` maps,
/// inside the root of `pid` (0: the host's).
pub fn catalog_symbols(
    pid: u32,
    vma: &Vma,
    runtime: Runtime,
) -> Result<(FileId, CatalogSymbols, usize), CatalogError> {
    let root = if pid == 0 {
        procmaps::host_root()
    } else {
        procmaps::open_root(pid)
    }
    .map_err(|source| ProcessError::Root { pid, source })?;
    let f = procmaps::open_mapped(&root, vma)?;
    let id = file_id(&f).ok_or(CatalogError::Stat)?;
    let len = usize::try_from(id.size).map_err(CatalogError::TooLarge)?;
    if len == 0 {
        return Err(CatalogError::Empty);
    }
    // SAFETY: a private read-only mapping of a file we hold open; the slice lives only
    // while it is mapped (unmapped below). A file truncated meanwhile faults the worker,
    // which is what a worker is for.
    let data = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::PRIVATE,
            &f,
            0,
        )
    }
    .map_err(CatalogError::Map)?;
    // SAFETY: `data` points at `len` readable bytes until the munmap below.
    let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
    let table = SymbolTable::parse_filtered(bytes, |n| CatalogSymbols::wants(runtime, n));
    // SAFETY: unmaps what was mapped above; `bytes` is not used after.
    unsafe { rustix::mm::munmap(data, len) }.ok();
    let table = table.map_err(CatalogError::Parse)?;
    Ok((
        id,
        CatalogSymbols::resolve(&table, runtime),
        table.functions_seen(),
    ))
}
