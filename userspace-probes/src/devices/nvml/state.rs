//! What the reads keep about one GPU between collections ([`GpuState`], with the last
//! expensive reads, [`Counters`]) and how often they make the expensive ones ([`Cadence`]).
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::devices::NvLinkStats;

/// What [`read_gpu`](super::read_gpu) keeps about one GPU between collections.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuState {
    /// Timestamp (µs, the driver's clock) of the newest process-utilization sample read so
    /// far: the next call asks only for newer ones.
    pub process_util_since: Option<u64>,
    /// SM share (0-1) per pid in the newest batch of samples, and when it was read.
    pub process_util: BTreeMap<u32, f64>,
    pub process_util_read_at: Option<Instant>,
    /// Critical XID events counted so far; None when the GPU does not deliver them to ethand.
    pub xid_errors: Option<u64>,
    /// Code of the most recent one.
    pub last_xid: Option<u64>,
    /// The same events by code (an event without a code is only in `xid_errors`).
    pub xid_errors_by_code: BTreeMap<u64, u64>,
    /// Pids with a compute context at this collection and at the one before: an XID drained
    /// now names both (a context the XID killed is only in the earlier list).
    pub pids: BTreeSet<u32>,
    pub previous_pids: BTreeSet<u32>,
    /// Per-link NVLink payload counters (transmit, receive; bytes) at the last counters read,
    /// and when: the start of the next rate interval.
    pub nvlink_totals: BTreeMap<u32, (Option<u64>, Option<u64>)>,
    pub nvlink_totals_at: Option<Instant>,
    /// The expensive reads (see [`Cadence`]), as last made, and when.
    pub counters: Option<Counters>,
    pub counters_read_at: Option<Instant>,
    /// Per-link NVLink error counters (replay, recovery, CRC FLIT, CRC data), and when.
    pub nvlink_errors: BTreeMap<u32, [Option<u64>; 4]>,
    pub nvlink_errors_read_at: Option<Instant>,
}

/// The values of the expensive reads, kept between the collections that make them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub energy_millijoules: Option<u64>,
    pub pcie_tx_bytes_per_second: Option<u64>,
    pub pcie_rx_bytes_per_second: Option<u64>,
    /// Active links with their traffic (errors filled in from `GpuState::nvlink_errors`).
    pub nvlinks: Vec<NvLinkStats>,
    /// SM share per pid; None when the driver would not say.
    pub sm_share: Option<BTreeMap<u32, f64>>,
    /// NVLink payload rate, all links, both directions, since the previous counters read.
    pub nvlink_bytes_per_second: Option<f64>,
    /// Fields among these that the GPU does not have, by
    /// [`GpuDevice`](crate::devices::GpuDevice) field name.
    pub unsupported: BTreeSet<&'static str>,
}

/// How often the expensive NVML reads are made. Measured on an H200 (driver 580, in a VM):
/// the whole collection took ~94 ms of CPU per GPU, almost all of it in these: the 72
/// per-link NVLink error counters ~69 ms, the per-link NVLink traffic ~17 ms, energy ~4 ms,
/// per-process utilization ~2.5 ms, PCIe throughput ~1.6 ms of CPU and ~42 ms of wall time.
/// The cheap gauges (utilization, memory, power, clocks, temperature, ECC, throttling,
/// processes: ~30 µs in all) are read every collection. Counters read less often lose no
/// totals, only resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// Energy, PCIe throughput, NVLink traffic, per-process SM utilization.
    pub counters: Duration,
    /// NVLink error counters (read at the first collection of `counters` after this long).
    pub nvlink_errors: Duration,
}

impl Cadence {
    /// Everything at every collection.
    pub const EVERY_TIME: Self = Self {
        counters: Duration::ZERO,
        nvlink_errors: Duration::ZERO,
    };
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            counters: Duration::from_secs(10),
            nvlink_errors: Duration::from_secs(60),
        }
    }
}
