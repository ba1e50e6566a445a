//! The NVML collector against a stand-in `libnvidia-ml.so.1` (tests/standins/nvml.c)
//! compiled here with `cc`: it must read exactly the values the stand-in answers, through the
//! public API the daemon uses (`open_collectors`, `collect_all`). This is not a real GPU: it
//! checks the symbol lookup, struct layouts, units, "not supported" handling, XID events and
//! GPM intervals against NVML's documented API, nothing more.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use ethand_userspace_probes::devices::nvml::Cadence;
use ethand_userspace_probes::devices::{
    CollectorState, DeviceCollector, DeviceProcess, DevicesConfig, DevicesSnapshot, GpuDevice,
    NvLinkStats, XidEvent, collect_all, open_collectors,
};
use nvml_wrapper::error::NvmlError;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The stand-in reads ETHAND_NVML_STANDIN_LOST at nvmlInit_v2: opening is serialised so
/// that one test's variable is not seen by another's library.
static OPEN: Mutex<()> = Mutex::new(());

/// Compiles the stand-in into a fresh directory; None (test skipped) when there is no `cc`.
fn build_standin(variant: &str) -> Option<PathBuf> {
    common::build_standin("nvml.c", "libnvidia-ml.so.1", variant, &[])
}

/// Opens the NVML collector on `lib` (with gpu1 lost when `lost`); returns it with the
/// status list.
fn open(
    lib: &Path,
    lost: bool,
) -> (
    Vec<Box<dyn DeviceCollector>>,
    Vec<ethand_userspace_probes::devices::CollectorStatus>,
) {
    let cfg = DevicesConfig {
        nvml_library: Some(lib.to_owned()),
        dcmi: false,
        nvml_cadence: Cadence::EVERY_TIME,
        ..Default::default()
    };
    let opened = {
        let _g = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the only reader is the stand-in's nvmlInit_v2, called under the same lock.
        unsafe {
            if lost {
                std::env::set_var("ETHAND_NVML_STANDIN_LOST", "1");
            } else {
                std::env::remove_var("ETHAND_NVML_STANDIN_LOST");
            }
        }
        let opened = open_collectors(&cfg);
        unsafe { std::env::remove_var("ETHAND_NVML_STANDIN_LOST") };
        opened
    };
    // Loaded (or not): the file is no longer needed.
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
    let (collectors, statuses) = opened;
    assert_eq!(statuses[0].name, "nvml");
    assert_eq!(statuses[0].state, CollectorState::Available, "{statuses:?}");
    assert_eq!(collectors.len(), 1);
    (collectors, statuses)
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// gpu0, the H200-like GPU, after its second collection.
fn gpu0() -> GpuDevice {
    GpuDevice {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        name: "NVIDIA H200".into(),
        pci_bus_id: "00000000:18:00.0".into(),
        minor_number: Some(0),
        driver_version: "570.86.15".into(),
        utilization_ratio: Some(0.87),
        memory_utilization_ratio: Some(0.41),
        memory_used_bytes: Some(3 * GIB),
        memory_free_bytes: Some(141 * GIB - 512 * MIB - 3 * GIB),
        memory_total_bytes: Some(141 * GIB),
        power_watts: Some(512.345),
        energy_millijoules: Some(123_456_789),
        temperature_celsius: Some(45),
        sm_clock_hertz: Some(1_980_000_000),
        memory_clock_hertz: Some(3_201_000_000),
        pcie_tx_bytes_per_second: Some(1000 * 1024),
        pcie_rx_bytes_per_second: Some(2000 * 1024),
        nvlinks: vec![
            NvLinkStats {
                link: 0,
                tx_bytes: Some(1000 * 1024),
                rx_bytes: Some(2000 * 1024),
                replay_errors: Some(1),
                recovery_errors: Some(10),
                crc_flit_errors: Some(20),
                crc_data_errors: Some(30),
            },
            NvLinkStats {
                link: 1,
                tx_bytes: Some(3000 * 1024),
                rx_bytes: Some(4000 * 1024),
                replay_errors: Some(2),
                recovery_errors: Some(11),
                crc_flit_errors: Some(21),
                crc_data_errors: Some(31),
            },
        ],
        ecc_corrected_errors: Some(12),
        ecc_uncorrected_errors: Some(0),
        throttle_reasons: Some(vec!["sw_power_cap".into()]),
        xid_errors: Some(2),
        last_xid: Some(13),
        gpm_supported: Some(true),
        sm_activity_ratio: Some(0.5),
        sm_occupancy_ratio: Some(0.25),
        tensor_activity_ratio: Some(0.125),
        dram_bandwidth_ratio: Some(0.75),
        graphics_activity_ratio: Some(0.625),
        pcie_tx_average_bytes_per_second: Some(1024.0 * MIB as f64),
        pcie_rx_average_bytes_per_second: Some(256.0 * MIB as f64),
        fp64_activity_ratio: Some(0.0625),
        fp32_activity_ratio: Some(0.375),
        fp16_activity_ratio: Some(0.1875),
        memory_reserved_bytes: Some(512 * MIB),
        memory_temperature_celsius: Some(52),
        power_limit_watts: Some(700.0),
        encoder_utilization_ratio: Some(0.07),
        decoder_utilization_ratio: Some(0.09),
        pcie_link_generation: Some(4),
        pcie_link_generation_max: Some(5),
        pcie_link_width: Some(8),
        pcie_link_width_max: Some(16),
        pcie_replays: Some(3),
        remapped_rows_correctable: Some(2),
        remapped_rows_uncorrectable: Some(1),
        row_remap_pending: Some(true),
        row_remap_failed: Some(false),
        retired_pages_single_bit: Some(4),
        retired_pages_double_bit: Some(1),
        retired_pages_pending: Some(true),
        // The traffic counters did not move between the two reads.
        nvlink_bytes_per_second: Some(0.0),
        xid_errors_by_code: BTreeMap::from([(13, 1), (79, 1)]),
        unsupported: vec![],
    }
}

/// What gpu1, the older GPU, does not have.
const GPU1_UNSUPPORTED: [&str; 19] = [
    "decoder_utilization_ratio",
    "dram_bandwidth_ratio",
    "encoder_utilization_ratio",
    "fp16_activity_ratio",
    "fp32_activity_ratio",
    "fp64_activity_ratio",
    "graphics_activity_ratio",
    "memory_temperature_celsius",
    "nvlink_bytes_per_second",
    "nvlinks",
    "pcie_rx_average_bytes_per_second",
    "pcie_tx_average_bytes_per_second",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_failed",
    "row_remap_pending",
    "sm_activity_ratio",
    "sm_occupancy_ratio",
    "tensor_activity_ratio",
];

fn gpu1() -> GpuDevice {
    GpuDevice {
        index: 1,
        uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
        name: "Tesla V100-SXM2-16GB".into(),
        pci_bus_id: "00000000:86:00.0".into(),
        minor_number: Some(1),
        driver_version: "570.86.15".into(),
        utilization_ratio: Some(0.33),
        memory_utilization_ratio: Some(0.12),
        memory_used_bytes: Some(GIB),
        memory_free_bytes: Some(16 * GIB - 256 * MIB - GIB),
        memory_total_bytes: Some(16 * GIB),
        // NO_PERMISSION: absent, and a note (not "unsupported").
        power_watts: None,
        energy_millijoules: Some(987_654_321),
        temperature_celsius: Some(61),
        sm_clock_hertz: Some(1_530_000_000),
        memory_clock_hertz: Some(877_000_000),
        pcie_tx_bytes_per_second: Some(300 * 1024),
        pcie_rx_bytes_per_second: Some(400 * 1024),
        nvlinks: vec![],
        ecc_corrected_errors: Some(5),
        ecc_uncorrected_errors: Some(2),
        throttle_reasons: Some(vec!["gpu_idle".into()]),
        // Not registered for XID events.
        xid_errors: None,
        last_xid: None,
        gpm_supported: Some(false),
        memory_reserved_bytes: Some(256 * MIB),
        power_limit_watts: Some(300.0),
        pcie_link_generation: Some(3),
        pcie_link_generation_max: Some(3),
        pcie_link_width: Some(16),
        pcie_link_width_max: Some(16),
        pcie_replays: Some(7),
        retired_pages_single_bit: Some(6),
        retired_pages_double_bit: Some(2),
        retired_pages_pending: Some(false),
        unsupported: GPU1_UNSUPPORTED.iter().map(|s| s.to_string()).collect(),
        // Everything else (GPM, encoder/decoder, memory temperature, row remapping, NVLink):
        // None, never 0.
        ..Default::default()
    }
}

fn processes() -> Vec<DeviceProcess> {
    let p = |pid, bytes, util| DeviceProcess {
        pid,
        device: "gpu0".into(),
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        memory_used_bytes: Some(bytes),
        utilization_ratio: Some(util),
    };
    vec![p(4242, GIB, 0.55), p(4343, 2 * GIB, 0.0)]
}

#[test]
fn reads_exactly_what_the_library_says() {
    let Some(lib) = build_standin("full") else {
        return;
    };
    let (mut collectors, opened) = open(&lib, false);
    let open_detail = "XID events not supported on gpu1 (not supported); GPM metrics (SM \
                       activity, occupancy, tensor, DRAM bandwidth, graphics, FP pipes, PCIe \
                       rates: Hopper and newer) not supported on gpu1";
    assert_eq!(opened[0].detail, open_detail);

    let before = unix_ns();
    let first: DevicesSnapshot = collect_all(&mut collectors, &opened, "node1");
    let after = unix_ns();
    // GPM and the NVLink rate need two reads: absent after the first, never 0.
    let g0 = &first.gpus[0];
    assert_eq!(g0.gpm_supported, Some(true));
    for v in [
        g0.sm_activity_ratio,
        g0.sm_occupancy_ratio,
        g0.tensor_activity_ratio,
        g0.dram_bandwidth_ratio,
        g0.graphics_activity_ratio,
        g0.pcie_tx_average_bytes_per_second,
        g0.pcie_rx_average_bytes_per_second,
        g0.fp64_activity_ratio,
        g0.fp32_activity_ratio,
        g0.fp16_activity_ratio,
        g0.nvlink_bytes_per_second,
    ] {
        assert_eq!(v, None);
    }
    assert_eq!(
        GpuDevice {
            sm_activity_ratio: None,
            sm_occupancy_ratio: None,
            tensor_activity_ratio: None,
            dram_bandwidth_ratio: None,
            graphics_activity_ratio: None,
            pcie_tx_average_bytes_per_second: None,
            pcie_rx_average_bytes_per_second: None,
            fp64_activity_ratio: None,
            fp32_activity_ratio: None,
            fp16_activity_ratio: None,
            nvlink_bytes_per_second: None,
            ..gpu0()
        },
        *g0
    );
    // XID events are drained at the first collection, after the GPUs were read: each names
    // the processes on gpu0.
    let want_events = |drained: &[XidEvent]| {
        assert_eq!(drained.len(), 2, "{drained:?}");
        for (e, (seq, xid)) in drained.iter().zip([(1, 79), (2, 13)]) {
            assert!(
                (before..=after).contains(&e.drained_unix_ns),
                "{} not in {before}..={after}",
                e.drained_unix_ns
            );
            assert_eq!(
                *e,
                XidEvent {
                    seq,
                    gpu: 0,
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    xid,
                    drained_unix_ns: e.drained_unix_ns,
                    pids: vec![4242, 4343],
                }
            );
        }
    };
    want_events(&first.xid_events);

    let snap = collect_all(&mut collectors, &opened, "node1");
    assert_eq!(snap.hostname, "node1");
    assert_eq!(snap.gpus, vec![gpu0(), gpu1()]);
    assert_eq!(snap.processes, processes());
    assert!(snap.npus.is_empty());
    // The ring again, the same events (consumers count each once by seq).
    want_events(&snap.xid_events);
    assert_eq!(snap.xid_events, first.xid_events);

    let nvml = &snap.collectors[0];
    assert_eq!(nvml.state, CollectorState::Available);
    assert_eq!(
        nvml.detail,
        format!(
            "{open_detail}; gpu1 does not have: {}; gpu1 power: {}",
            GPU1_UNSUPPORTED.join(", "),
            NvmlError::NoPermission
        )
    );
    assert_eq!(snap.collectors[1].name, "dcmi");
    assert_eq!(snap.collectors[1].state, CollectorState::Unavailable);
}

#[test]
fn a_lost_gpu_is_noted_and_the_others_still_read() {
    let Some(lib) = build_standin("lost") else {
        return;
    };
    let (mut collectors, opened) = open(&lib, true);
    assert!(
        opened[0].detail.contains(&format!(
            "XID events not supported on gpu1 ({})",
            NvmlError::GpuLost
        )),
        "{}",
        opened[0].detail
    );
    collect_all(&mut collectors, &opened, "");
    let snap = collect_all(&mut collectors, &opened, "");
    assert_eq!(snap.collectors[0].state, CollectorState::Available);
    assert_eq!(snap.gpus, vec![gpu0()]);
    assert_eq!(snap.processes, processes());
    assert_eq!(snap.xid_events.len(), 2);
    assert!(
        snap.collectors[0]
            .detail
            .ends_with(&format!("gpu1: {}", NvmlError::GpuLost)),
        "{}",
        snap.collectors[0].detail
    );
}
