//! The device collectors (NVML, DCMI) on their own thread: driver calls block for
//! milliseconds per device, so they never run on the async runtime or in the collection
//! loop. The loop takes the latest reading and joins it to processes by pid.
use std::sync::{Arc, RwLock};

use ethand_snapshot::{
    ProbeState, ProbeStatus, ProcessSnapshot,
    devices::{CollectorState, DevicesSnapshot},
    gpu::ProcessDeviceUsage,
};
use ethand_userspace_probes::devices as dev;
use tracing::{info, warn};

use crate::config::DevicesPlan;
use crate::pipeline::xid::XidLedger;

pub struct DeviceSampler {
    latest: Arc<RwLock<Arc<DevicesSnapshot>>>,
}

impl DeviceSampler {
    /// Opens the collectors and starts polling them every `devices.interval_ms`.
    pub fn start(plan: &DevicesPlan, hostname: String) -> Self {
        let dc = plan.collectors.clone();
        let interval = plan.interval;
        let latest = Arc::new(RwLock::new(Arc::new(DevicesSnapshot::default())));
        let out = latest.clone();
        let spawned = std::thread::Builder::new()
            .name("ethand-devices".into())
            .spawn(move || {
                let (mut collectors, statuses) = dev::open_collectors(&dc);
                for s in &statuses {
                    match s.state {
                        CollectorState::Available => info!(collector = %s.name, detail = %s.detail, "device collector available"),
                        _ => info!(collector = %s.name, state = s.state.as_str(), detail = %s.detail, "device collector not used"),
                    }
                }
                loop {
                    let snap = dev::collect_all(&mut collectors, &statuses, &hostname);
                    *out.write().expect("lock") = Arc::new(snap);
                    if collectors.is_empty() {
                        // Nothing to poll: the statuses above stay as they are.
                        return;
                    }
                    std::thread::sleep(interval);
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the device collector thread");
        }
        Self { latest }
    }

    pub fn latest(&self) -> Arc<DevicesSnapshot> {
        self.latest.read().expect("lock").clone()
    }
}

/// Collector states as probe lines for `ethand status` and `ethand_probe_state`.
pub fn probe_status(d: &DevicesSnapshot) -> Vec<ProbeStatus> {
    d.collectors
        .iter()
        .map(|c| ProbeStatus {
            name: format!("collector_{}", c.name),
            attach_point: match c.name.as_str() {
                "nvml" => "libnvidia-ml".into(),
                "dcmi" => "libdcmi".into(),
                other => other.into(),
            },
            state: match c.state {
                CollectorState::Available => ProbeState::Attached,
                CollectorState::Unavailable => ProbeState::Unsupported,
                CollectorState::Failed => ProbeState::Failed,
            },
            detail: c.detail.clone(),
        })
        .collect()
}

/// Adds to each process what the drivers report for it (memory, utilization per device) and
/// the XIDs of the GPUs it held a context on.
pub fn join(processes: &mut [ProcessSnapshot], d: &DevicesSnapshot, xids: &XidLedger) {
    for p in processes.iter_mut() {
        p.gpu_xid_events = xids.of(p);
    }
    if d.processes.is_empty() {
        return;
    }
    for p in processes.iter_mut() {
        p.devices = d
            .processes
            .iter()
            .filter(|dp| dp.pid == p.pid)
            .map(|dp| ProcessDeviceUsage {
                device: dp.device.clone(),
                uuid: dp.uuid.clone(),
                memory_used_bytes: dp.memory_used_bytes.unwrap_or(0),
                utilization_ratio: dp.utilization_ratio,
                device_utilization_ratio: d
                    .gpus
                    .iter()
                    .find(|g| g.label() == dp.device)
                    .and_then(|g| g.utilization_ratio)
                    .or_else(|| {
                        d.npus
                            .iter()
                            .find(|n| n.label() == dp.device)
                            .and_then(|n| n.aicore_utilization_ratio)
                    }),
            })
            .collect();
    }
}

/// One device's readings of one collection round.
#[derive(Clone, Debug, Default)]
struct Reading {
    label: String,
    utilization_ratio: Option<f64>,
    sm_activity_ratio: Option<f64>,
    sm_occupancy_ratio: Option<f64>,
    tensor_activity_ratio: Option<f64>,
    dram_bandwidth_ratio: Option<f64>,
    fp32_activity_ratio: Option<f64>,
    fp64_activity_ratio: Option<f64>,
}

/// Window means of the devices' readings (each over the rounds that had it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceMeans {
    pub utilization_ratio: Option<f64>,
    pub sm_activity_ratio: Option<f64>,
    pub sm_occupancy_ratio: Option<f64>,
    pub tensor_activity_ratio: Option<f64>,
    pub dram_bandwidth_ratio: Option<f64>,
    pub fp32_activity_ratio: Option<f64>,
    pub fp64_activity_ratio: Option<f64>,
}

/// The devices' readings per collection round, newest last, at most `cap` rounds: the
/// diagnosis averages a window of them instead of trusting the one reading of the moment.
pub struct DeviceHistory {
    cap: usize,
    rounds: std::collections::VecDeque<(u64, Vec<Reading>)>,
    /// The XID events of every round, per process.
    pub xids: crate::pipeline::xid::XidLedger,
}

impl DeviceHistory {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            rounds: Default::default(),
            xids: Default::default(),
        }
    }

    pub fn push(&mut self, t_ms: u64, d: &DevicesSnapshot) {
        self.xids.observe(d);
        let gpus = d.gpus.iter().map(|g| Reading {
            label: g.label(),
            utilization_ratio: g.utilization_ratio,
            sm_activity_ratio: g.sm_activity_ratio,
            sm_occupancy_ratio: g.sm_occupancy_ratio,
            tensor_activity_ratio: g.tensor_activity_ratio,
            dram_bandwidth_ratio: g.dram_bandwidth_ratio,
            fp32_activity_ratio: g.fp32_activity_ratio,
            fp64_activity_ratio: g.fp64_activity_ratio,
        });
        let npus = d.npus.iter().map(|n| Reading {
            label: n.label(),
            utilization_ratio: n.aicore_utilization_ratio,
            ..Default::default()
        });
        let all: Vec<Reading> = gpus.chain(npus).collect();
        if all.is_empty() {
            return;
        }
        if self.rounds.len() == self.cap {
            self.rounds.pop_front();
        }
        self.rounds.push_back((t_ms, all));
    }

    /// Means since `since_ms` over the devices named in `used` (all when empty).
    pub fn means(&self, used: &[String], since_ms: u64) -> DeviceMeans {
        let readings: Vec<&Reading> = self
            .rounds
            .iter()
            .filter(|(t, _)| *t >= since_ms)
            .flat_map(|(_, r)| r.iter())
            .filter(|r| used.is_empty() || used.contains(&r.label))
            .collect();
        let mean = |f: fn(&Reading) -> Option<f64>| {
            let v: Vec<f64> = readings.iter().filter_map(|r| f(r)).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        DeviceMeans {
            utilization_ratio: mean(|r| r.utilization_ratio),
            sm_activity_ratio: mean(|r| r.sm_activity_ratio),
            sm_occupancy_ratio: mean(|r| r.sm_occupancy_ratio),
            tensor_activity_ratio: mean(|r| r.tensor_activity_ratio),
            dram_bandwidth_ratio: mean(|r| r.dram_bandwidth_ratio),
            fp32_activity_ratio: mean(|r| r.fp32_activity_ratio),
            fp64_activity_ratio: mean(|r| r.fp64_activity_ratio),
        }
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;
    use ethand_snapshot::devices::GpuDevice;

    fn gpu(index: u32, util: f64, sm: Option<f64>) -> GpuDevice {
        GpuDevice {
            index,
            utilization_ratio: Some(util),
            sm_activity_ratio: sm,
            ..Default::default()
        }
    }

    #[test]
    fn window_means_cover_the_window_and_the_tree_gpus_only() {
        let mut h = DeviceHistory::new(3);
        for (t, u) in [(1000, 0.9), (2000, 0.1), (3000, 0.3), (4000, 0.5)] {
            h.push(
                t,
                &DevicesSnapshot {
                    gpus: vec![gpu(0, u, Some(u / 2.0)), gpu(1, 1.0, None)],
                    ..Default::default()
                },
            );
        }
        // The first round fell out of the ring (cap 3); the window starts at 3000.
        let m = h.means(&["gpu0".into()], 3000);
        assert!((m.utilization_ratio.unwrap() - 0.4).abs() < 1e-9);
        assert!((m.sm_activity_ratio.unwrap() - 0.2).abs() < 1e-9);
        // A GPU without GPM: the ratio is unknown, not 0.
        let m = h.means(&["gpu1".into()], 0);
        assert_eq!(m.sm_activity_ratio, None);
        assert!((m.utilization_ratio.unwrap() - 1.0).abs() < 1e-9);
        // No reading in the window: nothing known.
        assert_eq!(h.means(&[], 10_000), DeviceMeans::default());
    }
}
