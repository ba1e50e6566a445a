//! The Grafana dashboards (deploy/grafana) and the alerting rules (deploy/prometheus) against
//! live data: a real ethand measures workloads that make every panel's series exist (CPU, run
//! queue, syscalls, disk, network, and GPU runtime calls and NCCL collectives of two ranks
//! through the stand-in libraries, plus the stand-in NVML and DCMI libraries for device series,
//! NVML's listing a process of the job on gpu0 so that the per-job device panels fill), Debian's
//! Prometheus scrapes it every second with ethand's alerting rules loaded, and every panel
//! target's query, template variables substituted, must return data through the HTTP API.
//! Every alerting rule must evaluate without error.
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, KillOnDrop, ProbeState, RemoveOnDrop,
    prometheus_server::{DEPLOY, PrometheusServer, dashboards, exprs, panels},
    serial,
    standins::{self, Driver, Lib},
};
use serde_json::Value;

use crate::workload;

/// `$__rate_interval` in the queries: Grafana's value for a 1 s scrape interval and a short
/// time range is 4 s; 15 s keeps several scrapes in every window on a loaded machine.
const RATE_INTERVAL: &str = "15s";
/// Scrapes to wait for once the workloads run, so that every rate window is full.
const SCRAPES: usize = 20;
/// The job id and ranks the GPU drivers carry in their environment (as torchrun sets them).
const JOB_ID: &str = "dash-job";

/// Waits until `ethand status` lists each library file attached.
fn wait_attached(d: &Daemon, paths: &[&Path]) {
    let t0 = Instant::now();
    let inodes: Vec<u64> = paths
        .iter()
        .map(|p| fs::metadata(p).expect("stat library").ino())
        .collect();
    loop {
        let st = d.status();
        let attached = inodes.iter().all(|ino| {
            st.gpu_libraries
                .iter()
                .any(|l| l.inode == *ino && l.state == ProbeState::Attached)
        });
        if attached {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "stand-in libraries not attached: {:#?}",
            st.gpu_libraries
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// One rank of a two-rank job: launches, copies of every direction, syncs, growing device
/// memory and NCCL collectives, `iterations` times with a pause, between two `wait_stdin`.
/// `coll_us`: how long each collective takes (the rank that waits less is the straggler).
fn start_rank(rank: u32, coll_us: u32, iterations: usize) -> Driver {
    let s = standins::shared();
    let mut plan = vec!["wait_stdin".to_string(), format!("comm_init_rank {rank} 2")];
    for _ in 0..iterations {
        plan.extend(
            [
                "launches 20",
                "graph 1",
                "htod 1M",
                "dtoh 512K",
                "dtod 2M",
                "peer 256K",
                "memcpy_default 4K",
                "alloc 1M",
                "host_alloc 64K",
                "sync_stream 2",
                "allreduce 256K float32",
                "allgather 1024 bfloat16",
                "sleep 150",
            ]
            .map(String::from),
        );
    }
    plan.push("wait_stdin".into());
    let plan: Vec<&str> = plan.iter().map(String::as_str).collect();
    let mut cmd = s.command(&[Lib::Cuda, Lib::Nccl], &plan);
    cmd.env("ETHAND_STANDIN_COLL_US", coll_us.to_string())
        .env("TORCHELASTIC_RUN_ID", JOB_ID)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2");
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    drv
}

/// The value of every template variable of a dashboard, in order: `instance` and
/// single-value variables take the first value Prometheus has (their All value when it has
/// none), multi-value variables with an "All" option their All value (`.*`).
fn resolve_variables(prom: &PrometheusServer, d: &Value) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().expect("variable name").to_string();
        if v["type"] == "datasource" {
            vars.insert(name, "prometheus".into());
            continue;
        }
        let def = substitute(v["definition"].as_str().unwrap_or(""), &vars);
        let args = def
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: not label_values(...): {def}"));
        let (selector, label) = args
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        let values = prom.label_values(selector.trim(), label.trim());
        let all = v["includeAll"] == true;
        let value = if name != "instance" && all && v["multi"] == true {
            v["allValue"].as_str().unwrap_or(".*").to_string()
        } else {
            values.first().cloned().unwrap_or_else(|| {
                if all {
                    ".*".into()
                } else {
                    panic!("variable {name}: no values for {def}")
                }
            })
        };
        println!("  variable {name} = {value:?} (label values: {values:?})");
        vars.insert(name, value);
    }
    vars
}

/// `expr` with Grafana's built-in and the dashboard's template variables replaced.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", "1s")
        .replace("$__range", "1m");
    // Longest names first, so that $instance is not cut by a shorter $inst.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    out
}

