//! What one whole-map read costs the daemon in the kernel: `xtask map-read-cost` creates BPF
//! hash maps shaped like ethand's (key and value sizes, capacity), fills them with as many
//! entries as the scale suite's load makes, and times `BPF_MAP_LOOKUP_BATCH` reads of the
//! whole map, the call the daemon makes every interval. No programs, no load: the kernel's
//! cost per entry alone, for the scale analysis in docs/performance-analysis.md.
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

#[derive(Args)]
pub struct MapReadArgs {
    /// Whole-map reads per shape.
    #[arg(long, default_value_t = 200)]
    reads: u32,
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_TYPE_HASH: u32 = 1;

/// The leading members of `union bpf_attr` for BPF_MAP_CREATE (the rest stays zero).
#[repr(C)]
#[derive(Default)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    rest: [u32; 27],
}

#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

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

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: attr is a live bpf_attr prefix of the command's layout; the kernel reads and
    // writes only within size_of::<T>().
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size_of::<T>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// One map shape: what ethand's map holds at the scale suite's load.
struct Shape {
    map: &'static str,
    key_size: usize,
    value_size: usize,
    capacity: u32,
    entries: u32,
}

/// Seconds per whole-map read of a filled map of `shape`.
fn read_cost(shape: &Shape, reads: u32) -> Result<f64> {
    let mut create = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: shape.key_size as u32,
        value_size: shape.value_size as u32,
        max_entries: shape.capacity,
        ..Default::default()
    };
    let fd = bpf(BPF_MAP_CREATE, &mut create)?;
    // SAFETY: a new fd the kernel just returned, owned here alone.
    let map = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut key = vec![0u8; shape.key_size];
    let value = vec![1u8; shape.value_size];
    for i in 0..shape.entries {
        // Spread over the key like tids and tgids are (the hash does the rest).
        key[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_ne_bytes());
        let mut e = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut e)?;
    }
    // Buffers for the whole map in one call, as the daemon's grown buffers are.
    let chunk = shape.entries.max(1) as usize * 2;
    let mut keys = vec![0u8; shape.key_size * chunk];
    let mut values = vec![0u8; shape.value_size * chunk];
    let t = Instant::now();
    for _ in 0..reads {
        let (mut token_in, mut token_out, mut first, mut read) = (0u64, 0u64, true, 0);
        loop {
            let mut b = BatchAttr {
                in_batch: if first { 0 } else { &raw const token_in as u64 },
                out_batch: &raw mut token_out as u64,
                keys: keys.as_mut_ptr() as u64,
                values: values.as_mut_ptr() as u64,
                count: chunk as u32,
                map_fd: map.as_raw_fd() as u32,
                ..Default::default()
            };
            let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut b);
            read += b.count;
            match r {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Err(e) => return Err(e.into()),
            }
            token_in = token_out;
            first = false;
        }
        if read != shape.entries {
            bail!("{}: read {read} of {} entries", shape.map, shape.entries);
        }
    }
    Ok(t.elapsed().as_secs_f64() / f64::from(reads))
}

pub fn run(args: MapReadArgs) -> Result<()> {
    use ethand_common::{Hist, SyscallHistKey, SyscallKey, SyscallStats, ThreadStats};
    let thread = (size_of::<u32>(), size_of::<ThreadStats>());
    let syscall = (size_of::<SyscallKey>(), size_of::<SyscallStats>());
    let hist = (size_of::<SyscallHistKey>(), size_of::<Hist>());
    // Entries as at the scale suite's load (ethand_bpf_map_entries): 1,526 threads, 6,751
    // syscall and 3,222 histogram entries; at the default capacities, and smaller ones (fewer
    // buckets), and with a value of one word (the copy's share).
    let shapes = [
        ("THREADS", thread, 32_768, 1_526),
        ("THREADS", thread, 2_048, 1_526),
        ("SYSCALLS", syscall, 65_536, 6_751),
        ("SYSCALLS", syscall, 8_192, 6_751),
        ("SYSCALLS", (syscall.0, 8), 65_536, 6_751),
        ("SYSCALL_HIST", hist, 16_384, 3_222),
        ("SYSCALL_HIST", hist, 4_096, 3_222),
        ("SYSCALLS", syscall, 65_536, 0),
    ];
    println!(
        "{:<13} {:>8} {:>10} {:>9} {:>8} {:>13} {:>14}",
        "map", "key B", "value B", "capacity", "entries", "ms per read", "ns per entry"
    );
    for (map, (key_size, value_size), capacity, entries) in shapes {
        let shape = Shape {
            map,
            key_size,
            value_size,
            capacity,
            entries,
        };
        let s = read_cost(&shape, args.reads)?;
        let per_entry = if entries > 0 {
            format!("{:.0}", s * 1e9 / f64::from(entries))
        } else {
            "-".into()
        };
        println!(
            "{map:<13} {key_size:>8} {value_size:>10} {capacity:>9} {entries:>8} {:>13.3} {per_entry:>14}",
            s * 1e3
        );
    }
    Ok(())
}
