//! `ethand record`'s GPU tracks against the stand-ins: a driver started with
//! libethand_cupti.so makes a known set of kernels and copies on the stand-in CUPTI's
//! emulated serial GPU (10 us per kernel, 100 ns per KiB copied), twice; the recording must
//! hold exactly those, on the GPU track of their device and stream, each as long as the GPU
//! ran it, inside the recording and never overlapping on its track, with a flow from each
//! kernel's launch call. First while the daemon owns the CUPTI directory (the daemon opens
//! the window and streams its entries over the local API), then with the daemon stopped
//! (the recording opens the window itself): the same tracks either way.
use std::{fs, path::Path};

use ethand_tests::{
    Daemon, RemoveOnDrop, SETTLE, serial,
    standins::{self, Driver, Lib},
    temp_path,
};
use serde_json::Value;

use crate::record::{Recorder, events, f, load, u};

const KERNEL_NS: f64 = 10_000.0;
/// PyTorch's float add kernel, as CUPTI names it.
const TORCH_ADD: &str = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_";

#[test]
fn record_gpu_tracks_hold_exactly_what_the_gpu_ran() {
    let _serial = serial();
    let d = Daemon::start("record-gpu", "");
    let (lib, cfg) = recording_config(&d, "record-gpu");
    let add = format!("kernel {TORCH_ADD} x 50");
    let work = [
        "wait_stdin",
        "wait_cupti_enabled",
        "kernel gemm_fp32 x 300",
        "htod 1M x 4",
        &add,
        "sync ctx",
    ];
    let script: Vec<&str> = std::iter::once("cuinit")
        .chain(work)
        .chain(work)
        .chain(["wait_stdin"])
        .collect();
    let mut drv = injected_job(&lib, &script);
    std::thread::sleep(SETTLE);
    let args = ["--config", cfg.0.to_str().expect("utf-8")];

    // The daemon owns the directory: it opens the window and streams the entries.
    let (trace, pf) = record(&mut drv, &args, "daemon");
    let through = trace["metadata"]["gpu_activity"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p.get("through_daemon").is_some()))
        .cloned();
    eprintln!("observed: through the daemon: {through:?}");
    let through = through.expect("the recording says it went through the daemon");
    assert_eq!(
        (
            through["through_daemon"].as_str(),
            u(&through, "entries_dropped_by_daemon"),
            &through["stream_broken"]
        ),
        (d.socket.to_str(), 0, &Value::Null),
        "{through}"
    );
    check_tracks(&trace, &pf, drv.pid);

    // The daemon stopped: the recording opens the window itself.
    drop(d);
    let (trace, pf) = record(&mut drv, &args, "own");
    assert!(
        !trace["metadata"]["gpu_activity"]
            .to_string()
            .contains("through_daemon"),
        "{}",
        trace["metadata"]["gpu_activity"]
    );
    check_tracks(&trace, &pf, drv.pid);
    let truth = drv.finish();
    assert_eq!(truth.kernels.get("gemm_fp32"), Some(&600));
}

/// The daemon's installed library, and a recording's config naming the daemon's CUPTI
/// directory (`tag`: the daemon's name) and socket, removed on drop.
fn recording_config(d: &Daemon, tag: &str) -> (std::path::PathBuf, RemoveOnDrop) {
    let dir = temp_path(tag, "cupti");
    let lib = dir.join("libethand_cupti.so");
    assert!(lib.exists(), "the daemon did not install {}", lib.display());
    let cfg = temp_path(&format!("{tag}-rec"), "toml");
    fs::write(
        &cfg,
        format!(
            "[gpu]\ncupti_dir = {dir:?}\n[daemon]\nsocket = {:?}\n",
            d.socket
        ),
    )
    .expect("write config");
    (lib, RemoveOnDrop(cfg))
}

/// A stand-in driver running `script`, started with `lib` (and the stand-in CUPTI), at its
/// first wait.
fn injected_job(lib: &Path, script: &[&str]) -> Driver {
    let s = standins::shared();
    let mut cmd = s.command(&[Lib::Cuda], script);
    cmd.env("CUDA_INJECTION64_PATH", lib)
        .env("ETHAND_CUPTI_LIB", &s.cupti13);
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    drv
}

/// Records the driver's next round of work, to JSON and Perfetto.
fn record(drv: &mut Driver, args: &[&str], tag: &str) -> (Value, std::path::PathBuf) {
    let out = temp_path(&format!("record-gpu-{tag}"), "json");
    let pf = temp_path(&format!("record-gpu-{tag}"), "pftrace");
    let both = [args, &["-o", pf.to_str().expect("utf-8")]].concat();
    let rec = Recorder::start_with(drv.pid, "60s", &out, 1000, &both);
    drv.resume();
    // Its library maps the control file within 5 s of its creation (the recording's own),
    // and the daemon opens the window at its next round.
    drv.wait_for("waiting");
    let (code, stdout, stderr, _) = rec.interrupt();
    assert_eq!(code, 0, "ethand record failed:\n{stderr}");
    eprintln!("observed: ethand record ({tag}): {}", stdout.trim());
    (load(&out), pf)
}

