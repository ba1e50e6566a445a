//! The GPU scenario suite's real snapshots (H200, PyTorch, ethand at its default settings;
//! recorded by scripts/gpu-scenarios.sh and kept in tests/fixtures/gpu-scenarios/) diagnosed
//! again with the rules of this build through `ethand diagnose FILE --json`: each one's top
//! warning or critical finding must be the one tests/gpu/scenarios.json expects, and the
//! healthy ones must have none. A rule change that breaks a real case fails here, without a
//! GPU.
use std::path::{Path, PathBuf};

use ethand_tests::{ethand, temp_path, text};

const VARIANTS: [&str; 4] = [
    "daemon-worker",
    "daemon-launcher",
    "standalone-worker",
    "standalone-launcher",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// (top warning/critical finding, every finding id, rules not evaluated) of one file.
fn diagnose(file: &Path) -> (Option<String>, Vec<String>, Vec<String>) {
    let out = ethand(&["diagnose", file.to_str().expect("utf-8"), "--json"]);
    assert!(
        out.status.success(),
        "ethand diagnose {} failed ({}): {}",
        file.display(),
        out.status,
        text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let findings = v["findings"].as_array().expect("findings");
    let top = findings
        .iter()
        .find(|f| f["severity"] != "info")
        .map(|f| f["id"].as_str().expect("id").to_string());
    let all = findings
        .iter()
        .map(|f| f["id"].as_str().expect("id").to_string())
        .collect();
    let ne = v["not_evaluated"]
        .as_array()
        .expect("not_evaluated")
        .iter()
        .map(|n| n["rule"].as_str().expect("rule").to_string())
        .collect();
    (top, all, ne)
}

/// A copy of the snapshot with every GPM reading taken out.
fn without_gpm(file: &Path) -> PathBuf {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("JSON");
    let gpm = [
        "sm_activity_ratio",
        "sm_occupancy_ratio",
        "tensor_activity_ratio",
        "dram_bandwidth_ratio",
    ];
    if let Some(d) = v["total"]["gpu_derived"].as_object_mut() {
        for k in gpm {
            d.remove(k);
        }
    }
    if let Some(gpus) = v["devices"]["gpus"].as_array_mut() {
        for g in gpus {
            if let Some(g) = g.as_object_mut() {
                for k in gpm {
                    g.remove(k);
                }
                g.insert("gpm_supported".into(), false.into());
            }
        }
    }
    let out = temp_path(
        &format!(
            "no-gpm-{}",
            file.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
                + "-"
                + &file.file_stem().unwrap_or_default().to_string_lossy()
        ),
        "json",
    );
    std::fs::write(&out, serde_json::to_vec(&v).expect("JSON")).expect("write");
    out
}

#[test]
fn real_gpu_scenarios_get_their_expected_diagnosis() {
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/gpu/scenarios.json")).expect("scenarios.json"),
    )
    .expect("scenarios.json is JSON");
    let dir = root().join("tests/fixtures/gpu-scenarios");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for s in spec["scenarios"].as_array().expect("scenarios") {
        let name = s["name"].as_str().expect("name");
        let expected = s["expected"].as_str().map(String::from);
        let present: Vec<PathBuf> = VARIANTS
            .iter()
            .map(|v| dir.join(name).join(format!("{v}.json")))
            .filter(|p| p.is_file())
            .collect();
        // Scenarios that need more GPUs than the machine lent had can lack fixtures; every
        // one-GPU scenario has all four.
        if s["gpus"].as_u64() == Some(1) {
            assert_eq!(
                present.len(),
                VARIANTS.len(),
                "{name}: fixtures missing under {}",
                dir.display()
            );
        }
        for f in present {
            let (top, all, ne) = diagnose(&f);
            eprintln!(
                "observed: {name} {}: top {top:?}, findings {all:?}, not evaluated {ne:?}",
                f.file_name().unwrap().to_string_lossy()
            );
            checked += 1;
            if top != expected {
                wrong.push(format!(
                    "{}: expected {expected:?}, got {top:?} (findings {all:?})",
                    f.display()
                ));
            }
            // The same job on a GPU without GPM (before Hopper): the rules fall back to NVML's
            // utilization and must still come to the same conclusion.
            let (top_nogpm, _, _) = diagnose(&without_gpm(&f));
            if top_nogpm != expected {
                wrong.push(format!(
                    "{} without GPM: expected {expected:?}, got {top_nogpm:?}",
                    f.display()
                ));
            }
            // Every live thread of these real jobs has its state read (PyTorch's threads
            // blocked in futex/poll, the launcher in wait4), and none is a stalled tree.
            let t: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&f).expect("fixture")).expect("JSON");
            for p in t["processes"].as_array().expect("processes") {
                if p["alive"] != true {
                    continue;
                }
                for th in p["threads"].as_array().expect("threads") {
                    if th["alive"] == true && th["now"]["state"].as_str().is_none() {
                        wrong.push(format!(
                            "{}: pid {} thread {} has no state",
                            f.display(),
                            p["pid"],
                            th["tid"]
                        ));
                    }
                }
            }
            if all
                .iter()
                .any(|id| id == "stalled" || id == "single_thread_cpu_bound")
            {
                wrong.push(format!("{}: {all:?} on a busy GPU job", f.display()));
            }
            // At the default level every rule that bears on these jobs could run.
            if !ne.is_empty() {
                wrong.push(format!("{}: rules not evaluated: {ne:?}", f.display()));
            }
        }
    }
    assert!(checked >= 40, "only {checked} fixtures checked");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The top finding's detail lines of one fixture, through `ethand diagnose` (this build's rules
