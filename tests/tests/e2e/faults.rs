//! Faults: what happens to the node and to ethand when things go wrong. The daemon killed
//! with SIGKILL leaves no BPF object or probe behind and a new one works; SIGTERM under load
//! ends cleanly within a second; a long OTLP outage costs bounded memory and loses no totals;
//! tracefs or the kernel's BTF file missing in the daemon's mount namespace; a GPU runtime
//! library replaced on disk while probed.
use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::GpuLibraryStatus;
use ethand_tests::{
    Daemon, ProbeState, SETTLE, SelfStatus, assert_wakeup_not_needed, find_proc, measure, probe,
    serial,
    standins::{self, Driver, Lib, dynamic_symbols},
    temp_path, text,
};

use crate::workload;

/// GPU probing as in gpu.rs: rescan every 300 ms.
const GPU_TOML: &str = "[gpu]\nlevel = \"process\"\nrescan_interval_ms = 300\n";
const ATTACH_TIMEOUT: Duration = Duration::from_secs(6);

// ------------------------------------------------------------------ helpers

/// getpid() counted exactly by `d`: a fresh workload makes `n` of them.
fn assert_getpid_exact(d: &Daemon, n: u64) -> u64 {
    let mut w = workload(&["syscalls", &n.to_string(), "0"]);
    let m = measure(d, &mut w);
    let got = m.syscall_delta(w.pid, libc::SYS_getpid);
    w.finish();
    assert_eq!(got, (n, 0), "getpid (count, errors): expected ({n}, 0)");
    got.0
}

/// The `gpu_libraries` entries of the file now at `path` (same inode), or of `inode`.
fn lib_entry<'a>(st: &'a SelfStatus, inode: u64) -> Vec<&'a GpuLibraryStatus> {
    st.gpu_libraries
        .iter()
        .filter(|l| l.inode == inode)
        .collect()
}

fn inode_of(path: &Path) -> u64 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .ino()
}

/// Polls `ethand status` until the library file with `inode` is listed attached.
fn wait_attached(d: &Daemon, inode: u64) -> (SelfStatus, Duration) {
    wait_attached_within(d, inode, ATTACH_TIMEOUT)
}

