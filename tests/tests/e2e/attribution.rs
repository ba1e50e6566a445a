//! Workload attribution end to end: real cgroup v2 directories in the path forms the kubelet
//! and container runtimes create, fake runtime metadata in a temporary root, workloads moved
//! into those cgroups before they exec, with job/rank variables and a secret in their
//! environment. The snapshot JSON and /metrics must carry container, pod, namespace, job and
//! rank exactly, and the secret's value must appear nowhere ethand writes.
//!
//! Needs a writable cgroup v2 hierarchy (at /sys/fs/cgroup, or /sys/fs/cgroup/unified on a
//! hybrid host); without one the test says so and returns.
use std::{
    ffi::CString,
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, SETTLE, find_proc, serial, temp_path, text};

const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzEXAMPLEKEY-ethand-e2e";

/// Where cgroup v2 is mounted (the unified mount on a hybrid host), if anywhere.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2")
                .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect();
    mounts.sort_by_key(|m| m != Path::new("/sys/fs/cgroup"));
    mounts.into_iter().next()
}

/// The cgroups this test created, removed leaf first on drop after moving any process left in
/// them back to the test's own cgroup.
struct Cgroups {
    root: PathBuf,
    home: PathBuf,
    created: Vec<PathBuf>,
}

impl Cgroups {
    fn new(root: PathBuf) -> Self {
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/')
            .to_string();
        Self {
            home: root.join(rel),
            root,
            created: Vec::new(),
        }
    }

    /// Creates `rel` (a path like "/kubepods/pod.../id") and its missing parents.
    fn create(&mut self, rel: &str) -> std::io::Result<PathBuf> {
        let mut p = self.root.clone();
        for seg in rel.split('/').filter(|s| !s.is_empty()) {
            p.push(seg);
            match fs::create_dir(&p) {
                Ok(()) => self.created.push(p.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(p)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = fs::write(self.home.join("cgroup.procs"), pid);
            }
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                // The last process's exit takes a moment to leave the cgroup.
                thread::sleep(Duration::from_millis(20));
            }
            if dir.exists() {
                eprintln!("could not remove test cgroup {}", dir.display());
            }
        }
    }
}

/// `ethand-workload getpid-loop` started inside cgroup `cg`: the child writes itself into
/// `cg/cgroup.procs` between fork and exec, so the program ethand identifies never ran
/// anywhere else (and the exec makes ethand read its metadata again if it saw the fork).
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn start(cg: &Path, env: &[(&str, &str)]) -> Self {
        let procs = CString::new(
            cg.join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("no NUL in path");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ethand-workload"));
        cmd.arg("getpid-loop")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n < 0 { Err(err) } else { Ok(()) }
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the workload in {}: {e}", cg.display()));
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut w = Self {
            child,
            stdin,
            lines,
        };
        let l = w.line();
        assert!(l.starts_with("ready"), "workload said {l:?}");
        w
    }

    fn line(&mut self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line from the workload")
    }

    fn byte(&mut self) {
        let s = self.stdin.as_mut().expect("stdin");
        s.write_all(b"g").and_then(|()| s.flush()).expect("write");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct RemoveTree(PathBuf);

impl Drop for RemoveTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One test case: a cgroup path form and the runtime metadata that goes with it.
struct Case {
    name: &'static str,
    cgroup: String,
    id: String,
    runtime: &'static str,
    /// (file under the metadata root, contents)
    meta: (String, String),
    pod: Option<&'static str>,
    namespace: Option<&'static str>,
    container: &'static str,
    pod_uid: Option<&'static str>,
    qos: Option<&'static str>,
}

fn cases(tag: u32) -> Vec<Case> {
    // Ids unique to this run, so that a real container can never match.
    let id = |n: u32| format!("{:08x}{:056x}", 0xe7a0_0000u32 + n, tag as u64);
    let uid1 = format!("e7a0{tag:04x}-0001-4c8e-9a10-5d2e6f7a8b9c");
    let uid2 = format!("e7a0{tag:04x}-0002-4c8e-9a10-5d2e6f7a8b9c");
    let (id1, id2, id3) = (id(1), id(2), id(3));
    let uid1_: &'static str = Box::leak(uid1.replace('-', "_").into_boxed_str());
    vec![
        Case {
            name: "systemd driver, containerd",
            cgroup: format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid1_}.slice/cri-containerd-{id1}.scope"
            ),
            meta: (
                format!("containerd/{id1}/config.json"),
                format!(
                    r#"{{"ociVersion":"1.1.0","process":{{"env":["PATH=/bin","AWS_SECRET_ACCESS_KEY={SECRET}"]}},"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-name":"trainer-0","io.kubernetes.cri.sandbox-namespace":"ml","io.kubernetes.cri.container-name":"pytorch"}}}}"#
                ),
            ),
            id: id1,
            runtime: "containerd",
            pod: Some("trainer-0"),
            namespace: Some("ml"),
            container: "pytorch",
            pod_uid: Some(Box::leak(uid1.into_boxed_str())),
            qos: Some("burstable"),
        },
        Case {
            name: "cgroupfs driver, CRI-O",
            cgroup: format!("/kubepods/besteffort/pod{uid2}/{id2}"),
            meta: (
                format!("crio/{id2}/userdata/config.json"),
                r#"{"annotations":{"io.kubernetes.pod.name":"infer-7f9c","io.kubernetes.pod.namespace":"serving","io.kubernetes.container.name":"server"}}"#.to_string(),
            ),
            id: id2,
            runtime: "cri-o",
            pod: Some("infer-7f9c"),
            namespace: Some("serving"),
            container: "server",
            pod_uid: Some(Box::leak(uid2.into_boxed_str())),
            qos: Some("besteffort"),
        },
        Case {
            name: "plain Docker",
            cgroup: format!("/system.slice/docker-{id3}.scope"),
            meta: (
                format!("docker/{id3}/config.v2.json"),
                r#"{"Name":"/etl-batch","Config":{"Labels":{}}}"#.to_string(),
            ),
            id: id3,
            runtime: "docker",
            pod: None,
            namespace: None,
            container: "etl-batch",
            pod_uid: None,
            qos: None,
        },
    ]
}

