//! The device families (GPUs, NPUs, their processes, the dcgm-exporter aliases) as rendered.
use std::collections::{BTreeSet, HashMap};

use super::{PrometheusOptions, render};
use crate::catalog::devices::MAX_PROCESSES_PER_DEVICE;
use ethand_snapshot::NodeSnapshot;
use ethand_snapshot::devices::{
    CollectorState, CollectorStatus, DeviceProcess, DevicesSnapshot, GpuDevice, NpuDevice,
    NvLinkStats, THROTTLE_REASONS,
};

fn gpu0() -> GpuDevice {
    GpuDevice {
        index: 0,
        uuid: "GPU-aaaa".into(),
        name: "NVIDIA H200".into(),
        pci_bus_id: "00000000:18:00.0".into(),
        minor_number: Some(3),
        driver_version: "580.65.06".into(),
        utilization_ratio: Some(0.75),
        memory_utilization_ratio: Some(0.25),
        memory_used_bytes: Some(10 << 30),
        memory_free_bytes: Some(130 << 30),
        memory_total_bytes: Some(141 << 30),
        power_watts: Some(412.5),
        energy_millijoules: Some(123_456_789),
        temperature_celsius: Some(55),
        sm_clock_hertz: Some(1_980_000_000),
        memory_clock_hertz: Some(2_619_000_000),
        pcie_tx_bytes_per_second: Some(2048 * 1024),
        pcie_rx_bytes_per_second: Some(512 * 1024),
        nvlinks: vec![NvLinkStats {
            link: 2,
            tx_bytes: Some(1 << 40),
            rx_bytes: Some(3 << 30),
            replay_errors: Some(1),
            recovery_errors: Some(0),
            crc_flit_errors: None,
            crc_data_errors: Some(4),
        }],
        ecc_corrected_errors: Some(7),
        ecc_uncorrected_errors: Some(0),
        throttle_reasons: Some(vec!["sw_power_cap".into()]),
        xid_errors: Some(4),
        last_xid: Some(79),
        gpm_supported: Some(true),
        sm_activity_ratio: Some(0.875),
        sm_occupancy_ratio: Some(0.375),
        tensor_activity_ratio: Some(0.5),
        dram_bandwidth_ratio: Some(0.0625),
        graphics_activity_ratio: Some(0.9375),
        pcie_tx_average_bytes_per_second: Some(3.5e9),
        pcie_rx_average_bytes_per_second: Some(1.5e9),
        fp64_activity_ratio: Some(0.015625),
        fp32_activity_ratio: Some(0.25),
        fp16_activity_ratio: Some(0.125),
        memory_reserved_bytes: Some(512 << 20),
        memory_temperature_celsius: Some(81),
        power_limit_watts: Some(700.0),
        encoder_utilization_ratio: Some(0.12),
        decoder_utilization_ratio: Some(0.25),
        pcie_link_generation: Some(4),
        pcie_link_generation_max: Some(5),
        pcie_link_width: Some(8),
        pcie_link_width_max: Some(16),
        pcie_replays: Some(9),
        remapped_rows_correctable: Some(2),
        remapped_rows_uncorrectable: Some(1),
        row_remap_pending: Some(true),
        row_remap_failed: Some(false),
        retired_pages_single_bit: Some(5),
        retired_pages_double_bit: Some(6),
        retired_pages_pending: Some(false),
        nvlink_bytes_per_second: Some(2_048_000_000.0),
        xid_errors_by_code: [(79, 1), (31, 1), (5000, 2)].into_iter().collect(),
        ..Default::default()
    }
}

/// A GPU whose driver gives almost nothing: only identity.
fn gpu1() -> GpuDevice {
    GpuDevice {
        index: 1,
        uuid: "GPU-bbbb".into(),
        name: "Tesla T4".into(),
        pci_bus_id: "00000000:3b:00.0".into(),
        ..Default::default()
    }
}

