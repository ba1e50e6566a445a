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
        xid_errors: Some(2),
        last_xid: Some(79),
        gpm_supported: Some(true),
        sm_activity_ratio: Some(0.875),
        sm_occupancy_ratio: Some(0.375),
        tensor_activity_ratio: Some(0.5),
        dram_bandwidth_ratio: Some(0.0625),
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
    assert_eq!(v("ethand_gpu_xid_errors_total"), 2.0);
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
    ];
    let dcgm = [
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ];
    let idle = GpuDevice {
        sm_activity_ratio: Some(0.0),
        sm_occupancy_ratio: Some(0.0),
        tensor_activity_ratio: Some(0.0),
        dram_bandwidth_ratio: Some(0.0),
        ..gpu0()
    };
    let older = GpuDevice {
        gpm_supported: Some(false),
        sm_activity_ratio: None,
        sm_occupancy_ratio: None,
        tensor_activity_ratio: None,
        dram_bandwidth_ratio: None,
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
    let l = r#"gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia3",modelName="NVIDIA H200",Hostname="node1""#;
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
    assert_eq!(v("DCGM_FI_DEV_XID_ERRORS"), 79.0);
    assert_eq!(v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), 7.0);
    assert_eq!(v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), 0.0);
    // Profiling fields: ratios in dcgm-exporter too.
    assert_eq!(v("DCGM_FI_PROF_SM_ACTIVE"), 0.875);
    assert_eq!(v("DCGM_FI_PROF_SM_OCCUPANCY"), 0.375);
    assert_eq!(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), 0.5);
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
