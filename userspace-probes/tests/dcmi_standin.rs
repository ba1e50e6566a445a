//! The DCMI collector against a stand-in `libdcmi.so` (tests/standins/dcmi.c) compiled here
//! with `cc`: it must read exactly the values the stand-in answers, through the public API
//! the daemon uses (`open_collectors`, `DeviceCollector::collect`). This is not real Ascend
//! hardware: it checks the symbol lookup, struct layouts, units and error handling against
//! the documented API, nothing more.
mod common;

use std::path::{Path, PathBuf};

use ethand_userspace_probes::devices::{
    CollectorState, DeviceCollector, DeviceProcess, DevicesConfig, NpuDevice, open_collectors,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Compiles the stand-in into a fresh directory; None (test skipped) when there is no `cc`.
fn build(variant: &str, defines: &[&str]) -> Option<PathBuf> {
    common::build_standin("dcmi.c", "libdcmi.so", variant, defines)
}

fn open(lib: &Path) -> (Box<dyn DeviceCollector>, String) {
    let cfg = DevicesConfig {
        nvml: false,
        dcmi: true,
        nvml_library: None,
        dcmi_library: Some(lib.to_owned()),
        ..Default::default()
    };
    let (mut collectors, statuses) = open_collectors(&cfg);
    // Loaded (or not): the file is no longer needed.
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert_eq!(statuses[0].name, "nvml");
    assert_eq!(statuses[0].state, CollectorState::Unavailable);
    let dcmi = &statuses[1];
    assert_eq!(dcmi.name, "dcmi");
    assert_eq!(dcmi.state, CollectorState::Available, "{dcmi:?}");
    assert_eq!(collectors.len(), 1);
    let c = collectors.pop().unwrap();
    assert_eq!(c.name(), "dcmi");
    (c, dcmi.detail.clone())
}

#[test]
fn reads_exactly_what_the_library_says() {
    let Some(lib) = build("full", &[]) else {
        return;
    };
    let (mut c, detail) = open(&lib);
    assert_eq!(detail, "", "every symbol is there");

    let sample = c.collect().unwrap();
    assert!(sample.notes.is_empty(), "{:?}", sample.notes);
    assert!(sample.gpus.is_empty());
    let uuid3 = "00003001-00000002-00000003-00000004-00000005";
    let uuid7 = "00007001-00000002-00000003-00000004-00000005";
    assert_eq!(
        sample.npus,
        vec![
            NpuDevice {
                index: 1, // logic id, not the enumeration order
                card_id: 3,
                device_id: 0,
                uuid: uuid3.into(),
                name: "Ascend910B3".into(),
                pci_bus_id: "0000:c1:00.0".into(),
                driver_version: "24.1.rc2.stand-in".into(),
                aicore_utilization_ratio: Some(0.37),
                hbm_used_bytes: Some(12_288 * MIB),
                hbm_total_bytes: Some(64 * GIB),
                hbm_bandwidth_utilization_ratio: Some(0.23),
                hbm_temperature_celsius: Some(41),
                power_watts: Some(123.4),
                temperature_celsius: Some(47),
                health: Some(0),
            },
            NpuDevice {
                index: 0,
                card_id: 7,
                device_id: 0,
                uuid: uuid7.into(),
                name: "Ascend910B3".into(),
                pci_bus_id: "0001:41:00.0".into(),
                driver_version: "24.1.rc2.stand-in".into(),
                aicore_utilization_ratio: Some(0.81),
                hbm_used_bytes: Some(30_000 * MIB),
                hbm_total_bytes: Some(32 * GIB),
                hbm_bandwidth_utilization_ratio: Some(0.9),
                hbm_temperature_celsius: Some(52),
                power_watts: Some(200.5),
                temperature_celsius: Some(63),
                health: Some(2),
            },
        ]
    );
    assert_eq!(
        sample.processes,
        vec![
            DeviceProcess {
                pid: 4242,
                device: "npu1".into(),
                uuid: uuid3.into(),
                memory_used_bytes: Some(GIB),
                utilization_ratio: None,
            },
            DeviceProcess {
                pid: 4343,
                device: "npu1".into(),
                uuid: uuid3.into(),
                memory_used_bytes: Some(512 * MIB),
                utilization_ratio: None,
            },
        ]
    );
    // A second collection reads the same.
    assert_eq!(c.collect().unwrap(), sample);
}

#[test]
fn missing_symbols_leave_their_fields_empty() {
    let Some(lib) = build("minimal", &["-DSTANDIN_MINIMAL"]) else {
        return;
    };
    let (mut c, detail) = open(&lib);
    for missing in [
        "dcmi_get_device_power_info",
        "dcmi_get_device_health",
        "dcmi_get_device_logic_id",
        "dcmi_get_device_resource_info",
    ] {
        assert!(detail.contains(missing), "{missing} not in {detail:?}");
    }
    let sample = c.collect().unwrap();
    // Card 7's temperature is "not supported": empty, and no note.
    assert!(sample.notes.is_empty(), "{:?}", sample.notes);
    let want = |index, card_id, util, used, total, bw, hbm_temp, temp| NpuDevice {
        index,
        card_id,
        device_id: 0,
        aicore_utilization_ratio: Some(util),
        hbm_used_bytes: Some(used),
        hbm_total_bytes: Some(total),
        hbm_bandwidth_utilization_ratio: Some(bw),
        hbm_temperature_celsius: Some(hbm_temp),
        temperature_celsius: temp,
        ..Default::default()
    };
    assert_eq!(
        sample.npus,
        vec![
            // No dcmi_get_device_logic_id: numbered in enumeration order.
            want(0, 3, 0.37, 12_288 * MIB, 64 * GIB, 0.23, 41, Some(47)),
            want(1, 7, 0.81, 30_000 * MIB, 32 * GIB, 0.9, 52, None),
        ]
    );
    assert!(sample.processes.is_empty());
}

#[test]
fn a_missing_library_is_reported_not_raised() {
    let cfg = DevicesConfig {
        nvml: false,
        dcmi_library: Some("/nonexistent/dir/libdcmi.so".into()),
        ..Default::default()
    };
    let (collectors, statuses) = open_collectors(&cfg);
    assert!(collectors.is_empty());
    assert_eq!(statuses[1].state, CollectorState::Unavailable);
    assert!(
        statuses[1]
            .detail
            .starts_with("/nonexistent/dir/libdcmi.so not found: no Ascend driver"),
        "{}",
        statuses[1].detail
    );
}