fn wait_attached_within(d: &Daemon, inode: u64, limit: Duration) -> (SelfStatus, Duration) {
    let t0 = Instant::now();
    loop {
        let st = d.status();
        if lib_entry(&st, inode)
            .iter()
            .any(|l| l.state == ProbeState::Attached)
        {
            return (st, t0.elapsed());
        }
        assert!(
            t0.elapsed() < limit,
            "inode {inode} not attached after {limit:?}: {:#?}",
            st.gpu_libraries
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Launches (cuLaunchKernel & co.) ethand counted for `pid` once the daemon has collected.
fn launches(d: &Daemon, pid: u32) -> u64 {
    thread::sleep(SETTLE);
    let snap = d.snapshot(pid);
    find_proc(&snap, pid)
        .gpu
        .as_ref()
        .and_then(|g| g.launches)
        .unwrap_or(0)
}

/// BPF object ids a process holds through its file descriptors (/proc/PID/fdinfo).
#[derive(Debug, Default)]
struct BpfIds {
    progs: BTreeSet<u32>,
    maps: BTreeSet<u32>,
    links: BTreeSet<u32>,
}

fn bpf_ids(pid: u32) -> BpfIds {
    let mut ids = BpfIds::default();
    for e in fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("fdinfo dir")
        .flatten()
    {
        let Ok(info) = fs::read_to_string(e.path()) else {
            continue;
        };
        for line in info.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let Ok(id) = v.trim().parse::<u32>() else {
                continue;
            };
            match k {
                "prog_id" => ids.progs.insert(id),
                "map_id" => ids.maps.insert(id),
                "link_id" => ids.links.insert(id),
                _ => false,
            };
        }
    }
    ids
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

/// Whether the kernel still has the BPF object `id` (`cmd`: one of the GET_FD_BY_ID).
fn bpf_object_exists(cmd: libc::c_long, id: u32) -> bool {
    // union bpf_attr for *_GET_FD_BY_ID: { u32 id; u32 next_id; u32 open_flags; }
    let attr: [u32; 3] = [id, 0, 0];
    // SAFETY: the bpf syscall reads 12 bytes of `attr`, which lives across the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), 12) };
    if fd >= 0 {
        // SAFETY: closing the descriptor the kernel just gave us.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    let err = std::io::Error::last_os_error();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "bpf(cmd {cmd}, id {id}): expected the object or ENOENT, got {err}"
    );
    false
}

/// The address of `symbol` of the library file `lib` (by inode) in process `pid`, and the
/// file offset of that byte.
fn symbol_in_process(pid: u32, lib: &Path, inode: u64, symbol: &str) -> (u64, u64) {
    let vaddr = dynamic_symbols(lib)
        .expect("nm")
        .into_iter()
        .find(|s| s.name == symbol)
        .unwrap_or_else(|| panic!("{symbol} not in {}", lib.display()))
        .addr;
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    // (start, end, perms, file offset) of the mappings of that file.
    let mut segs = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[4].parse::<u64>().ok() != Some(inode) {
            continue;
        }
        let (s, e) = f[0].split_once('-').expect("range");
        segs.push((
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
            f[1].to_string(),
            u64::from_str_radix(f[2], 16).unwrap(),
        ));
    }
    // The mapping of file offset 0 is the load base (first LOAD segment at vaddr 0).
    let base = segs
        .iter()
        .find(|s| s.3 == 0)
        .unwrap_or_else(|| {
            panic!(
                "pid {pid} does not map {} at offset 0: {segs:?}",
                lib.display()
            )
        })
        .0;
    let addr = base + vaddr;
    let seg = segs
        .iter()
        .find(|s| s.0 <= addr && addr < s.1 && s.2.contains('x'))
        .unwrap_or_else(|| panic!("{symbol} at {addr:#x} is in no executable mapping: {segs:?}"));
    (addr, seg.3 + (addr - seg.0))
}

/// The first byte of `symbol` in process `pid`'s memory and in the library file: a uprobe
/// replaces it with a breakpoint in the process; without one they are equal.
fn probed_byte(pid: u32, lib: &Path, inode: u64, symbol: &str) -> (u8, u8) {
    let (addr, off) = symbol_in_process(pid, lib, inode, symbol);
    let mut mem = [0u8; 1];
    fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|f| f.read_exact_at(&mut mem, addr))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/mem at {addr:#x}: {e}"));
    let mut file = [0u8; 1];
    fs::File::open(lib)
        .and_then(|f| f.read_exact_at(&mut file, off))
        .unwrap_or_else(|e| panic!("read {} at {off:#x}: {e}", lib.display()));
    (mem[0], file[0])
}

/// Lines of the daemon's log at WARN or ERROR level.
fn warn_or_error_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

// ------------------------------------------------------------------ kill -9

/// SIGKILL leaves nothing behind: every BPF program, map and link the daemon held (ids from
/// its fdinfo, GPU uprobes included) is gone from the kernel, the breakpoints it put into a
/// process using libcuda are removed, nothing is pinned or registered in tracefs. A new
/// daemon (same socket path, the dead one's socket file still there) counts getpid() and the
/// same process's launches exactly.
#[test]
fn kill_9_leaves_no_bpf_objects_and_restart_works() {
    let _serial = serial();
    let s = standins::shared();
    let cuda_ino = inode_of(&s.cuda);
    let mut d = Daemon::start("faults-kill9", GPU_TOML);
    let mut drv = s.spawn_driver(
        &[Lib::Cuda],
        &[
            "wait_stdin",
            "launches 7",
            "wait_stdin",
            "launches 11",
            "wait_stdin",
        ],
    );
    drv.wait_for("waiting");
    wait_attached(&d, cuda_ino);
    let (mem, file) = probed_byte(drv.pid, &s.cuda, cuda_ino, "cuLaunchKernel");
    eprintln!("observed: cuLaunchKernel first byte attached: process {mem:#04x}, file {file:#04x}");
    assert_ne!(
        mem, file,
        "with ethand attached, cuLaunchKernel in the driver must carry a uprobe breakpoint"
    );
    drv.resume();
    drv.wait_for("waiting");
    assert_eq!(launches(&d, drv.pid), 7, "launches before the kill");

    let ids = bpf_ids(d.pid());
    eprintln!(
        "observed: daemon pid {} holds {} programs {:?}, {} maps {:?}, {} links {:?}",
        d.pid(),
        ids.progs.len(),
        ids.progs,
        ids.maps.len(),
        ids.maps,
        ids.links.len(),
        ids.links
    );
    // The kernel probes and the GPU entry program at least; maps of every subsystem; a link
    // per attached tracepoint.
    assert!(ids.progs.len() >= 10, "programs: {:?}", ids.progs);
    assert!(ids.maps.len() >= 10, "maps: {:?}", ids.maps);
    assert!(ids.links.len() >= 10, "links: {:?}", ids.links);
    for &id in &ids.progs {
        assert!(
            bpf_object_exists(BPF_PROG_GET_FD_BY_ID, id),
            "prog {id} live"
        );
    }

    let st = d.kill();
    assert!(
        d.socket.exists(),
        "a killed daemon cannot remove its socket: the restart must cope with the stale one"
    );
    // Programs and maps are freed after an RCU grace period and a work item: poll.
    let t0 = Instant::now();
    let left = loop {
        let left: Vec<String> = (ids
            .progs
            .iter()
            .map(|&i| (BPF_PROG_GET_FD_BY_ID, "prog", i)))
        .chain(ids.maps.iter().map(|&i| (BPF_MAP_GET_FD_BY_ID, "map", i)))
        .chain(
            ids.links
                .iter()
                .map(|&i| (BPF_LINK_GET_FD_BY_ID, "link", i)),
        )
        .filter(|&(cmd, _, id)| bpf_object_exists(cmd, id))
        .map(|(_, what, id)| format!("{what} {id}"))
        .collect();
        if left.is_empty() || t0.elapsed() > Duration::from_secs(5) {
            break left;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let freed_in = t0.elapsed();
    let (mem, file) = probed_byte(drv.pid, &s.cuda, cuda_ino, "cuLaunchKernel");
    eprintln!(
        "observed: killed ({st:?}); {} ids checked, left after {freed_in:?}: {left:?}; \
         cuLaunchKernel byte now process {mem:#04x}, file {file:#04x}",
        ids.progs.len() + ids.maps.len() + ids.links.len()
    );
    assert!(left.is_empty(), "BPF objects left after SIGKILL: {left:?}");
    assert_eq!(
        mem, file,
        "the uprobe breakpoint is still in the driver's cuLaunchKernel after SIGKILL"
    );
    // Nothing pinned (bpffs), no probe registered through tracefs.
    let mut pinned = Vec::new();
    let mut dirs = vec![PathBuf::from("/sys/fs/bpf")];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_lowercase();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
            if name.contains("ethand") || name.contains("aya") {
                pinned.push(e.path());
            }
        }
    }
    assert!(pinned.is_empty(), "pinned after SIGKILL: {pinned:?}");
    let root = s.root.to_string_lossy().into_owned();
    for events in ["uprobe_events", "kprobe_events"] {
        let t =
            fs::read_to_string(Path::new("/sys/kernel/tracing").join(events)).unwrap_or_default();
        let ours: Vec<&str> = t
            .lines()
            .filter(|l| l.contains("ethand") || l.contains("aya") || l.contains(&root))
            .collect();
        eprintln!(
            "observed: {events}: {} lines, ours {ours:?}",
            t.lines().count()
        );
        assert!(ours.is_empty(), "{events} after SIGKILL: {ours:?}");
    }

    // A new daemon at the same socket path.
    let d2 = Daemon::start("faults-kill9", GPU_TOML);
    wait_attached(&d2, cuda_ino);
    let n = assert_getpid_exact(&d2, 10_000);
    drv.resume();
    drv.wait_for("waiting");
    let after = launches(&d2, drv.pid);
    eprintln!("observed: restarted: getpid {n}, driver launches since the restart {after}");
    assert_eq!(after, 11, "launches counted by the restarted daemon");
    drv.finish();
    drop(d2);
}

// ------------------------------------------------------------------ SIGTERM

/// SIGTERM with a getpid loop running and a driver calling libcuda through attached uprobes:
/// the daemon exits 0 in under a second, removes its socket and logs no warning or error
/// while shutting down.
#[test]
fn sigterm_under_load_exits_cleanly_within_a_second() {
    let _serial = serial();
    let s = standins::shared();
    let cuda_ino = inode_of(&s.cuda);
    let mut d = Daemon::start("faults-term", GPU_TOML);
    let mut w = workload(&["getpid-loop"]);
    let mut drv = s.spawn_driver(
        &[Lib::Cuda],
        &["wait_stdin", "launches 20000000", "wait_stdin"],
    );
    drv.wait_for("waiting");
    wait_attached(&d, cuda_ino);
    w.send_byte();
    drv.resume();
    thread::sleep(Duration::from_secs(1));
    let busy = launches(&d, drv.pid);
    assert!(busy > 0, "the driver's launches are counted before SIGTERM");
    let socket = d.socket.clone();
    let (took, status) = d
        .terminate(Duration::from_secs(10))
        .expect("ethand still running 10 s after SIGTERM");
    let log = d.log_text();
    let shutdown_log = &log[log.find("shutting down").unwrap_or(0)..];
    let bad = warn_or_error_lines(shutdown_log);
    eprintln!(
        "observed: SIGTERM -> exit {status} in {took:?} ({busy} launches counted before); \
         socket left: {}; warnings/errors while shutting down: {bad:?}",
        socket.exists()
    );
    let done = w.stop();
    eprintln!("observed: getpid loop {:?}", done.0);
    drop(drv);
    assert!(
        took < Duration::from_secs(1),
        "shutdown took {took:?}; log:\n{log}"
    );
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(!socket.exists(), "socket {} left behind", socket.display());
    assert!(
        log.contains("shutting down"),
        "no \"shutting down\" line: {log}"
    );
    assert!(
        bad.is_empty(),
        "warnings or errors while shutting down: {bad:?}"
    );
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "error lines in the log: {errors:?}");
}

// ------------------------------------------------------------------ mount namespace faults

/// A wrapper for [`Daemon::start_with`]: runs `script` (sh) in a new private mount namespace,
/// then execs `then` followed by ethand's command line.
fn in_private_mount_ns(script: &str, then: &[&str]) -> Vec<String> {
    let mut w: Vec<String> = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        .map(String::from)
        .to_vec();
    w.push(format!("set -e\n{script}\nexec \"$@\""));
    w.push("sh".into());
    w.extend(then.iter().map(|s| s.to_string()));
    w
}

const UMOUNT_TRACEFS: &str = "umount -l /sys/kernel/tracing 2>/dev/null || true\n\
     umount -l /sys/kernel/debug/tracing 2>/dev/null || true\n\
     if [ -e /sys/kernel/tracing/events ] || [ -e /sys/kernel/debug/tracing/events ]; then \
         echo 'tracefs still mounted' >&2; exit 99; fi";

/// Without CAP_SYS_ADMIN (root's other capabilities kept): ethand cannot mount anything.
const NO_SYS_ADMIN: [&str; 2] = ["setpriv", "--bounding-set=-sys_admin"];

/// Whether process `pid` sees tracefs mounted at `at`.
fn tracefs_mounted(pid: &str, at: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 4 && f[4] == at && l.contains(" - tracefs ")
        })
}