/// over the recorded snapshot, its stack sample included).
fn top_detail(file: &Path) -> Vec<String> {
    let out = ethand(&["diagnose", file.to_str().expect("utf-8"), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["severity"] != "info")
        .and_then(|f| f["detail"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|d| d.as_str().expect("text").to_string())
        .collect()
}

/// On the H200, at the default settings, the findings name the Python line that causes them:
/// the sync storm's `.item()` line as the site of its synchronizations, the input stall's
/// decoding line as where the main thread's time goes. The source text is what the daemon read
/// from the script on the GPU machine.
#[test]
fn real_gpu_findings_name_the_python_line() {
    let dir = root().join("tests/fixtures/gpu-scenarios");
    let storm = top_detail(&dir.join("sync_storm/daemon-worker.json"));
    eprintln!("sync_storm: {storm:#?}");
    assert!(
        storm.iter().any(
            |d| d.starts_with("where in the code: cuStreamSynchronize: ")
                && d.contains("scenarios.py:")
                && d.contains(
                    "in mode_sync_storm.<locals>.step(): `total[0] += (x @ w).relu().sum().item()`"
                )
        ),
        "{storm:#?}"
    );
    let stall = top_detail(&dir.join("input_main/daemon-worker.json"));
    eprintln!("input_main: {stall:#?}");
    assert!(
        stall.iter().any(
            |d| d.starts_with("where the time goes: main thread of pid ")
                && d.contains("in decode(): `a = np.tanh(a @ a.T / size) + 0.5`")
        ),
        "{stall:#?}"
    );
}

/// On the H200, at the default settings, the native CPU profile of the snapshot says what the
/// input stall's main thread runs (numpy's loops and BLAS, which decode() calls) and where the
/// DataLoader trainer's main thread waits (a futex under Python's lock: the batch queue); the
/// healthy ResNet step's report has its flame graph.
#[test]
fn real_gpu_findings_say_where_the_cpu_time_goes_and_where_threads_wait() {
    let dir = root().join("tests/fixtures/gpu-scenarios");
    let stall = top_detail(&dir.join("input_main/daemon-worker.json"));
    assert!(
        stall.iter().any(
            |d| d.starts_with("where the CPU time goes: main thread of pid ")
                && d.contains("_multiarray_umath")
                && d.contains("openblas")
        ),
        "{stall:#?}"
    );
    let workers = top_detail(&dir.join("input_workers/daemon-worker.json"));
    let root_pid: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("input_workers/daemon-worker.json")).expect("read"),
    )
    .expect("JSON");
    let root_pid = root_pid["root_pid"].as_u64().expect("root_pid");
    assert!(
        workers.iter().any(|d| d.starts_with(&format!(
            "where it waits: main thread of pid {root_pid} (python): blocked "
        )) && d.contains("in futex() from PyThread_acquire_lock_timed")),
        "{workers:#?}"
    );
    let html =
        std::fs::read_to_string(dir.join("healthy_resnet/daemon-worker.html")).expect("read");
    let profile = html
        .split("<h2>CPU profile</h2>")
        .nth(1)
        .expect("a CPU profile section");
    assert!(
        profile.contains("<svg class=\"flame\""),
        "a native flame graph"
    );
    assert!(
        profile.contains("libcuda.so"),
        "the driver's share of the step"
    );
}
