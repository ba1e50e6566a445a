//! The NVML collector end to end, without a GPU: the daemon loads the stand-in
//! `libnvidia-ml.so.1` (tests/standins/nvml.c, its values documented there), which lists a
//! real process of this test (a `sleep` with a job id and a rank in its environment, as
//! torchrun sets them) on gpu0 and delivers XID 79 and XID 13 on gpu0. What must come out:
//! every native series and dcgm-exporter alias with the stand-in's values in their units and
//! types, nothing (never 0) for what gpu1 lacks and its listing in `ethand status`, the XIDs
//! by code on the GPU and on the process that held it, with the `gpu_errors` finding in its
//! snapshot, and the job's labels on gpu0's device series (`devices.workload_labels`).
use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, KillOnDrop, serial, standins, temp_path, text};

const JOB_ID: &str = "nvml-e2e-job";
const RANK: &str = "3";

/// The value of the one series of `name` whose label set contains every `labels` pair.
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    series(body, name, labels).map(|(_, v)| v)
}

/// The label text and value of that series.
fn series<'a>(body: &'a str, name: &str, labels: &[(&str, &str)]) -> Option<(&'a str, f64)> {
    let prefix = format!("{name}{{");
    body.lines().find_map(|l| {
        let rest = l.strip_prefix(&prefix)?;
        let (set, v) = rest.rsplit_once("} ")?;
        let has = |(k, v): &(&str, &str)| set.split(',').any(|p| p == format!("{k}=\"{v}\""));
        if labels.iter().all(has) {
            Some((set, v.trim().parse().ok()?))
        } else {
            None
        }
    })
}

