//! A real H200 reading (tests/fixtures/gpu-h200/nvml-compare: `ethand snapshot --json` of a
//! busy PyTorch job with RANK and TORCHELASTIC_RUN_ID set, and `nvidia-smi --query-gpu` of the
//! same seconds, taken by scripts/gpu-nvml-compare.sh) rendered again by this build with the
//! dcgm-exporter aliases and the owner labels on: every default dcgm-exporter field that NVML
//! gives on that GPU must be there with dcgm-exporter's type and labels, its value must be
//! nvidia-smi's where the field does not move under load, and what this GPU lacks must be
//! absent rather than 0.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::{NodeSnapshot, TreeSnapshot, selection::ExportSelection};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpu-h200/nvml-compare")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// nvidia-smi's CSV row of gpu 0, by field name (the unit stripped from the header).
fn smi() -> BTreeMap<String, String> {
    let text = read(&dir().join("smi-2.csv"));
    let mut lines = text.lines();
    let head: Vec<String> = lines
        .next()
        .expect("header")
        .split(',')
        .map(|h| h.trim().split(" [").next().unwrap().to_owned())
        .collect();
    let row: Vec<String> = lines
        .next()
        .expect("gpu 0")
        .split(',')
        .map(|c| c.trim().split(' ').next().unwrap().to_owned())
        .collect();
    head.into_iter().zip(row).collect()
}

/// The value of the one series of `name` (with `gpu="0"` or `gpu="gpu0"`) and its labels.
fn sample(text: &str, name: &str) -> Option<(String, f64)> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(&format!("{name}{{"))?;
        let (labels, v) = rest.rsplit_once("} ")?;
        Some((labels.to_owned(), v.parse().ok()?))
    })
}