#[test]
fn every_dashboard_panel_has_data_and_every_rule_evaluates() {
    let _serial = serial();
    let t0 = Instant::now();
    let s = standins::shared();
    let dcmi = standins::build_device_library(&s.root.join("dcmi"), "dcmi.c", "libdcmi.so");
    let nvml = standins::build_device_library(&s.root.join("nvml"), "nvml.c", "libnvidia-ml.so.1");
    // The job's process NVML lists on gpu0 (it owns the GPU: the per-job device panels).
    let gpu_holder = KillOnDrop(
        Command::new("sleep")
            .arg("600")
            .env("TORCHELASTIC_RUN_ID", JOB_ID)
            .env("RANK", "0")
            .spawn()
            .expect("spawn sleep"),
    );
    let d = Daemon::start_with(
        "dashboards",
        &format!(
            "[daemon]\nbpf_stats = \"always\"\n\
             [prometheus]\ncomms = [\"ethand-workload\", \"gpu_driver\"]\n\
             [gpu]\nlevel = \"process\"\nrescan_interval_ms = 300\n\
             [devices]\ndcmi_library = {:?}\nnvml_library = {:?}\ninterval_ms = 500\n\
             counters_interval_ms = 500\nworkload_labels = true\n",
            dcmi.display().to_string(),
            nvml.display().to_string()
        ),
        &[],
        &[("ETHAND_NVML_STANDIN_PIDS", gpu_holder.0.id().to_string())],
    );
    let instance = format!("127.0.0.1:{}", d.port);
    let rules = Path::new(DEPLOY).join("prometheus/ethand-alerts.yml");
    let rules = fs::canonicalize(&rules).expect("deploy/prometheus/ethand-alerts.yml");
    let prom = PrometheusServer::start("dashboards", std::slice::from_ref(&instance), &[rules]);

    // Workloads, all alive until the queries are done.
    let file = Path::new("/var/tmp").join(format!("ethand-test-dash-{}.dat", std::process::id()));
    let _cleanup = RemoveOnDrop(file.clone());
    let mut spin = workload(&["spin-threads", "3", "1500", "3000"]);
    spin.send_byte();
    let mut disk = workload(&[
        "readloop",
        file.to_str().expect("utf-8"),
        "2",
        "40000",
        "direct",
    ]);
    disk.send_byte();
    // Few datagrams: a burst larger than the receive buffer would lose some.
    let mut net = workload(&["net", "4000000", "20", "512"]);
    net.go();
    let mut sys = workload(&["syscalls", "2000", "500"]);
    sys.go();
    let mut ranks = [start_rank(0, 3000, 150), start_rank(1, 300, 150)];
    wait_attached(&d, &[s.path(Lib::Cuda), s.path(Lib::Nccl)]);
    for r in &mut ranks {
        r.resume();
    }
    let started = Instant::now();
    println!(
        "workloads running {:?} after the start; waiting for {SCRAPES} scrapes",
        t0.elapsed()
    );
    let base = prom.successful_scrapes();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let n = prom.successful_scrapes().saturating_sub(base);
        if n >= SCRAPES {
            println!("{n} scrapes after {:?}", started.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} successful scrapes of {instance} in 90 s; prometheus log:\n{}",
            prom.log_text()
        );
        thread::sleep(Duration::from_secs(1));
    }

    let mut failures = Vec::new();
    let mut checked = 0;
    for (file, dash) in dashboards() {
        println!("{file}:");
        let vars = resolve_variables(&prom, &dash);
        for p in panels(&dash) {
            let title = p["title"].as_str().unwrap_or("");
            for raw in exprs(p) {
                let expr = substitute(raw, &vars);
                assert!(
                    !expr.contains("$__") && !expr.contains("${"),
                    "{file} / {title}: a variable left in {expr}"
                );
                let v = prom.query(&expr);
                let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
                let nan = result.iter().filter(|r| r["value"][1] == "NaN").count();
                println!("  {title}: {} series ({nan} NaN): {expr}", result.len());
                checked += 1;
                if v["status"] != "success" {
                    failures.push(format!("{file} / {title}: query failed: {v}\n    {expr}"));
                } else if result.is_empty() {
                    failures.push(format!("{file} / {title}: no data\n    {expr}"));
                }
            }
        }
    }
    // The alerting rules: loaded, evaluated against this data, no errors.
    let v = prom.api("/api/v1/rules");
    assert_eq!(v["status"], "success", "{v}");
    let mut rules = 0;
    for g in v["data"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            rules += 1;
            let health = r["health"].as_str().unwrap_or("");
            println!(
                "  rule {}: health {health}, state {}",
                r["name"],
                r["state"].as_str().unwrap_or("-")
            );
            if health != "ok" {
                failures.push(format!(
                    "rule {}: health {health}: {}",
                    r["name"], r["lastError"]
                ));
            }
        }
    }
    println!(
        "{checked} panel queries, {rules} rules checked; workloads ran {:?}",
        started.elapsed()
    );
    assert!(rules >= 11, "only {rules} rules loaded");

    spin.stop();
    for r in ranks {
        drop(r);
    }
    drop((disk, net, sys));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
