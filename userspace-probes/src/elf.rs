//! Symbol resolution for uprobes, done here rather than by aya: we read the dynamic symbol
//! table (plus `.symtab` when present), honour symbol versions (the default version wins over
//! hidden compatibility ones), accept weak symbols (libnccl exports its API as weak aliases of
//! `pnccl*`), refuse IFUNCs (a probe there fires in the resolver, not per call) and turn each
//! virtual address into the file offset the kernel's uprobe wants.
use std::{collections::HashMap, fs, path::Path};

use object::{
    elf,
    read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _, Sym as _},
};

/// Why bytes are not an ELF file [`SymbolTable::parse`] can read: which structure is
/// malformed.
pub use object::read::Error as ParseError;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a 64-bit ELF shared object: {source}")]
    Parse { path: String, source: ParseError },
}

/// Why a wanted symbol cannot be probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// Not exported by this file (another version of the library).
    Missing,
    /// An indirect function: a probe on it would fire once, in the dynamic linker's resolver.
    Ifunc,
    /// Same address as an earlier symbol in the request: probing both would count twice.
    AliasOf(String),
    /// Its address lies in no loadable segment.
    NoSegment,
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => write!(f, "not exported by this library"),
            Self::Ifunc => write!(f, "an IFUNC (would fire in the resolver, not per call)"),
            Self::AliasOf(s) => write!(f, "alias of {s} (probed once, under {s})"),
            Self::NoSegment => write!(f, "address outside every loadable segment"),
        }
    }
}

/// The defined function symbols of one ELF file: name -> (virtual address, type).
#[derive(Debug, Default)]
pub struct SymbolTable {
    funcs: HashMap<String, (u64, bool)>,
    /// Defined function symbols seen, kept or not.
    seen: usize,
    /// PT_LOAD segments: (vaddr, file offset, file size).
    segments: Vec<(u64, u64, u64)>,
}

