//! `ethand record`'s GPU tracks against the stand-ins: a driver started with
//! libethand_cupti.so (installed by a daemon that then stops, as on a node where the
//! daemon ran) makes a known set of kernels and copies on the stand-in CUPTI's emulated
//! serial GPU (10 us per kernel, 100 ns per KiB copied); the recording must hold exactly
//! those, on the GPU track of their device and stream, each as long as the GPU ran it,
//! inside the recording and never overlapping on its track. While the daemon owns the
//! CUPTI directory, the recording must say so and still write the host tracks.
use std::fs;

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
    let dir = temp_path("record-gpu", "cupti");
    let lib = dir.join("libethand_cupti.so");
    assert!(lib.exists(), "the daemon did not install {}", lib.display());
    let cfg = temp_path("record-gpu-rec", "toml");
    fs::write(&cfg, format!("[gpu]\ncupti_dir = {dir:?}\n")).expect("write config");
    let _rm = RemoveOnDrop(cfg.clone());
    let s = standins::shared();
    let add = format!("kernel {TORCH_ADD} x 50");
    let mut cmd = s.command(
        &[Lib::Cuda],
        &[
            "cuinit",
            "wait_stdin",
            "wait_cupti_enabled",
            "kernel gemm_fp32 x 300",
            "htod 1M x 4",
            &add,
            "sync ctx",
            "wait_stdin",
        ],
    );
    cmd.env("CUDA_INJECTION64_PATH", &lib)
        .env("ETHAND_CUPTI_LIB", &s.cupti13);
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    std::thread::sleep(SETTLE);
    let args = ["--config", cfg.to_str().expect("utf-8")];

    // The daemon owns the directory: host tracks only, and the recording says why.
    let owned = temp_path("record-gpu-owned", "json");
    let rec = Recorder::start_with(drv.pid, "1s", &owned, 1000, &args);
    rec.finish();
    let trace = load(&owned);
    let warnings = trace["metadata"]["warnings"].to_string();
    eprintln!("observed: with the daemon running: {warnings}");
    assert!(
        warnings.contains("GPU tracks not recorded") && warnings.contains("stop it"),
        "{warnings}"
    );
    assert!(
        !events(&trace)
            .iter()
            .any(|e| e["cat"].as_str().is_some_and(|c| c.starts_with("gpu_"))),
        "GPU work recorded through a directory the daemon owns"
    );

    // The daemon stopped: the recording opens the window itself.
    drop(d);
    let out = temp_path("record-gpu", "json");
    let pf = temp_path("record-gpu", "pftrace");
    let _rm_out = (RemoveOnDrop(out.clone()), RemoveOnDrop(pf.clone()));
    let both = [&args[..], &["-o", pf.to_str().expect("utf-8")]].concat();
    let rec = Recorder::start_with(drv.pid, "60s", &out, 1000, &both);
    drv.resume();
    // Its library maps the recording's control file within 5 s of its creation.
    drv.wait_for("waiting");
    let (code, stdout, stderr, _) = rec.interrupt();
    assert_eq!(code, 0, "ethand record failed:\n{stderr}");
    eprintln!("observed: ethand record: {}", stdout.trim());
    let truth = drv.finish();
    assert_eq!(truth.kernels.get("gemm_fp32"), Some(&300));
    let trace = load(&out);
    let meta = &trace["metadata"];
    let pid = u64::from(truth.pid);
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
            u(p, "syncs"),
            u(p, "records_not_drawn")
        ),
        (0, 1, 0),
        "{p}"
    );
    let dur = f(meta, "duration_s");
    let gpu: Vec<&Value> = events(&trace)
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
    let label = events(&trace)
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && u(e, "tid") == tid)
        .map(|e| e["args"]["name"].clone());
    assert_eq!(label, Some(Value::from("GPU 0 stream 0")), "track {tid}");
    // Flows: from inside a cuLaunchKernel slice of the launching thread to its kernel.
    let launches: Vec<(f64, f64)> = events(&trace)
        .iter()
        .filter(|e| e["name"] == "cuLaunchKernel" && u(e, "pid") == pid)
        .map(|e| (f(e, "ts"), f(e, "ts") + f(e, "dur")))
        .collect();
    let flow = |ph: &str| -> Vec<&Value> {
        events(&trace)
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
        assert_eq!(u(s, "tid"), u64::from(truth.pid), "{s}");
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
    let d = ethand_perfetto::decode::decode(&fs::read(&pf).expect("the Perfetto trace"))
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
        ("GPU 0 stream 0", Some(Some(truth.pid as i32)))
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
