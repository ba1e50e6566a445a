//! Whole-map reads with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+): one syscall per few thousand
//! entries instead of two per entry (`get_next_key` + `lookup`). At 1,000 processes the
//! per-entry walk was most of the daemon's CPU time; kernels without batch operations fall
//! back to the walk.
use std::io;
use std::mem::{align_of, size_of};
use std::os::fd::{AsFd, AsRawFd};

use aya::Pod;
use aya::maps::{HashMap, IterableMap, MapData};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries per call: large enough that a tick takes one or two calls, small enough that the
/// buffers stay a few hundred KiB.
const CHUNK: usize = 4096;

/// Reads every entry of a (non per-CPU) hash map into `out` (cleared first): batched where
/// the kernel can, else entry by entry. `batch_ok` remembers that the kernel refused batches,
/// to stop trying. The caller keeps `out` between reads: a fresh vector of a large map each
/// interval was an mmap of fresh pages (above the malloc mmap threshold), and faulting and
/// zeroing them was a quarter of the daemon's CPU time at 1,000 processes.
pub fn read_all<K: Pod, V: Pod>(
    map: &HashMap<MapData, K, V>,
    batch_ok: &mut bool,
    out: &mut Vec<(K, V)>,
) {
    out.clear();
    if *batch_ok {
        match lookup_batch(map.map(), out) {
            Ok(()) => return,
            Err(e) => {
                tracing::info!(error = %e, "BPF_MAP_LOOKUP_BATCH unavailable: reading maps entry by entry");
                *batch_ok = false;
                out.clear();
            }
        }
    }
    out.extend(map.iter().filter_map(Result::ok));
}

thread_local! {
    /// Key and value buffers of batch lookups, kept between reads: allocating (and zeroing)
    /// a megabyte per map per interval showed up as memset and page faults at 1,000
    /// processes. Vec<u64> keeps them 8-byte aligned for any key or value type here.
    static SCRATCH: std::cell::RefCell<(Vec<u64>, Vec<u64>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// Grows `buf` to hold at least `n` items of `T`; returns room for how many it holds.
fn room<T>(buf: &mut Vec<u64>, n: usize) -> usize {
    assert!(align_of::<T>() <= align_of::<u64>());
    let words = (n * size_of::<T>()).div_ceil(8);
    if buf.capacity() < words {
        buf.reserve_exact(words - buf.len());
    }
    buf.capacity() * 8 / size_of::<T>()
}

fn lookup_batch<K: Pod, V: Pod>(map: &MapData, out: &mut Vec<(K, V)>) -> io::Result<()> {
    SCRATCH.with_borrow_mut(|(kbuf, vbuf)| lookup_batch_into(map, kbuf, vbuf, out))
}

fn lookup_batch_into<K: Pod, V: Pod>(
    map: &MapData,
    kbuf: &mut Vec<u64>,
    vbuf: &mut Vec<u64>,
    out: &mut Vec<(K, V)>,
) -> io::Result<()> {
    let fd = map.fd().as_fd().as_raw_fd();
    // The buffers only ever grow: after the first reads one call takes the whole map.
    let mut chunk = room::<K>(kbuf, CHUNK).min(room::<V>(vbuf, CHUNK));
    // The hash map's batch token is the bucket index to resume from (a u32).
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    loop {
        let keys = kbuf.as_mut_ptr().cast::<K>();
        let values = vbuf.as_mut_ptr().cast::<V>();
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys as u64,
            values: values as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        // SAFETY: attr points at buffers with room for `count` keys and values of the map's
        // sizes (K and V are the map's key and value types) and at the tokens, all live for
        // the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (r < 0).then(io::Error::last_os_error);
        let n = (attr.count as usize).min(chunk);
        let errno = err.as_ref().and_then(io::Error::raw_os_error);
        // One bucket holds more entries than the buffers: retry this step, larger.
        if errno == Some(libc::ENOSPC) && chunk < (1 << 20) {
            chunk = room::<K>(kbuf, chunk * 4).min(room::<V>(vbuf, chunk * 4));
            continue;
        }
        if errno.is_some_and(|e| e != libc::ENOENT) {
            return Err(err.expect("set"));
        }
        out.reserve(n);
        // SAFETY: the kernel wrote n keys and n values at the start of the buffers (n is at
        // most `count`); Pod types are valid for any bytes.
        unsafe {
            let ks = std::slice::from_raw_parts(keys, n);
            let vs = std::slice::from_raw_parts(values, n);
            out.extend(ks.iter().copied().zip(vs.iter().copied()));
        }
        // ENOENT: the end of the map; the last entries were in the buffers.
        if errno == Some(libc::ENOENT) {
            return Ok(());
        }
        token_in = token_out;
        first = false;
    }
}

const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Deletes `keys` from a hash map with `BPF_MAP_DELETE_BATCH` (Linux 5.6+): one syscall for
/// all of them instead of one per key. At 100 process exits a second, deleting their map
/// entries one by one was a fifth of the daemon's CPU time. Keys already absent are skipped.
/// Falls back to one delete per key where the kernel refuses batches (`batch_ok`).
pub fn delete_keys<K: Pod, V: Pod>(
    map: &mut HashMap<MapData, K, V>,
    keys: &[K],
    batch_ok: &mut bool,
) {
    if keys.is_empty() {
        return;
    }
    if *batch_ok {
        match delete_batch(map.map(), keys) {
            Ok(()) => return,
            Err(e) => {
                tracing::info!(error = %e, "BPF_MAP_DELETE_BATCH unavailable: deleting entry by entry");
                *batch_ok = false;
            }
        }
    }
    for k in keys {
        let _ = map.remove(k);
    }
}

fn delete_batch<K: Pod>(map: &MapData, keys: &[K]) -> io::Result<()> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut rest = keys;
    while !rest.is_empty() {
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: rest.len() as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        // SAFETY: attr points at `count` keys of the map's key type, live for the call; the
        // kernel only reads them (and writes `count` back into attr).
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_DELETE_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        if r == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        // The kernel deletes in order and stops at the first key it cannot delete, telling
        // how many it did: an absent key (ENOENT) is skipped, anything else is an error.
        let done = (attr.count as usize).min(rest.len());
        // Any other error: the caller deletes key by key (keys already gone are ignored).
        if err.raw_os_error() != Some(libc::ENOENT) || done >= rest.len() {
            return Err(err);
        }
        rest = &rest[done + 1..];
    }
    Ok(())
}