/// Kernel probes by name (GPU uprobes and device collectors left out).
fn kernel_probes(st: &SelfStatus) -> Vec<&ethand_tests::ProbeStatus> {
    st.probes
        .iter()
        .filter(|p| !p.name.starts_with("uprobe_") && !p.name.starts_with("collector_"))
        .collect()
}

/// Probes on BTF tracepoints (no tracefs needed), besides the network ones
/// (`crate::net::NET_PROBES`): every kernel probe on this kernel but `sched_wakeup`, which is
/// not needed here (`assert_wakeup_not_needed`).
const BTF_PROBES: [&str; 9] = [
    "sched_switch",
    "sched_wakeup_new",
    "sys_enter",
    "sys_exit",
    "block_start",
    "block_issue",
    "block_complete",
    "sched_process_exec",
    "sched_process_exit",
];

/// tracefs unmounted in the daemon's mount namespace. As root ethand mounts it there itself
/// (says so in its log; the test's namespace is untouched) and the classic tracepoints work:
/// with prefer_btf = false syscalls are counted through them exactly. Without CAP_SYS_ADMIN it
/// cannot: every kernel probe stays on its BTF tracepoint (none needs tracefs) and counts
/// getpid() exactly, exec events included (the GPU uprobes attach and count launches
/// exactly); with prefer_btf = false there, every kernel probe is unsupported, naming tracefs.
#[test]
fn tracefs_unmounted_is_mounted_or_reported_per_probe() {
    let _serial = serial();
    // Root: ethand mounts tracefs in its own namespace.
    {
        let d = Daemon::start_with(
            "faults-tracefs",
            "[probes]\nprefer_btf = false\n",
            &in_private_mount_ns(UMOUNT_TRACEFS, &[]),
            &[],
        );
        let pid = d.pid().to_string();
        let log = d.log_text();
        let mounted_line = log.lines().find(|l| l.contains("mounted it at"));
        let st = d.status();
        let not_attached: Vec<_> = kernel_probes(&st)
            .into_iter()
            .filter(|p| p.state != ProbeState::Attached && p.name != "sched_wakeup")
            .collect();
        assert_wakeup_not_needed(&st.probes);
        let sys_enter = probe(&st.probes, "sys_enter");
        eprintln!(
            "observed: daemon {pid} sees tracefs at /sys/kernel/tracing: {}; log: {mounted_line:?}; \
             sys_enter at {:?}; kernel probes not attached: {not_attached:?}",
            tracefs_mounted(&pid, "/sys/kernel/tracing"),
            sys_enter.attach_point
        );
        assert!(
            tracefs_mounted(&pid, "/sys/kernel/tracing"),
            "ethand did not mount tracefs in its namespace"
        );
        assert!(
            tracefs_mounted("self", "/sys/kernel/tracing"),
            "the test's own namespace lost tracefs"
        );
        assert!(mounted_line.is_some(), "no log line about mounting tracefs");
        assert!(not_attached.is_empty(), "not attached: {not_attached:?}");
        assert_eq!(
            sys_enter.attach_point, "tracepoint/raw_syscalls/sys_enter",
            "prefer_btf = false: the classic tracepoint"
        );
        let n = assert_getpid_exact(&d, 10_000);
        eprintln!("observed: getpid through classic tracepoints on ethand's tracefs: {n}");
    }
    // Without CAP_SYS_ADMIN: per-probe degradation.
    let s = standins::shared();
    let cuda_ino = inode_of(&s.cuda);
    let d = Daemon::start_with(
        "faults-tracefs-nomount",
        GPU_TOML,
        &in_private_mount_ns(UMOUNT_TRACEFS, &NO_SYS_ADMIN),
        &[],
    );
    let pid = d.pid().to_string();
    assert!(!tracefs_mounted(&pid, "/sys/kernel/tracing"));
    let st = d.status();
    for name in BTF_PROBES.iter().chain(&crate::net::NET_PROBES) {
        let p = probe(&st.probes, name);
        assert_eq!(p.state, ProbeState::Attached, "{p:?}");
        assert!(p.attach_point.starts_with("tp_btf/"), "{p:?}");
    }
    let n = assert_getpid_exact(&d, 10_000);
    let mut drv = s.spawn_driver(&[Lib::Cuda], &["wait_stdin", "launches 13", "wait_stdin"]);
    drv.wait_for("waiting");
    // The exec event (BTF tracepoint) makes the daemon scan the new process at once.
    let (_, took) = wait_attached_within(&d, cuda_ino, Duration::from_secs(15));
    eprintln!("observed: without tracefs libcuda attached {took:?} after the driver loaded it");
    drv.resume();
    drv.wait_for("waiting");
    let l = launches(&d, drv.pid);
    eprintln!("observed: without tracefs: getpid {n}, launches {l}");
    drv.finish();
    assert_eq!(l, 13, "launches through uprobes without tracefs");
    drop(d);
    // Classic tracepoints asked for, and no tracefs to read their formats from.
    let d = Daemon::start_with(
        "faults-tracefs-classic",
        "[probes]\nprefer_btf = false\n",
        &in_private_mount_ns(UMOUNT_TRACEFS, &NO_SYS_ADMIN),
        &[],
    );
    let st = d.status();
    // sched_wakeup_new and sched_process_fork have no classic program: they stay on their
    // BTF tracepoints.
    for name in ["sched_wakeup_new", "sched_process_fork"] {
        let p = probe(&st.probes, name);
        assert_eq!(
            (p.state, p.attach_point.as_str()),
            (ProbeState::Attached, format!("tp_btf/{name}").as_str()),
            "{p:?}"
        );
    }
    assert_wakeup_not_needed(&st.probes);
    for p in kernel_probes(&st).into_iter().filter(|p| {
        p.name != "sched_wakeup_new" && p.name != "sched_wakeup" && p.name != "sched_process_fork"
    }) {
        eprintln!(
            "observed: prefer_btf = false, no tracefs: {} {:?}: {}",
            p.name, p.state, p.detail
        );
        assert_eq!(p.state, ProbeState::Unsupported, "{p:?}");
        assert!(
            p.detail.contains("tracefs is not mounted") && p.detail.contains("failed"),
            "{}'s detail does not say tracefs is missing: {:?}",
            p.name,
            p.detail
        );
    }
}

