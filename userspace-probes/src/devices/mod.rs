//! Device collectors: what the vendor management libraries say about the node's accelerators.
//! NVIDIA GPUs through NVML ([`nvml`], via `nvml-wrapper`) and Huawei Ascend NPUs through
//! DCMI ([`dcmi`], via `libloading`). Both libraries are loaded at run time, so ethand builds
//! and runs on machines without either driver; there the collector is reported unavailable,
//! which is not an error.
//!
//! **Invariant:** this module is the only code in ethand that calls a device management
//! library. The exporters read its output, [`DevicesSnapshot`], from the node snapshot.
//!
//! # Use (the daemon)
//! ```no_run
//! use ethand_userspace_probes::devices::{DevicesConfig, collect_all, open_collectors};
//!
//! // Once at start-up: load what is there and say what is not.
//! let (mut collectors, statuses) = open_collectors(&DevicesConfig::default());
//! // Every interval, off the async runtime (NVML and DCMI calls block for milliseconds),
//! // e.g. inside `tokio::task::spawn_blocking` or on a dedicated thread:
//! let devices = collect_all(&mut collectors, &statuses, "node1");
//! // node_snapshot.devices = devices;
//! ```
//! `open_collectors` reports every collector ethand knows, enabled or not, available or not,
//! with a reason; `collect_all` runs the available ones, merges their samples and turns a
//! failed collection into `state: failed` with the error, so that `ethand status` and
//! `ethand_device_collector_up` tell the truth. A collector is `Send`: it may move to the
//! thread that collects, but is used by one thread at a time (`&mut self`).
use std::path::PathBuf;

pub mod dcmi;
pub mod nvml;

pub use ethand_snapshot::devices::{
    CollectorState, CollectorStatus, DeviceProcess, DevicesSnapshot, GpuDevice, MAX_XID_EVENTS,
    NpuDevice, NvLinkStats, XidEvent,
};

/// One reading of a collector's devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSample {
    pub gpus: Vec<GpuDevice>,
    pub npus: Vec<NpuDevice>,
    /// Processes holding device memory, one entry per (process, device).
    pub processes: Vec<DeviceProcess>,
    /// What could not be read this time for a reason other than "this device does not
    /// support it" (which is silent: the field is just `None`), e.g. "gpu1 power: no
    /// permission". [`collect_all`] puts them in the collector's status detail.
    pub notes: Vec<String>,
    /// The collector's most recent XID events, oldest first (see
    /// [`DevicesSnapshot::xid_events`]).
    pub xid_events: Vec<XidEvent>,
}

/// A collector's reading failed as a whole (no device could be listed).
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("NVML {call}: {source}")]
    Nvml {
        call: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("DCMI {call} returned {code} ({})", dcmi::code_name(*code))]
    Dcmi { call: &'static str, code: i32 },
}

/// A source of device readings (NVML, DCMI).
pub trait DeviceCollector: Send {
    /// "nvml" or "dcmi": the `collector` label and the name in [`CollectorStatus`].
    fn name(&self) -> &'static str;
    /// Reads every device now. Blocking (driver calls, milliseconds per device): call it off
    /// the async runtime. Fields a device does not support are `None`.
    fn collect(&mut self) -> Result<DeviceSample, DeviceError>;
}

/// Which collectors to try and where their libraries are. The daemon maps its TOML
/// (`[devices]`) to this.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicesConfig {
    /// Try NVML (NVIDIA GPUs). Default true.
    pub nvml: bool,
    /// Try DCMI (Huawei Ascend NPUs). Default true.
    pub dcmi: bool,
    /// NVML library to load instead of the system's `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// DCMI library to load instead of searching for `libdcmi.so` (see
    /// [`dcmi::DEFAULT_LIBRARIES`]).
    pub dcmi_library: Option<PathBuf>,
    /// How often NVML's expensive reads are made.
    pub nvml_cadence: nvml::Cadence,
}

impl Default for DevicesConfig {
    fn default() -> Self {
        Self {
            nvml: true,
            dcmi: true,
            nvml_library: None,
            dcmi_library: None,
            nvml_cadence: nvml::Cadence::default(),
        }
    }
}