#[test]
fn stand_in_nvml_through_the_daemon() {
    let _serial = serial();
    let lib = standins::build_device_library(
        &temp_path("nvml-standin", "d"),
        "nvml.c",
        "libnvidia-ml.so.1",
    );
    let job = KillOnDrop(
        Command::new("sleep")
            .arg("300")
            .env("TORCHELASTIC_RUN_ID", JOB_ID)
            .env("RANK", RANK)
            .spawn()
            .expect("spawn sleep"),
    );
    let pid = job.0.id().to_string();
    let d = Daemon::start_with(
        "nvml",
        &format!(
            "[devices]\nnvml_library = {:?}\ndcmi = false\ninterval_ms = 300\n\
             counters_interval_ms = 300\ndcgm_aliases = true\nworkload_labels = true\n",
            lib.display().to_string()
        ),
        &[],
        &[("ETHAND_NVML_STANDIN_PIDS", pid.clone())],
    );

    // The XIDs are drained at the first collection; the job's labels and its attribution
    // need its process in the model, GPM a second collection: wait for all three.
    let t0 = Instant::now();
    let body = loop {
        let body = d.metrics();
        if series(
            &body,
            "ethand_process_gpu_xid_events_total",
            &[("pid", &pid), ("xid", "13")],
        )
        .is_some()
            && series(&body, "ethand_gpu_utilization_ratio", &[("job_id", JOB_ID)]).is_some()
            // GPM's first values come one device interval after the start.
            && series(&body, "ethand_gpu_graphics_activity_ratio", &[("gpu", "gpu0")]).is_some()
        {
            break body;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no per-process XID or job-labelled device series after 20 s:\n{body}\nlog:\n{}",
            d.log_text()
        );
        thread::sleep(Duration::from_millis(300));
    };
    let g0 = [("gpu", "gpu0")];
    let g1 = [("gpu", "gpu1")];

    // Native series, base units: the stand-in's values.
    for (name, labels, want) in [
        ("ethand_gpu_utilization_ratio", &g0[..], 0.87),
        (
            "ethand_gpu_memory_reserved_bytes",
            &g0,
            (512u64 << 20) as f64,
        ),
        ("ethand_gpu_memory_temperature_celsius", &g0, 52.0),
        ("ethand_gpu_power_limit_watts", &g0, 700.0),
        ("ethand_gpu_power_limit_watts", &g1, 300.0),
        ("ethand_gpu_encoder_utilization_ratio", &g0, 0.07),
        ("ethand_gpu_decoder_utilization_ratio", &g0, 0.09),
        ("ethand_gpu_pcie_link_generation", &g0, 4.0),
        ("ethand_gpu_pcie_link_generation_max", &g0, 5.0),
        ("ethand_gpu_pcie_link_width", &g0, 8.0),
        ("ethand_gpu_pcie_link_width_max", &g0, 16.0),
        ("ethand_gpu_pcie_replays_total", &g0, 3.0),
        ("ethand_gpu_pcie_replays_total", &g1, 7.0),
        ("ethand_gpu_memory_row_remap_pending", &g0, 1.0),
        ("ethand_gpu_memory_row_remap_failed", &g0, 0.0),
        ("ethand_gpu_memory_retired_pages_pending", &g0, 1.0),
        ("ethand_gpu_graphics_activity_ratio", &g0, 0.625),
        (
            "ethand_gpu_pcie_tx_average_bytes_per_second",
            &g0,
            1024.0 * 1048576.0,
        ),
        (
            "ethand_gpu_pcie_rx_average_bytes_per_second",
            &g0,
            256.0 * 1048576.0,
        ),
    ] {
        assert_eq!(
            value(&body, name, labels),
            Some(want),
            "{name}{labels:?}:\n{body}"
        );
    }
    for (cause, want) in [("correctable", 2.0), ("uncorrectable", 1.0)] {
        assert_eq!(
            value(
                &body,
                "ethand_gpu_memory_remapped_rows_total",
                &[("gpu", "gpu0"), ("cause", cause)]
            ),
            Some(want)
        );
    }
    for (gpu, cause, want) in [
        ("gpu0", "single_bit", 4.0),
        ("gpu0", "double_bit", 1.0),
        ("gpu1", "single_bit", 6.0),
        ("gpu1", "double_bit", 2.0),
    ] {
        assert_eq!(
            value(
                &body,
                "ethand_gpu_memory_retired_pages_total",
                &[("gpu", gpu), ("cause", cause)]
            ),
            Some(want)
        );
    }
    // What gpu1 lacks (and its power, refused with NO_PERMISSION) is absent, never 0.
    for name in [
        "ethand_gpu_memory_temperature_celsius",
        "ethand_gpu_encoder_utilization_ratio",
        "ethand_gpu_decoder_utilization_ratio",
        "ethand_gpu_memory_remapped_rows_total",
        "ethand_gpu_memory_row_remap_failed",
        "ethand_gpu_graphics_activity_ratio",
        "ethand_gpu_sm_activity_ratio",
        "ethand_gpu_power_watts",
    ] {
        assert_eq!(series(&body, name, &g1), None, "{name} of gpu1:\n{body}");
    }
    for alias in [
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ] {
        assert_eq!(
            series(&body, alias, &[("gpu", "1")]),
            None,
            "{alias} of gpu1"
        );
    }

    // dcgm-exporter's names, units, types and labels.
    let a0 = [("gpu", "0"), ("DCGM_FI_DRIVER_VERSION", "570.86.15")];
    for (name, want) in [
        ("DCGM_FI_DEV_MEMORY_TEMP", 52.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3.0),
        ("DCGM_FI_DEV_ENC_UTIL", 7.0),
        ("DCGM_FI_DEV_DEC_UTIL", 9.0),
        ("DCGM_FI_DEV_FB_RESERVED", 512.0),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 2.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0.0),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123_456_789.0),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.625),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", 1024.0 * 1048576.0),
    ] {
        assert_eq!(value(&body, name, &a0), Some(want), "{name}:\n{body}");
    }
    for (name, kind) in [
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} is a {kind}"
        );
    }
    // The last XID (13) with its code and meaning.
    let (xid, v) = series(&body, "DCGM_FI_DEV_XID_ERRORS", &a0).expect("XID alias");
    assert_eq!(v, 13.0);
    assert!(xid.contains("err_code=\"13\""), "{xid}");

    // XIDs by code on the GPU, and on the process that held it, with the job's labels.
    for code in ["79", "13"] {
        assert_eq!(
            value(
                &body,
                "ethand_gpu_xid_errors_total",
                &[("gpu", "gpu0"), ("xid", code)]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &body,
                "ethand_process_gpu_xid_events_total",
                &[
                    ("pid", &pid),
                    ("gpu", "gpu0"),
                    ("xid", code),
                    ("job_id", JOB_ID),
                    ("rank", RANK)
                ]
            ),
            Some(1.0),
            "{body}"
        );
    }
    // The job owns gpu0: its labels are on gpu0's device series and aliases; gpu1 has no
    // process, so none.
    let (labels, _) = series(&body, "ethand_gpu_power_watts", &g0).expect("gpu0 power");
    assert!(
        labels.contains(&format!("job_id=\"{JOB_ID}\""))
            && labels.contains(&format!("rank=\"{RANK}\"")),
        "{labels}"
    );
    assert!(
        series(
            &body,
            "DCGM_FI_DEV_GPU_UTIL",
            &[("gpu", "0"), ("job_id", JOB_ID)]
        )
        .is_some()
    );
    let (labels, _) = series(&body, "ethand_gpu_power_limit_watts", &g1).expect("gpu1 limit");
    assert!(!labels.contains("job_id"), "{labels}");

    // The driver's per-process series of the job carry its labels.
    let (labels, v) = series(&body, "ethand_process_gpu_memory_bytes", &[("pid", &pid)])
        .expect("the job's device memory");
    assert_eq!(v, (1u64 << 30) as f64);
    assert!(labels.contains(&format!("job_id=\"{JOB_ID}\"")), "{labels}");

    // `ethand status` lists what gpu1 does not have.
    let status = text(&d.cli(&["status"]).stdout);
    assert!(
        status.contains("gpu1 does not have:") && status.contains("memory_temperature_celsius"),
        "{status}"
    );

    // The job's snapshot: its XIDs and the finding that names them.
    let t = d.snapshot(pid.parse().expect("pid"));
    let p = t
        .processes
        .iter()
        .find(|p| p.pid.to_string() == pid)
        .expect("the job in its snapshot");
    let mut codes: Vec<(u64, u64)> = p.gpu_xid_events.iter().map(|x| (x.xid, x.count)).collect();
    codes.sort();
    assert_eq!(codes, vec![(13, 1), (79, 1)]);
    let f = t
        .findings
        .iter()
        .find(|f| f.id == "gpu_errors")
        .unwrap_or_else(|| panic!("no gpu_errors finding: {:?}", t.findings));
    assert!(
        f.detail
            .iter()
            .any(|l| l.contains("XID 79 (GPU has fallen off the bus)")
                && l.contains(&format!("pid {pid}"))),
        "{:?}",
        f.detail
    );
}
