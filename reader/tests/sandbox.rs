//! The reader against what it is for: a real supervisor (this crate's `ethand-reader`
//! binary), real workers, and files made to hurt it. Runs as any user; the parts that need
//! root (another owner's credentials) say so and are covered again by the daemon's
//! end-to-end tests, which CI runs as root.
use std::{
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use ethand_reader::{Reader, SymbolizeOptions, supervisor::Args};

fn reader() -> Reader {
    Reader::spawn(
        Command::new(env!("CARGO_BIN_EXE_ethand-reader")),
        &Args::default(),
    )
    .expect("spawn the supervisor")
}

fn me() -> (u32, Option<u64>) {
    let pid = std::process::id();
    (pid, ethand_reader::owner::start_ticks(pid))
}

fn opts(code_info: bool) -> SymbolizeOptions {
    SymbolizeOptions {
        code_info,
        source_lines: false,
        source_skip_first_module: false,
        deadline: Duration::from_secs(10),
    }
}

#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn ethand_reader_test_marker(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3)
}

/// A temporary directory of this test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ethand-reader-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        // Workers run as the owner: let anyone traverse (the unprivileged pass runs as nobody).
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Self(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Maps `path` executable into this process; the address of its first byte. Never unmapped
/// (the test process ends soon).
fn map(path: &Path) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    use std::os::fd::AsRawFd;
    // SAFETY: a private read-only mapping of our own file.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(a, libc::MAP_FAILED);
    a as u64
}

#[test]
fn own_functions_are_named_and_the_worker_is_boxed() {
    let r = reader();
    let (pid, start) = me();
    let addr = ethand_reader_test_marker as *const () as usize as u64;
    let out = r.symbolize(pid, start, &[vec![addr + 1, 0x10]], opts(false));
    assert_eq!(out.stacks.len(), 1, "{:?}", out.notes);
    let f = &out.stacks[0].frames[0];
    assert_eq!(
        f.function.as_deref(),
        Some("ethand_reader_test_marker"),
        "{f:?} {:?}",
        out.notes
    );
    assert!(
        f.module.as_deref().is_some_and(|m| m.contains("sandbox")),
        "{f:?}"
    );
    // An address in no mapping keeps its value.
    assert_eq!(out.stacks[0].frames[1].module, None);

    // The worker's box, as the kernel reports it.
    let mut s = r.session(pid, start).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.worker_pid)).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    // The filter is installed before the first request is read: ask once, then look.
    s.symbolize(pid, start, &[vec![addr]], opts(false)).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.worker_pid)).unwrap();
    let field2 = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field2("Seccomp:"), "2", "{status}");
    assert_eq!(field2("NoNewPrivs:"), "1");
    let eff = u64::from_str_radix(&field2("CapEff:"), 16).unwrap();
    assert_eq!(eff & !(1 << 19), 0, "only CAP_SYS_PTRACE may stay: {eff:x}");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert!(
        field("Uid:")
            .split_whitespace()
            .all(|u| u == uid.to_string())
    );
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", s.worker_pid)).unwrap();
    assert_eq!(adj.trim(), "1000");
}