/// Tries every enabled collector. Returns the ones that can read devices, and one status per
/// collector ethand knows (in the order nvml, dcmi): `available` (its detail says what it
/// cannot read, e.g. XID events), `unavailable` with the reason (no library, no driver, no
/// device, disabled in the config), or `failed` (the library is there but would not
/// initialise). Never fails: a node without accelerators simply gets no collectors.
pub fn open_collectors(
    cfg: &DevicesConfig,
) -> (Vec<Box<dyn DeviceCollector>>, Vec<CollectorStatus>) {
    let mut collectors: Vec<Box<dyn DeviceCollector>> = Vec::new();
    let mut statuses = Vec::new();

    if cfg.nvml {
        match nvml::NvmlCollector::open(cfg.nvml_library.as_deref(), cfg.nvml_cadence) {
            Ok(c) => {
                statuses.push(status(nvml::NAME, CollectorState::Available, c.detail()));
                collectors.push(Box::new(c));
            }
            Err((state, detail)) => statuses.push(status(nvml::NAME, state, detail)),
        }
    } else {
        statuses.push(disabled(nvml::NAME));
    }

    if cfg.dcmi {
        match dcmi::DcmiCollector::open(cfg.dcmi_library.as_deref()) {
            Ok(c) => {
                statuses.push(status(dcmi::NAME, CollectorState::Available, c.detail()));
                collectors.push(Box::new(c));
            }
            Err((state, detail)) => statuses.push(status(dcmi::NAME, state, detail)),
        }
    } else {
        statuses.push(disabled(dcmi::NAME));
    }

    (collectors, statuses)
}

/// Runs every collector once and merges what they read. `opened` is the status list from
/// [`open_collectors`]: collectors that were unavailable keep their status; an available one
/// becomes `failed` (with the error) when its collection fails, and `available` again when a
/// later one succeeds, with this collection's notes appended to its detail. `hostname` fills
/// [`DevicesSnapshot::hostname`] (the DCGM `Hostname` label).
pub fn collect_all(
    collectors: &mut [Box<dyn DeviceCollector>],
    opened: &[CollectorStatus],
    hostname: &str,
) -> DevicesSnapshot {
    let mut snap = DevicesSnapshot {
        hostname: hostname.to_owned(),
        collectors: opened.to_vec(),
        ..Default::default()
    };
    for c in collectors.iter_mut() {
        let result = c.collect();
        let st = match snap.collectors.iter_mut().find(|s| s.name == c.name()) {
            Some(st) => st,
            None => {
                snap.collectors
                    .push(status(c.name(), CollectorState::Available, String::new()));
                snap.collectors.last_mut().expect("just pushed")
            }
        };
        match result {
            Ok(sample) => {
                st.state = CollectorState::Available;
                let mut clauses = unsupported_clauses(&sample.gpus);
                clauses.extend(sample.notes);
                let notes = clauses.join("; ");
                if !notes.is_empty() {
                    st.detail = if st.detail.is_empty() {
                        notes
                    } else {
                        format!("{}; {notes}", st.detail)
                    };
                }
                snap.xid_events.extend(sample.xid_events);
                snap.gpus.extend(sample.gpus);
                snap.npus.extend(sample.npus);
                snap.processes.extend(sample.processes);
            }
            Err(e) => {
                st.state = CollectorState::Failed;
                st.detail = format!("collection failed: {e}");
            }
        }
    }
    snap
}

/// "gpu1 does not have: a, b" per GPU with unsupported fields; consecutive GPUs that lack
/// the same fields share one clause ("gpu0-7 do not have: ...").
fn unsupported_clauses(gpus: &[GpuDevice]) -> Vec<String> {
    let mut groups: Vec<(u32, u32, &[String])> = Vec::new();
    for g in gpus.iter().filter(|g| !g.unsupported.is_empty()) {
        match groups.last_mut() {
            Some((_, last, fields)) if *last + 1 == g.index && *fields == g.unsupported => {
                *last = g.index;
            }
            _ => groups.push((g.index, g.index, &g.unsupported)),
        }
    }
    groups
        .into_iter()
        .map(|(first, last, fields)| {
            let fields = fields.join(", ");
            if first == last {
                format!("gpu{first} does not have: {fields}")
            } else {
                format!("gpu{first}-{last} do not have: {fields}")
            }
        })
        .collect()
}

fn status(name: &str, state: CollectorState, detail: String) -> CollectorStatus {
    CollectorStatus {
        name: name.to_owned(),
        state,
        detail,
    }
}

