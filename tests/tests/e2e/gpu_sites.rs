//! Call sites of GPU runtime calls from the user stacks the kernel takes (`gpu.call_sites`),
//! against a C program of known ground truth: `sync_a` calls the stand-in
//! `cuStreamSynchronize` 37 times and `sync_b` 11 times, each from one known line. Built
//! `-g -O1 -fno-omit-frame-pointer`, linked to the stand-in libcuda; then a stripped copy
//! (`strip -s`), whose sites must still be two with the same counts, named by module and
//! offset.
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{
    ProbeState,
    stacks::{CallSites, Frame},
};
use ethand_tests::{
    Daemon, INTERVAL_MS, SETTLE,
    cprog::{self, Prog},
    find_proc, serial, standins,
};

const TOML: &str = "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 300\n";
const CALLS_A: u64 = 37;
const CALLS_B: u64 = 11;

const SOURCE: &str = r#"#include <stdio.h>

typedef int CUresult;
typedef void *CUstream;
CUresult cuStreamSynchronize(CUstream s);

__attribute__((noinline)) void sync_a(int n) {
    for (int i = 0; i < n; i++) {
        cuStreamSynchronize(0); /* SITE_A */
    }
}

__attribute__((noinline)) void sync_b(int n) {
    for (int i = 0; i < n; i++) {
        cuStreamSynchronize(0); /* SITE_B */
    }
}

