//! Instruction pointers of a process's user stacks to frames, inside a worker. Each address is
//! located by the kernel (`PROCMAP_QUERY`: the mapping, its raw path, device and inode), its
//! file opened by what is mapped (`procmaps::open_mapped`: a regular file with that device
//! and inode, inside the process's root, readable by the owner) and parsed by blazesym (ELF
//! symbols, DWARF file and line, demangling) through `/proc/self/fd/N`. A file that cannot
//! be opened gives frames with its module and offset and a note saying why; a file in the
//! caller's skip list (it made a worker fail before) is not parsed again.
use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    os::fd::AsRawFd,
    path::PathBuf,
};

use blazesym::symbolize::{Input, Symbolized, Symbolizer, source::Elf, source::Source};
use ethand_snapshot::stacks::Frame;
use ethand_userspace_probes::procmaps::{self, ProcMaps, Vma};

use crate::{
    proto::{FileId, MAX_NAME, MAX_STACK_FRAMES, MAX_STACKS, SymStack, cut},
    source::{self, Roots},
};

/// What one request needs.
pub struct Job<'a> {
    pub pid: u32,
    pub stacks: Vec<Vec<u64>>,
    pub code_info: bool,
    pub source_lines: bool,
    pub source_skip_first_module: bool,
    pub skip: &'a [FileId],
    /// The worker took the owner's credentials; without them only world-readable files are
    /// parsed and no source line is read.
    pub as_owner: bool,
}

/// The identity of an open file.
pub fn file_id(f: &File) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata().ok()?;
    Some(FileId {
        dev_major: libc::major(m.dev()),
        dev_minor: libc::minor(m.dev()),
        inode: m.ino(),
        size: m.size(),
        mtime_ns: m
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(m.mtime_nsec()),
    })
}

/// A mapping's name as a module name for outputs.
fn module_name(v: &Vma) -> String {
    if v.name.is_empty() {
        return "[anon]".into();
    }
    cut(String::from_utf8_lossy(&v.name).into_owned(), MAX_NAME)
}

