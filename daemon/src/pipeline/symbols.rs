//! Instruction pointers to frames, for the GPU call sites (`gpu/sites.rs`) and the CPU
//! profile (`cpu_profile.rs`).
//! - User stacks with blazesym: each address normalized to (file, offset) through the
//!   process's maps, the file opened through `/proc/PID/root` (a container's own binaries,
//!   no CAP_SYS_ADMIN needed, unlike `/proc/PID/map_files`).
//! - Kernel stacks from `/proc/kallsyms`, read through a descriptor opened at start-up: the
//!   kernel decides at open whether the reader may see the addresses (CAP_SYSLOG), and the
//!   daemon gives that capability up after start-up.
use std::{
    io::{Read, Seek},
    sync::Mutex,
};

use blazesym::{
    Pid,
    normalize::{Normalizer, UserMeta},
    symbolize::{Input, Symbolized, Symbolizer, source::Elf, source::Source},
};
use ethand_snapshot::stacks::{Frame, FrameKind};

/// Frames of each user stack of process `pid` (innermost first: the first address exact, the
/// others return addresses). `code_info`: file and line from DWARF where the file has it
/// (slower on large libraries).
pub fn user_frames<'a>(
    pid: u32,
    stacks: impl Iterator<Item = &'a [u64]>,
    code_info: bool,
) -> Vec<Vec<Frame>> {
    UserSymbolizer::new(code_info).frames(pid, stacks)
}

/// A symbolizer kept across calls (`ethand record` symbolizes as it goes): the files it has
/// parsed stay parsed.
pub struct UserSymbolizer {
    normalizer: Normalizer,
    symbolizer: Symbolizer,
}

impl UserSymbolizer {
    pub fn new(code_info: bool) -> Self {
        Self {
            normalizer: Normalizer::builder().enable_build_ids(false).build(),
            symbolizer: Symbolizer::builder()
                .enable_code_info(code_info)
                .enable_demangling(true)
                .enable_inlined_fns(false)
                .build(),
        }
    }

    /// See [`user_frames`].
    pub fn frames<'a>(&self, pid: u32, stacks: impl Iterator<Item = &'a [u64]>) -> Vec<Vec<Frame>> {
        let (normalizer, symbolizer) = (&self.normalizer, &self.symbolizer);
        let root = format!("/proc/{pid}/root");
        // For addresses in no file blazesym reads: the mapping's name ("[vdso]", "[anon:...]").
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let named = named_mappings(&maps);
        let inodes = file_inodes(&maps);
        stacks
            .map(|ips| {
                // A return address is the instruction after the call: look up the call itself.
                let lookup: Vec<u64> = ips
                    .iter()
                    .enumerate()
                    .map(|(i, ip)| if i == 0 { *ip } else { ip.saturating_sub(1) })
                    .collect();
                let norm = normalizer
                    .normalize_user_addrs(Pid::from(pid), &lookup)
                    .ok();
                let mut frames: Vec<Frame> = Vec::with_capacity(lookup.len());
                for (i, addr) in lookup.iter().enumerate() {
                    let back = u64::from(i != 0);
                    let mapped = norm.as_ref().and_then(|n| {
                        let (off, m) = *n.outputs.get(i)?;
                        match n.meta.get(m)? {
                            UserMeta::Elf(e) => Some((off, e.path.clone())),
                            _ => None,
                        }
                    });
                    let Some((off, path)) = mapped else {
                        let a = addr + back;
                        let m = named.iter().find(|(lo, hi, _)| (*lo..*hi).contains(&a));
                        frames.push(Frame {
                            module: m.map(|(_, _, n)| n.clone()),
                            offset: Some(m.map_or(a, |(lo, _, _)| a - lo)),
                            ..Frame::default()
                        });
                        continue;
                    };
                    let mut f = Frame {
                        module: Some(path.to_string_lossy().into_owned()),
                        offset: Some(off + back),
                        ..Frame::default()
                    };
                    let file = file_of(&root, &path, &inodes);
                    let src = Source::Elf(Elf::new(file));
                    if let Ok(Symbolized::Sym(sym)) =
                        symbolizer.symbolize_single(&src, Input::FileOffset(off))
                    {
                        f.function = Some(sym.name.into_owned());
                        if let Some(ci) = &sym.code_info {
                            let p = match &ci.dir {
                                Some(d) => d.join(&*ci.file),
                                None => std::path::PathBuf::from(&*ci.file),
                            };
                            f.file = Some(p.to_string_lossy().into_owned());
                            f.line = ci.line;
                        }
                    }
                    frames.push(f);
                }
                frames
            })
            .collect()
    }
}

