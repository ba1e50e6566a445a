//! The device collectors (NVML, DCMI) on their own thread: driver calls block for
//! milliseconds per device, so they never run on the async runtime or in the collection
//! loop. The loop takes the latest reading and joins it to processes by pid.
use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use ethand_exporters::{
    devices::{CollectorState, DevicesSnapshot},
    gpu::ProcessDeviceUsage,
    snapshot::{ProbeState, ProbeStatus, ProcessSnapshot},
};
use ethand_userspace_probes::devices::{self as dev, DevicesConfig};
use tracing::{info, warn};

use crate::config::Config;

pub struct DeviceSampler {
    latest: Arc<RwLock<Arc<DevicesSnapshot>>>,
}

impl DeviceSampler {
    /// Opens the collectors and starts polling them every `devices.interval_ms`.
    pub fn start(cfg: &Config, hostname: String) -> Self {
        let d = &cfg.devices;
        let dc = DevicesConfig {
            nvml: d.nvml,
            dcmi: d.dcmi,
            nvml_library: (!d.nvml_library.is_empty()).then(|| PathBuf::from(&d.nvml_library)),
            dcmi_library: (!d.dcmi_library.is_empty()).then(|| PathBuf::from(&d.dcmi_library)),
            nvml_cadence: dev::nvml::Cadence {
                counters: Duration::from_millis(d.counters_interval_ms),
                nvlink_errors: Duration::from_millis(d.nvlink_errors_interval_ms),
            },
        };
        let interval = Duration::from_millis(d.interval_ms);
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

/// Adds to each process what the drivers report for it (memory, utilization per device).
pub fn join(processes: &mut [ProcessSnapshot], d: &DevicesSnapshot) {
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