/// Symbolizes `job`; `parsing` is told each file before it is parsed. Returns the stacks
/// and one note per file that could not be used.
pub fn run(
    job: Job<'_>,
    mut parsing: impl FnMut(FileId, &str),
) -> Result<(Vec<SymStack>, Vec<String>), String> {
    let pid = job.pid;
    let mut maps = ProcMaps::open(pid)
        .map_err(|e| format!("cannot read the mappings of process {pid}: {e}"))?;
    let roots =
        Roots::of(pid).map_err(|e| format!("cannot open the root of process {pid}: {e}"))?;
    // A return address is the instruction after the call: look up the call itself.
    let lookups: Vec<Vec<u64>> = job
        .stacks
        .iter()
        .take(MAX_STACKS)
        .map(|ips| {
            ips.iter()
                .take(MAX_STACK_FRAMES)
                .enumerate()
                .map(|(i, ip)| if i == 0 { *ip } else { ip.saturating_sub(1) })
                .collect()
        })
        .collect();
    // The mapping of every address, each looked up once.
    let mut vmas: Vec<Vma> = Vec::new();
    let mut where_: HashMap<u64, Option<usize>> = HashMap::new();
    for &a in lookups.iter().flatten() {
        if where_.contains_key(&a) {
            continue;
        }
        let i = match vmas.iter().position(|v| (v.start..v.end).contains(&a)) {
            Some(i) => Some(i),
            None => match maps.at(a) {
                Ok(Some(v)) => {
                    vmas.push(v);
                    Some(vmas.len() - 1)
                }
                _ => None,
            },
        };
        where_.insert(a, i);
    }
    // Per file mapping: its file opened once (by device and inode), the offsets wanted.
    let mut notes = Vec::new();
    // (device, inode) -> (the file, its name, the offsets wanted in it)
    type Wanted = (File, String, Vec<u64>);
    let mut by_file: BTreeMap<(u32, u32, u64), Wanted> = BTreeMap::new();
    let mut unusable: HashMap<(u32, u32, u64), String> = HashMap::new();
    for (&a, i) in &where_ {
        let Some(v) = i.map(|i| &vmas[i]) else {
            continue;
        };
        if !v.is_file() {
            continue;
        }
        let key = (v.dev_major, v.dev_minor, v.inode);
        if unusable.contains_key(&key) {
            continue;
        }
        if let Some(e) = by_file.get_mut(&key) {
            e.2.push(v.file_offset(a));
            continue;
        }
        match open_for(&roots, v, job.as_owner) {
            Ok(f) => {
                by_file.insert(key, (f, module_name(v), vec![v.file_offset(a)]));
            }
            Err(why) => {
                notes.push(format!("{}: {why}", module_name(v)));
                unusable.insert(key, why);
            }
        }
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(job.code_info)
        .enable_demangling(true)
        .enable_inlined_fns(false)
        .enable_auto_reload(false)
        // No debug directory of the host is searched for a file the process names.
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .build();
    // (file key, offset) -> (function, file, line)
    type Sym = (Option<String>, Option<String>, Option<u32>);
    let mut syms: HashMap<((u32, u32, u64), u64), Sym> = HashMap::new();
    for (key, (f, name, mut offsets)) in by_file {
        let Some(id) = file_id(&f) else { continue };
        if job.skip.contains(&id) {
            notes.push(format!(
                "{name}: not parsed: it made the reader fail before"
            ));
            unusable.insert(key, "not parsed: it made the reader fail before".into());
            continue;
        }
        parsing(id, &name);
        offsets.sort_unstable();
        offsets.dedup();
        let src = Source::Elf(Elf {
            debug_syms: job.code_info,
            ..Elf::new(format!("/proc/self/fd/{}", f.as_raw_fd()))
        });
        let inputs = Input::FileOffset(&offsets[..]);
        match symbolizer.symbolize(&src, inputs) {
            Ok(results) => {
                for (off, r) in offsets.iter().zip(results) {
                    if let Symbolized::Sym(sym) = r {
                        let (file, line) = match &sym.code_info {
                            Some(ci) => {
                                let p = match &ci.dir {
                                    Some(d) => d.join(&*ci.file),
                                    None => PathBuf::from(&*ci.file),
                                };
                                (
                                    Some(cut(p.to_string_lossy().into_owned(), MAX_NAME)),
                                    ci.line,
                                )
                            }
                            None => (None, None),
                        };
                        syms.insert(
                            (key, *off),
                            (Some(cut(sym.name.into_owned(), MAX_NAME)), file, line),
                        );
                    }
                }
            }
            Err(e) => {
                notes.push(cut(format!("{name}: {e}"), MAX_NAME));
                unusable.insert(key, "its symbols could not be read".into());
            }
        }
        drop(f);
    }
    let mut stacks = Vec::with_capacity(lookups.len());
    for ips in &lookups {
        let mut frames = Vec::with_capacity(ips.len());
        for (i, &a) in ips.iter().enumerate() {
            let back = u64::from(i != 0);
            let Some(v) = where_.get(&a).copied().flatten().map(|i| &vmas[i]) else {
                frames.push(Frame {
                    offset: Some(a + back),
                    ..Frame::default()
                });
                continue;
            };
            if !v.is_file() {
                frames.push(Frame {
                    module: Some(module_name(v)),
                    offset: Some(a + back - v.start),
                    ..Frame::default()
                });
                continue;
            }
            let off = v.file_offset(a);
            let key = (v.dev_major, v.dev_minor, v.inode);
            let mut f = Frame {
                module: Some(module_name(v)),
                offset: Some(off + back),
                unresolved: unusable.get(&key).cloned(),
                ..Frame::default()
            };
            if let Some((func, file, line)) = syms.get(&(key, off)) {
                f.function = func.clone();
                f.file = file.clone();
                f.line = *line;
            }
            frames.push(f);
        }
        let skip = if job.source_skip_first_module {
            let first = frames.first().map(|f| &f.module);
            1 + frames
                .iter()
                .skip(1)
                .take_while(|f| f.module.is_some() && Some(&f.module) == first)
                .count()
        } else {
            0
        };
        let source = (job.source_lines && job.as_owner)
            .then(|| {
                frames
                    .iter()
                    .skip(skip)
                    .find(|f| f.file.is_some() && f.line.is_some())
                    .and_then(|f| source::line(&roots, f.file.as_deref()?, f.line?))
            })
            .flatten();
        stacks.push(SymStack { frames, source });
    }
    Ok((stacks, notes))
}

/// Opens the file a mapping maps, as this worker may: without the owner's credentials only
/// a world-readable file.
fn open_for(roots: &Roots, v: &Vma, as_owner: bool) -> Result<File, String> {
    let f = procmaps::open_mapped(&roots.root, v).map_err(|e| e.to_string())?;
    if !as_owner {
        use std::os::unix::fs::PermissionsExt;
        let mode = f
            .metadata()
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        if mode & 0o004 == 0 {
            return Err("not read: the reader could not take the process owner's credentials and the file is not world-readable".into());
        }
    }
    Ok(f)
}