/// Exactly the 300 gemm and 50 add kernels and 4 copies of one round of work, each on the
/// one track, as long as the GPU ran it, with a flow from its launch call.
fn check_tracks(trace: &Value, pf: &Path, pid: u32) {
    let _rm = ethand_tests::RemoveOnDrop(pf.to_path_buf());
    let meta = &trace["metadata"];
    let (pid32, pid) = (pid, u64::from(pid));
    eprintln!("observed: gpu_activity {}", meta["gpu_activity"]);
    let p = &meta["gpu_activity"][0];
    assert_eq!((u(p, "pid"), p["state"].as_str()), (pid, Some("recorded")));
    assert_eq!(
        (u(p, "kernels"), u(p, "copies"), u(p, "memsets")),
        (350, 4, 0),
        "{p}"
    );
    assert_eq!(
        (
            u(p, "records_dropped_by_cupti"),
            u(p, "records_lost_by_ethand"),
            u(p, "syncs"),
            u(p, "records_not_drawn")
        ),
        (0, 0, 1, 0),
        "{p}"
    );
    let dur = f(meta, "duration_s");
    let gpu: Vec<&Value> = events(trace)
        .iter()
        .filter(|e| {
            matches!(
                e["cat"].as_str(),
                Some("gpu_kernel" | "gpu_memcpy" | "gpu_memset")
            )
        })
        .collect();
    let named = |n: &str| gpu.iter().filter(|e| e["name"] == n).count();
    let demangled = "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3> >";
    assert_eq!(named("gemm_fp32"), 300);
    assert_eq!(named(demangled), 50);
    assert_eq!(named("host_to_device"), 4);
    assert_eq!(gpu.len(), 354, "nothing else");
    for e in &gpu {
        assert_eq!(e["ph"], "X");
        assert_eq!(u(e, "pid"), pid);
        let a = &e["args"];
        match e["cat"].as_str() {
            Some("gpu_kernel") => {
                assert_eq!(f(e, "dur") * 1000.0, KERNEL_NS, "{e}");
                let class = if e["name"] == demangled {
                    assert_eq!(a["mangled"], TORCH_ADD);
                    "elementwise"
                } else {
                    "gemm"
                };
                assert_eq!(a["class"], class, "{e}");
            }
            Some("gpu_memcpy") => {
                assert_eq!(u(a, "bytes"), 1 << 20);
                assert_eq!(
                    (a["src"].as_str(), a["dst"].as_str()),
                    (Some("pageable"), Some("device")),
                    "{e}"
                );
                // 100 ns per KiB.
                assert_eq!(f(e, "dur") * 1000.0, 102_400.0, "{e}");
            }
            c => panic!("unexpected category {c:?}: {e}"),
        }
        // Inside the recording (µs from its start), mapped from CUPTI's clock.
        let ts = f(e, "ts");
        assert!(ts > 0.0 && ts < dur * 1e6, "{e} outside [0, {dur} s]");
    }
    // One serial GPU: one track, its slices one after the other.
    let tids: std::collections::BTreeSet<u64> = gpu.iter().map(|e| u(e, "tid")).collect();
    assert_eq!(tids.len(), 1, "{tids:?}");
    let tid = *tids.first().expect("one");
    let label = events(trace)
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && u(e, "tid") == tid)
        .map(|e| e["args"]["name"].clone());
    assert_eq!(label, Some(Value::from("GPU 0 stream 0")), "track {tid}");
    // Flows: from inside a cuLaunchKernel slice of the launching thread to its kernel.
    let launches: Vec<(f64, f64)> = events(trace)
        .iter()
        .filter(|e| e["name"] == "cuLaunchKernel" && u(e, "pid") == pid)
        .map(|e| (f(e, "ts"), f(e, "ts") + f(e, "dur")))
        .collect();
    let flow = |ph: &str| -> Vec<&Value> {
        events(trace)
            .iter()
            .filter(|e| e["cat"] == "gpu_flow" && e["ph"] == ph)
            .collect()
    };
    let (starts, ends) = (flow("s"), flow("f"));
    assert_eq!((starts.len(), ends.len()), (350, 350));
    let kernel_at: std::collections::BTreeSet<(u64, String)> = gpu
        .iter()
        .filter(|e| e["cat"] == "gpu_kernel")
        .map(|e| (u(e, "tid"), e["ts"].to_string()))
        .collect();
    for (s, e) in starts.iter().zip(&ends) {
        assert_eq!(s["id"], e["id"]);
        assert_eq!(u(s, "tid"), pid, "{s}");
        let ts = f(s, "ts");
        assert!(
            launches.iter().any(|(a, b)| *a <= ts && ts <= *b),
            "flow start {s} inside no cuLaunchKernel slice"
        );
        assert!(
            kernel_at.contains(&(u(e, "tid"), e["ts"].to_string())),
            "flow end {e} at no kernel"
        );
    }
    let mut spans: Vec<(f64, f64)> = gpu.iter().map(|e| (f(e, "ts"), f(e, "dur"))).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0 + 0.001,
            "overlap on one track: {w:?}"
        );
    }

    // The Perfetto output: the same slices on one "GPU 0 stream 0" track under the process,
    // as trace_processor's import rules want them.
    let d = ethand_perfetto::decode::decode(&fs::read(pf).expect("the Perfetto trace"))
        .unwrap_or_else(|e| panic!("import rules: {e}"));
    let slices: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.category.starts_with("gpu_"))
        .collect();
    // (Flows are no slices in Perfetto's format: on the slices themselves.)
    assert_eq!(slices.len(), 354);
    let tracks: std::collections::BTreeSet<u64> = slices.iter().map(|e| e.track).collect();
    assert_eq!(tracks.len(), 1, "{tracks:?}");
    let t = &d.tracks[tracks.first().expect("one")];
    let parent = t.parent.map(|p| d.tracks[&p].pid);
    assert_eq!(
        (t.name.as_str(), parent),
        ("GPU 0 stream 0", Some(Some(pid32 as i32)))
    );
    // Each kernel ends the flow its launch call's slice began.
    let outs: std::collections::HashSet<u64> = d
        .events
        .iter()
        .filter(|e| e.name == "cuLaunchKernel")
        .flat_map(|e| e.flows_out.iter().copied())
        .collect();
    let joined = slices
        .iter()
        .filter(|e| e.flows_in.len() == 1 && outs.contains(&e.flows_in[0]))
        .count();
    assert_eq!(joined, 350);
    for e in &slices {
        let want = if e.category == "gpu_memcpy" {
            102_400
        } else {
            10_000
        };
        assert_eq!(e.end_ns.map(|end| end - e.start_ns), Some(want), "{e:?}");
    }
}