/// Where to read a file the process maps: through its root (`/proc/PID/root` + the path, a
/// container's own file) where the path exists there; else the path as the daemon sees it when
/// that is the very file mapped (same inode: a chroot or a mount namespace whose files the
/// kernel names by their host path); else through the root (and no symbols).
fn file_of(
    root: &str,
    path: &std::path::Path,
    inodes: &std::collections::HashMap<String, u64>,
) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let in_root = std::path::PathBuf::from(format!("{root}{}", path.display()));
    if in_root.exists() {
        return in_root;
    }
    let same = inodes
        .get(&*path.to_string_lossy())
        .zip(std::fs::metadata(path).ok())
        .is_some_and(|(ino, md)| md.ino() == *ino && md.is_file());
    if same { path.to_path_buf() } else { in_root }
}

/// Inode of each file path in /proc/PID/maps.
fn file_inodes(maps: &str) -> std::collections::HashMap<String, u64> {
    maps.lines()
        .filter_map(|l| {
            let mut it = l.splitn(6, ' ');
            let inode = it.nth(4)?.parse().ok()?;
            let path = it.next()?.trim_start();
            path.starts_with('/').then(|| (path.to_string(), inode))
        })
        .collect()
}

/// The address ranges of /proc/PID/maps lines whose name is not a path ("[vdso]",
/// "[stack]", "[anon:name]"); anonymous lines without a name as "[anon]".
fn named_mappings(maps: &str) -> Vec<(u64, u64, String)> {
    maps.lines()
        .filter_map(|l| {
            let mut it = l.splitn(6, ' ');
            let (lo, hi) = it.next()?.split_once('-')?;
            let name = it.nth(4).map(str::trim).unwrap_or("");
            if name.starts_with('/') {
                return None;
            }
            let name = if name.is_empty() { "[anon]" } else { name };
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
                name.chars().take(64).collect(),
            ))
        })
        .collect()
}

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
    fn mappings_without_a_path_keep_their_names() {
        let maps = "55d0-55e0 r-xp 00000000 08:01 1234 /usr/bin/python3\n\
                    7ff0-7ff2 r-xp 00000000 00:00 0                          [vdso]\n\
                    7a00-7b00 rwxp 00000000 00:00 0 \n";
        let m = named_mappings(maps);
        assert_eq!(
            m,
            vec![
                (0x7ff0, 0x7ff2, "[vdso]".to_string()),
                (0x7a00, 0x7b00, "[anon]".to_string())
            ]
        );
    }

    #[test]
    fn a_file_outside_the_processs_root_is_read_only_when_it_is_the_mapped_one() {
        use std::os::unix::fs::MetadataExt;
        let me = std::env::current_exe().expect("exe");
        let ino = std::fs::metadata(&me).expect("stat").ino();
        let key = me.to_string_lossy().into_owned();
        let root = "/nonexistent-root";
        let right = std::collections::HashMap::from([(key.clone(), ino)]);
        assert_eq!(file_of(root, &me, &right), me);
        let wrong = std::collections::HashMap::from([(key, ino + 1)]);
        assert!(file_of(root, &me, &wrong).starts_with(root));
        let maps = "55d0-55e0 r-xp 00001000 08:01 1234 /usr/bin/python3 (deleted)\n\
                    7ff0-7ff2 r-xp 00000000 00:00 0                          [vdso]\n\
                    7a00-7b00 r--p 00000000 08:01 99    /lib/x.so\n";
        let i = file_inodes(maps);
        assert_eq!(i.get("/lib/x.so"), Some(&99));
        assert_eq!(i.len(), 2);
    }

    #[test]
    fn hidden_addresses_are_no_symbols() {
        let text = "0000000000000000 T _stext\n0000000000000000 t schedule\n";
        assert!(KernelSymbols::parse(text).is_none());
    }
}