fn snapshot() -> NodeSnapshot {
    let mut procs: Vec<DeviceProcess> = (0..(MAX_PROCESSES_PER_DEVICE as u32 + 3))
        .map(|i| DeviceProcess {
            pid: 1000 + i,
            device: "gpu0".into(),
            uuid: "GPU-aaaa".into(),
            // pid 1000 holds the most; the last three (the smallest) become "other".
            memory_used_bytes: Some(u64::from(100 - i) << 20),
            utilization_ratio: Some(0.01),
        })
        .collect();
    procs.push(DeviceProcess {
        pid: 42,
        device: "npu1".into(),
        uuid: "NPU-1".into(),
        memory_used_bytes: Some(3 << 30),
        utilization_ratio: None,
    });
    NodeSnapshot {
        devices: DevicesSnapshot {
            hostname: "node1".into(),
            collectors: vec![
                CollectorStatus {
                    name: "nvml".into(),
                    state: CollectorState::Available,
                    detail: String::new(),
                },
                CollectorStatus {
                    name: "dcmi".into(),
                    state: CollectorState::Unavailable,
                    detail: "libdcmi.so not found".into(),
                },
            ],
            gpus: vec![gpu0(), gpu1()],
            npus: vec![NpuDevice {
                index: 1,
                card_id: 4,
                device_id: 0,
                uuid: "NPU-1".into(),
                name: "910B3".into(),
                pci_bus_id: "0000:c1:00.0".into(),
                driver_version: "24.1.rc2".into(),
                aicore_utilization_ratio: Some(0.5),
                hbm_used_bytes: Some(4 << 30),
                hbm_total_bytes: Some(64 << 30),
                hbm_bandwidth_utilization_ratio: Some(0.1),
                hbm_temperature_celsius: Some(40),
                power_watts: Some(95.5),
                temperature_celsius: Some(45),
                health: Some(1),
            }],
            processes: procs,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn value(s: &HashMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no series {series} in {:#?}", s.keys()))
}

fn opts(dcgm_aliases: bool) -> PrometheusOptions {
    PrometheusOptions {
        dcgm_aliases,
        ..Default::default()
    }
}

#[test]
fn gpu_values_and_labels() {
    let s = samples(&render(&snapshot(), &opts(false)));
    let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
    let v = |name: &str| value(&s, &format!("{name}{{{g}}}"));
    assert_eq!(v("ethand_gpu_utilization_ratio"), 0.75);
    assert_eq!(v("ethand_gpu_memory_utilization_ratio"), 0.25);
    assert_eq!(v("ethand_gpu_sm_activity_ratio"), 0.875);
    assert_eq!(v("ethand_gpu_sm_occupancy_ratio"), 0.375);
    assert_eq!(v("ethand_gpu_tensor_activity_ratio"), 0.5);
    assert_eq!(v("ethand_gpu_fp32_activity_ratio"), 0.25);
    assert_eq!(v("ethand_gpu_fp64_activity_ratio"), 0.015625);
    assert_eq!(v("ethand_gpu_fp16_activity_ratio"), 0.125);
    assert_eq!(v("ethand_gpu_dram_bandwidth_ratio"), 0.0625);
    assert_eq!(v("ethand_gpu_memory_used_bytes"), (10u64 << 30) as f64);
    assert_eq!(v("ethand_gpu_memory_total_bytes"), (141u64 << 30) as f64);
    assert_eq!(v("ethand_gpu_power_watts"), 412.5);
    assert_eq!(v("ethand_gpu_energy_joules_total"), 123_456.789);
    assert_eq!(v("ethand_gpu_temperature_celsius"), 55.0);
    assert_eq!(v("ethand_gpu_sm_clock_hertz"), 1.98e9);
    assert_eq!(v("ethand_gpu_memory_clock_hertz"), 2.619e9);
    assert_eq!(v("ethand_gpu_pcie_tx_bytes_per_second"), 2048.0 * 1024.0);
    assert_eq!(v("ethand_gpu_pcie_rx_bytes_per_second"), 512.0 * 1024.0);
    let xid = |code: &str| {
        value(
            &s,
            &format!(r#"ethand_gpu_xid_errors_total{{{g},xid="{code}"}}"#),
        )
    };
    assert_eq!(xid("31"), 1.0);
    assert_eq!(xid("79"), 1.0);
    // Codes beyond the bound are counted as "other".
    assert_eq!(xid("other"), 2.0);
    let e = |t: &str| {
        value(
            &s,
            &format!(r#"ethand_gpu_ecc_errors_total{{{g},type="{t}"}}"#),
        )
    };
    assert_eq!(e("corrected"), 7.0);
    assert_eq!(e("uncorrected"), 0.0);
    let link = |rest: &str| format!(r#"{{{g},link="2",{rest}}}"#);
    assert_eq!(
        value(
            &s,
            &format!(
                "ethand_gpu_nvlink_bytes_total{}",
                link(r#"direction="transmit""#)
            )
        ),
        (1u64 << 40) as f64
    );
    assert_eq!(
        value(
            &s,
            &format!(
                "ethand_gpu_nvlink_errors_total{}",
                link(r#"type="crc_data""#)
            )
        ),
        4.0
    );
    // crc_flit is None: no sample.
    assert!(!s.contains_key(&format!(
        "ethand_gpu_nvlink_errors_total{}",
        link(r#"type="crc_flit""#)
    )));
    // Throttle reasons: every known reason as 0/1.
    for r in THROTTLE_REASONS {
        let want = if *r == "sw_power_cap" { 1.0 } else { 0.0 };
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_gpu_throttle_reason{{{g},reason="{r}"}}"#)
            ),
            want,
            "{r}"
        );
    }
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_gpu_info{{{g},name="NVIDIA H200",pci_bus_id="00000000:18:00.0",driver="580.65.06"}}"#
            )
        ),
        1.0
    );
    assert_eq!(
        value(&s, r#"ethand_device_collector_up{collector="nvml"}"#),
        1.0
    );
    assert_eq!(
        value(&s, r#"ethand_device_collector_up{collector="dcmi"}"#),
        0.0
    );
}

#[test]
fn missing_fields_emit_no_sample() {
    let text = render(&snapshot(), &opts(true));
    let gpu1: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("GPU-bbbb"))
        .collect();
    // gpu1 has identity only: its info series, and nothing else (not even DCGM's).
    assert_eq!(gpu1.len(), 1, "{gpu1:#?}");
    assert!(gpu1[0].starts_with("ethand_gpu_info{"), "{gpu1:?}");
    // No devices at all: only what the snapshot has, no empty families.
    let empty = render(&NodeSnapshot::default(), &opts(true));
    assert!(
        !empty.contains("ethand_gpu_") && !empty.contains("DCGM_"),
        "{empty}"
    );
}

#[test]
fn gpm_ratios_are_absent_where_unmeasured() {
    // Measured and zero: a series with 0. Unsupported (Some(false)) or not asked (None):
    // no series at all, in ethand's names or DCGM's.
    let gpm = [
        "sm_activity",
        "sm_occupancy",
        "tensor_activity",
        "dram_bandwidth",
        "fp64_activity",
        "fp32_activity",
        "fp16_activity",
    ];
    let dcgm = [
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    ];
    let idle = GpuDevice {
        sm_activity_ratio: Some(0.0),
        sm_occupancy_ratio: Some(0.0),
        tensor_activity_ratio: Some(0.0),
        dram_bandwidth_ratio: Some(0.0),
        fp64_activity_ratio: Some(0.0),
        fp32_activity_ratio: Some(0.0),
        fp16_activity_ratio: Some(0.0),
        ..gpu0()
    };
    let older = GpuDevice {
        gpm_supported: Some(false),
        sm_activity_ratio: None,
        sm_occupancy_ratio: None,
        tensor_activity_ratio: None,
        dram_bandwidth_ratio: None,
        fp64_activity_ratio: None,
        fp32_activity_ratio: None,
        fp16_activity_ratio: None,
        ..gpu0()
    };
    let first_interval = GpuDevice {
        gpm_supported: Some(true),
        ..older.clone()
    };
    for (gpu, present) in [(idle, true), (older, false), (first_interval, false)] {
        let mut snap = snapshot();
        snap.devices.gpus = vec![gpu];
        let text = render(&snap, &opts(true));
        let s = samples(&text);
        let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
        for name in gpm {
            let series = format!("ethand_gpu_{name}_ratio{{{g}}}");
            assert_eq!(s.get(&series).copied(), present.then_some(0.0), "{series}");
        }
        for name in dcgm {
            assert_eq!(
                text.lines().any(|l| l.starts_with(&format!("{name}{{"))),
                present,
                "{name}"
            );
            // No series, no family: no HELP/TYPE either.
            assert_eq!(text.contains(&format!("# TYPE {name} ")), present, "{name}");
        }
        // The rest of the GPU is there either way.
        assert!(s.contains_key(&format!("ethand_gpu_power_watts{{{g}}}")));
    }
}

#[test]
fn npu_values() {
    let s = samples(&render(&snapshot(), &opts(false)));
    let n = r#"npu="npu1",uuid="NPU-1""#;
    let v = |name: &str| value(&s, &format!("{name}{{{n}}}"));
    assert_eq!(v("ethand_npu_aicore_utilization_ratio"), 0.5);
    assert_eq!(v("ethand_npu_hbm_used_bytes"), (4u64 << 30) as f64);
    assert_eq!(v("ethand_npu_hbm_total_bytes"), (64u64 << 30) as f64);
    assert_eq!(v("ethand_npu_hbm_bandwidth_utilization_ratio"), 0.1);
    assert_eq!(v("ethand_npu_hbm_temperature_celsius"), 40.0);
    assert_eq!(v("ethand_npu_power_watts"), 95.5);
    assert_eq!(v("ethand_npu_temperature_celsius"), 45.0);
    assert_eq!(v("ethand_npu_health"), 1.0);
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_npu_info{{{n},name="910B3",pci_bus_id="0000:c1:00.0",driver="24.1.rc2",card="4",chip="0"}}"#
            )
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_process_npu_memory_bytes{pid="42",npu="npu1",uuid="NPU-1"}"#
        ),
        (3u64 << 30) as f64
    );
}

#[test]
fn processes_are_capped_per_device() {
    let s = samples(&render(&snapshot(), &opts(false)));
    let pids: BTreeSet<&str> = s
        .keys()
        .filter_map(|k| k.strip_prefix("ethand_process_gpu_memory_bytes{pid=\""))
        .map(|k| k.split('"').next().unwrap())
        .collect();
    assert_eq!(pids.len(), MAX_PROCESSES_PER_DEVICE + 1, "{pids:?}");
    assert!(pids.contains("1000") && pids.contains("other"));
    let last = 1000 + MAX_PROCESSES_PER_DEVICE as u32;
    assert!(!pids.contains(last.to_string().as_str()));
    let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
    // The three smallest: 100 - 32, - 33, - 34 MiB.
    let other: u64 = (32..35).map(|i| (100 - i) << 20).sum();
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_gpu_memory_bytes{{pid="other",{g}}}"#)
        ),
        other as f64
    );
    let util = value(
        &s,
        &format!(r#"ethand_process_gpu_utilization_ratio{{pid="other",{g}}}"#),
    );
    assert!((util - 0.03).abs() < 1e-12, "{util}");
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_gpu_memory_bytes{{pid="1000",{g}}}"#)
        ),
        (100u64 << 20) as f64
    );
}