/// /sys/kernel/btf/vmlinux masked (an empty file bound over it) in the daemon's namespace:
/// ethand reads the kernel's BTF from the kernel instead, says so on every BTF tracepoint
/// probe and in its log, and counts getpid() and scheduler ping-pong exactly (the struct
/// offsets from that BTF are right). Without CAP_SYS_ADMIN that way is closed too: ethand
/// stops at once with one error naming both sources.
#[test]
fn btf_file_masked_falls_back_to_the_kernels_btf() {
    let _serial = serial();
    let mask = "mount --bind /dev/null /sys/kernel/btf/vmlinux\n\
                if [ -s /sys/kernel/btf/vmlinux ]; then echo 'BTF still there' >&2; exit 99; fi";
    {
        let d = Daemon::start_with("faults-btf", "", &in_private_mount_ns(mask, &[]), &[]);
        let st = d.status();
        let log = d.log_text();
        let warned = log
            .lines()
            .find(|l| l.contains("kernel BTF file unusable"))
            .map(str::to_string);
        eprintln!("observed: log: {warned:?}");
        for name in BTF_PROBES.iter().chain(&crate::net::NET_PROBES) {
            let p = probe(&st.probes, name);
            eprintln!(
                "observed: {name} {:?} at {}: {}",
                p.state, p.attach_point, p.detail
            );
            assert_eq!(p.state, ProbeState::Attached, "{p:?}");
            assert!(p.attach_point.starts_with("tp_btf/"), "{p:?}");
            assert!(
                p.detail.contains("kernel BTF read from the kernel")
                    && p.detail
                        .contains("/sys/kernel/btf/vmlinux unusable (empty file)"),
                "{name}: {:?}",
                p.detail
            );
        }
        assert!(warned.is_some(), "no warning about the BTF file in the log");
        let n = assert_getpid_exact(&d, 10_000);
        eprintln!("observed: getpid {n}");
        crate::sched::assert_ping_pong(&d, 1000);
    }
    // No CAP_SYS_ADMIN: no BTF at all.
    let socket = temp_path("faults-btf-none", "sock");
    let config = temp_path("faults-btf-none", "toml");
    fs::write(
        &config,
        format!("[daemon]\nsocket = {socket:?}\n[prometheus]\nenabled = false\n"),
    )
    .expect("config");
    let wrapper = in_private_mount_ns(mask, &NO_SYS_ADMIN);
    let out = ethand_tests::run_with_timeout(
        std::process::Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .arg(ethand_tests::ethand_bin())
            .args(["run", "--config"])
            .arg(&config)
            .env("NO_COLOR", "1")
            .env_remove("ETHAND_CONFIG"),
        Duration::from_secs(30),
    );
    let _ = fs::remove_file(&config);
    let _ = fs::remove_file(&socket);
    let err = text(&out.stderr);
    eprintln!("observed: without BTF: {} {}", out.status, err.trim());
    assert!(!out.status.success(), "ethand ran without any kernel BTF");
    assert!(
        err.contains("no kernel BTF")
            && err.contains("/sys/kernel/btf/vmlinux: empty file")
            && err.contains("from the kernel: Operation not permitted"),
        "the error does not name both BTF sources: {err}"
    );
}