impl SymbolTable {
    pub fn read(path: &Path) -> Result<Self, ElfError> {
        let data = fs::read(path).map_err(|source| ElfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data).map_err(|source| ElfError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    /// The file's symbols; the error says which of its structures is malformed.
    pub fn parse(data: &[u8]) -> Result<Self, ParseError> {
        Self::parse_filtered(data, |_| true)
    }

    /// As [`SymbolTable::parse`], keeping only the names `keep` wants: memory bounded by what
    /// the caller asks for, however many symbols the file claims.
    pub fn parse_filtered(data: &[u8], keep: impl Fn(&str) -> bool) -> Result<Self, ParseError> {
        let file = ElfFile64::<object::Endianness>::parse(data)?;
        let endian = file.endian();
        let mut out = Self::default();
        for ph in file.elf_program_headers() {
            if ph.p_type(endian) == elf::PT_LOAD {
                out.segments
                    .push((ph.p_vaddr(endian), ph.p_offset(endian), ph.p_filesz(endian)));
            }
        }
        let header = file.elf_header();
        let sections = header.sections(endian, data)?;
        let versions = sections.versions(endian, data)?;
        // .dynsym first: it is what the dynamic linker uses; .symtab (rarely present in
        // shipped libraries) only adds names.
        for (table, is_dyn) in [
            (file.elf_dynamic_symbol_table(), true),
            (file.elf_symbol_table(), false),
        ] {
            let strings = table.strings();
            for (i, sym) in table.iter().enumerate() {
                let st = sym.st_type();
                let ifunc = st == elf::STT_GNU_IFUNC;
                if !(st == elf::STT_FUNC || ifunc) || sym.st_shndx(endian) == elf::SHN_UNDEF {
                    continue;
                }
                let bind = sym.st_bind();
                if bind != elf::STB_GLOBAL && bind != elf::STB_WEAK {
                    continue;
                }
                let Ok(name) = sym.name(endian, strings) else {
                    continue;
                };
                let Ok(name) = std::str::from_utf8(name) else {
                    continue;
                };
                out.seen += 1;
                if !keep(name) {
                    continue;
                }
                let hidden = is_dyn
                    && versions.as_ref().is_some_and(|v| {
                        v.version_index(endian, object::read::SymbolIndex(i))
                            .is_hidden()
                    });
                let entry = (sym.st_value(endian), ifunc);
                match out.funcs.get(name) {
                    // A hidden (compat) version never replaces what we have.
                    Some(_) if hidden => {}
                    Some(_) if !is_dyn => {}
                    _ => {
                        out.funcs.insert(name.to_string(), entry);
                    }
                }
            }
        }
        Ok(out)
    }

    /// File offset of a virtual address.
    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            // Checked: a segment's fields come from an untrusted file and may sit at u64's end.
            .find(|(v, _, sz)| vaddr >= *v && vaddr - v < *sz)
            .and_then(|(v, off, _)| off.checked_add(vaddr - v))
    }

    /// Resolves `names` in order: the file offset of each, or why not. Two names at one
    /// address resolve once (the first); the second is reported as its alias.
    pub fn resolve<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Vec<(&'a str, Result<u64, Unresolved>)> {
        let mut by_offset: HashMap<u64, &'a str> = HashMap::new();
        names
            .into_iter()
            .map(|name| {
                let r = match self.funcs.get(name) {
                    None => Err(Unresolved::Missing),
                    Some((_, true)) => Err(Unresolved::Ifunc),
                    Some((vaddr, false)) => match self.file_offset(*vaddr) {
                        None => Err(Unresolved::NoSegment),
                        Some(off) => match by_offset.get(&off) {
                            Some(first) => Err(Unresolved::AliasOf(first.to_string())),
                            None => {
                                by_offset.insert(off, name);
                                Ok(off)
                            }
                        },
                    },
                };
                (name, r)
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.funcs.len()
    }

    /// Defined function symbols in the file (with those a filtered parse did not keep).
    pub fn functions_seen(&self) -> usize {
        self.seen
    }

    pub fn is_empty(&self) -> bool {
        self.funcs.is_empty()
    }

    /// Every defined function name with the given prefix (for `ethand survey`).
    pub fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .funcs
            .iter()
            .filter(|(n, (_, ifunc))| n.starts_with(prefix) && !ifunc)
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libc is an ELF with versioned symbols (and hidden compat versions): the resolver
    /// finds `getpid`, reports a made-up name missing, and offsets fall in the file.
    #[test]
    fn segments_at_the_end_of_the_address_space_do_not_overflow() {
        // Found by the elf fuzz target: vaddr + size and offset + delta past u64::MAX.
        let mut t = SymbolTable::default();
        t.segments.push((u64::MAX - 8, u64::MAX - 2, 64));
        t.funcs.insert("edge".into(), (u64::MAX - 4, false));
        t.funcs.insert("below".into(), (3, false));
        let r = t.resolve(["edge", "below"]);
        assert_eq!(r[0].1, Err(Unresolved::NoSegment));
        assert_eq!(r[1].1, Err(Unresolved::NoSegment));
        t.segments.push((0x1000, 0x200, 0x100));
        t.funcs.insert("inside".into(), (0x1010, false));
        assert_eq!(t.resolve(["inside"])[0].1, Ok(0x210));
    }

    #[test]
    fn a_file_that_is_not_elf_is_refused_with_its_cause() {
        let e = SymbolTable::read(Path::new("/proc/self/status")).unwrap_err();
        assert!(matches!(e, ElfError::Parse { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("/proc/self/status is not a 64-bit ELF shared object: "),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert!(SymbolTable::parse(b"\x7fELF").is_err());
    }

    #[test]
    fn resolves_libc() {
        let path = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("libc.so.6");
        let t = SymbolTable::read(path).unwrap();
        let len = fs::metadata(path).unwrap().len();
        let r = t.resolve(["getpid", "no_such_function_xyz", "memcpy"]);
        let off = *r[0].1.as_ref().unwrap();
        assert!(off > 0 && off < len);
        assert_eq!(r[1].1, Err(Unresolved::Missing));
        // memcpy is an IFUNC in glibc on x86_64.
        assert_eq!(r[2].1, Err(Unresolved::Ifunc));
    }
}
