//! NVML GPM (SM activity, SM occupancy, tensor activity, DRAM bandwidth) on the GPUs of this
//! machine, through the public API the daemon uses. Where NVML is unavailable the test says
//! why and passes; `ETHAND_REQUIRE_GPM=1` asks for at least one GPU with GPM (Hopper and
//! newer), and `ETHAND_EXPECT_GPM_BUSY=1` for SM and tensor activity on every such GPU (run a
//! matrix-product loop beside it). What it read is printed (`--nocapture`).
use std::time::{Duration, Instant};

use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::NodeSnapshot;
use ethand_userspace_probes::devices::{
    CollectorState, DevicesConfig, GpuDevice, collect_all, open_collectors,
};

fn ratios(g: &GpuDevice) -> [Option<f64>; 4] {
    [
        g.sm_activity_ratio,
        g.sm_occupancy_ratio,
        g.tensor_activity_ratio,
        g.dram_bandwidth_ratio,
    ]
}

#[test]
fn gpm_over_each_device_interval() {
    let cfg = DevicesConfig {
        dcmi: false,
        ..Default::default()
    };
    let (mut collectors, statuses) = open_collectors(&cfg);
    let status = &statuses[0];
    if status.state != CollectorState::Available {
        assert!(
            std::env::var_os("ETHAND_REQUIRE_GPM").is_none(),
            "GPM required but NVML is {status:?}"
        );
        eprintln!("skipped: NVML {}: {}", status.state.as_str(), status.detail);
        return;
    }
    println!("status: {status:?}");

    // The first collection starts the first interval: no values yet.
    let t = Instant::now();
    let first = collect_all(&mut collectors, &statuses, "this-host");
    println!("first collection: {:?}", t.elapsed());
    for g in &first.gpus {
        assert!(g.gpm_supported.is_some(), "GPM support not asked: {g:?}");
        assert_eq!(ratios(g), [None; 4], "first interval: {g:?}");
    }
    let with_gpm: Vec<u32> = first
        .gpus
        .iter()
        .filter(|g| g.gpm_supported == Some(true))
        .map(|g| g.index)
        .collect();
    if std::env::var_os("ETHAND_REQUIRE_GPM").is_some() {
        assert!(!with_gpm.is_empty(), "no GPU with GPM: {:?}", first.gpus);
    }

    // Each later collection: the interval since the previous one (the daemon's
    // devices.interval_ms, 1 s by default).
    let busy = std::env::var_os("ETHAND_EXPECT_GPM_BUSY").is_some();
    for round in 1..=3 {
        std::thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        let snap = collect_all(&mut collectors, &statuses, "this-host");
        println!("collection {round}: {:?}", t.elapsed());
        println!("status: {:?}", snap.collectors[0]);
        for g in &snap.gpus {
            println!(
                "gpu{} {} gpm_supported={:?} sm_activity={:?} sm_occupancy={:?} \
                 tensor_activity={:?} dram_bandwidth={:?} (utilization {:?})",
                g.index,
                g.name,
                g.gpm_supported,
                g.sm_activity_ratio,
                g.sm_occupancy_ratio,
                g.tensor_activity_ratio,
                g.dram_bandwidth_ratio,
                g.utilization_ratio
            );
            if !with_gpm.contains(&g.index) {
                assert_eq!(ratios(g), [None; 4], "no GPM, yet values: {g:?}");
                continue;
            }
            for r in ratios(g) {
                let r = r.unwrap_or_else(|| panic!("GPU with GPM, no value: {g:?}"));
                assert!((0.0..=1.0).contains(&r), "{g:?}");
            }
            if busy {
                assert!(g.sm_activity_ratio.unwrap() > 0.5, "{g:?}");
                assert!(g.tensor_activity_ratio.unwrap() > 0.05, "{g:?}");
            }
        }
        if round == 3 {
            let node = NodeSnapshot {
                devices: snap,
                ..Default::default()
            };
            let opts = PrometheusOptions {
                dcgm_aliases: true,
                ..Default::default()
            };
            let text = render(&node, &opts);
            for l in text
                .lines()
                .filter(|l| l.contains("_sm_") || l.contains("_tensor_") || l.contains("_dram_"))
            {
                println!("{l}");
            }
        }
    }
}