int main(void) {
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    if (!fgets(line, sizeof line, stdin)) return 1;
    sync_a(37);
    sync_b(11);
    printf("done\n");
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
"#;

fn line_of(marker: &str) -> u32 {
    cprog::line_of(SOURCE, marker)
}

/// Compiles the program against the stand-in libcuda into `dir`: (source, binary, stripped
/// copy).
fn build(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (src, bin) = cprog::compile(dir, "callsites", SOURCE, &[]);
    let stripped = dir.join("callsites-stripped");
    fs::copy(&bin, &stripped).expect("copy");
    let out = Command::new("strip")
        .arg("-s")
        .arg(&stripped)
        .output()
        .expect("run strip");
    assert!(out.status.success(), "strip failed");
    (src, bin, stripped)
}

/// The program, started and ready.
fn start(bin: &Path) -> Prog {
    Prog::start(Command::new(bin).env(standins::SYNC_ENV, "50"))
}

/// Lets it make its calls.
fn go(p: &mut Prog) {
    p.say(b"go\n");
    p.expect("done");
}

/// Waits until the stand-in libcuda is attached.
fn wait_attached(d: &Daemon, lib: &Path) {
    let ino = fs::metadata(lib).expect("stat").ino();
    let t0 = Instant::now();
    loop {
        let st = d.status();
        if st
            .gpu_libraries
            .iter()
            .any(|l| l.inode == ino && l.state == ProbeState::Attached)
        {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} not attached: {:#?}",
            lib.display(),
            st.gpu_libraries
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the program and returns its cuStreamSynchronize call sites once the daemon has
/// collected them (two snapshots an interval apart agree).
fn sites_of(d: &Daemon, bin: &Path) -> CallSites {
    let mut p = start(bin);
    wait_attached(d, &standins::shared().cuda);
    go(&mut p);
    thread::sleep(SETTLE);
    let pid = p.pid();
    let get = || {
        let snap = d.snapshot(pid);
        let g = find_proc(&snap, pid)
            .gpu
            .clone()
            .unwrap_or_else(|| panic!("no gpu section for {pid}"));
        g.call_sites
            .into_iter()
            .find(|c| c.call == "cuStreamSynchronize")
    };
    let t0 = Instant::now();
    let mut last = get();
    loop {
        thread::sleep(Duration::from_millis(INTERVAL_MS + 50));
        let now = get();
        if (now == last && now.as_ref().is_some_and(|c| c.total >= CALLS_A + CALLS_B))
            || t0.elapsed() > Duration::from_secs(5)
        {
            eprintln!("observed: {}: {now:#?}", bin.display());
            return now.unwrap_or_else(|| panic!("no call sites of cuStreamSynchronize"));
        }
        last = now;
    }
}

fn innermost(c: &CallSites, i: usize) -> &Frame {
    c.sites[i].frames.first().expect("a frame")
}

#[test]
fn call_sites_exact_from_kernel_stacks() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-callsites-{}", std::process::id()));
    let (src, bin, stripped) = build(&dir);
    let d = Daemon::start("gpu-sites", TOML);

    let c = sites_of(&d, &bin);
    assert_eq!(c.category, "sync");
    assert_eq!(c.total, CALLS_A + CALLS_B, "{c:#?}");
    assert_eq!(c.other, 0);
    assert_eq!(c.unattributed, Some(0));
    assert_eq!(c.sites.len(), 2, "{c:#?}");
    let src_path = src.display().to_string();
    for (i, (func, count, marker)) in [("sync_a", CALLS_A, "SITE_A"), ("sync_b", CALLS_B, "SITE_B")]
        .into_iter()
        .enumerate()
    {
        let f = innermost(&c, i);
        assert_eq!(c.sites[i].count, count, "{c:#?}");
        assert_eq!(f.function.as_deref(), Some(func), "{f:?}");
        assert_eq!(f.file.as_deref(), Some(src_path.as_str()), "{f:?}");
        assert_eq!(f.line, Some(line_of(marker)), "{f:?}");
        assert_eq!(f.module.as_deref(), Some(bin.to_str().unwrap()), "{f:?}");
        // Timed (syncs are), and the source line read back.
        assert!(c.sites[i].time_ns.is_some_and(|t| t > 0), "{c:#?}");
        assert!(
            c.sites[i]
                .source
                .as_deref()
                .is_some_and(|s| s.contains(marker)),
            "{c:#?}"
        );
        // The caller of sync_a / sync_b is main.
        let caller = c.sites[i].frames.get(1).expect("a caller frame");
        assert_eq!(caller.function.as_deref(), Some("main"), "{caller:?}");
    }
    let offsets: Vec<Option<u64>> = (0..2).map(|i| innermost(&c, i).offset).collect();

    let c = sites_of(&d, &stripped);
    assert_eq!(c.total, CALLS_A + CALLS_B, "{c:#?}");
    assert_eq!(c.sites.len(), 2, "{c:#?}");
    assert_eq!(
        c.sites.iter().map(|s| s.count).collect::<Vec<_>>(),
        [CALLS_A, CALLS_B]
    );
    for (i, off) in offsets.iter().enumerate() {
        let f = innermost(&c, i);
        assert_eq!(f.function, None, "{f:?}");
        assert_eq!(
            f.module.as_deref(),
            Some(stripped.to_str().unwrap()),
            "{f:?}"
        );
        // strip keeps the code where it was: the same file offsets.
        assert_eq!(f.offset, *off, "{f:?}");
    }
    let _ = fs::remove_dir_all(&dir);
}

/// `gpu.call_stacks = false`: the calls are counted as before, no call site is.
#[test]
fn no_call_sites_when_call_stacks_off() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-callsites-off-{}", std::process::id()));
    let (_, bin, _) = build(&dir);
    let d = Daemon::start(
        "gpu-sites-off",
        "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 300\ncall_stacks = false\n",
    );
    let mut p = start(&bin);
    wait_attached(&d, &standins::shared().cuda);
    go(&mut p);
    thread::sleep(SETTLE);
    let pid = p.pid();
    let t0 = Instant::now();
    let g = loop {
        let snap = d.snapshot(pid);
        let g = find_proc(&snap, pid).gpu.clone();
        if g.as_ref()
            .is_some_and(|g| g.sync.calls == CALLS_A + CALLS_B)
            || t0.elapsed() > Duration::from_secs(5)
        {
            break g.expect("a gpu section");
        }
        thread::sleep(Duration::from_millis(INTERVAL_MS + 50));
    };
    assert_eq!(g.sync.calls, CALLS_A + CALLS_B);
    assert!(g.call_sites.is_empty(), "{:#?}", g.call_sites);
    let _ = fs::remove_dir_all(&dir);
}
