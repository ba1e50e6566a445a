//! [`NvmlCollector`]: the library loaded for the daemon's lifetime, every GPU read at each
//! collection, and the XID events drained after them into an [`XidRing`].
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, GpmSample, Nvml};

use super::fields::unsupported;
use super::source::NvmlGpu;
use super::{Cadence, DEFAULT_LIBRARY, GpmState, GpuState, NAME, read_gpm, read_gpu};
use crate::devices::{
    CollectorState, DeviceCollector, DeviceError, DeviceSample, MAX_XID_EVENTS, XidEvent,
};

/// XID events drained per collection at most; the rest wait for the next one.
const MAX_EVENTS_PER_COLLECT: usize = 4096;

/// Reads every GPU through NVML. Holds the library (and NVML's initialisation) for its
/// lifetime, and an event set registered for critical XID errors on every GPU that supports
/// them, drained without blocking at each collection.
pub struct NvmlCollector {
    /// Borrows the `Nvml` below: declared first so it is dropped first (see `Drop`).
    events: Option<EventSet<'static>>,
    /// Per NVML index.
    states: Vec<GpuState>,
    /// Per NVML index. Its samples borrow the `Nvml` below: emptied in `Drop` before it.
    gpm: Vec<GpmState<GpmSample<'static>>>,
    driver_version: String,
    xid_events: XidRing,
    /// What this collector cannot do here (XID events), for the status.
    detail: String,
    cadence: Cadence,
    /// Boxed and leaked in `open`, freed in `Drop` after `events`.
    nvml: NonNull<Nvml>,
}

// SAFETY: `Nvml` is Send + Sync (nvml-wrapper asserts it) and `EventSet` is Send; the
// pointer is owned by this struct alone, and the collector is used by one thread at a time
// (`&mut self`).
unsafe impl Send for NvmlCollector {}

impl Drop for NvmlCollector {
    fn drop(&mut self) {
        self.events = None;
        self.gpm.clear();
        // SAFETY: from Box::leak in `open`; the event set and the GPM samples, the only
        // things left that borrowed it, are gone, and devices are never kept across calls.
        drop(unsafe { Box::from_raw(self.nvml.as_ptr()) });
    }
}

impl NvmlCollector {
    /// Loads NVML (`library`, default [`DEFAULT_LIBRARY`]) and registers for XID events.
    /// Err: the state to report (unavailable: no library, driver or GPU; failed: NVML would
    /// not initialise) and why.
    pub(crate) fn open(
        library: Option<&Path>,
        cadence: Cadence,
    ) -> Result<Self, (CollectorState, String)> {
        let path = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let shown = path.to_string_lossy();
        let nvml = Nvml::builder().lib_path(path).init().map_err(|e| match e {
            NvmlError::LibloadingError(e) => (
                CollectorState::Unavailable,
                format!("{shown} not found: no NVIDIA driver ({e})"),
            ),
            NvmlError::DriverNotLoaded => (
                CollectorState::Unavailable,
                format!("{shown} loaded but the NVIDIA kernel driver is not"),
            ),
            NvmlError::FailedToLoadSymbol(e) => (
                CollectorState::Failed,
                format!("{shown} is not a usable NVML library: {e}"),
            ),
            e => (
                CollectorState::Failed,
                format!("NVML initialisation failed: {e}"),
            ),
        })?;
        let count = nvml.device_count().map_err(|e| {
            (
                CollectorState::Failed,
                format!("NVML cannot count GPUs: {e}"),
            )
        })?;
        if count == 0 {
            return Err((
                CollectorState::Unavailable,
                "NVML reports no GPU".to_owned(),
            ));
        }
        let driver_version = nvml.sys_driver_version().unwrap_or_default();
        let mut me = Self {
            events: None,
            states: vec![GpuState::default(); count as usize],
            gpm: Vec::new(),
            driver_version,
            xid_events: XidRing::default(),
            detail: String::new(),
            cadence,
            nvml: NonNull::from(Box::leak(Box::new(nvml))),
        };
        me.register_xid_events(count);
        me.ask_gpm_support(count);
        Ok(me)
    }

