//! Kernel stacks to frames, for the CPU profile (`cpu_profile.rs`) and `ethand record`: from
//! `/proc/kallsyms`, read through a descriptor opened at start-up (the kernel decides at open
//! whether the reader may see the addresses: CAP_SYSLOG, which the daemon gives up after
//! start-up). Kernel symbols are the kernel's own text, not a user's. User stacks are
//! symbolized by the reader (`pipeline/reader.rs`), never here.
use std::{
    io::{Read, Seek},
    sync::Mutex,
};

use ethand_snapshot::stacks::{Frame, FrameKind};

/// `/proc/kallsyms`, opened while the daemon may still see kernel addresses.
pub struct Kallsyms(Mutex<Option<std::fs::File>>);

impl Kallsyms {
    pub fn open() -> Self {
        Self(Mutex::new(std::fs::File::open("/proc/kallsyms").ok()))
    }

    /// The kernel's function symbols; None where kallsyms cannot be read or shows no
    /// addresses (a reader without CAP_SYSLOG sees zeros).
    pub fn load(&self) -> Option<KernelSymbols> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let f = guard.as_mut()?;
        f.rewind().ok()?;
        let mut text = String::new();
        f.read_to_string(&mut text).ok()?;
        KernelSymbols::parse(&text)
    }
}

/// Kernel function symbols by address.
pub struct KernelSymbols {
    /// (address, name), sorted by address.
    syms: Vec<(u64, Box<str>)>,
}

impl KernelSymbols {
    /// Text symbols of kallsyms' "ADDRESS TYPE NAME [MODULE]" lines; None when every address
    /// is hidden (0).
    pub fn parse(text: &str) -> Option<Self> {
        let mut syms: Vec<(u64, Box<str>)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_ascii_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then(|| (addr, name.into()))
            })
            .collect();
        if syms.is_empty() {
            return None;
        }
        syms.sort_unstable_by_key(|(a, _)| *a);
        Some(Self { syms })
    }

    /// Frames of a kernel stack (innermost first: the first address exact, the others return
    /// addresses).
    pub fn frames(&self, ips: &[u64]) -> Vec<Frame> {
        ips.iter()
            .enumerate()
            .map(|(i, ip)| {
                let at = if i == 0 { *ip } else { ip.saturating_sub(1) };
                let idx = self.syms.partition_point(|(a, _)| *a <= at);
                Frame {
                    kind: FrameKind::Kernel,
                    function: idx
                        .checked_sub(1)
                        .and_then(|i| self.syms.get(i))
                        .map(|(_, n)| n.to_string()),
                    ..Frame::default()
                }
            })
            .collect()
    }
}

/// Frames of a kernel stack where no symbols could be read: the addresses are not shown
/// (they locate the kernel in memory); each frame says only that it is the kernel's.
pub fn unnamed_kernel_frames(n: usize) -> Vec<Frame> {
    vec![
        Frame {
            kind: FrameKind::Kernel,
            module: Some("[kernel]".into()),
            ..Frame::default()
        };
        n
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms_lines_become_sorted_function_symbols() {
        let text = "ffffffff81000000 T _stext\n\
                    ffffffff81002000 t do_nanosleep\n\
                    ffffffff81001000 T schedule\n\
                    ffffffff81003000 D some_data\n\
                    ffffffffc0000000 t nv_ioctl\t[nvidia]\n\
                    garbage line\n";
        let k = KernelSymbols::parse(text).expect("symbols");
        let f = k.frames(&[0xffffffff81001010, 0xffffffff81002000, 0xffffffffc0000100]);
        let names: Vec<_> = f.iter().map(|f| f.function.as_deref()).collect();
        // The second address is a return address: the call ended at 0x...2000, in the
        // function before it.
        assert_eq!(
            names,
            vec![Some("schedule"), Some("schedule"), Some("nv_ioctl")]
        );
        assert!(f.iter().all(|f| f.kind == FrameKind::Kernel));
        // Below the first symbol: no name.
        assert_eq!(k.frames(&[0x1000])[0].function, None);
    }

    #[test]
    fn hidden_addresses_are_no_symbols() {
        let text = "0000000000000000 T _stext\n0000000000000000 t schedule\n";
        assert!(KernelSymbols::parse(text).is_none());
    }
}