fn disabled(name: &str) -> CollectorStatus {
    status(
        name,
        CollectorState::Unavailable,
        "disabled in the configuration".to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        name: &'static str,
        fail: bool,
    }

    impl DeviceCollector for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn collect(&mut self) -> Result<DeviceSample, DeviceError> {
            if self.fail {
                return Err(DeviceError::Dcmi {
                    call: "dcmi_get_card_num_list",
                    code: -8008,
                });
            }
            Ok(DeviceSample {
                gpus: vec![GpuDevice {
                    index: 0,
                    uuid: "GPU-0".into(),
                    unsupported: vec!["decoder_utilization_ratio".into()],
                    ..Default::default()
                }],
                notes: vec!["gpu0 power: no permission".into()],
                xid_events: vec![XidEvent {
                    seq: 1,
                    xid: 79,
                    ..Default::default()
                }],
                ..Default::default()
            })
        }
    }

    #[test]
    fn collect_all_merges_and_reports() {
        let opened = vec![
            status(
                nvml::NAME,
                CollectorState::Available,
                "XID events off".into(),
            ),
            status(dcmi::NAME, CollectorState::Available, String::new()),
        ];
        let mut collectors: Vec<Box<dyn DeviceCollector>> = vec![
            Box::new(Fake {
                name: nvml::NAME,
                fail: false,
            }),
            Box::new(Fake {
                name: dcmi::NAME,
                fail: true,
            }),
        ];
        let snap = collect_all(&mut collectors, &opened, "node1");
        assert_eq!(snap.hostname, "node1");
        assert_eq!(snap.gpus.len(), 1);
        assert_eq!(snap.collectors[0].state, CollectorState::Available);
        assert_eq!(
            snap.collectors[0].detail,
            "XID events off; gpu0 does not have: decoder_utilization_ratio; gpu0 power: no \
             permission"
        );
        assert_eq!(snap.xid_events.len(), 1);
        assert_eq!(snap.collectors[1].state, CollectorState::Failed);
        assert_eq!(
            snap.collectors[1].detail,
            "collection failed: DCMI dcmi_get_card_num_list returned -8008 (device does not \
             exist)"
        );
    }

    #[test]
    fn unsupported_fields_are_one_clause_per_gpu_or_run_of_alike_gpus() {
        let gpu = |index, fields: &[&str]| GpuDevice {
            index,
            unsupported: fields.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let gpus = [
            gpu(0, &["a", "b"]),
            gpu(1, &["a", "b"]),
            gpu(2, &["a", "b"]),
            gpu(3, &[]),
            gpu(4, &["c"]),
            gpu(5, &["a", "b"]),
        ];
        assert_eq!(
            unsupported_clauses(&gpus),
            [
                "gpu0-2 do not have: a, b",
                "gpu4 does not have: c",
                "gpu5 does not have: a, b"
            ]
        );
        assert!(unsupported_clauses(&[gpu(0, &[])]).is_empty());
    }

    #[test]
    fn disabled_collectors_are_reported_unavailable() {
        let cfg = DevicesConfig {
            nvml: false,
            dcmi: false,
            ..Default::default()
        };
        let (collectors, statuses) = open_collectors(&cfg);
        assert!(collectors.is_empty());
        assert_eq!(statuses.len(), 2);
        for s in &statuses {
            assert_eq!(s.state, CollectorState::Unavailable);
            assert_eq!(s.detail, "disabled in the configuration");
        }
    }

    #[test]
    fn missing_libraries_are_unavailable_not_errors() {
        let cfg = DevicesConfig {
            nvml_library: Some("/nonexistent/libnvidia-ml.so.1".into()),
            dcmi_library: Some("/nonexistent/libdcmi.so".into()),
            ..Default::default()
        };
        let (collectors, statuses) = open_collectors(&cfg);
        assert!(collectors.is_empty());
        let names: Vec<_> = statuses.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["nvml", "dcmi"]);
        for s in &statuses {
            assert_eq!(s.state, CollectorState::Unavailable, "{s:?}");
        }
        assert!(
            statuses[0]
                .detail
                .starts_with("/nonexistent/libnvidia-ml.so.1 not found: no NVIDIA driver"),
            "{}",
            statuses[0].detail
        );
        assert!(
            statuses[1]
                .detail
                .starts_with("/nonexistent/libdcmi.so not found: no Ascend driver"),
            "{}",
            statuses[1].detail
        );
    }

    #[test]
    fn default_open_never_fails() {
        // Whatever this machine has: each collector is reported once, with a reason when it
        // is not available.
        let (collectors, statuses) = open_collectors(&DevicesConfig::default());
        assert_eq!(statuses.len(), 2);
        assert!(collectors.len() <= 2);
        for s in &statuses {
            if s.state != CollectorState::Available {
                assert!(!s.detail.is_empty(), "{s:?}");
            }
        }
    }
}
