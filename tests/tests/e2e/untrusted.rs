//! What other users control is hostile input (docs/security.md, "What ethand reads of other
//! users"): the files their processes map, their memory, the paths and source files they
//! name, their cgroups and syscalls, and the level switch. Each test is one attack an
//! unprivileged user (uid 65534) can make with a shell and a compiler, bounded in count and
//! time, and asserts what must hold under it: the daemon lives, `/metrics` and the API
//! answer within their timeouts, a process started afterwards is known, the daemon's memory
//! stays bounded, and no byte of a file the attacker may not read reaches any output.
//! Figures are printed (`observed:`).
use std::{
    fs,
    io::Write,
    os::unix::{
        ffi::OsStrExt,
        fs::{MetadataExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{ProbeState, TreeSnapshot, stacks::Frame};
use ethand_tests::{
    Daemon, SETTLE, metric, peak_rss_bytes, run_with_timeout, serial,
    standins::{self, Lib},
    text,
};

const NOBODY: u32 = 65534;
/// The owner of the files the attacker must not read (any uid works; no account needed).
const VICTIM: u32 = 60124;
/// The daemon's own memory bound: the attacks below once took it past the unit's MemoryMax;
/// now what they cost lands in a reader worker, which its own limits end.
const DAEMON_MEMORY_MAX: u64 = 128 << 20;
const TOML: &str = "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 300\n";

/// A directory of this test that every user may traverse, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d =
            std::env::temp_dir().join(format!("ethand-untrusted-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("mkdir");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod");
        Self(d)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Makes `path`'s directories and gives everything under `dir` to `uid`, world-readable
/// and traversable (the attacker builds in its own directory).
fn give(dir: &Path, uid: u32) {
    let out = Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(dir)
        .output()
        .expect("chown");
    assert!(out.status.success(), "chown: {}", text(&out.stderr));
}

/// `cmd` as uid/gid `uid`, no supplementary groups.
fn as_user(uid: u32, prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "--",
    ])
    .arg(prog)
    .args(args);
    c
}

/// Compiles C `src` into `out` with `args` (after the source).
fn cc(dir: &Path, name: &str, src: &str, out: &Path, args: &[&str]) {
    let c = dir.join(format!("{name}.c"));
    fs::write(&c, src).expect("write C");
    let o = Command::new("gcc")
        .args(["-g", "-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(out)
        .arg(&c)
        .args(args)
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc {name}: {}", text(&o.stderr));
}

/// A program that dlopens LIB and, at each line on stdin, calls `FUNC(N)` (a helper) or,
/// for a `cu*` name, `FUNC(0)` N times; prints `done` after each. Stays alive until stdin
/// ends. Usage: caller LIB FUNC N.
const CALLER: &str = r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    int (*f)(long) = (int (*)(long))dlsym(h, argv[2]);
    if (!f) { printf("dlsym failed\n"); return 1; }
    long n = atol(argv[3]);
    int loop = strncmp(argv[2], "cu", 2) == 0;
    printf("ready\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (loop) { for (long i = 0; i < n; i++) f(0); } else { f(n); }
        printf("done\n");
    }
    return 0;
}
"#;

/// A helper library whose `helper_sync(n)` calls cuStreamSynchronize n times: it is on the
/// call stack of every sync it makes.
const HELPER: &str = r#"int cuStreamSynchronize(void *s);
__attribute__((noinline)) int helper_sync(long n) {
    for (long i = 0; i < n; i++) cuStreamSynchronize(0);
    return 0;
}
"#;

/// A running caller: stdin to ask, stdout to hear.
struct Caller {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Caller {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the caller");
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut c = Self { child, out };
        c.expect("ready");
        c
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn expect(&mut self, word: &str) {
        use std::io::BufRead;
        let mut line = String::new();
        self.out.read_line(&mut line).expect("read the caller");
        assert_eq!(line.trim(), word, "the caller said {line:?}");
    }

    fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("write");
        stdin.flush().expect("flush");
        self.expect("done");
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
        (&data[n..n + end] == name.as_bytes()).then(|| (h, u64_at(h + 0x18)))
    })
}

/// Builds the helper library at `out` with compressed DWARF, then makes it a bomb: `claim`
/// sets the compressed `.debug_info`'s claimed size to 1 TiB (16 KB file); `real` replaces
/// it by 1 GiB of real zlib (a 1 MB file).
fn bomb_library(dir: &Path, out: &Path, real: bool) {
    let s = standins::shared();
    let plain = dir.join("plain.so");
    let libdir = s.cuda.parent().expect("dir");
    cc(
        dir,
        "helper",
        HELPER,
        &plain,
        &[
            "-shared",
            "-fPIC",
            &format!("-L{}", libdir.display()),
            "-l:libcuda.so.1",
        ],
    );
    let o = Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(&plain)
        .arg(out)
        .output()
        .expect("objcopy");
    assert!(o.status.success(), "objcopy: {}", text(&o.stderr));
    if real {
        // Chdr (zlib, 1 GiB, align 1) and 1 GiB of zeros deflated: about 1 MB.
        let payload = dir.join("payload");
        let py = format!(
            "import struct,zlib\nc=zlib.compressobj(9)\nf=open({:?},'wb')\n\
             f.write(struct.pack('<IIQQ',1,0,1<<30,1))\nz=bytes(1<<20)\n\
             for _ in range(1024): f.write(c.compress(z))\nf.write(c.flush())\n",
            payload.display().to_string()
        );
        let o = Command::new("python3")
            .args(["-c", &py])
            .output()
            .expect("python3");
        assert!(o.status.success(), "python3: {}", text(&o.stderr));
        let o = Command::new("objcopy")
            .arg(format!(
                "--update-section=.debug_info={}",
                payload.display()
            ))
            .arg(out)
            .output()
            .expect("objcopy");
        assert!(
            o.status.success(),
            "objcopy --update-section: {}",
            text(&o.stderr)
        );
    } else {
        let mut data = fs::read(out).expect("read");
        let (_, off) = section(&data, ".debug_info").expect(".debug_info");
        data[off + 8..off + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        fs::write(out, &data).expect("write");
    }
}

/// `ethand snapshot --pid PID` in `format` (json, text, html, csv) as text, within `limit`.
fn snapshot_text(d: &Daemon, pid: u32, extra: &[&str], limit: Duration) -> String {
    let sock = d.socket.to_str().expect("utf-8");
    let html = std::env::temp_dir().join(format!(
        "ethand-untrusted-{}-{pid}.html",
        std::process::id()
    ));
    let mut args = vec!["snapshot", "--pid"];
    let p = pid.to_string();
    args.push(&p);
    args.extend(extra);
    let h = html.to_str().expect("utf-8").to_string();
    if extra.contains(&"--html") {
        args.push(&h);
    }
    args.extend(["--socket", sock]);
    let t0 = Instant::now();
    let o = run_with_timeout(Command::new(ethand_tests::ethand_bin()).args(&args), limit);
    assert!(
        o.status.success(),
        "snapshot {extra:?} failed after {:?}: {}",
        t0.elapsed(),
        text(&o.stderr)
    );
    let mut all = text(&o.stdout);
    if let Ok(h) = fs::read_to_string(&html) {
        all.push_str(&h);
        let _ = fs::remove_file(&html);
    }
    all
}

/// The daemon is alive, answers /metrics and status promptly, its rounds go on, and a
/// process started now is known.
fn still_serving(d: &Daemon, what: &str) {
    let t0 = Instant::now();
    let body = d.metrics();
    let scrape = t0.elapsed();
    let stamp =
        metric(&body, "ethand_last_round_timestamp_seconds").expect("the round's timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let st = d.status();
    let mut fresh = Command::new("sleep").arg("30").spawn().expect("sleep");
    thread::sleep(SETTLE);
    let known = d.cli(&["snapshot", "--pid", &fresh.id().to_string(), "--json"]);
    let _ = fresh.kill();
    let _ = fresh.wait();
    println!(
        "observed ({what}): /metrics in {scrape:?}, last round {:.1} s old, status round age {:?} ms",
        now - stamp,
        st.last_round_age_ms
    );
    assert!(
        scrape < Duration::from_secs(2),
        "{what}: /metrics took {scrape:?}"
    );
    assert!(
        now - stamp < 5.0,
        "{what}: /metrics serves a round {:.1} s old",
        now - stamp
    );
    assert!(
        st.last_round_age_ms.is_some_and(|a| a < 5000),
        "{what}: {:?}",
        st.last_round_age_ms
    );
    assert!(
        known.status.success(),
        "{what}: a new process is not known: {}",
        text(&known.stderr)
    );
}

/// Rows "a helper library on a GPU call stack whose compressed .debug_str header claims
/// 1 TiB" and "the same with 1 GiB of real zlib in a 1 MB file": before, the next scrape
/// aborted the daemon, or took it from 48 to 1,095 MB. Now /metrics never symbolizes, and a
/// snapshot's worker dies on the file while the daemon goes on.
#[test]
fn decompression_bombs_on_a_call_stack_cost_a_worker_not_the_daemon() {
    let _serial = serial();
    let dir = Dir::new("bomb");
    let s = standins::shared();
    let caller = dir.path("caller");
    cc(&dir.0, "caller", CALLER, &caller, &["-ldl"]);
    let claim = dir.path("libclaim.so");
    bomb_library(&dir.0, &claim, false);
    let real = dir.path("libreal.so");
    bomb_library(&dir.0, &real, true);
    give(&dir.0, NOBODY);
    let d = Daemon::start("untrusted-bomb", TOML);
    let rss0 = peak_rss_bytes(d.pid());
    for (name, lib) in [("1 TiB claimed", &claim), ("1 GiB of zlib", &real)] {
        let mut c = Caller::start({
            let mut cmd = as_user(
                NOBODY,
                &caller,
                &[lib.to_str().unwrap(), "helper_sync", "37"],
            );
            cmd.env("LD_LIBRARY_PATH", s.cuda.parent().unwrap());
            cmd
        });
        thread::sleep(Duration::from_millis(1500));
        c.go();
        thread::sleep(SETTLE);
        // Scrapes never symbolize.
        for _ in 0..3 {
            still_serving(&d, name);
        }
        let t = snapshot_text(&d, c.pid(), &["--json"], Duration::from_secs(30));
        let t: TreeSnapshot = serde_json::from_str(&t).expect("JSON");
        let g = t.processes[0].gpu.as_ref().expect("gpu");
        let sites = g
            .call_sites
            .iter()
            .find(|s| s.call == "cuStreamSynchronize")
            .expect("sync sites");
        let frames: Vec<&Frame> = sites.sites.iter().flat_map(|s| &s.frames).collect();
        println!(
            "observed ({name}): {} sync calls; frames {frames:?}",
            sites.total
        );
        assert_eq!(sites.total, 37);
        // The caller's own frames are named; the bomb's frame says why it is not.
        assert!(
            frames
                .iter()
                .any(|f| f.module.as_deref().is_some_and(|m| m.ends_with(".so"))
                    && f.unresolved.is_some()),
            "{frames:?}"
        );
        let _ = snapshot_text(&d, c.pid(), &["--cpu-profile"], Duration::from_secs(30));
        still_serving(&d, name);
    }
    let st = d.status();
    let r = st.reader.expect("reader status");
    let rss1 = peak_rss_bytes(d.pid());
    println!(
        "observed: daemon VmHWM {} -> {} MB; reader {r:?}",
        rss0 >> 20,
        rss1 >> 20
    );
    assert!(r.pid.is_some() && r.died >= 1, "{r:?}");
    assert!(!r.blamed_files.is_empty(), "{r:?}");
    assert!(rss1 < DAEMON_MEMORY_MAX, "daemon VmHWM {} MB", rss1 >> 20);
}

/// Row "a 16 KB program named python3 whose .bss section claims 1 TiB": before, any snapshot
/// of a tree holding it aborted the daemon (py-spy's version lookup). Now its worker dies
/// and the snapshot says so.
#[test]
fn a_python_binary_with_a_huge_bss_costs_a_worker_not_the_daemon() {
    let _serial = serial();
    let dir = Dir::new("bss");
    let py = dir.path("python3");
    cc(
        &dir.0,
        "fakepy",
        "#include <unistd.h>\nchar big[4096];\nint main(void) { big[0] = 1; for (;;) pause(); }\n",
        &py,
        &[],
    );
    let mut data = fs::read(&py).expect("read");
    let (h, _) = section(&data, ".bss").expect(".bss");
    // sh_size at +0x20 of the section header.
    data[h + 0x20..h + 0x28].copy_from_slice(&(1u64 << 40).to_le_bytes());
    fs::write(&py, &data).expect("write");
    fs::set_permissions(&py, fs::Permissions::from_mode(0o755)).expect("chmod");
    give(&dir.0, NOBODY);
    let d = Daemon::start("untrusted-bss", TOML);
    let child = ethand_tests::KillOnDrop(as_user(NOBODY, &py, &[]).spawn().expect("spawn"));
    thread::sleep(SETTLE);
    let t = snapshot_text(&d, child.0.id(), &["--json"], Duration::from_secs(30));
    let t: TreeSnapshot = serde_json::from_str(&t).expect("JSON");
    let notes = t
        .stack_sample
        .as_ref()
        .map(|s| s.notes.clone())
        .unwrap_or_default();
    println!("observed: stack sample notes {notes:?}");
    assert!(
        !notes.is_empty(),
        "the snapshot says why the process was not sampled"
    );
    still_serving(&d, "huge .bss");
    drop(child);
    assert!(peak_rss_bytes(d.pid()) < DAEMON_MEMORY_MAX);
}

/// Row "real CPython, threads 4,000 frames deep with 4,095-character names": before, the
/// daemon's memory went from 30 to 223 MB (1 thread) and 799 MB (4 threads), 2.8 CPU-s per
/// read. Now the reads happen in a worker, late ones are abandoned, and the daemon's memory
/// does not move.
#[test]
fn deep_python_stacks_cost_the_daemon_nothing() {
    let _serial = serial();
    let dir = Dir::new("deep");
    let script = dir.path("deep.py");
    fs::write(
        &script,
        r#"import sys, threading, time
sys.setrecursionlimit(20000)
name = "f" + "x" * 4094
src = "def " + name + "(n):\n    if n: return " + name + "(n - 1)\n    time.sleep(3600)\n"
g = {"time": time}
exec(compile(src, "/" + "d" * 4000 + ".py", "exec"), g)
for _ in range(4):
    threading.Thread(target=g[name], args=(4000,), daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"#,
    )
    .expect("script");
    give(&dir.0, NOBODY);
    let d = Daemon::start("untrusted-deep", TOML);
    let rss0 = peak_rss_bytes(d.pid());
    let mut child = ethand_tests::KillOnDrop(
        as_user(
            NOBODY,
            Path::new("/usr/bin/python3"),
            &[script.to_str().unwrap()],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3"),
    );
    {
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(child.0.stdout.as_mut().unwrap())
            .read_line(&mut l)
            .expect("ready");
        assert_eq!(l.trim(), "ready");
    }
    thread::sleep(SETTLE);
    let t0 = Instant::now();
    let t = snapshot_text(&d, child.0.id(), &["--json"], Duration::from_secs(40));
    let took = t0.elapsed();
    let t: TreeSnapshot = serde_json::from_str(&t).expect("JSON");
    let rss1 = peak_rss_bytes(d.pid());
    let s = t.stack_sample.as_ref();
    println!(
        "observed: snapshot in {took:?}; daemon VmHWM {} -> {} MB; reads {:?}, notes {:?}",
        rss0 >> 20,
        rss1 >> 20,
        s.map(|s| s.reads),
        s.map(|s| &s.notes)
    );
    assert!(
        rss1.saturating_sub(rss0) < 32 << 20,
        "the daemon grew by {} MB",
        (rss1 - rss0) >> 20
    );
    still_serving(&d, "deep Python stacks");
}

/// Rows "libcuda mapped at a path with a newline; the maps spelling (\012) names a FIFO", "a
/// deleted library on a GPU call stack whose path now names a FIFO", "a libpython path
/// spelled with \012 naming a FIFO" and "libcuda at a path with a space, or a newline: never
/// probed". Before, the collection thread or a snapshot slot blocked for good, SIGTERM did
/// not stop the daemon, and such a libcuda was never probed. Now nothing blocks, and both
/// libraries are probed: every call is counted.
#[test]
fn fifos_at_mapped_paths_never_block_and_odd_paths_are_probed() {
    let _serial = serial();
    let dir = Dir::new("fifo");
    let s = standins::shared();
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o666) },
            0,
            "mkfifo {p:?}"
        );
    };
    // libcuda under a directory with a newline, a FIFO where the escaped spelling points,
    // and one under a directory with a space.
    fs::create_dir_all(dir.path("a\nb")).unwrap();
    fs::create_dir_all(dir.path("a\\012b")).unwrap();
    fs::create_dir_all(dir.path("c d")).unwrap();
    let newline = dir.path("a\nb/libcuda.so.1");
    let space = dir.path("c d/libcuda.so.1");
    fs::copy(&s.cuda, &newline).unwrap();
    fs::copy(&s.cuda, &space).unwrap();
    mkfifo(&dir.path("a\\012b/libcuda.so.1"));
    // A "libpython" of the same kind.
    fs::create_dir_all(dir.path("p\nq")).unwrap();
    fs::create_dir_all(dir.path("p\\012q")).unwrap();
    let libpy = dir.path("p\nq/libpython3.12.so.1.0");
    fs::copy(&s.cuda, &libpy).unwrap();
    mkfifo(&dir.path("p\\012q/libpython3.12.so.1.0"));
    // A helper on the call stack, deleted and replaced by a FIFO once loaded.
    let caller = dir.path("caller");
    cc(&dir.0, "caller", CALLER, &caller, &["-ldl"]);
    let helper = dir.path("libhelper.so");
    let libdir = s.cuda.parent().unwrap();
    cc(
        &dir.0,
        "helper",
        HELPER,
        &helper,
        &[
            "-shared",
            "-fPIC",
            &format!("-L{}", libdir.display()),
            "-l:libcuda.so.1",
        ],
    );
    give(&dir.0, NOBODY);
    let d = Daemon::start("untrusted-fifo", TOML);
    let mut drivers = Vec::new();
    for (what, path) in [("newline", &newline), ("space", &space)] {
        let mut cmd = as_user(NOBODY, &s.driver, &[]);
        cmd.arg("--cuda").arg(path).args([
            "--",
            "wait_stdin",
            "sync",
            "stream",
            "500",
            "wait_stdin",
        ]);
        let mut drv = standins::Driver::spawn(&mut cmd);
        drv.wait_for("waiting");
        // Probed: the library is attached under its raw path.
        let t0 = Instant::now();
        loop {
            let st = d.status();
            let lib = st
                .gpu_libraries
                .iter()
                .find(|l| Path::new(&l.path) == path.as_path());
            if lib.is_some_and(|l| l.state == ProbeState::Attached) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{what}: not attached: {:#?}",
                st.gpu_libraries
            );
            thread::sleep(Duration::from_millis(100));
        }
        drv.resume();
        drv.wait_for("waiting");
        thread::sleep(SETTLE);
        let t = d.snapshot(drv.pid);
        let g = t.processes[0].gpu.as_ref().expect("gpu");
        let syncs: u64 = g
            .symbols
            .iter()
            .filter(|s| s.symbol == "cuStreamSynchronize")
            .map(|s| s.calls)
            .sum();
        println!("observed ({what}): {syncs} of 500 syncs counted");
        assert_eq!(syncs, 500, "{what}");
        still_serving(&d, what);
        drivers.push(drv);
    }
    // The "libpython": a snapshot answers (its worker refuses the path), and so does the next.
    let mut py = Caller::start(as_user(
        NOBODY,
        &caller,
        &[libpy.to_str().unwrap(), "cuInit", "1"],
    ));
    thread::sleep(SETTLE);
    let t = snapshot_text(&d, py.pid(), &["--json"], Duration::from_secs(20));
    let t: TreeSnapshot = serde_json::from_str(&t).expect("JSON");
    println!(
        "observed (libpython): notes {:?}",
        t.stack_sample.as_ref().map(|s| &s.notes)
    );
    assert!(
        t.stack_sample
            .as_ref()
            .is_some_and(|s| s.notes.iter().any(|n| n.contains("newline")))
    );
    py.go();
    still_serving(&d, "libpython with a newline");
    // The deleted helper: scrapes and snapshots answer; its frame says why it has no name.
    let mut c = Caller::start({
        let mut cmd = as_user(
            NOBODY,
            &caller,
            &[helper.to_str().unwrap(), "helper_sync", "11"],
        );
        cmd.env("LD_LIBRARY_PATH", libdir);
        cmd
    });
    // Its libcuda is found at the next rescans.
    thread::sleep(Duration::from_millis(1500));
    c.go();
    fs::remove_file(&helper).unwrap();
    mkfifo(&helper);
    thread::sleep(SETTLE);
    still_serving(&d, "deleted helper");
    let t = d.snapshot(c.pid());
    let g = t.processes[0].gpu.as_ref().expect("gpu");
    let frames: Vec<&Frame> = g
        .call_sites
        .iter()
        .flat_map(|s| &s.sites)
        .flat_map(|s| &s.frames)
        .collect();
    println!("observed (deleted helper): {frames:?}");
    assert!(frames.iter().any(|f| {
        f.module
            .as_deref()
            .is_some_and(|m| m.contains("libhelper.so"))
            && f.unresolved.is_some()
    }));
    still_serving(&d, "deleted helper, after its snapshot");
    // A daemon started now (a restart) reaches ready with all of it mapped.
    let t0 = Instant::now();
    let again = Daemon::start("untrusted-fifo-restart", TOML);
    println!("observed: a second daemon ready in {:?}", t0.elapsed());
    still_serving(&again, "restarted daemon");
    drop(again);
    drop(drivers);
    // And SIGTERM still ends it at once.
    let mut d = d;
    let stopped = d.terminate(Duration::from_secs(10));
    println!("observed: SIGTERM: {stopped:?}");
    assert!(
        stopped.is_some_and(|(t, st)| st.success() && t < Duration::from_secs(8)),
        "{stopped:?}"
    );
}

/// Rows "Python code compiled with co_filename = another user's 0644 file behind a 0700
/// home (or DWARF #line naming it)" and "a deleted library's path replaced by a symlink to
/// another user's 0700 binary": before, the snapshot printed that file's lines and that
/// binary's function names. Now files are read as the attacker, who may not read them:
/// nothing of them is in any output.
#[test]
fn files_the_owner_may_not_read_never_reach_an_output() {
    let _serial = serial();
    let dir = Dir::new("owner");
    let s = standins::shared();
    let libdir = s.cuda.parent().unwrap();
    // The victim's home: 0700, a world-readable secret inside, and a private binary.
    let home = dir.path("victim");
    fs::create_dir_all(&home).unwrap();
    let marker = format!("hunter2-{}", std::process::id());
    let secret_py = home.join("secret.py");
    fs::write(&secret_py, format!("DB_PASSWORD = \"{marker}\"\n")).unwrap();
    let secret_c = home.join("secret.c");
    fs::write(&secret_c, format!("char *db_password = \"{marker}\";\n")).unwrap();
    let secret_so = home.join("libsecret.so");
    cc(
        &dir.0,
        "secretlib",
        "int victim_secret_function(long n) { return n * 3; }\n",
        &secret_so,
        &["-shared", "-fPIC"],
    );
    for f in [&secret_py, &secret_c] {
        fs::set_permissions(f, fs::Permissions::from_mode(0o644)).unwrap();
    }
    // The attacker's files.
    let work = dir.path("attacker");
    fs::create_dir_all(&work).unwrap();
    let caller = work.join("caller");
    cc(&dir.0, "caller", CALLER, &caller, &["-ldl"]);
    // A library whose DWARF names the victim's file for its sync line.
    let lined = work.join("liblined.so");
    let src = format!(
        "int cuStreamSynchronize(void *s);\n#line 1 \"{}\"\n__attribute__((noinline)) int helper_sync(long n) {{ for (long i = 0; i < n; i++) cuStreamSynchronize(0); return 0; }}\n",
        secret_c.display()
    );
    cc(
        &dir.0,
        "lined",
        &src,
        &lined,
        &[
            "-shared",
            "-fPIC",
            &format!("-L{}", libdir.display()),
            "-l:libcuda.so.1",
        ],
    );
    // A library to be replaced by a symlink to the victim's binary.
    let swapped = work.join("libswapped.so");
    cc(
        &dir.0,
        "swapped",
        HELPER,
        &swapped,
        &[
            "-shared",
            "-fPIC",
            &format!("-L{}", libdir.display()),
            "-l:libcuda.so.1",
        ],
    );
    let script = work.join("spin.py");
    fs::write(
        &script,
        format!(
            "import time\nsrc = 'def spin():\\n    while True: pass\\n'\ng = {{}}\nexec(compile(src, {:?}, 'exec'), g)\nprint('ready', flush=True)\ng['spin']()\n",
            secret_py.display().to_string()
        ),
    )
    .unwrap();
    give(&work, NOBODY);
    give(&home, VICTIM);
    fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(&secret_so, fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::start("untrusted-owner", TOML);
    let mut py = ethand_tests::KillOnDrop(
        as_user(
            NOBODY,
            Path::new("/usr/bin/python3"),
            &[script.to_str().unwrap()],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3"),
    );
    {
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(py.0.stdout.as_mut().unwrap())
            .read_line(&mut l)
            .expect("ready");
    }
    let mut lc = Caller::start({
        let mut cmd = as_user(
            NOBODY,
            &caller,
            &[lined.to_str().unwrap(), "helper_sync", "20"],
        );
        cmd.env("LD_LIBRARY_PATH", libdir);
        cmd
    });
    let mut sc = Caller::start({
        let mut cmd = as_user(
            NOBODY,
            &caller,
            &[swapped.to_str().unwrap(), "helper_sync", "20"],
        );
        cmd.env("LD_LIBRARY_PATH", libdir);
        cmd
    });
    // Their libcuda is found at the next rescans.
    thread::sleep(Duration::from_millis(1500));
    lc.go();
    sc.go();
    fs::remove_file(&swapped).unwrap();
    std::os::unix::fs::symlink(&secret_so, &swapped).unwrap();
    thread::sleep(SETTLE);
    let mut everything = d.metrics();
    for pid in [py.0.id(), lc.pid(), sc.pid()] {
        for format in [&["--json"][..], &[][..], &["--csv"][..], &["--html"][..]] {
            everything.push_str(&snapshot_text(&d, pid, format, Duration::from_secs(30)));
        }
    }
    // The calls were counted at their sites, and the frames name the victim's files (the
    // attacker chose those names), but nothing of those files was read.
    for (pid, lib) in [(lc.pid(), "liblined.so"), (sc.pid(), "libswapped.so")] {
        let t = d.snapshot(pid);
        let g = t.processes[0].gpu.as_ref().expect("gpu");
        let sites = g
            .call_sites
            .iter()
            .find(|s| s.call == "cuStreamSynchronize")
            .expect("sites");
        let frames: Vec<&Frame> = sites.sites.iter().flat_map(|s| &s.frames).collect();
        println!("observed ({lib}): {} calls; frames {frames:?}", sites.total);
        assert_eq!(sites.total, 20);
        assert!(
            sites
                .sites
                .iter()
                .all(|s| s.source.as_deref().is_none_or(|x| !x.contains(&marker))),
            "{:?}",
            sites.sites
        );
        if lib == "liblined.so" {
            // Its innermost line is the victim's file: not read, so no source at all.
            assert!(
                sites.sites.iter().all(|s| s.source.is_none()),
                "{:?}",
                sites.sites
            );
            assert!(
                frames
                    .iter()
                    .any(|f| f.file.as_deref().is_some_and(|f| f.ends_with("secret.c"))),
                "{frames:?}"
            );
        } else {
            assert!(
                frames
                    .iter()
                    .any(|f| f.module.as_deref().is_some_and(|m| m.contains(lib))
                        && f.function.is_none()),
                "{frames:?}"
            );
        }
    }
    // The Python line is sampled (its file and line are named), but its text is not read.
    assert!(
        everything.contains("secret.py"),
        "the sampled frame is there"
    );
    // And a recorded trace (CPU and Python samples of the attacker's processes).
    let trace = dir.path("trace.json");
    for pid in [py.0.id(), lc.pid()] {
        let o = run_with_timeout(
            Command::new(ethand_tests::ethand_bin())
                .args([
                    "record",
                    "--pid",
                    &pid.to_string(),
                    "--duration",
                    "2s",
                    "-o",
                ])
                .arg(&trace),
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "record: {}", text(&o.stderr));
        everything.push_str(&fs::read_to_string(&trace).expect("trace"));
    }
    for forbidden in [marker.as_str(), "victim_secret_function", "db_password"] {
        assert!(
            !everything.contains(forbidden),
            "{forbidden:?} reached an output"
        );
    }
    println!(
        "observed: {} bytes of outputs, none with the victim's bytes",
        everything.len()
    );
}

/// Row "3,000 short-lived cgroups": before, ~13 series each stayed in /metrics forever. Now
/// a cgroup's series end a hold time after its last process, and beyond max_cgroups the
/// rest are summed in "[other cgroups]".
#[test]
fn departed_cgroups_leave_metrics_and_series_are_capped() {
    let _serial = serial();
    let Some(unified) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .find(|p| {
            Path::new(&format!("{p}/cgroup.procs")).exists()
                && Path::new(&format!("{p}/cgroup.controllers")).exists()
        })
    else {
        eprintln!("skipped: no cgroup v2 hierarchy");
        return;
    };
    let d = Daemon::start(
        "untrusted-cgroups",
        "[prometheus]\ncgroup_hold_seconds = 3\nmax_cgroups = 60\n[daemon]\nexit_grace_seconds = 1\n",
    );
    let base = PathBuf::from(unified).join(format!("ethand-churn-{}", std::process::id()));
    fs::create_dir_all(&base).expect("mkdir cgroup");
    let n = 300;
    for i in 0..n {
        let cg = base.join(format!("job{i}"));
        fs::create_dir(&cg).expect("mkdir cgroup");
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec /bin/true",
                cg.display()
            ))
            .output()
            .expect("sh");
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let count = |body: &str| -> (usize, bool) {
        let mut names = std::collections::BTreeSet::new();
        for l in body
            .lines()
            .filter(|l| l.starts_with("ethand_cgroup_cpu_seconds_total{"))
        {
            if let Some(c) = l
                .split("cgroup=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
            {
                names.insert(c.to_string());
            }
        }
        let other = names.contains("[other cgroups]");
        (
            names.iter().filter(|c| c.contains("ethand-churn")).count(),
            other,
        )
    };
    thread::sleep(SETTLE);
    let (during, other) = count(&d.metrics());
    for i in 0..n {
        let _ = fs::remove_dir(base.join(format!("job{i}")));
    }
    let _ = fs::remove_dir(&base);
    thread::sleep(Duration::from_secs(5));
    let (after, _) = count(&d.metrics());
    println!(
        "observed: {n} cgroups: {during} with series of their own (cap 60, other bucket {other}), {after} after the hold"
    );
    assert!(during <= 60, "{during} cgroup series");
    assert!(
        other,
        "the cgroups beyond the cap are summed in [other cgroups]"
    );
    assert_eq!(after, 0, "departed cgroups kept their series");
}

/// Row "~120 processes each making 554 unimplemented syscall numbers": before, the syscall
/// map (65,536 keys) filled and another user's new processes got 0 syscalls counted (truth
/// 15,000 each). Now unimplemented numbers share one key, a process's distinct numbers are
/// capped (here 48; the rest counted under one key), and the other user's processes are
/// counted exactly.
#[test]
fn unknown_syscalls_and_one_processs_numbers_cannot_starve_others() {
    let _serial = serial();
    let dir = Dir::new("sysnr");
    let flood = dir.path("flood");
    cc(
        &dir.0,
        "flood",
        r#"#include <unistd.h>
#include <sys/syscall.h>
#include <stdio.h>
int main(void) {
    /* 554 numbers no kernel implements (at and above the map's table of 1,024). */
    for (long nr = 1024; nr < 1578; nr++) syscall(nr);
    /* Sixty implemented numbers, each failing harmlessly on a bad descriptor or argument. */
    long bad[] = {SYS_read, SYS_write, SYS_fstat, SYS_lseek, SYS_ioctl, SYS_pread64, SYS_pwrite64,
        SYS_readv, SYS_writev, SYS_dup, SYS_fcntl, SYS_flock, SYS_fsync, SYS_fdatasync,
        SYS_ftruncate, SYS_fchdir, SYS_fchmod, SYS_fchown, SYS_fstatfs, SYS_getdents64,
        SYS_syncfs, SYS_epoll_wait, SYS_timerfd_gettime, SYS_inotify_rm_watch, SYS_fgetxattr,
        SYS_flistxattr, SYS_fadvise64, SYS_accept, SYS_getsockname, SYS_getpeername,
        SYS_shutdown, SYS_listen, SYS_getpgid, SYS_getsid, SYS_getpriority,
        SYS_sched_getscheduler, SYS_sched_getparam, SYS_sched_get_priority_max,
        SYS_sched_get_priority_min, SYS_sched_rr_get_interval, SYS_getitimer, SYS_times,
        SYS_sysinfo, SYS_getrusage, SYS_uname, SYS_getcwd, SYS_getgroups, SYS_getresuid,
        SYS_getresgid, SYS_capget, SYS_getrlimit, SYS_getcpu, SYS_get_mempolicy,
        SYS_getppid, SYS_getuid, SYS_getgid, SYS_geteuid, SYS_getegid, SYS_gettid, SYS_getpgrp};
    for (int r = 0; r < 3; r++)
        for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) syscall(bad[i], -1L, -1L, -1L, -1L);
    printf("done\n"); fflush(stdout);
    pause();
    return 0;
}
"#,
        &flood,
        &[],
    );
    let getpid = dir.path("getpid");
    cc(
        &dir.0,
        "getpid",
        "#include <unistd.h>\n#include <sys/syscall.h>\n#include <stdio.h>\nint main(void) { for (int i = 0; i < 15000; i++) syscall(SYS_getpid); printf(\"done\\n\"); fflush(stdout); pause(); return 0; }\n",
        &getpid,
        &[],
    );
    give(&dir.0, NOBODY);
    let d = Daemon::start(
        "untrusted-sysnr",
        "[maps]\nsyscall_numbers_per_process = 48\n",
    );
    struct Procs(Vec<std::process::Child>);
    impl Drop for Procs {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let spawn = |mut cmd: Command| {
        let mut c = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut l)
            .expect("done");
        c
    };
    let attackers = Procs(
        (0..120)
            .map(|_| spawn(as_user(NOBODY, &flood, &[])))
            .collect(),
    );
    // Another user's processes started afterwards (their uid set in the fork: few syscalls of
    // their own before the program's).
    let victims = Procs(
        (0..3)
            .map(|_| {
                use std::os::unix::process::CommandExt;
                let mut c = Command::new(&getpid);
                c.uid(VICTIM).gid(VICTIM);
                spawn(c)
            })
            .collect(),
    );
    thread::sleep(SETTLE);
    let nr_getpid = libc::SYS_getpid as u32;
    for v in &victims.0 {
        let t = d.snapshot(v.id());
        let p = &t.processes[0];
        let n = p
            .syscalls
            .by_nr
            .iter()
            .find(|r| r.nr == nr_getpid)
            .map_or(0, |r| r.count);
        println!(
            "observed: victim {} getpid {n} of 15000 ({} numbers)",
            v.id(),
            p.syscalls.by_nr.len()
        );
        assert_eq!(n, 15_000, "victim {}", v.id());
    }
    let t = d.snapshot(attackers.0[0].id());
    let rows: Vec<(String, u64)> = t.processes[0]
        .syscalls
        .by_nr
        .iter()
        .map(|r| (r.name.clone(), r.count))
        .collect();
    println!("observed: an attacker's {} rows {rows:?}", rows.len());
    let unimpl = rows
        .iter()
        .find(|(n, _)| n == "[unimplemented]")
        .map_or(0, |r| r.1);
    let over = rows
        .iter()
        .find(|(n, _)| n == "[over the per-process limit]")
        .map_or(0, |r| r.1);
    assert_eq!(unimpl, 554, "each unknown number counted, under one key");
    assert!(
        over > 0,
        "numbers beyond the limit are counted under one key"
    );
    assert!(rows.len() <= 48 + 2, "{} rows", rows.len());
    let st = d.status();
    let full = st
        .dropped
        .iter()
        .find(|c| c.reason == "syscalls_full")
        .map_or(0, |c| c.count);
    println!("observed: syscalls_full {full}");
    assert_eq!(full, 0, "the syscall map filled");
}

/// Row "a member of the socket group switches levels 18 times while a victim makes 50,000
/// syncs": before, 46,353 were counted and any member could switch. Now a switch attaches the
/// new probes before the old ones go (no call lost or doubled), only root may switch by
/// default, and switches are rate-limited.
#[test]
fn level_switches_lose_no_call_and_are_roots_to_make() {
    let _serial = serial();
    let s = standins::shared();
    let d = Daemon::start(
        "untrusted-level",
        "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 300\n[daemon]\nlevel_switch_interval_seconds = 0\n",
    );
    let mut drv = s.spawn_driver(
        &[Lib::Cuda],
        &["wait_stdin", "sync stream 50000", "wait_stdin"],
    );
    drv.wait_for("waiting");
    // This driver's library file (by inode), not any library: another test's process may map
    // a copy of its own, attached first, while this one's calls would go unprobed.
    let inode = std::fs::metadata(s.path(Lib::Cuda))
        .expect("stand-in libcuda")
        .ino();
    let t0 = Instant::now();
    while !d
        .status()
        .gpu_libraries
        .iter()
        .any(|l| l.inode == inode && l.state == ProbeState::Attached)
    {
        assert!(t0.elapsed() < Duration::from_secs(15), "not attached");
        thread::sleep(Duration::from_millis(100));
    }
    drv.resume();
    let levels = ["process", "calls", "op", "calls", "process", "op"];
    let mut switches = 0;
    for i in 0..18 {
        let o = d.cli(&["level", levels[i % levels.len()]]);
        assert!(o.status.success(), "switch {i}: {}", text(&o.stderr));
        switches += 1;
    }
    drv.wait_for("waiting");
    thread::sleep(SETTLE);
    let t = d.snapshot(drv.pid);
    let g = t.processes[0].gpu.as_ref().expect("gpu");
    let syncs: u64 = g
        .symbols
        .iter()
        .filter(|s| s.symbol == "cuStreamSynchronize")
        .map(|s| s.calls)
        .sum();
    let truth = drv.finish().total("cuStreamSynchronize").calls;
    println!("observed: {switches} switches during the loop: {syncs} syncs counted, truth {truth}");
    assert_eq!(syncs, truth);
    // Not every socket user's to make, and not in a loop.
    let d2 = Daemon::start(
        "untrusted-level-policy",
        "[daemon]\nsocket_group = \"\"\nlevel_switch_interval_seconds = 10\n",
    );
    fs::set_permissions(&d2.socket, fs::Permissions::from_mode(0o666)).expect("chmod the socket");
    let o = run_with_timeout(
        &mut as_user(
            NOBODY,
            &ethand_tests::ethand_bin(),
            &["level", "process", "--socket", d2.socket.to_str().unwrap()],
        ),
        Duration::from_secs(20),
    );
    println!("observed: nobody's switch: {}", text(&o.stderr).trim());
    assert!(
        !o.status.success() && text(&o.stderr).contains("only root"),
        "{}",
        text(&o.stderr)
    );
    let first = d2.cli(&["level", "process"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let second = d2.cli(&["level", "calls"]);
    println!(
        "observed: a second switch at once: {}",
        text(&second.stderr).trim()
    );
    assert!(
        !second.status.success() && text(&second.stderr).contains("at most one switch"),
        "{}",
        text(&second.stderr)
    );
}
