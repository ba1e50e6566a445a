//! The NVML collector on the GPUs of this machine, through the public API the daemon uses.
//! Where NVML is unavailable (no NVIDIA driver) the test says why and passes, unless
//! `ETHAND_REQUIRE_NVML=1` asks for a GPU. What it read is printed (`--nocapture`).
use std::time::Duration;

use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::NodeSnapshot;
use ethand_userspace_probes::devices::{
    CollectorState, DevicesConfig, collect_all, open_collectors,
};

#[test]
fn reads_the_gpus_of_this_machine() {
    let cfg = DevicesConfig {
        dcmi: false,
        ..Default::default()
    };
    let (mut collectors, statuses) = open_collectors(&cfg);
    let status = &statuses[0];
    assert_eq!(status.name, "nvml");
    if status.state != CollectorState::Available {
        assert!(
            std::env::var_os("ETHAND_REQUIRE_NVML").is_none(),
            "NVML required but {status:?}"
        );
        eprintln!("skipped: NVML {}: {}", status.state.as_str(), status.detail);
        return;
    }
    println!("status: {status:?}");
    let c = &mut collectors[0];
    let first = c.collect().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let second = c.collect().unwrap();
    println!("{second:#?}");

    assert!(!second.gpus.is_empty());
    assert_eq!(first.gpus.len(), second.gpus.len());
    for (a, g) in first.gpus.iter().zip(&second.gpus) {
        assert_eq!(a.uuid, g.uuid);
        assert!(
            g.uuid.starts_with("GPU-") || g.uuid.starts_with("MIG-"),
            "{g:?}"
        );
        assert!(!g.name.is_empty() && !g.pci_bus_id.is_empty(), "{g:?}");
        assert!(!g.driver_version.is_empty(), "{g:?}");
        let total = g.memory_total_bytes.expect("every GPU reports its memory");
        assert!(total > 1 << 30, "{g:?}");
        assert!(g.memory_used_bytes.unwrap() <= total, "{g:?}");
        for r in [g.utilization_ratio, g.memory_utilization_ratio]
            .into_iter()
            .flatten()
        {
            assert!((0.0..=1.0).contains(&r), "{g:?}");
        }
        if let Some(t) = g.temperature_celsius {
            assert!((0..130).contains(&t), "{g:?}");
        }
        if let Some(w) = g.power_watts {
            assert!(w > 0.0 && w < 5000.0, "{g:?}");
        }
        if let (Some(e0), Some(e1)) = (a.energy_millijoules, g.energy_millijoules) {
            assert!(e1 >= e0, "energy went back: {e0} -> {e1}");
        }
        if let Some(hz) = g.sm_clock_hertz {
            assert!(hz >= 1_000_000, "{g:?}");
        }
        for link in &g.nvlinks {
            let before = a.nvlinks.iter().find(|l| l.link == link.link);
            if let (Some(b), Some(tx)) = (before.and_then(|b| b.tx_bytes), link.tx_bytes) {
                assert!(tx >= b, "nvlink {} tx went back", link.link);
            }
        }
    }
    // What /metrics would show for it, DCGM aliases included.
    let node = NodeSnapshot {
        devices: collect_all(&mut collectors, &statuses, "this-host"),
        ..Default::default()
    };
    let opts = PrometheusOptions {
        dcgm_aliases: true,
        ..Default::default()
    };
    let text = render(&node, &opts);
    println!("{text}");
    assert!(text.contains("ethand_gpu_memory_total_bytes{"), "{text}");
    assert!(
        text.contains("ethand_device_collector_up{collector=\"nvml\"} 1"),
        "{text}"
    );
    for p in &second.processes {
        assert!(p.pid > 0 && p.device.starts_with("gpu"), "{p:?}");
        if let Some(u) = p.utilization_ratio {
            assert!((0.0..=1.0).contains(&u), "{p:?}");
        }
    }
}