    /// What the status should say about an available collector.
    pub(crate) fn detail(&self) -> String {
        self.detail.clone()
    }

    /// The library, for the lifetime of `self` (see `Drop`).
    fn nvml(&self) -> &'static Nvml {
        // SAFETY: the Nvml lives until `drop`, which first drops the only 'static borrower
        // (`events`); everything else borrows it for one call only.
        unsafe { self.nvml.as_ref() }
    }

    fn register_xid_events(&mut self, count: u32) {
        let nvml = self.nvml();
        let mut problems = Vec::new();
        let mut registered: Vec<u32> = Vec::new();
        let mut set = match nvml.create_event_set() {
            Ok(s) => Some(s),
            Err(e) => {
                self.detail = format!("XID events not available: {e}");
                return;
            }
        };
        for i in 0..count {
            let device = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!("gpu{i} ({e})"));
                    continue;
                }
            };
            match device.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(_) => {
                    problems.push(format!("gpu{i} (not supported)"));
                    continue;
                }
                Err(e) => {
                    problems.push(format!("gpu{i} ({e})"));
                    continue;
                }
            }
            let Some(s) = set.take() else { break };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
                Ok(s) => {
                    set = Some(s);
                    registered.push(i);
                }
                Err(e) => {
                    problems.push(format!("gpu{i} ({})", e.error));
                    // A failed registration consumes the set: start a new one with the GPUs
                    // registered so far.
                    set = nvml.create_event_set().ok();
                    registered.retain(|&j| {
                        let Some(s) = set.take() else { return false };
                        match nvml
                            .device_by_index(j)
                            .map_err(Into::into)
                            .and_then(|d| d.register_events(EventTypes::CRITICAL_XID_ERROR, s))
                        {
                            Ok(s) => {
                                set = Some(s);
                                true
                            }
                            Err(_) => {
                                set = nvml.create_event_set().ok();
                                false
                            }
                        }
                    });
                }
            }
        }
        for &i in &registered {
            self.states[i as usize].xid_errors = Some(0);
        }
        if !registered.is_empty() {
            self.events = set;
        }
        if !problems.is_empty() {
            self.detail = format!("XID events not supported on {}", problems.join(", "));
        }
    }

    /// Asks every GPU once whether it has GPM, and says in the status which do not.
    fn ask_gpm_support(&mut self, count: u32) {
        let nvml = self.nvml();
        self.gpm.resize_with(count as usize, GpmState::default);
        let mut without = Vec::new();
        for i in 0..count {
            let Ok(device) = nvml.device_by_index(i) else {
                continue;
            };
            let st = &mut self.gpm[i as usize];
            st.supported = match device.gpm_support() {
                Ok(s) => Some(s),
                Err(e) if unsupported(&e) => Some(false),
                // Asked again at the first collection, which notes the error.
                Err(_) => None,
            };
            if st.supported == Some(false) {
                without.push(format!("gpu{i}"));
            }
        }
        if !without.is_empty() {
            let gpm = format!(
                "GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth, graphics, FP \
                 pipes, PCIe rates: Hopper and newer) not supported on {}",
                without.join(", ")
            );
            self.detail = if self.detail.is_empty() {
                gpm
            } else {
                format!("{}; {gpm}", self.detail)
            };
        }
    }

    /// Counts the XID events that arrived since the last call, without waiting, and keeps each
    /// in the ring with the pids its GPU had at this collection and the one before (so call
    /// it after the GPUs were read). `uuids`: the UUIDs just read, by index.
    fn drain_xid_events(&mut self, uuids: &BTreeMap<u32, String>, notes: &mut Vec<String>) {
        let Some(set) = &self.events else { return };
        let mut drained = Vec::new();
        for _ in 0..MAX_EVENTS_PER_COLLECT {
            match set.wait(0) {
                Ok(ev) => {
                    if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let i = match ev.device.index() {
                        Ok(i) => i,
                        Err(e) => {
                            notes.push(format!("XID event from an unknown GPU: {e}"));
                            continue;
                        }
                    };
                    let code = match ev.event_data {
                        Some(XidError::Value(code)) => Some(code),
                        _ => None,
                    };
                    let uuid = uuids
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| ev.device.uuid().unwrap_or_default());
                    drained.push((i, uuid, code));
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    notes.push(format!("XID events: {e}"));
                    break;
                }
            }
        }
        let now = unix_ns_now();
        for (i, uuid, code) in drained {
            let i = i as usize;
            if i >= self.states.len() {
                self.states.resize(i + 1, GpuState::default());
            }
            self.xid_events
                .record(&mut self.states[i], i as u32, uuid, code, now);
        }
    }
}