fn default_fields() -> Vec<(String, String)> {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dcgm-default-counters.csv"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut c = l.split(',').map(str::trim);
            (c.next().unwrap().to_owned(), c.next().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn real_h200_reading_renders_every_default_dcgm_field_it_has() {
    let tree: TreeSnapshot =
        serde_json::from_str(&read(&dir().join("snapshot-job.json"))).expect("TreeSnapshot");
    let node = NodeSnapshot {
        devices: tree.devices.clone(),
        processes: tree.processes.clone(),
        ..Default::default()
    };
    let text = render(
        &node,
        &PrometheusOptions {
            selection: ExportSelection::Preselected,
            dcgm_aliases: true,
            device_workload_labels: true,
        },
    );
    let smi = smi();
    let gpu = &tree.devices.gpus[0];

    // What this GPU (an H200 in a VM: no active NVLink, no page retirement on HBM3e) lacks.
    let lacking = [(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "nvlink_bytes_per_second",
    )];
    for (alias, field) in lacking {
        assert!(
            gpu.unsupported.iter().any(|u| u == field),
            "{:?}",
            gpu.unsupported
        );
        assert_eq!(sample(&text, alias), None, "{alias}: absent, never 0");
    }
    for field in ["retired_pages_single_bit", "retired_pages_pending"] {
        assert!(gpu.unsupported.iter().any(|u| u == field));
    }
    assert_eq!(
        sample(&text, "ethand_gpu_memory_retired_pages_total"),
        None,
        "no page retirement on this GPU: absent"
    );
    assert_eq!(smi["retired_pages.single_bit_ecc.count"], "[N/A]");

    for (name, kind) in default_fields() {
        if name == "DCGM_FI_DEV_VGPU_LICENSE_STATUS" || lacking.iter().any(|(a, _)| *a == name) {
            continue;
        }
        if kind == "label" {
            let (labels, _) = sample(&text, "DCGM_FI_DEV_GPU_UTIL").expect("GPU_UTIL");
            assert!(
                labels.contains(&format!("{name}=\"{}\"", smi["driver_version"])),
                "{labels}"
            );
            continue;
        }
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name}: no {kind} family"
        );
        let (labels, _) = sample(&text, &name).unwrap_or_else(|| panic!("{name}: no series"));
        for l in [
            "gpu=\"0\"",
            "UUID=\"GPU-",
            "modelName=\"NVIDIA H200\"",
            "device=\"nvidia0\"",
        ] {
            assert!(labels.contains(l), "{name}: {labels}");
        }
        // The job owns the GPU: its labels are on the aliases.
        assert!(
            labels.contains("job_id=\"nvml-compare-job\"") && labels.contains("rank=\"0\""),
            "{name}: {labels}"
        );
    }

    // Fields that do not move under load: nvidia-smi's value, in dcgm-exporter's unit.
    let num = |k: &str| -> f64 { smi[k].parse().unwrap_or_else(|_| panic!("{k}: {}", smi[k])) };
    let yes = |k: &str| -> f64 { if smi[k] == "Yes" { 1.0 } else { 0.0 } };
    for (alias, want) in [
        ("DCGM_FI_DEV_FB_RESERVED", num("memory.reserved")),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            num("remapped_rows.correctable"),
        ),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            num("remapped_rows.uncorrectable"),
        ),
        (
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            yes("remapped_rows.failure"),
        ),
        ("DCGM_FI_DEV_ENC_UTIL", num("utilization.encoder")),
        ("DCGM_FI_DEV_DEC_UTIL", num("utilization.decoder")),
    ] {
        let (_, v) = sample(&text, alias).expect(alias);
        // nvidia-smi rounds MiB to the nearest; dcgm-exporter truncates.
        assert!(
            (v - want).abs() <= 1.0,
            "{alias}: {v} against nvidia-smi's {want}"
        );
    }
    for (native, want) in [
        (
            "ethand_gpu_pcie_link_generation",
            num("pcie.link.gen.gpucurrent"),
        ),
        (
            "ethand_gpu_pcie_link_generation_max",
            num("pcie.link.gen.max"),
        ),
        ("ethand_gpu_pcie_link_width", num("pcie.link.width.current")),
        ("ethand_gpu_pcie_link_width_max", num("pcie.link.width.max")),
        ("ethand_gpu_power_limit_watts", num("enforced.power.limit")),
        (
            "ethand_gpu_memory_row_remap_pending",
            yes("remapped_rows.pending"),
        ),
        (
            "ethand_gpu_memory_total_bytes",
            num("memory.total") * 1048576.0,
        ),
    ] {
        let (labels, v) = sample(&text, native).expect(native);
        assert!(labels.contains("gpu=\"gpu0\""), "{labels}");
        assert!(
            (v - want).abs() <= want.abs() * 1e-3,
            "{native}: {v} against nvidia-smi's {want}"
        );
    }
    // Under load: the same reading, within what one second changes.
    let (_, t) = sample(&text, "DCGM_FI_DEV_MEMORY_TEMP").expect("memory temperature");
    assert!((t - num("temperature.memory")).abs() <= 3.0, "{t}");
    let (_, p) = sample(&text, "DCGM_FI_DEV_POWER_USAGE").expect("power");
    assert!((p - num("power.draw")).abs() <= 0.25 * p, "{p}");
    // GPM's graphics, tensor and DRAM activity of a busy bf16 matmul loop, and its PCIe.
    for (alias, lo, hi) in [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.8, 1.0),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.7, 1.0),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0.05, 0.5),
    ] {
        let (_, v) = sample(&text, alias).expect(alias);
        assert!((lo..=hi).contains(&v), "{alias}: {v}");
    }
    // The driver's per-process series carry the job's labels too.
    for name in [
        "ethand_process_gpu_memory_bytes",
        "ethand_process_gpu_utilization_ratio",
    ] {
        let (labels, _) = sample(&text, name).expect(name);
        assert!(
            labels.contains("job_id=\"nvml-compare-job\"") && labels.contains("rank=\"0\""),
            "{name}: {labels}"
        );
    }
    let (_, rx) = sample(&text, "DCGM_FI_PROF_PCIE_RX_BYTES").expect("PCIe RX");
    assert!(rx > 100e6, "64 MiB host-to-device every 50 ms: {rx} B/s");
}