// ------------------------------------------------------------------ OTLP outage

/// Short-lived `ethand-workload` processes, each making 100 getpid(): new processes and
/// series all the time.
fn churn(n: usize) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut kids = Vec::new();
    for _ in 0..n {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ethand-workload"))
            .args(["syscalls", "100", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn churn workload");
        // `go`, then stdin closed: it works, reports, exits.
        let _ = c.stdin.take().expect("stdin").write_all(b"g");
        kids.push(c);
    }
    for mut c in kids {
        let _ = c.wait();
    }
}

/// The OTLP endpoint is down for 40 s while the daemon exports every 200 ms and hundreds of
/// short-lived processes come and go (a per-process series each; exited ones leave the model
/// after 5 s, so its population is steady after the first quarter): its RSS stays under
/// 64 MiB and does not trend upward over the second half. Then a receiver starts on that port: the
/// first batch carries the exact getpid() total of a workload that ran during the outage, and
/// every batch is accounted for: the first one that arrives reports 0 exports ok and D
/// dropped, each later one exactly one more ok and still D dropped, and D equals the daemon's
/// dropped-batch counter (the batches made while nobody listened). Extends
/// `otlp::otlp_endpoint_down_counts_drops_then_recovers` (6 s, no churn) to a long outage.
#[test]
fn otlp_long_outage_bounded_memory_then_exact_recovery() {
    let _serial = serial();
    const OUTAGE: Duration = Duration::from_secs(40);
    const RSS_BOUND: u64 = 64 << 20;
    let port = ethand_tests::free_port();
    let d = Daemon::start(
        "faults-otlp",
        &format!(
            "[daemon]\nexit_grace_seconds = 5\n\
             [otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{port}\"\nprotocol = \"grpc\"\n\
             interval_ms = 200\ntimeout_ms = 150\n[prometheus]\ncomms = [\"ethand-workload\"]\n"
        ),
    );
    let getpids = 10_000u64;
    let mut w = workload(&["syscalls", &getpids.to_string(), "0"]);
    thread::sleep(SETTLE);
    let before = ethand_tests::syscall(find_proc(&d.snapshot(w.pid), w.pid), libc::SYS_getpid).0;
    let t0 = Instant::now();
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut spawned = 0;
    let mut went = false;
    while t0.elapsed() < OUTAGE {
        let tick = Instant::now();
        churn(10);
        spawned += 10;
        if !went && t0.elapsed() > OUTAGE / 2 {
            w.go();
            went = true;
        }
        if samples
            .last()
            .is_none_or(|(t, _)| t0.elapsed().as_secs_f64() - t >= 2.0)
        {
            samples.push((t0.elapsed().as_secs_f64(), d.status().rss_bytes));
        }
        thread::sleep(Duration::from_millis(200).saturating_sub(tick.elapsed()));
    }
    let down = d.status().otlp.expect("status has otlp");
    let rss: Vec<u64> = samples.iter().map(|s| s.1 >> 10).collect();
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let n = samples.len();
    let mean = |s: &[(f64, u64)]| s.iter().map(|x| x.1 as f64).sum::<f64>() / s.len() as f64;
    let (q2, q4) = (mean(&samples[n / 4..n / 2]), mean(&samples[3 * n / 4..]));
    eprintln!(
        "observed: {spawned} short-lived processes in {OUTAGE:?}; RSS KiB every 2 s: {rss:?}; \
         max {} KiB (bound {} KiB); mean second quarter {:.0} KiB, last quarter {:.0} KiB; \
         status while down {down:?}",
        max >> 10,
        RSS_BOUND >> 10,
        q2 / 1024.0,
        q4 / 1024.0
    );
    assert_eq!(down.exports_ok, 0, "nothing listened on {port}: {down:?}");
    assert_eq!(
        down.overflow_points, 0,
        "hundreds of processes fit otlp.max_points_per_metric: {down:?}"
    );
    assert!(
        down.dropped_batches >= 100,
        "40 s at 200 ms: about 200 batches, each dropped: {down:?}"
    );
    assert!(down.exports_failed >= down.dropped_batches, "{down:?}");
    assert!(max < RSS_BOUND, "RSS {} KiB over the bound", max >> 10);
    assert!(
        q4 <= q2 + f64::from(2u32 << 20),
        "RSS grows during the outage: second quarter {:.0} KiB, last quarter {:.0} KiB",
        q2 / 1024.0,
        q4 / 1024.0
    );

    let r = crate::otlp::GrpcReceiver::start(port);
    let up_at = Instant::now();
    r.store.wait_for(0, 8);
    let recovered_in = up_at.elapsed();
    let st = d.status();
    let up = st.otlp.clone().expect("status has otlp");
    let reqs = r.store.0.lock().unwrap().clone();
    let pid = w.pid.to_string();
    let value = |req, metric, want: &[(&str, &str)]| {
        crate::otlp::point(req, metric, want)
            .unwrap_or_else(|| panic!("no {metric} {want:?} in a batch"))
    };
    // (exports ok, dropped) as each batch reports them (as of the previous export).
    let books: Vec<(u64, u64)> = reqs
        .iter()
        .map(|q| {
            (
                value(q, "ethand.otlp.exports", &[("ethand.otlp.result", "ok")]) as u64,
                value(q, "ethand.otlp.dropped_batches", &[]) as u64,
            )
        })
        .collect();
    let first_getpid = value(
        &reqs[0],
        "ethand.process.syscalls",
        &[("process.pid", &pid), ("ethand.syscall", "getpid")],
    );
    eprintln!(
        "observed: first batch {recovered_in:?} after the receiver started; getpid before the \
         outage's work {before}, in the first batch {first_getpid}; (ok, dropped) per batch \
         {books:?}; status {up:?}"
    );
    assert_eq!(
        first_getpid,
        (before + getpids) as f64,
        "the first batch after the outage carries the exact total"
    );
    let d0 = books[0].1;
    assert_eq!(
        books[0].0, 0,
        "the first batch that arrives follows no success"
    );
    // The first batch to arrive may have been sent by the last attempt of a retry loop with
    // little of its budget left: the receiver got it, its reply came after that attempt's
    // deadline, and the exporter (rightly, from what it knows) counted the batch dropped.
    // Only a timeout may do that, and only to that one batch.
    let first_timed_out =
        books.len() > 1 && books[1] == (0, d0 + 1) && up.last_error.contains("timed out");
    let (oks_before, dropped) = if first_timed_out {
        eprintln!("observed: the first batch that arrived had timed out at the exporter");
        (1, d0 + 1)
    } else {
        (0, d0)
    };
    for (i, b) in books.iter().enumerate().skip(1) {
        assert_eq!(
            *b,
            (i as u64 - oks_before, dropped),
            "batch {i}: every batch after the first arrived is one more ok, no new drop: {books:?}"
        );
    }
    assert!(d0 >= down.dropped_batches, "{d0} < {down:?}");
    assert_eq!(
        up.dropped_batches, dropped,
        "the daemon's dropped-batch counter equals the batches made before the first that arrived"
    );
    assert!(
        up.exports_ok >= books.len() as u64 - 1 - oks_before,
        "{up:?} vs {} batches",
        books.len()
    );
    w.finish();
}

// ------------------------------------------------------------------ library replaced on disk

/// Removes a directory on drop.
struct RmDir(PathBuf);

impl Drop for RmDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Builds the stand-in libcuda from the same source with other options (-O0: every function
/// at another offset) into `out`.
fn build_other_cuda(out: &Path) {
    let src = Path::new(standins::SOURCES);
    let o = std::process::Command::new("gcc")
        .args([
            "-O0",
            "-fPIC",
            "-shared",
            "-fno-inline",
            "-Wl,-soname,libcuda.so.1",
            "-o",
        ])
        .arg(out)
        .arg(src.join("cuda.c"))
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

fn symbol_offset(lib: &Path, name: &str) -> u64 {
    dynamic_symbols(lib)
        .expect("nm")
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not in {}", lib.display()))
        .addr
}

/// `gpu_driver --cuda LIB -- PLAN`.
fn driver_on(lib: &Path, plan: &[&str]) -> Driver {
    let mut cmd = std::process::Command::new(&standins::shared().driver);
    cmd.arg("--cuda").arg(lib).arg("--");
    for w in plan {
        cmd.args(w.split_whitespace());
    }
    Driver::spawn(&mut cmd)
}

/// A driver upgrade while probed. libcuda at a path, a process using it, attached; the file
/// replaced the way package managers do it (new file, renamed over the old path) with a build
/// whose functions sit at other offsets: the old process is still counted exactly, a new
/// process mapping the new file gets it attached (a second entry, new inode) and is counted
/// exactly (not twice), and the old entry says its file is gone from disk. Then the new file
/// rewritten in place (same inode, `cp` style): ethand notices, resolves the symbols again and
/// says so, and a process loading the rewritten file is counted exactly (without that its
/// probes would sit at the old offsets, inside other functions).
#[test]
fn gpu_library_replaced_on_disk_while_attached() {
    let _serial = serial();
    let s = standins::shared();
    let dir = temp_path("faults-upgrade", "d");
    let _ = fs::remove_dir_all(&dir);
    let _rm = RmDir(dir.clone());
    fs::create_dir_all(dir.join("lib")).expect("dir");
    let lib = dir.join("lib/libcuda.so.1");
    let other = dir.join("other-build.so");
    fs::copy(&s.cuda, &lib).expect("install libcuda");
    build_other_cuda(&other);
    let (off_a, off_b) = (
        symbol_offset(&lib, "cuLaunchKernel"),
        symbol_offset(&other, "cuLaunchKernel"),
    );
    assert_ne!(
        off_a, off_b,
        "the two builds must place cuLaunchKernel differently"
    );
    let ino1 = inode_of(&lib);

    let d = Daemon::start("faults-upgrade", GPU_TOML);
    let mut old = driver_on(
        &lib,
        &[
            "wait_stdin",
            "launches 5",
            "wait_stdin",
            "launches 7",
            "wait_stdin",
        ],
    );
    old.wait_for("waiting");
    wait_attached(&d, ino1);
    old.resume();
    old.wait_for("waiting");
    assert_eq!(launches(&d, old.pid), 5, "old process before the upgrade");

    // The upgrade: write the new file next to it, rename over the old path.
    let tmp = dir.join("lib/.libcuda.so.1.dpkg-new");
    fs::copy(&other, &tmp).expect("write new file");
    fs::rename(&tmp, &lib).expect("rename over");
    let ino2 = inode_of(&lib);
    assert_ne!(ino1, ino2);
    let mut new = driver_on(&lib, &["wait_stdin", "launches 9", "wait_stdin"]);
    new.wait_for("waiting");
    let (_, took) = wait_attached(&d, ino2);
    new.resume();
    new.wait_for("waiting");
    old.resume();
    old.wait_for("waiting");
    let (old_n, new_n) = (launches(&d, old.pid), launches(&d, new.pid));
    let st = d.status();
    let e1 = lib_entry(&st, ino1);
    let e2 = lib_entry(&st, ino2);
    eprintln!(
        "observed: cuLaunchKernel at {off_a:#x} (old build) / {off_b:#x} (new); new inode \
         attached {took:?} after the new process loaded it; launches old {old_n} (want 12), \
         new {new_n} (want 9)\nobserved: old entry {e1:?}\nobserved: new entry {e2:?}"
    );
    assert_eq!(old_n, 12, "old process after the upgrade");
    assert_eq!(new_n, 9, "new process on the new file");
    assert_eq!((e1.len(), e2.len()), (1, 1), "one entry per inode");
    assert_eq!(e1[0].state, ProbeState::Attached, "{:?}", e1[0]);
    assert_eq!(e2[0].state, ProbeState::Attached, "{:?}", e2[0]);
    assert!(
        e1[0].detail.contains("replaced or deleted on disk"),
        "the old entry does not say its file is gone: {:?}",
        e1[0].detail
    );
    assert!(
        !e2[0].detail.contains("replaced or deleted"),
        "{:?}",
        e2[0].detail
    );
    new.finish();

    // In place: the same inode rewritten with the first build (truncate + write).
    fs::write(&lib, fs::read(&s.cuda).expect("read first build")).expect("rewrite in place");
    assert_eq!(inode_of(&lib), ino2, "rewritten in place: same inode");
    let t0 = Instant::now();
    let e = loop {
        let st = d.status();
        let e = lib_entry(&st, ino2).first().map(|e| (*e).clone());
        if let Some(e) = e.filter(|e| e.detail.contains("rewritten in place")) {
            break e;
        }
        assert!(
            t0.elapsed() < ATTACH_TIMEOUT,
            "ethand did not notice the rewrite: {:?}",
            lib_entry(&st, ino2)
        );
        thread::sleep(Duration::from_millis(100));
    };
    let noticed = t0.elapsed();
    let mut third = driver_on(&lib, &["wait_stdin", "launches 4", "wait_stdin"]);
    third.wait_for("waiting");
    third.resume();
    third.wait_for("waiting");
    let third_n = launches(&d, third.pid);
    eprintln!(
        "observed: rewrite noticed after {noticed:?}: {:?} {}; launches of a process on the \
         rewritten file {third_n} (want 4)",
        e.state, e.detail
    );
    third.finish();
    assert_eq!(e.state, ProbeState::Attached, "{e:?}");
    assert_eq!(third_n, 4, "process on the rewritten file");
    assert!(
        d.log_text().contains("rewritten in place"),
        "the log does not mention the rewrite"
    );
    old.finish();
    // Still alive and answering.
    assert_getpid_exact(&d, 1000);
}