/// The most recent XID events, oldest first (at most [`MAX_XID_EVENTS`]), numbered from 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct XidRing {
    events: VecDeque<XidEvent>,
    seq: u64,
}

impl XidRing {
    /// Counts one XID event of GPU `gpu` in its `state` and, when it has a code, keeps it
    /// with the pids of the GPU's last two collections, dropping the oldest when full.
    pub fn record(
        &mut self,
        state: &mut GpuState,
        gpu: u32,
        uuid: String,
        code: Option<u64>,
        drained_unix_ns: u64,
    ) {
        state.xid_errors = Some(state.xid_errors.unwrap_or(0) + 1);
        let Some(code) = code else { return };
        state.last_xid = Some(code);
        *state.xid_errors_by_code.entry(code).or_insert(0) += 1;
        self.seq += 1;
        if self.events.len() >= MAX_XID_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(XidEvent {
            seq: self.seq,
            gpu,
            uuid,
            xid: code,
            drained_unix_ns,
            pids: state.previous_pids.union(&state.pids).copied().collect(),
        });
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<XidEvent> {
        self.events.iter().cloned().collect()
    }
}

fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl DeviceCollector for NvmlCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn collect(&mut self) -> Result<DeviceSample, DeviceError> {
        let nvml = self.nvml();
        let count = nvml.device_count().map_err(|source| DeviceError::Nvml {
            call: "nvmlDeviceGetCount",
            source,
        })?;
        let mut sample = DeviceSample::default();
        if self.states.len() < count as usize {
            self.states.resize(count as usize, GpuState::default());
        }
        if self.gpm.len() < count as usize {
            self.gpm.resize_with(count as usize, GpmState::default);
        }
        for i in 0..count {
            let device = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    sample.notes.push(format!("gpu{i}: {e}"));
                    continue;
                }
            };
            let src = NvmlGpu { nvml, device };
            let state = &mut self.states[i as usize];
            match read_gpu(
                &src,
                &self.driver_version,
                state,
                Instant::now(),
                &self.cadence,
            ) {
                Ok(mut r) => {
                    let label = r.gpu.label();
                    read_gpm(&src, &mut self.gpm[i as usize], &label, &mut r.notes)
                        .apply(&mut r.gpu);
                    r.gpu.unsupported.sort();
                    r.gpu.unsupported.dedup();
                    sample.gpus.push(r.gpu);
                    sample.processes.extend(r.processes);
                    sample.notes.extend(r.notes);
                }
                Err(e) => sample.notes.push(format!("gpu{i}: {e}")),
            }
        }
        // After the reads: an event's pids include this collection's processes.
        let uuids = sample
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect();
        self.drain_xid_events(&uuids, &mut sample.notes);
        for g in &mut sample.gpus {
            if let Some(st) = self.states.get(g.index as usize) {
                g.xid_errors = st.xid_errors;
                g.last_xid = st.last_xid;
                g.xid_errors_by_code = st.xid_errors_by_code.clone();
            }
        }
        sample.xid_events = self.xid_events.events();
        Ok(sample)
    }
}
