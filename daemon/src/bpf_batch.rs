//! Whole-map reads with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+): one syscall per few thousand
//! entries instead of two per entry (`get_next_key` + `lookup`). At 1,000 processes the
//! per-entry walk was most of the daemon's CPU time; kernels without batch operations fall
//! back to the walk.
use std::io;
use std::mem::{size_of, zeroed};
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

/// Reads every entry of a (non per-CPU) hash map: batched where the kernel can, else entry by
/// entry. `batch_ok` remembers that the kernel refused batches, to stop trying.
pub fn read_all<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>, batch_ok: &mut bool) -> Vec<(K, V)> {
    if *batch_ok {
        match lookup_batch(map.map()) {
            Ok(v) => return v,
            Err(e) => {
                tracing::info!(error = %e, "BPF_MAP_LOOKUP_BATCH unavailable: reading maps entry by entry");
                *batch_ok = false;
            }
        }
    }
    map.iter().filter_map(Result::ok).collect()
}

fn lookup_batch<K: Pod, V: Pod>(map: &MapData) -> io::Result<Vec<(K, V)>> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut chunk = CHUNK;
    // SAFETY: Pod types are plain integers and arrays of them: all-zero is a valid value.
    let mut keys: Vec<K> = vec![unsafe { zeroed() }; chunk];
    let mut values: Vec<V> = vec![unsafe { zeroed() }; chunk];
    let mut out = Vec::new();
    // The hash map's batch token is the bucket index to resume from (a u32).
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        // SAFETY: attr points at buffers of `count` keys and values of the map's sizes (K and
        // V are the map's key and value types) and at the tokens, all live for the call.
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
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            // The end of the map; the last entries are in the buffers.
            Some(libc::ENOENT) => {
                out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
                return Ok(out);
            }
            // One bucket holds more entries than the buffers: retry this step, larger.
            Some(libc::ENOSPC) if chunk < (1 << 20) => {
                chunk *= 4;
                keys.resize(chunk, unsafe { zeroed() });
                values.resize(chunk, unsafe { zeroed() });
                continue;
            }
            Some(_) => return Err(err.expect("set")),
        }
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
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
