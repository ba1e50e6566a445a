//! The catalog's symbols of a runtime library file a process maps (libcuda, libnccl, ...), for
//! the daemon's uprobes, inside a worker: anyone can map a file named `libcuda.so`, so its
//! bytes are parsed here, from a read-only mapping (not counted in the worker's memory
//! limit), keeping only the catalog's names however many the file claims.
use ethand_userspace_probes::{
    Runtime,
    catalog::CatalogSymbols,
    elf::SymbolTable,
    procmaps::{self, Vma},
};

use crate::{proto::FileId, symbolize::file_id};

/// (the file read, its catalog symbols, defined functions in it) of the file `vma` maps,
/// inside the root of `pid` (0: the host's).
pub fn catalog_symbols(
    pid: u32,
    vma: &Vma,
    runtime: Runtime,
) -> Result<(FileId, CatalogSymbols, usize), String> {
    let root = if pid == 0 {
        procmaps::host_root()
    } else {
        procmaps::open_root(pid)
    }
    .map_err(|e| format!("cannot open the root of process {pid}: {e}"))?;
    let f = procmaps::open_mapped(&root, vma).map_err(|e| e.to_string())?;
    let id = file_id(&f).ok_or("cannot stat the file")?;
    let len = usize::try_from(id.size).map_err(|_| "file too large")?;
    if len == 0 {
        return Err("the file is empty".into());
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
    .map_err(|e| format!("cannot map the file: {e}"))?;
    // SAFETY: `data` points at `len` readable bytes until the munmap below.
    let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
    let table = SymbolTable::parse_filtered(bytes, |n| CatalogSymbols::wants(runtime, n));
    // SAFETY: unmaps what was mapped above; `bytes` is not used after.
    unsafe { rustix::mm::munmap(data, len) }.ok();
    let table = table.map_err(|e| format!("not a 64-bit ELF shared object: {e}"))?;
    Ok((
        id,
        CatalogSymbols::resolve(&table, runtime),
        table.functions_seen(),
    ))
}
