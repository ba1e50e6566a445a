//! The expensive reads (energy, PCIe throughput, NVLink traffic and errors, per-process SM
//! utilization), made at the [`Cadence`](super::Cadence).
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;

use super::fields::{Fields, kib, percent};
use super::{Counters, GpuSource, GpuState, MAX_NVLINKS};
use crate::devices::NvLinkStats;

/// NVML samples per-process utilization every 1/6 s to 1 s. A collection that finds no new
/// sample within this long of the last batch reuses that batch (the driver has not sampled
/// yet); after it, no new sample means every process was idle.
const PROCESS_UTIL_FRESH: Duration = Duration::from_secs(2);

/// The expensive reads (see [`Cadence`]); the NVLink error counters only when `errors_due`.
pub(super) fn read_counters(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    state: &mut GpuState,
    errors_due: bool,
    now: Instant,
) -> Counters {
    use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    };
    let mut nvlinks = Vec::new();
    for link in 0..MAX_NVLINKS {
        // InvalidArg: no such link on this GPU.
        match src.nvlink_active(link) {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::InvalidArg) => continue,
            Err(e) => {
                f.field::<()>(
                    &["nvlinks", "nvlink_bytes_per_second"],
                    &format!("nvlink {link} state"),
                    Err(e),
                );
                continue;
            }
        }
        let what = format!("nvlink {link}");
        let data = src.field_values(&[
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
        ]);
        let (tx, rx) = match data {
            Ok(v) => {
                let mut v = v.into_iter();
                let mut next = || {
                    let r = v.next().unwrap_or(Err(NvmlError::UnexpectedVariant(0)));
                    f.get(&what, r)
                };
                (next(), next())
            }
            Err(e) => (f.get(&what, Err(e)), None),
        };
        if errors_due {
            let mut errors = |c| f.get(&what, src.nvlink_error_counter(link, c));
            let read = [
                errors(ErrorCounter::DlReplay),
                errors(ErrorCounter::DlRecovery),
                errors(ErrorCounter::DlCrcFlit),
                errors(ErrorCounter::DlCrcData),
            ];
            state.nvlink_errors.insert(link, read);
        }
        nvlinks.push(NvLinkStats {
            link,
            tx_bytes: tx.map(kib),
            rx_bytes: rx.map(kib),
            ..Default::default()
        });
    }
    if errors_due {
        state
            .nvlink_errors
            .retain(|l, _| nvlinks.iter().any(|n| n.link == *l));
    }
    let nvlink_bytes_per_second = nvlink_rate(state, &nvlinks, now);

    // Per process: SM share from the newest utilization sample of each pid in the newest
    // batch (the samples since the previous read). NVML lists only processes with non-zero
    // utilization (NOT_FOUND: none at all), so a listed process missing from the batch used
    // no SM time: 0.
    let batch = match src.process_utilization(state.process_util_since) {
        Ok(samples) => Some(samples),
        Err(NvmlError::NotFound) => Some(Vec::new()),
        Err(e) => f.get("process utilization", Err(e)),
    };
    let sm_share = batch.map(|samples| {
        if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
            let mut latest: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
            for s in &samples {
                let e = latest.entry(s.pid).or_insert((0, 0.0));
                if s.timestamp >= e.0 {
                    *e = (s.timestamp, percent(s.sm_util));
                }
            }
            state.process_util = latest.into_iter().map(|(pid, (_, r))| (pid, r)).collect();
            state.process_util_since = Some(newest);
            state.process_util_read_at = Some(now);
        } else if !state
            .process_util_read_at
            .is_some_and(|t| now.saturating_duration_since(t) < PROCESS_UTIL_FRESH)
        {
            state.process_util.clear();
        }
        state.process_util.clone()
    });
    Counters {
        energy_millijoules: f.field(
            &["energy_millijoules"],
            "energy",
            src.total_energy_consumption(),
        ),
        pcie_tx_bytes_per_second: f
            .field(
                &["pcie_tx_bytes_per_second"],
                "pcie tx",
                src.pcie_throughput(PcieUtilCounter::Send),
            )
            .map(kib),
        pcie_rx_bytes_per_second: f
            .field(
                &["pcie_rx_bytes_per_second"],
                "pcie rx",
                src.pcie_throughput(PcieUtilCounter::Receive),
            )
            .map(kib),
        nvlinks,
        sm_share,
        nvlink_bytes_per_second,
        unsupported: BTreeSet::new(),
    }
}

/// NVLink payload rate over all active links, both directions, between the previous counters
/// read and this one (`nvlinks`, which become the start of the next interval). None at the
/// first read, without links or counters in common, and when a counter went backwards (the
/// driver was reloaded: the totals restarted).
fn nvlink_rate(state: &mut GpuState, nvlinks: &[NvLinkStats], now: Instant) -> Option<f64> {
    let totals: BTreeMap<u32, (Option<u64>, Option<u64>)> = nvlinks
        .iter()
        .map(|l| (l.link, (l.tx_bytes, l.rx_bytes)))
        .collect();
    let previous = std::mem::replace(&mut state.nvlink_totals, totals);
    let since = state.nvlink_totals_at.replace(now)?;
    let seconds = now.saturating_duration_since(since).as_secs_f64();
    if seconds <= 0.0 {
        return None;
    }
    let mut bytes = 0u64;
    let mut any = false;
    for (link, (tx, rx)) in &state.nvlink_totals {
        let Some((tx0, rx0)) = previous.get(link) else {
            continue;
        };
        for (new, old) in [(tx, tx0), (rx, rx0)] {
            if let (Some(new), Some(old)) = (new, old) {
                bytes = bytes.saturating_add(new.checked_sub(*old)?);
                any = true;
            }
        }
    }
    any.then(|| bytes as f64 / seconds)
}
