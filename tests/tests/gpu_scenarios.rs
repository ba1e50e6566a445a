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
        "fp32_activity_ratio",
        "fp64_activity_ratio",
        "fp16_activity_ratio",
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
        // What NVML alone can support, where a scenario says it differs: one outcome, or a
        // list of those NVML's figures leave open (a reading at a rule's line).
        let expected_nogpm = expected_of(s, "expected_without_gpm", vec![expected.clone()]);
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
            if !expected_nogpm.contains(&top_nogpm) {
                wrong.push(format!(
                    "{} without GPM: expected {expected_nogpm:?}, got {top_nogpm:?}",
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

/// The scenario's expected outcomes from scenarios.json: `key`, else `fallback`'s; a list
/// where NVML's figures leave the outcome open.
fn expected_of(
    s: &serde_json::Value,
    key: &str,
    fallback: Vec<Option<String>>,
) -> Vec<Option<String>> {
    match s.get(key) {
        Some(serde_json::Value::Array(a)) => {
            a.iter().map(|e| e.as_str().map(String::from)).collect()
        }
        Some(e) => vec![e.as_str().map(String::from)],
        None => fallback,
    }
}

/// The same scenarios started with libethand_cupti.so (`INJECT=1 scripts/gpu-scenarios.sh`,
/// H100, 2026-12-07, the daemon at its defaults; tests/fixtures/gpu-scenarios-cupti/ holds
/// the 12 whose snapshots the CUDA-graph crash's Xid did not reach, see its README): the
/// daemon's snapshots hold what the GPU ran, and the rules that read the kernels
/// (short_kernels, gpu_waits_for_host, collectives_not_overlapped, fp32 GEMMs by name) must
/// neither raise a false alarm on the healthy ones nor take the place of the finding each
/// problem expects (`expected_injected` where the kernels tell more), with GPM and without.
#[test]
fn real_gpu_scenarios_with_their_kernels_recorded() {
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/gpu/scenarios.json")).expect("scenarios.json"),
    )
    .expect("scenarios.json is JSON");
    let dir = root().join("tests/fixtures/gpu-scenarios-cupti");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for s in spec["scenarios"].as_array().expect("scenarios") {
        let name = s["name"].as_str().expect("name");
        if !dir.join(name).is_dir() {
            continue;
        }
        let expected = expected_of(s, "expected", vec![None]);
        let expected = expected_of(s, "expected_injected", expected);
        let nogpm = expected_of(s, "expected_without_gpm", expected.clone());
        let nogpm = expected_of(s, "expected_injected_without_gpm", nogpm);
        for v in ["daemon-worker", "daemon-launcher"] {
            let f = dir.join(name).join(format!("{v}.json"));
            assert!(f.is_file(), "{name}: no {}", f.display());
            let t: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&f).expect("fixture")).expect("JSON");
            let recorded = t["gpu_activity"]["processes"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["state"] == "recorded")
                        .map(|p| p["devices"].as_array().map_or(0, |d| d.len()))
                        .sum::<usize>()
                })
                .unwrap_or(0);
            if recorded == 0 {
                wrong.push(format!("{}: no device activity recorded", f.display()));
            }
            let (top, all, ne) = diagnose(&f);
            eprintln!(
                "observed: {name} {v} (kernels recorded): top {top:?}, findings {all:?}, not evaluated {ne:?}"
            );
            checked += 1;
            if !expected.contains(&top) {
                wrong.push(format!(
                    "{}: expected {expected:?}, got {top:?} (findings {all:?})",
                    f.display()
                ));
            }
            let (top_nogpm, all_nogpm, _) = diagnose(&without_gpm(&f));
            if !nogpm.contains(&top_nogpm) {
                wrong.push(format!(
                    "{} without GPM: expected {nogpm:?}, got {top_nogpm:?} (findings {all_nogpm:?})",
                    f.display()
                ));
            }
            if !ne.is_empty() {
                wrong.push(format!("{}: rules not evaluated: {ne:?}", f.display()));
            }
        }
    }
    assert!(checked >= 24, "only {checked} fixtures checked");
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