/// One `gpu_trace` request on a fresh connection; the connection, for more.
fn ask_trace(d: &Daemon, pids: &[u32], duration_ms: u64) -> std::os::unix::net::UnixStream {
    use std::io::Write;
    let s = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    let req = serde_json::json!({"cmd": "gpu_trace", "pids": pids, "duration_ms": duration_ms});
    (&s).write_all(format!("{req}\n").as_bytes()).expect("send");
    s
}

/// An `{"entry":...}` line's (what, window state, close reason); state and reason 0 for an
/// entry that is no window event (ethand_common's CuptiEventHeader and CuptiWindowEvent).
fn window_event(l: &Value) -> Option<(u32, u32, u32)> {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD
        .decode(l["entry"].as_str()?)
        .ok()?;
    let u32_at = |o: usize| {
        b.get(o..o + 4)
            .map(|x| u32::from_ne_bytes(x.try_into().unwrap()))
    };
    let what = u32_at(0)?;
    if what != 3 {
        return Some((what, 0, 0));
    }
    Some((what, u32_at(32)?, u32_at(44)?))
}

fn line(s: &std::os::unix::net::UnixStream) -> Value {
    use std::io::BufRead;
    let mut l = String::new();
    // One byte at a time: the next line stays in the socket for the next call.
    let mut r = std::io::BufReader::with_capacity(1, s);
    r.read_line(&mut l).expect("read a line");
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
}

