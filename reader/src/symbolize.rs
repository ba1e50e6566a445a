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
    owner::ProcessError,
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

/// (device major, device minor, inode) of a mapped file.
type FileKey = (u32, u32, u64);
/// A file opened once, its module name, the offsets wanted in it.
type Wanted = (File, String, Vec<u64>);
/// What a file offset resolved to: (function, file, line).
type Sym = (Option<String>, Option<String>, Option<u32>);

/// Symbolizes `job`; `parsing` is told each file before it is parsed. Returns the stacks
/// and one note per file that could not be used.
pub fn run(
    job: Job<'_>,
    parsing: impl FnMut(FileId, &str),
) -> Result<(Vec<SymStack>, Vec<String>), ProcessError> {
    let pid = job.pid;
    let mut maps = ProcMaps::open(pid).map_err(|source| ProcessError::Mappings { pid, source })?;
    let roots = Roots::of(pid).map_err(|source| ProcessError::Root { pid, source })?;
    let lookups = lookup_addresses(&job.stacks);
    let located = Located::find(&mut maps, &lookups);
    let mut notes = Vec::new();
    // Why a file's frames have no names, by file: the frames' `unresolved`.
    let mut unusable: HashMap<FileKey, String> = HashMap::new();
    let by_file = open_files(&located, &roots, job.as_owner, &mut unusable, &mut notes);
    let syms = symbolize_files(by_file, &job, parsing, &mut unusable, &mut notes);
    let stacks = lookups
        .iter()
        .map(|ips| {
            let frames = frames(ips, &located, &syms, &unusable);
            let source = source_line(&frames, &job, &roots);
            SymStack { frames, source }
        })
        .collect();
    Ok((stacks, notes))
}

/// The addresses to look up, bounded: a return address is the instruction after the call,
/// so the call itself is looked up (all but the first, exact, address).
fn lookup_addresses(stacks: &[Vec<u64>]) -> Vec<Vec<u64>> {
    stacks
        .iter()
        .take(MAX_STACKS)
        .map(|ips| {
            ips.iter()
                .take(MAX_STACK_FRAMES)
                .enumerate()
                .map(|(i, ip)| if i == 0 { *ip } else { ip.saturating_sub(1) })
                .collect()
        })
        .collect()
}

/// The mapping of every address, each looked up once.
struct Located {
    vmas: Vec<Vma>,
    /// Address -> its mapping in `vmas` (None: not mapped).
    at: HashMap<u64, Option<usize>>,
}

impl Located {
    fn find(maps: &mut ProcMaps, lookups: &[Vec<u64>]) -> Self {
        let mut vmas: Vec<Vma> = Vec::new();
        let mut at: HashMap<u64, Option<usize>> = HashMap::new();
        for &a in lookups.iter().flatten() {
            if at.contains_key(&a) {
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
            at.insert(a, i);
        }
        Self { vmas, at }
    }

    fn vma(&self, a: u64) -> Option<&Vma> {
        self.at.get(&a).copied().flatten().map(|i| &self.vmas[i])
    }
}

/// Opens each mapped file once (by device and inode) with the offsets wanted in it; a file
/// that cannot be opened goes to `unusable` and `notes`.
fn open_files(
    located: &Located,
    roots: &Roots,
    as_owner: bool,
    unusable: &mut HashMap<FileKey, String>,
    notes: &mut Vec<String>,
) -> BTreeMap<FileKey, Wanted> {
    let mut by_file: BTreeMap<FileKey, Wanted> = BTreeMap::new();
    for (&a, i) in &located.at {
        let Some(v) = i.map(|i| &located.vmas[i]) else {
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
        match open_for(roots, v, as_owner) {
            Ok(f) => {
                by_file.insert(key, (f, module_name(v), vec![v.file_offset(a)]));
            }
            Err(why) => {
                notes.push(format!("{}: {why}", module_name(v)));
                unusable.insert(key, why.to_string());
            }
        }
    }
    by_file
}

/// Parses each file (blazesym, through `/proc/self/fd/N`) for the offsets wanted in it,
/// telling `parsing` first; a file skipped or that fails goes to `unusable` and `notes`.
fn symbolize_files(
    by_file: BTreeMap<FileKey, Wanted>,
    job: &Job<'_>,
    mut parsing: impl FnMut(FileId, &str),
    unusable: &mut HashMap<FileKey, String>,
    notes: &mut Vec<String>,
) -> HashMap<(FileKey, u64), Sym> {
    let symbolizer = Symbolizer::builder()
        .enable_code_info(job.code_info)
        .enable_demangling(true)
        .enable_inlined_fns(false)
        .enable_auto_reload(false)
        // No debug directory of the host is searched for a file the process names.
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .build();
    let mut syms: HashMap<(FileKey, u64), Sym> = HashMap::new();
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
                        syms.insert((key, *off), resolved(sym));
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
    syms
}

/// A symbol's name, file and line, cut to [`MAX_NAME`].
fn resolved(sym: blazesym::symbolize::Sym<'_>) -> Sym {
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
    (Some(cut(sym.name.into_owned(), MAX_NAME)), file, line)
}

/// The frames of one stack: module and offset where mapped, names where resolved, and why
/// not where the file was unusable.
fn frames(
    ips: &[u64],
    located: &Located,
    syms: &HashMap<(FileKey, u64), Sym>,
    unusable: &HashMap<FileKey, String>,
) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(ips.len());
    for (i, &a) in ips.iter().enumerate() {
        let back = u64::from(i != 0);
        let Some(v) = located.vma(a) else {
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
    frames
}

/// The source text of the innermost frame with a file and line (past the first module's
/// frames when the job says so), read as the owner; None without the owner's credentials.
fn source_line(frames: &[Frame], job: &Job<'_>, roots: &Roots) -> Option<String> {
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
    (job.source_lines && job.as_owner)
        .then(|| {
            frames
                .iter()
                .skip(skip)
                .find(|f| f.file.is_some() && f.line.is_some())
                .and_then(|f| source::line(roots, f.file.as_deref()?, f.line?))
        })
        .flatten()
}

/// Why a mapped file is not parsed (a note, and its frames' `unresolved`).
#[derive(Debug, thiserror::Error)]
enum Unusable {
    #[error(transparent)]
    Open(#[from] procmaps::OpenError),
    #[error(transparent)]
    Stat(std::io::Error),
    #[error(
        "not read: the reader could not take the process owner's credentials and the file is not world-readable"
    )]
    NotWorldReadable,
}

/// Opens the file a mapping maps, as this worker may: without the owner's credentials only
/// a world-readable file.
fn open_for(roots: &Roots, v: &Vma, as_owner: bool) -> Result<File, Unusable> {
    let f = procmaps::open_mapped(&roots.root, v)?;
    if !as_owner {
        use std::os::unix::fs::PermissionsExt;
        let mode = f.metadata().map_err(Unusable::Stat)?.permissions().mode();
        if mode & 0o004 == 0 {
            return Err(Unusable::NotWorldReadable);
        }
    }
    Ok(f)
}