/// The sample lines of `family` for `pid`.
fn series<'a>(body: &'a str, family: &str, pid: u32) -> Vec<&'a str> {
    let pid = format!("pid=\"{pid}\"");
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&pid))
        .collect()
}

#[test]
fn cgroup_paths_runtime_metadata_and_environment_attribute_processes() {
    let _serial = serial();
    let Some(mount) = cgroup2_mount() else {
        eprintln!("SKIPPED: no cgroup v2 hierarchy mounted here");
        return;
    };
    let mut cgroups = Cgroups::new(mount.clone());
    let tag = std::process::id() & 0xffff;
    let cases = cases(tag);
    let meta_root = temp_path("attribution-meta", "d");
    let _cleanup = RemoveTree(meta_root.clone());
    let mut dirs = Vec::new();
    for c in &cases {
        match cgroups.create(&c.cgroup) {
            Ok(d) => dirs.push(d),
            Err(e) => {
                eprintln!(
                    "SKIPPED: cannot create cgroup {} under {}: {e}",
                    c.cgroup,
                    mount.display()
                );
                return;
            }
        }
        let f = meta_root.join(&c.meta.0);
        fs::create_dir_all(f.parent().expect("parent")).expect("metadata dir");
        fs::write(&f, &c.meta.1).expect("metadata file");
    }
    println!(
        "cgroup v2 at {}; metadata under {}",
        mount.display(),
        meta_root.display()
    );

    let m = meta_root.display();
    let d = Daemon::start(
        "attribution",
        &format!(
            "[prometheus]\ncomms = [\"ethand-workload\"]\n[attribution]\ncontainerd_dirs = [\"{m}/containerd\"]\ncrio_dirs = [\"{m}/crio\"]\ndocker_dirs = [\"{m}/docker\"]\n"
        ),
    );

    let env = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("TORCHELASTIC_RUN_ID", "job-42"),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
    ];
    let mut workers: Vec<Worker> = dirs.iter().map(|cg| Worker::start(cg, &env)).collect();
    for (w, c) in workers.iter_mut().zip(&cases) {
        let own = fs::read_to_string(format!("/proc/{}/cgroup", w.pid())).expect("cgroup");
        assert!(
            own.lines()
                .any(|l| l.strip_prefix("0::") == Some(c.cgroup.as_str())),
            "{}: workload not in {}: {own}",
            c.name,
            c.cgroup
        );
        w.byte(); // go: burn CPU so that it has per-process series
    }
    thread::sleep(SETTLE * 2);

    // Snapshot JSON: exact identity.
    for (w, c) in workers.iter().zip(&cases) {
        let raw = d.cli(&["snapshot", "--pid", &w.pid().to_string(), "--json"]);
        assert!(raw.status.success(), "snapshot: {}", text(&raw.stderr));
        let raw_json = text(&raw.stdout);
        assert!(
            !raw_json.contains(SECRET),
            "{}: the secret is in the snapshot",
            c.name
        );
        let t: ethand_tests::TreeSnapshot = serde_json::from_str(&raw_json).expect("TreeSnapshot");
        let p = find_proc(&t, w.pid());
        let wl = p
            .workload
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no workload identity in {}", c.name, p.cgroup));
        println!("{}: cgroup {} -> {wl:?}", c.name, p.cgroup);
        assert_eq!(p.cgroup, c.cgroup, "{}", c.name);
        assert_eq!(
            wl.container_runtime.as_deref(),
            Some(c.runtime),
            "{}",
            c.name
        );
        assert_eq!(
            wl.container_id.as_deref(),
            Some(c.id.as_str()),
            "{}",
            c.name
        );
        assert_eq!(wl.container.as_deref(), Some(c.container), "{}", c.name);
        assert_eq!(wl.pod.as_deref(), c.pod, "{}", c.name);
        assert_eq!(wl.namespace.as_deref(), c.namespace, "{}", c.name);
        assert_eq!(wl.pod_uid.as_deref(), c.pod_uid, "{}", c.name);
        assert_eq!(wl.qos_class.as_deref(), c.qos, "{}", c.name);
        assert_eq!(wl.job_id.as_deref(), Some("job-42"), "{}", c.name);
        assert_eq!(wl.job_id_source.as_deref(), Some("TORCHELASTIC_RUN_ID"));
        assert_eq!(wl.rank, Some(3), "{}", c.name);
        assert_eq!(wl.rank_source.as_deref(), Some("RANK"));
        let keys: Vec<&str> = wl.env.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["RANK", "TORCHELASTIC_RUN_ID", "WORLD_SIZE"],
            "{}",
            c.name
        );
        // The terminal header shows it on one line.
        let human = text(&d.cli(&["snapshot", "--pid", &w.pid().to_string()]).stdout);
        let line = human
            .lines()
            .find(|l| l.starts_with("workload: "))
            .unwrap_or_else(|| panic!("no workload line in:\n{human}"));
        println!("  {line}");
        assert!(
            line.contains("job job-42") && line.contains("rank 3/8"),
            "{line}"
        );
        assert!(line.contains(c.container), "{line}");
    }

    // /metrics: per-process series carry the labels; the info series the container id; the
    // per-cgroup series the container and pod.
    let body = d.metrics();
    assert!(!body.contains(SECRET), "the secret is in /metrics");
    for (w, c) in workers.iter().zip(&cases) {
        let cpu = series(&body, "ethand_process_cpu_seconds_total", w.pid());
        assert_eq!(cpu.len(), 1, "{}: {cpu:?}", c.name);
        let mut want = vec![
            format!("container=\"{}\"", c.container),
            "job_id=\"job-42\"".to_string(),
            "rank=\"3\"".to_string(),
        ];
        if let (Some(pod), Some(ns)) = (c.pod, c.namespace) {
            want.push(format!("pod=\"{pod}\""));
            want.push(format!("namespace=\"{ns}\""));
        } else {
            assert!(
                !cpu[0].contains("pod=") && !cpu[0].contains("namespace="),
                "{}",
                cpu[0]
            );
        }
        for l in &want {
            assert!(
                cpu[0].contains(l.as_str()),
                "{}: {l} missing in {}",
                c.name,
                cpu[0]
            );
        }
        let info = series(&body, "ethand_process_workload_info", w.pid());
        assert_eq!(info.len(), 1, "{}: {info:?}", c.name);
        assert!(
            info[0].contains(&format!("container_id=\"{}\"", c.id))
                && info[0].contains(&format!("container_runtime=\"{}\"", c.runtime)),
            "{}: {}",
            c.name,
            info[0]
        );
        let cg: Vec<&str> = body
            .lines()
            .filter(|l| {
                l.starts_with("ethand_cgroup_cpu_seconds_total{")
                    && l.contains(&format!("cgroup=\"{}\"", c.cgroup))
            })
            .collect();
        assert_eq!(cg.len(), 1, "{}: {cg:?}", c.name);
        assert!(
            cg[0].contains(&format!("container=\"{}\"", c.container)),
            "{}",
            cg[0]
        );
        if let Some(pod) = c.pod {
            assert!(cg[0].contains(&format!("pod=\"{pod}\"")), "{}", cg[0]);
        }
        assert!(
            !cg[0].contains("job_id="),
            "job and rank stay off cgroup series: {}",
            cg[0]
        );
    }

    // Nor in status, nor in the daemon's log.
    for args in [&["status"][..], &["status", "--json"][..]] {
        let out = d.cli(args);
        assert!(
            !text(&out.stdout).contains(SECRET),
            "the secret is in ethand {args:?}"
        );
    }
    let t0 = Instant::now();
    for w in &mut workers {
        w.byte(); // stop
        let l = w.line();
        assert!(l.starts_with("done"), "{l}");
    }
    drop(workers);
    thread::sleep(SETTLE);
    assert!(
        !d.log_text().contains(SECRET),
        "the secret is in the daemon log"
    );
    println!("checked in {:?}", t0.elapsed());
    drop(d);
    drop(cgroups);
}