/// Builds `name.so` from C source with debug information; None without a C compiler.
fn build_so(dir: &Path, name: &str, src: &str) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let so = dir.join(format!("{name}.so"));
    let ok = Command::new("cc")
        .args(["-g", "-O0", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .ok()?
        .success();
    ok.then_some(so)
}

/// The file offset and size of section `name` of a 64-bit little-endian ELF file.
fn section(data: &[u8], name: &str) -> Option<(usize, usize)> {
    let u16_at = |o: usize| u16::from_le_bytes(data[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap()) as usize;
    let shoff = u64_at(0x28);
    let (shentsize, shnum, shstrndx) = (u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let strtab = u64_at(shoff + shstrndx * shentsize + 0x18);
    (0..shnum).find_map(|i| {
        let h = shoff + i * shentsize;
        let n = strtab + u32_at(h);
        let end = data[n..].iter().position(|&c| c == 0)?;
        (&data[n..n + end] == name.as_bytes()).then(|| (u64_at(h + 0x18), u64_at(h + 0x20)))
    })
}

/// A 16 KB library whose compressed `.debug_str` claims to decompress to 1 TiB: parsing its
/// DWARF kills the worker (its memory limit), never the caller; the retry skips the file,
/// and a later request does not parse it again.
#[test]
fn a_decompression_bomb_kills_a_worker_not_the_caller() {
    let d = Dir::new("bomb");
    let Some(so) = build_so(
        &d.0,
        "bomb",
        "int bomb_fn(int x) { return x * 7; }\nint other_fn(int x) { return x + 1; }\n",
    ) else {
        eprintln!("skipped: no C compiler");
        return;
    };
    let z = d.0.join("bomb.z.so");
    let ok = Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(&so)
        .arg(&z)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: no objcopy");
        return;
    }
    let mut data = std::fs::read(&z).unwrap();
    let (off, _) = section(&data, ".debug_info").expect(".debug_info");
    // Elf64_Chdr: ch_type (u32), ch_reserved (u32), ch_size (u64), ch_addralign (u64).
    assert_eq!(
        u32::from_le_bytes(data[off..off + 4].try_into().unwrap()),
        1,
        "zlib"
    );
    data[off + 8..off + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    if let Some((o, _)) = section(&data, ".debug_str") {
        data[o + 8..o + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    }
    std::fs::write(&z, &data).unwrap();
    assert!(data.len() < 64 << 10);
    let base = map(&z);
    let r = reader();
    let (pid, start) = me();
    let t0 = Instant::now();
    let out = r.symbolize(pid, start, &[vec![base + 0x1100]], opts(true));
    assert!(t0.elapsed() < Duration::from_secs(20));
    let f = &out.stacks[0].frames[0];
    assert!(
        f.module
            .as_deref()
            .is_some_and(|m| m.ends_with("bomb.z.so"))
            || f.unresolved.is_some(),
        "{f:?}"
    );
    let blamed = r.blamed();
    let died = out.notes.iter().any(|n| n.contains("ended while parsing"));
    // Either blazesym refuses the size itself, or the worker died on it and it is blamed.
    assert!(
        died == !blamed.is_empty(),
        "notes {:?}, blamed {blamed:?}",
        out.notes
    );
    if died {
        // The retry skipped it and says so.
        assert!(
            f.unresolved
                .as_deref()
                .is_some_and(|u| u.contains("made the reader fail")),
            "{f:?}"
        );
        let again = r.symbolize(pid, start, &[vec![base + 0x1100]], opts(true));
        assert!(
            !again.notes.iter().any(|n| n.contains("ended while")),
            "{:?}",
            again.notes
        );
    }
    // Still serving.
    let addr = ethand_reader_test_marker as *const () as usize as u64;
    let ok = r.symbolize(pid, start, &[vec![addr]], opts(false));
    assert_eq!(
        ok.stacks[0].frames[0].function.as_deref(),
        Some("ethand_reader_test_marker")
    );
}

/// A mapped file whose path now names a FIFO: refused at once, never opened.
#[test]
fn a_fifo_at_a_mapped_path_is_never_opened() {
    let d = Dir::new("fifo");
    let Some(so) = build_so(&d.0, "lib a\nb", "int f(int x) { return x; }\n") else {
        eprintln!("skipped: no C compiler");
        return;
    };
    let base = map(&so);
    std::fs::remove_file(&so).unwrap();
    let c = std::ffi::CString::new(so.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let r = reader();
    let (pid, start) = me();
    let t0 = Instant::now();
    let out = r.symbolize(pid, start, &[vec![base + 0x1000]], opts(true));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let f = &out.stacks[0].frames[0];
    assert!(
        f.module
            .as_deref()
            .is_some_and(|m| m.contains("lib a\nb.so")),
        "{f:?}"
    );
    assert!(
        f.unresolved.as_deref().is_some_and(|u| u.contains("FIFO")),
        "{f:?} {:?}",
        out.notes
    );
}

/// A request for a process that has gone, or a pid reused since, is refused.
#[test]
fn a_reused_pid_is_refused() {
    let r = reader();
    let (pid, start) = me();
    let err = r.session(pid, start.map(|s| s + 1)).err().expect("refused");
    assert!(err.to_string().contains("reused"), "{err}");
    assert!(r.session(u32::MAX - 7, None).is_err());
}

/// Sessions beyond the limit are refused, and free again once closed.
#[test]
fn workers_are_capped() {
    let args = Args {
        limits: ethand_reader::Limits {
            max_workers: 2,
            ..Default::default()
        },
        ..Args::default()
    };
    let r = Reader::spawn(Command::new(env!("CARGO_BIN_EXE_ethand-reader")), &args).unwrap();
    let (pid, start) = me();
    let a = r.session(pid, start).unwrap();
    let b = r.session(pid, start).unwrap();
    let c = r.session(pid, start);
    assert!(c.err().is_some_and(|e| e.to_string().contains("busy")));
    drop(a);
    drop(b);
    let t0 = Instant::now();
    loop {
        match r.session(pid, start) {
            Ok(_) => break,
            Err(e) if t0.elapsed() > Duration::from_secs(5) => panic!("still refused: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