#[test]
fn dcgm_aliases_use_dcgm_units_and_labels() {
    let text = render(&snapshot(), &opts(false));
    assert!(!text.contains("DCGM_"), "aliases are off by default");
    let s = samples(&render(&snapshot(), &opts(true)));
    let l = r#"gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia3",modelName="NVIDIA H200",Hostname="node1",DCGM_FI_DRIVER_VERSION="580.65.06""#;
    let v = |name: &str| value(&s, &format!("{name}{{{l}}}"));
    assert_eq!(v("DCGM_FI_DEV_GPU_UTIL"), 75.0);
    assert_eq!(v("DCGM_FI_DEV_MEM_COPY_UTIL"), 25.0);
    assert_eq!(v("DCGM_FI_DEV_FB_USED"), 10.0 * 1024.0);
    assert_eq!(v("DCGM_FI_DEV_FB_FREE"), 130.0 * 1024.0);
    assert_eq!(v("DCGM_FI_DEV_POWER_USAGE"), 412.5);
    assert_eq!(v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), 123_456_789.0);
    assert_eq!(v("DCGM_FI_DEV_GPU_TEMP"), 55.0);
    assert_eq!(v("DCGM_FI_DEV_SM_CLOCK"), 1980.0);
    assert_eq!(v("DCGM_FI_DEV_MEM_CLOCK"), 2619.0);
    assert_eq!(v("DCGM_FI_DEV_PCIE_TX_THROUGHPUT"), 2048.0);
    assert_eq!(v("DCGM_FI_DEV_PCIE_RX_THROUGHPUT"), 512.0);
    assert_eq!(
        value(
            &s,
            &format!(
                r#"DCGM_FI_DEV_XID_ERRORS{{{l},err_code="79",err_msg="GPU has fallen off the bus"}}"#
            )
        ),
        79.0
    );
    assert_eq!(v("DCGM_FI_DEV_MEMORY_TEMP"), 81.0);
    assert_eq!(v("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), 9.0);
    assert_eq!(v("DCGM_FI_DEV_ENC_UTIL"), 12.0);
    assert_eq!(v("DCGM_FI_DEV_DEC_UTIL"), 25.0);
    assert_eq!(v("DCGM_FI_DEV_FB_RESERVED"), 512.0);
    // DCGM's "approximately MiB/s": bytes/s / 1024 / 1000.
    assert_eq!(v("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), 2000.0);
    assert_eq!(v("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), 1.0);
    assert_eq!(v("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), 2.0);
    assert_eq!(v("DCGM_FI_DEV_ROW_REMAP_FAILURE"), 0.0);
    assert_eq!(v("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), 0.9375);
    assert_eq!(v("DCGM_FI_PROF_PCIE_TX_BYTES"), 3.5e9);
    assert_eq!(v("DCGM_FI_PROF_PCIE_RX_BYTES"), 1.5e9);
    assert_eq!(v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), 7.0);
    assert_eq!(v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), 0.0);
    // Profiling fields: ratios in dcgm-exporter too.
    assert_eq!(v("DCGM_FI_PROF_SM_ACTIVE"), 0.875);
    assert_eq!(v("DCGM_FI_PROF_SM_OCCUPANCY"), 0.375);
    assert_eq!(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), 0.5);
    assert_eq!(v("DCGM_FI_PROF_PIPE_FP32_ACTIVE"), 0.25);
    assert_eq!(v("DCGM_FI_PROF_DRAM_ACTIVE"), 0.0625);
}

#[test]
fn every_device_family_is_rendered_and_declared() {
    let text = render(&snapshot(), &opts(true));
    let rendered: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    // metric_catalog() lists the device families last, from the collectors' state on.
    let catalog = crate::prometheus::metric_catalog();
    let first = catalog
        .iter()
        .position(|f| f.0 == "ethand_device_collector_up")
        .unwrap();
    let devices = &catalog[first..];
    for (name, _, help) in devices {
        assert!(rendered.contains(name), "{name} not rendered");
        assert!(text.contains(&format!("# HELP {name} {help}\n")), "{name}");
    }
}

/// The issue-26 families: exact values, labels and types.
#[test]
fn health_and_rate_families() {
    let text = render(&snapshot(), &opts(false));
    let s = samples(&text);
    let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
    let v = |name: &str| value(&s, &format!("{name}{{{g}}}"));
    assert_eq!(v("ethand_gpu_graphics_activity_ratio"), 0.9375);
    assert_eq!(v("ethand_gpu_pcie_tx_average_bytes_per_second"), 3.5e9);
    assert_eq!(v("ethand_gpu_pcie_rx_average_bytes_per_second"), 1.5e9);
    assert_eq!(v("ethand_gpu_memory_reserved_bytes"), (512u64 << 20) as f64);
    assert_eq!(v("ethand_gpu_memory_free_bytes"), (130u64 << 30) as f64);
    assert_eq!(v("ethand_gpu_memory_temperature_celsius"), 81.0);
    assert_eq!(v("ethand_gpu_power_limit_watts"), 700.0);
    assert_eq!(v("ethand_gpu_encoder_utilization_ratio"), 0.12);
    assert_eq!(v("ethand_gpu_decoder_utilization_ratio"), 0.25);
    assert_eq!(v("ethand_gpu_pcie_link_generation"), 4.0);
    assert_eq!(v("ethand_gpu_pcie_link_generation_max"), 5.0);
    assert_eq!(v("ethand_gpu_pcie_link_width"), 8.0);
    assert_eq!(v("ethand_gpu_pcie_link_width_max"), 16.0);
    assert_eq!(v("ethand_gpu_pcie_replays_total"), 9.0);
    assert_eq!(v("ethand_gpu_memory_row_remap_pending"), 1.0);
    assert_eq!(v("ethand_gpu_memory_row_remap_failed"), 0.0);
    assert_eq!(v("ethand_gpu_memory_retired_pages_pending"), 0.0);
    assert_eq!(v("ethand_gpu_nvlink_bytes_per_second"), 2.048e9);
    let cause = |name: &str, c: &str| value(&s, &format!(r#"{name}{{{g},cause="{c}"}}"#));
    let rows = "ethand_gpu_memory_remapped_rows_total";
    assert_eq!(cause(rows, "correctable"), 2.0);
    assert_eq!(cause(rows, "uncorrectable"), 1.0);
    let pages = "ethand_gpu_memory_retired_pages_total";
    assert_eq!(cause(pages, "single_bit"), 5.0);
    assert_eq!(cause(pages, "double_bit"), 6.0);
    for (name, kind) in [
        ("ethand_gpu_graphics_activity_ratio", "gauge"),
        ("ethand_gpu_pcie_tx_average_bytes_per_second", "gauge"),
        ("ethand_gpu_pcie_link_width_max", "gauge"),
        ("ethand_gpu_pcie_replays_total", "counter"),
        ("ethand_gpu_memory_remapped_rows_total", "counter"),
        ("ethand_gpu_memory_retired_pages_total", "counter"),
        ("ethand_gpu_memory_row_remap_failed", "gauge"),
        ("ethand_gpu_nvlink_bytes_per_second", "gauge"),
        ("ethand_gpu_xid_errors_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
}

/// A field the driver does not give is no series, in ethand's names and DCGM's; a watched
/// GPU without XID events has no XID counter series (and DCGM's last-XID alias is 0).
#[test]
fn absent_never_zero() {
    let mut bare = gpu0();
    bare.graphics_activity_ratio = None;
    bare.pcie_tx_average_bytes_per_second = None;
    bare.memory_reserved_bytes = None;
    bare.memory_temperature_celsius = None;
    bare.power_limit_watts = None;
    bare.encoder_utilization_ratio = None;
    bare.pcie_link_generation = None;
    bare.pcie_replays = None;
    bare.remapped_rows_correctable = None;
    bare.row_remap_failed = None;
    bare.retired_pages_single_bit = None;
    bare.retired_pages_double_bit = None;
    bare.retired_pages_pending = None;
    bare.nvlink_bytes_per_second = None;
    bare.xid_errors = Some(0);
    bare.last_xid = None;
    bare.xid_errors_by_code.clear();
    let mut snap = snapshot();
    snap.devices.gpus = vec![bare];
    let text = render(&snap, &opts(true));
    for gone in [
        "ethand_gpu_graphics_activity_ratio{",
        "ethand_gpu_pcie_tx_average_bytes_per_second{",
        "ethand_gpu_memory_reserved_bytes{",
        "ethand_gpu_memory_temperature_celsius{",
        "ethand_gpu_power_limit_watts{",
        "ethand_gpu_encoder_utilization_ratio{",
        "ethand_gpu_pcie_link_generation{",
        "ethand_gpu_pcie_replays_total{",
        "ethand_gpu_memory_row_remap_failed{",
        "ethand_gpu_memory_retired_pages_total{",
        "ethand_gpu_memory_retired_pages_pending{",
        "ethand_gpu_nvlink_bytes_per_second{",
        "ethand_gpu_xid_errors_total{",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE{",
        "DCGM_FI_PROF_PCIE_TX_BYTES{",
        "DCGM_FI_DEV_FB_RESERVED{",
        "DCGM_FI_DEV_MEMORY_TEMP{",
        "DCGM_FI_DEV_ENC_UTIL{",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER{",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE{",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{",
    ] {
        assert!(!text.contains(gone), "{gone} present:\n{text}");
    }
    // The other half of each pair is still there.
    let s = samples(&text);
    let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_gpu_memory_remapped_rows_total{{{g},cause="uncorrectable"}}"#)
        ),
        1.0
    );
    assert!(!s.contains_key(&format!(
        r#"ethand_gpu_memory_remapped_rows_total{{{g},cause="correctable"}}"#
    )));
    assert!(
        text.lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{")
                && l.ends_with(r#"err_code="0",err_msg="No Error"} 0"#)),
        "{text}"
    );
}

/// dcgm-exporter's counters are typed counter, under its names (no `_total`).
#[test]
fn dcgm_counter_types() {
    let text = render(&snapshot(), &opts(true));
    for name in [
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "{name}:\n{text}"
        );
        assert!(text.contains(&format!("\n{name}{{")), "{name} sample");
        assert!(!text.contains(&format!("{name}_total")), "{name}_total");
    }
    for name in [
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ] {
        assert!(text.contains(&format!("# TYPE {name} gauge\n")), "{name}");
    }
}

#[test]
fn xid_meanings_come_from_the_one_table() {
    use crate::catalog::dcgm::xid_meaning;
    assert_eq!(xid_meaning(79), "GPU has fallen off the bus");
    assert_eq!(xid_meaning(48), "Double-bit ECC error");
    assert_eq!(xid_meaning(0), "No Error");
    assert_eq!(xid_meaning(7), "Unknown Error");
    assert_eq!(xid_meaning(u64::MAX), "Unknown Error");
    // A bounded label: every code up to 10k maps to a handful of texts.
    let texts: std::collections::BTreeSet<&str> = (0..10_000).map(xid_meaning).collect();
    assert!(texts.len() < 40, "{texts:?}");
}

mod workload {
    use super::*;
    use ethand_snapshot::{ProcessSnapshot, WorkloadIdentity};

    fn w(pod: &str, rank: Option<u32>) -> WorkloadIdentity {
        WorkloadIdentity {
            namespace: Some("ml".into()),
            pod: Some(pod.into()),
            container: Some("pytorch".into()),
            job_id: Some("job-7".into()),
            rank,
            ..Default::default()
        }
    }

    fn proc(pid: u32, workload: Option<WorkloadIdentity>) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            comm: "python".into(),
            alive: true,
            workload,
            ..Default::default()
        }
    }

    fn on(pid: u32, gpu: &GpuDevice) -> DeviceProcess {
        DeviceProcess {
            pid,
            device: gpu.label(),
            uuid: gpu.uuid.clone(),
            memory_used_bytes: Some(1 << 30),
            utilization_ratio: None,
        }
    }

    /// gpu0: two processes of one workload (pod a, rank 0); gpu1: processes of two pods;
    /// gpu2: a process of unknown workload; gpu3: no process.
    fn node() -> NodeSnapshot {
        let gpus: Vec<GpuDevice> = (0..4)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "NVIDIA H200".into(),
                pci_bus_id: format!("00000000:1{i}:00.0"),
                driver_version: "580.65.06".into(),
                utilization_ratio: Some(0.5),
                ..Default::default()
            })
            .collect();
        let mut snap = NodeSnapshot {
            processes: vec![
                proc(10, Some(w("a", Some(0)))),
                proc(11, Some(w("a", Some(0)))),
                proc(20, Some(w("b", None))),
                proc(21, Some(w("c", None))),
                proc(30, None),
            ],
            ..Default::default()
        };
        snap.devices.hostname = "node1".into();
        snap.devices.processes = vec![
            on(10, &gpus[0]),
            on(11, &gpus[0]),
            on(20, &gpus[1]),
            on(21, &gpus[1]),
            on(30, &gpus[2]),
        ];
        snap.devices.gpus = gpus;
        snap
    }

    fn render_with(labels: bool) -> String {
        render(
            &node(),
            &PrometheusOptions {
                dcgm_aliases: true,
                device_workload_labels: labels,
                ..Default::default()
            },
        )
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn one_owner_gets_its_labels() {
        let text = render_with(true);
        assert_eq!(
            line(&text, r#"ethand_gpu_utilization_ratio{gpu="gpu0""#),
            r#"ethand_gpu_utilization_ratio{gpu="gpu0",uuid="GPU-0",namespace="ml",pod="a",container="pytorch",job_id="job-7",rank="0"} 0.5"#
        );
        assert_eq!(
            line(&text, r#"DCGM_FI_DEV_GPU_UTIL{gpu="0""#),
            r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:10:00.0",device="nvidia0",modelName="NVIDIA H200",Hostname="node1",DCGM_FI_DRIVER_VERSION="580.65.06",namespace="ml",pod="a",container="pytorch",job_id="job-7",rank="0"} 50"#
        );
        assert!(line(&text, r#"ethand_gpu_info{gpu="gpu0""#).contains(r#"pod="a""#));
    }

    #[test]
    fn shared_unknown_or_idle_gpus_get_none() {
        let text = render_with(true);
        for gpu in ["1", "2", "3"] {
            for prefix in [
                format!(r#"ethand_gpu_utilization_ratio{{gpu="gpu{gpu}""#),
                format!(r#"DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}""#),
            ] {
                let l = line(&text, &prefix);
                assert!(
                    !l.contains("pod=") && !l.contains("job_id=") && !l.contains("namespace="),
                    "{l}"
                );
            }
        }
    }

    #[test]
    fn off_by_default() {
        assert!(!PrometheusOptions::default().device_workload_labels);
        let text = render_with(false);
        for l in text
            .lines()
            .filter(|l| l.starts_with("ethand_gpu_") || l.starts_with("DCGM_"))
        {
            assert!(!l.contains("pod=") && !l.contains("job_id="), "{l}");
        }
    }

    /// Two ranks of one job on one GPU are two workloads: no labels.
    #[test]
    fn different_ranks_share_no_labels() {
        let mut snap = node();
        snap.processes[1].workload = Some(w("a", Some(1)));
        let owners = crate::prometheus::gpu_owners(&snap);
        assert!(!owners.contains_key(&0), "{owners:?}");
        snap.processes[1].workload = Some(w("a", Some(0)));
        assert!(crate::prometheus::gpu_owners(&snap).contains_key(&0));
    }

    /// The per-process XID series carry the process's pid, comm and workload labels.
    #[test]
    fn process_xid_events_carry_workload_labels() {
        let mut snap = node();
        // A GPU user: selected whatever the top-N says.
        snap.processes[0].gpu = Some(Default::default());
        snap.processes[0].gpu_xid_events = vec![ethand_snapshot::gpu::ProcessXid {
            device: "gpu0".into(),
            uuid: "GPU-0".into(),
            xid: 79,
            count: 2,
            last_unix_ns: 5,
        }];
        let text = render(
            &snap,
            &PrometheusOptions {
                selection: ethand_snapshot::selection::ExportSelection::top(10),
                ..Default::default()
            },
        );
        assert_eq!(
            line(&text, "ethand_process_gpu_xid_events_total{"),
            r#"ethand_process_gpu_xid_events_total{pid="10",comm="python",namespace="ml",pod="a",container="pytorch",job_id="job-7",rank="0",gpu="gpu0",uuid="GPU-0",xid="79"} 2"#
        );
        assert!(text.contains("# TYPE ethand_process_gpu_xid_events_total counter\n"));
    }
}