/// Steps per second of a scenario's run on the GPU machine: its `steps.json`, the count and
/// the first and last time of the "step UNIX_TIME" lines the run logged after its warm-up.
fn step_rate(dir: &Path) -> Option<f64> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("steps.json")).ok()?).ok()?;
    let n = v["steps"].as_f64()?;
    let span = v["last_unix_s"].as_f64()? - v["first_unix_s"].as_f64()?;
    (n >= 3.0 && span > 0.0).then(|| (n - 1.0) / span)
}

/// Rules whose speed-up estimate is checked by a CPU pair in CI rather than a GPU scenario
/// (tests/tests/e2e/diagnose.rs), with the test that checks it.
const CHECKED_IN_CI: &[(&str, &str)] = &[(
    "cpu_contention",
    "contention_estimate_matches_the_measured_fix_of_removing_neighbours",
)];

/// Every speed-up a finding states is checked against the measured speed-up of its fix: each
/// problem scenario with a `fixed_by` was run on the GPU machine next to the same work fixed
/// as its finding advises; the estimate of its finding (in every recorded variant) must be
/// within 30 % of the ratio of their step rates, or the rule gives none. And no rule states a
/// speed-up that no pair checks.
#[test]
fn speedup_estimates_match_the_measured_fixes() {
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/gpu/scenarios.json")).expect("scenarios.json"),
    )
    .expect("scenarios.json is JSON");
    let dir = root().join("tests/fixtures/gpu-scenarios");
    let mut checked_rules: Vec<String> = CHECKED_IN_CI.iter().map(|(r, _)| r.to_string()).collect();
    let mut wrong = Vec::new();
    let mut pairs = 0;
    for s in spec["scenarios"].as_array().expect("scenarios") {
        let (Some(name), Some(fix)) = (s["name"].as_str(), s["fixed_by"].as_str()) else {
            continue;
        };
        let expected = s["expected"]
            .as_str()
            .expect("a problem scenario expects a finding");
        let (Some(slow), Some(fast)) = (step_rate(&dir.join(name)), step_rate(&dir.join(fix)))
        else {
            wrong.push(format!(
                "{name} / {fix}: no steps.txt under {}",
                dir.display()
            ));
            continue;
        };
        pairs += 1;
        let measured = fast / slow;
        for v in VARIANTS {
            let f = dir.join(name).join(format!("{v}.json"));
            if !f.is_file() {
                continue;
            }
            let out = ethand(&["diagnose", f.to_str().expect("utf-8"), "--json"]);
            let t: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            let Some(finding) = t["findings"]
                .as_array()
                .expect("findings")
                .iter()
                .find(|x| x["id"] == expected)
            else {
                continue; // the diagnosis test reports a missing finding
            };
            let estimate = finding["estimated_speedup"].as_f64();
            eprintln!(
                "observed: {name} {v}: {slow:.2} -> {fast:.2} steps/s with {fix}: measured {measured:.2}x, {expected} estimates {estimate:?}"
            );
            if let Some(e) = estimate {
                if (e / measured - 1.0).abs() > 0.3 {
                    wrong.push(format!(
                        "{name} {v}: {expected} estimates {e:.2}x, its fix ({fix}) measured {measured:.2}x"
                    ));
                }
                checked_rules.push(expected.to_string());
            }
        }
    }
    assert!(pairs >= 5, "only {pairs} measured pairs");
    // Rules with a `speedup` expression: each one checked by a pair above or in CI.
    let rules =
        std::fs::read_to_string(root().join("daemon/src/diagnose/rules.toml")).expect("rules");
    let mut id = "";
    for line in rules.lines() {
        if let Some(v) = line.strip_prefix("id = ") {
            id = v.trim_matches('"');
        }
        if line.starts_with("speedup = ") && !checked_rules.iter().any(|r| r == id) {
            wrong.push(format!(
                "rule {id} states a speed-up that no measured fix checks"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