/// The API's `gpu_trace` (the daemon's side of a recording): what it refuses, a process not
/// started with the library named as such, at most four streams at once, and a stream that
/// ends with its client, freeing its place and its window.
#[test]
fn gpu_trace_streams_are_bounded_and_end_with_their_client() {
    let _serial = serial();
    let d = Daemon::start("gpu-trace", "");
    let dir = temp_path("gpu-trace", "cupti");
    let lib = dir.join("libethand_cupti.so");
    let too_many: Vec<u32> = (1..=65).collect();
    for (pids, ms, want) in [
        (&[][..], 1000, "1 to 64 pids, not 0"),
        (&too_many[..], 1000, "1 to 64 pids, not 65"),
        (&[1][..], 0, "duration_ms must be 1 to 3600000"),
        (&[1][..], 3_600_001, "duration_ms must be 1 to 3600000"),
    ] {
        let answer = line(&ask_trace(&d, pids, ms));
        assert!(
            answer["error"].as_str().is_some_and(|e| e.contains(want)),
            "{answer}"
        );
    }
    // A process without the library: named, no window, and the stream ends at once.
    let me = std::process::id();
    let s = ask_trace(&d, &[me], 60_000);
    let opened = line(&s);
    assert_eq!(
        opened["opened"][0]["state"].as_str(),
        Some("not_injected"),
        "{opened}"
    );
    assert_eq!(opened["opened"][0]["pid"], me);
    let done = line(&s);
    assert_eq!(
        done["done"],
        serde_json::json!({"entries": 0, "entries_dropped": 0, "closed": true})
    );

    // Four injected stand-in jobs, each one's window held open by a stream of 60 s (a
    // second window in one process would end its first).
    let mut jobs: Vec<Driver> = (0..5)
        .map(|_| injected_job(&lib, &["cuinit", "wait_stdin"]))
        .collect();
    std::thread::sleep(SETTLE);
    let streams: Vec<_> = jobs[..4]
        .iter()
        .map(|drv| {
            let s = ask_trace(&d, &[drv.pid], 60_000);
            let opened = line(&s);
            assert!(opened["opened"][0]["window_id"].is_u64(), "{opened}");
            s
        })
        .collect();
    let drv = &jobs[4];
    let fifth = line(&ask_trace(&d, &[drv.pid], 60_000));
    eprintln!("observed: a fifth stream: {fifth}");
    assert!(
        fifth["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("busy: 4 GPU traces")),
        "{fifth}"
    );
    // Clients gone: their streams end at the next rounds and a new one is served.
    drop(streams);
    let t0 = std::time::Instant::now();
    loop {
        let answer = line(&ask_trace(&d, &[drv.pid], 1000));
        if answer.get("opened").is_some() {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "still busy 10 s after its clients went: {answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // A second window asked of a process ends its first: the first stream's library says
    // why (reason 4, another_window) and the stream ends, closed.
    let first = ask_trace(&d, &[jobs[0].pid], 60_000);
    assert!(line(&first)["opened"][0]["window_id"].is_u64());
    // Once its library has opened it (the OPENED entry).
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &(u32, u32, u32)| e.1 == 1) {
        seen.push(window_event(&line(&first)).expect("an entry"));
    }
    let second = ask_trace(&d, &[jobs[0].pid], 60_000);
    assert!(line(&second)["opened"][0]["window_id"].is_u64());
    loop {
        let l = line(&first);
        if l.get("done").is_some() {
            assert_eq!(l["done"]["closed"], true, "{l}");
            break;
        }
        seen.push(window_event(&l).expect("an entry"));
    }
    eprintln!("observed: the first stream's window events (what, state, reason): {seen:?}");
    assert!(seen.contains(&(3, 2, 4)), "{seen:?}");
    drop(second);
    for mut j in jobs.drain(..) {
        j.resume();
        j.finish();
    }
}

/// 200,000 kernels recorded through the daemon (its ring drained once a round, its queue to
/// the recording bounded): the count is exact, and every record the library handed over
/// reached the recording.
#[test]
fn a_burst_recorded_through_the_daemon_loses_nothing() {
    const N: u64 = 200_000;
    let _serial = serial();
    let d = Daemon::start("record-burst", "");
    let (lib, cfg) = recording_config(&d, "record-burst");
    let burst = format!("kernel gemm_fp32 x {N}");
    let script = [
        "cuinit",
        "wait_stdin",
        "wait_cupti_enabled",
        &burst,
        "sync ctx",
        "wait_stdin",
    ];
    let mut drv = injected_job(&lib, &script);
    std::thread::sleep(SETTLE);
    let out = temp_path("record-burst", "json");
    let args = ["--config", cfg.0.to_str().expect("utf-8")];
    let rec = Recorder::start_with(drv.pid, "60s", &out, 1000, &args);
    drv.resume();
    drv.wait_for("waiting");
    let (code, _, stderr, _) = rec.interrupt();
    assert_eq!(code, 0, "ethand record failed:\n{stderr}");
    let truth = drv.finish();
    assert_eq!(truth.kernels.get("gemm_fp32"), Some(&N));
    let trace = load(&out);
    let a = &trace["metadata"]["gpu_activity"];
    eprintln!("observed: burst of {N}: {a}");
    let p = &a[0];
    assert_eq!(
        (
            u(p, "kernels"),
            u(p, "records_lost_by_ethand"),
            u(p, "records_dropped_by_cupti")
        ),
        (N, 0, 0),
        "{a}"
    );
    assert_eq!(u(&a[1], "entries_dropped_by_daemon"), 0, "{a}");
}
