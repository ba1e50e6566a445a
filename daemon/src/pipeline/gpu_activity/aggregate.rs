//! One process's window: the library's events as they arrive from the ring buffer, summed
//! into the snapshot's kernel view. Everything here comes from the recorded process (its
//! library, or anything it maps at the probe functions' addresses): sizes are bounded and
//! nothing is trusted beyond being counted for that process.
use std::collections::HashMap;

use super::{
    idle::{self, KernelSpan},
    launches::{ClockMap, Joined, Launches},
};
use ethand_common::{
    CUPTI_BATCH, CUPTI_NAME_MAX, CUPTI_NONE, CuptiEventHeader, CuptiRec, CuptiWindowEvent,
    LaunchEvent, cupti_close_reason, cupti_event, cupti_rec_kind, cupti_window_state,
};
use ethand_snapshot::kernels::{
    ActivityState, CommOverlap, CopyKind, CopyStat, DeviceActivity, GpuActivityProcess,
    KernelClass, KernelClassStat, KernelStat, LaunchSites, MemoryKind, SyncKind, SyncStat,
    TOP_KERNELS, TimedCount,
};

/// Kernel names kept per window (the library gives at most 4,096 ids).
pub const MAX_NAMES: usize = 4096;

/// A kernel name as a probe handed it over: its bytes up to the first NUL, invalid UTF-8
/// replaced.
pub fn name_text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// What a window that ended REFUSED or FAILED means for its process.
pub fn ended(e: &CuptiWindowEvent) -> (ActivityState, String) {
    match e.state {
        cupti_window_state::REFUSED => (
            ActivityState::Refused,
            "another tool holds CUPTI (torch.profiler, Nsight, a debugger): ethand stepped aside"
                .into(),
        ),
        _ => (ActivityState::Failed, failure(e)),
    }
}

/// Why a CLOSED window closed, as the outputs name it.
pub fn closed_by(e: &CuptiWindowEvent) -> &'static str {
    match e.reason {
        cupti_close_reason::DEADLINE => "deadline",
        cupti_close_reason::ASKED => "asked",
        cupti_close_reason::MAX_RECORDS => "max_records",
        cupti_close_reason::ANOTHER_WINDOW => "another_window",
        _ => "unknown",
    }
}

/// What a window ended by another one asked of its process leaves out.
pub fn cut_short(window_ns: u64) -> String {
    format!(
        "another window was asked of the process (a second snapshot, or a snapshot during a recording; the library keeps one at a time) and ended this one after {:.1} s: the figures cover those seconds",
        window_ns as f64 / 1e9
    )
}

#[derive(Default)]
struct Kernel {
    count: u64,
    ns: u64,
    max_ns: u64,
}

#[derive(Default)]
struct Timeline {
    kernels: Vec<KernelSpan>,
    /// The name id of each of `kernels` (its class decides communication or computation).
    name_ids: Vec<u32>,
    /// Copies and memsets: (start, end).
    copies: Vec<(u64, u64)>,
}

#[derive(Default)]
pub struct Window {
    /// Records beyond this are counted, not summed (the window's share of the budget).
    pub max_records: u64,
    pub received: u64,
    pub ignored: u64,
    /// Entries the probes could not read whole.
    pub partial: u64,
    /// Kernels whose start CUPTI put before the window's open (their time counted from it).
    began_before_open: u64,
    names: HashMap<u32, String>,
    kernels: HashMap<u32, Kernel>,
    /// Per device: what ran when, for the union and the idle split.
    timelines: HashMap<u32, Timeline>,
    copies: HashMap<(u8, u8, u8), (u64, u64, u64)>,
    memsets: TimedCount,
    syncs: HashMap<u32, (u64, u64)>,
    opened: Option<CuptiWindowEvent>,
    closed: Option<CuptiWindowEvent>,
    /// REFUSED or FAILED.
    ended: Option<CuptiWindowEvent>,
    /// The launch calls, where they are traced (Err: why not; None: not asked).
    launches: Option<Result<Launches, String>>,
}

fn span(r: &CuptiRec) -> u64 {
    // CUPTI may leave 0 timestamps (no device memory for them): no time.
    if r.start == 0 || r.end < r.start {
        0
    } else {
        r.end - r.start
    }
}

impl Window {
    pub fn new(max_records: u64) -> Self {
        Self {
            max_records,
            ..Self::default()
        }
    }

    /// Launch calls are traced for this window (or, with Err, could not be: why).
    pub fn trace_launches(&mut self, traced: Result<(), String>) {
        self.launches = Some(traced.map(|()| Launches::new(self.max_records)));
    }

    pub fn launch(&mut self, e: &LaunchEvent) {
        if let Some(Ok(l)) = self.launches.as_mut() {
            l.add(e);
        }
    }

    /// The library said the window is over (closed, refused or failed): nothing more comes.
    pub fn done(&self) -> bool {
        self.closed.is_some() || self.ended.is_some()
    }

    pub fn records(&mut self, recs: &[CuptiRec]) {
        for r in recs {
            if self.received >= self.max_records {
                self.ignored += 1;
                continue;
            }
            self.received += 1;
            self.record(r);
        }
    }

    fn record(&mut self, r: &CuptiRec) {
        let ns = span(r);
        match r.kind {
            cupti_rec_kind::KERNEL => {
                // A kernel's time counts from the window's open, as busy time does: on the
                // H100 a second window of a CUDA-graph process (CUPTI kept attached) got a
                // graph replay's kernels with a start 465 ms before the window.
                let from = self.opened.map_or(0, |o| o.clock_cupti);
                let ns = if ns > 0 && r.start < from {
                    self.began_before_open += 1;
                    r.end.saturating_sub(from)
                } else {
                    ns
                };
                let k = self.kernels.entry(r.name_id).or_default();
                k.count += 1;
                k.ns += ns;
                k.max_ns = k.max_ns.max(ns);
                if ns > 0 {
                    let t = self.timelines.entry(r.device).or_default();
                    t.kernels.push(KernelSpan {
                        start: r.start,
                        end: r.end,
                        queued: r.queued,
                    });
                    t.name_ids.push(r.name_id);
                }
            }
            cupti_rec_kind::MEMCPY => {
                let c = self
                    .copies
                    .entry((r.copy_kind, r.src_kind, r.dst_kind))
                    .or_default();
                c.0 += 1;
                c.1 += r.bytes;
                c.2 += ns;
                self.copy_span(r, ns);
            }
            cupti_rec_kind::MEMSET => {
                self.memsets.count += 1;
                self.memsets.bytes += r.bytes;
                self.memsets.gpu_ns += ns;
                self.copy_span(r, ns);
            }
            cupti_rec_kind::SYNC => {
                let s = self.syncs.entry(r.sync_type).or_default();
                s.0 += 1;
                s.1 += ns;
            }
            _ => self.ignored += 1,
        }
    }

    fn copy_span(&mut self, r: &CuptiRec, ns: u64) {
        if ns > 0 {
            let t = self.timelines.entry(r.device).or_default();
            t.copies.push((r.start, r.end));
        }
    }

    pub fn name(&mut self, id: u32, bytes: &[u8]) {
        if (id as usize) >= MAX_NAMES
            || (self.names.len() >= MAX_NAMES && !self.names.contains_key(&id))
        {
            return;
        }
        self.names.insert(id, name_text(bytes));
    }

    pub fn event(&mut self, e: CuptiWindowEvent) {
        match e.state {
            cupti_window_state::OPENED => self.opened = Some(e),
            cupti_window_state::CLOSED => self.closed = Some(e),
            cupti_window_state::REFUSED | cupti_window_state::FAILED => self.ended = Some(e),
            _ => {}
        }
    }

    /// The process's part of the snapshot, and its kernels joined to their launch calls
    /// (where those were traced and the window was recorded).
    pub fn finish(mut self, pid: u32) -> (GpuActivityProcess, Option<Joined>) {
        let launches = self.launches.take();
        let mut joined = None;
        let mut unavailable = None;
        let mut p = self.summarize(pid, |kernels, clock, names| match launches {
            None => None,
            Some(Err(why)) => {
                unavailable = Some(why);
                None
            }
            Some(Ok(l)) => {
                let mut j = l.join(kernels, clock);
                for s in j.sites.iter_mut() {
                    s.top = site_kernels(std::mem::take(&mut s.by_name), names);
                }
                let counts = j.counts.clone();
                joined = Some(j);
                Some(counts)
            }
        });
        if p.state == ActivityState::Recorded {
            p.launch_sites_unavailable = unavailable;
        } else {
            p.launch_sites = None;
        }
        (p, joined)
    }

    /// `join`: the launch sites' counts of the window's kernels (each with its name id),
    /// called once the window is known to be recorded.
    fn summarize(
        self,
        pid: u32,
        join: impl FnOnce(&[(KernelSpan, u32)], ClockMap, &HashMap<u32, String>) -> Option<LaunchSites>,
    ) -> GpuActivityProcess {
        let mut p = GpuActivityProcess {
            pid,
            state: ActivityState::NoAnswer,
            cupti_version: [self.opened, self.closed, self.ended]
                .iter()
                .flatten()
                .map(|e| e.cupti_version)
                .find(|v| *v != 0),
            records: self.received,
            ..Default::default()
        };
        if let Some(e) = self.ended {
            let (state, detail) = ended(&e);
            (p.state, p.detail) = (state, Some(detail));
            return p;
        }
        let (Some(open), Some(close)) = (self.opened, self.closed) else {
            if self.opened.is_some() {
                p.detail = Some("the window opened but its end never arrived".into());
            }
            return p;
        };
        p.state = ActivityState::Recorded;
        let window_ns = close.clock_mono.saturating_sub(open.clock_mono);
        p.window_ns = Some(window_ns);
        p.records_dropped_by_cupti = close.dropped;
        p.records_lost_by_ethand =
            close.records.saturating_sub(self.received + self.ignored) + self.partial;
        let mut notes = Vec::new();
        if self.ignored > 0 {
            notes.push(format!(
                "{} records over the window's budget of {} were counted, not summed",
                self.ignored, self.max_records
            ));
        }
        if close.reason == cupti_close_reason::ANOTHER_WINDOW {
            notes.push(cut_short(window_ns));
        }
        if self.began_before_open > 0 {
            notes.push(format!(
                "{} kernels began before the window opened, as CUPTI timed them: their time counts from its open",
                self.began_before_open
            ));
        }
        if !notes.is_empty() {
            p.detail = Some(notes.join("; "));
        }
        // The window on CUPTI's clock: busy and idle are counted within it.
        let window_c = (open.clock_cupti, close.clock_cupti.max(open.clock_cupti));
        let class_of = |id: u32| {
            (id != CUPTI_NONE)
                .then(|| self.names.get(&id))
                .flatten()
                .map_or(KernelClass::Other, |n| KernelClass::of(n))
        };
        let kernels: Vec<(KernelSpan, u32)> = self
            .timelines
            .values()
            .flat_map(|t| t.kernels.iter().copied().zip(t.name_ids.iter().copied()))
            .collect();
        p.launch_sites = join(&kernels, ClockMap::new(&open, &close), &self.names);
        drop(kernels);
        p.devices = self
            .timelines
            .into_iter()
            .filter(|(_, t)| !t.kernels.is_empty())
            .map(|(device, t)| device_activity(device, t, window_c, window_ns, &class_of))
            .collect();
        p.devices.sort_by_key(|d| d.device);
        (p.kernels, p.kernels_other, p.kernel_classes) = kernel_stats(self.kernels, &self.names);
        p.copies = self
            .copies
            .into_iter()
            .map(|((kind, src, dst), (count, bytes, ns))| CopyStat {
                kind: CopyKind::from_cupti(kind),
                src: MemoryKind::from_cupti(src),
                dst: MemoryKind::from_cupti(dst),
                count,
                bytes,
                gpu_ns: ns,
                bytes_per_s: (ns > 0).then(|| bytes as f64 * 1e9 / ns as f64),
            })
            .collect();
        p.copies
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.kind.cmp(&b.kind)));
        p.memsets = (self.memsets.count > 0).then_some(self.memsets);
        p.syncs = self
            .syncs
            .into_iter()
            .map(|(t, (count, ns))| SyncStat {
                kind: SyncKind::from_cupti(t),
                count,
                wait_ns: ns,
            })
            .collect();
        p.syncs.sort_by_key(|s| s.kind);
        p
    }
}

/// One device's busy time, idle split and collectives' overlap, within the window
/// `(open, close)` on CUPTI's clock.
fn device_activity(
    device: u32,
    mut t: Timeline,
    (open, close): (u64, u64),
    window_ns: u64,
    class_of: &impl Fn(u32) -> KernelClass,
) -> DeviceActivity {
    let clamp = |k: &KernelSpan| (k.start.clamp(open, close), k.end.clamp(open, close));
    let busy = union_ns(t.kernels.iter().map(clamp).collect());
    // Within the window, as the busy time.
    let kernel_ns = t
        .kernels
        .iter()
        .map(|k| {
            let (s, e) = clamp(k);
            e - s
        })
        .sum();
    let (mut comm, mut compute) = (Vec::new(), Vec::new());
    for (k, id) in t.kernels.iter().zip(&t.name_ids) {
        match class_of(*id) {
            KernelClass::Communication => comm.push(clamp(k)),
            _ => compute.push(clamp(k)),
        }
    }
    let communication = (!comm.is_empty()).then(|| CommOverlap {
        communication_ns: union_ns(comm.clone()),
        overlapped_ns: intersection_ns(comm, compute),
    });
    DeviceActivity {
        device,
        kernels: t.kernels.len() as u64,
        kernel_ns,
        busy_ns: busy,
        busy_fraction: (window_ns > 0).then(|| busy as f64 / window_ns as f64),
        idle: Some(idle::split(&mut t.kernels, t.copies, open, close)),
        communication,
    }
}

/// A kernel of name id `id`: its name (None: lost) and its class; no counts.
fn named(id: u32, names: &HashMap<u32, String>) -> KernelStat {
    let name = (id != CUPTI_NONE)
        .then(|| names.get(&id).cloned())
        .flatten();
    KernelStat {
        class: name.as_deref().map_or(KernelClass::Other, KernelClass::of),
        name,
        ..Default::default()
    }
}

/// Kernels by name, most GPU time first (the top [`TOP_KERNELS`], the rest summed), and by
/// class (all of them).
fn kernel_stats(
    kernels: HashMap<u32, Kernel>,
    names: &HashMap<u32, String>,
) -> (Vec<KernelStat>, Option<KernelStat>, Vec<KernelClassStat>) {
    let mut stats: Vec<KernelStat> = kernels
        .into_iter()
        .map(|(id, k)| KernelStat {
            count: k.count,
            gpu_ns: k.ns,
            max_ns: k.max_ns,
            ..named(id, names)
        })
        .collect();
    let mut classes: HashMap<KernelClass, KernelClassStat> = HashMap::new();
    for k in &stats {
        let c = classes.entry(k.class).or_insert_with(|| KernelClassStat {
            class: k.class,
            ..Default::default()
        });
        c.count += k.count;
        c.gpu_ns += k.gpu_ns;
    }
    let mut classes: Vec<KernelClassStat> = classes.into_values().collect();
    classes.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.class.cmp(&b.class)));
    stats.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.name.cmp(&b.name)));
    let other = (stats.len() > TOP_KERNELS).then(|| {
        stats
            .split_off(TOP_KERNELS)
            .into_iter()
            .fold(KernelStat::default(), |mut o, k| {
                o.count += k.count;
                o.gpu_ns += k.gpu_ns;
                o.max_ns = o.max_ns.max(k.max_ns);
                o
            })
    });
    (stats, other, classes)
}

/// The kernels of one launch site by name, most GPU time first (all of them: sites with the
/// same frames are merged before the list is cut to [`KERNELS_PER_SITE`]).
fn site_kernels(
    by_name: HashMap<u32, (u64, u64)>,
    names: &HashMap<u32, String>,
) -> Vec<KernelStat> {
    let mut top: Vec<KernelStat> = by_name
        .into_iter()
        .map(|(id, (count, ns))| KernelStat {
            count,
            gpu_ns: ns,
            ..named(id, names)
        })
        .collect();
    top.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.name.cmp(&b.name)));
    top
}

/// One `LAUNCH_EVENTS` entry, to the window `window_of(tgid, window_id)` gives (none: the
/// entry is dropped).
pub fn apply_launch<'a>(bytes: &[u8], window_of: impl FnOnce(u32, u64) -> Option<&'a mut Window>) {
    let Some(e) = read::<LaunchEvent>(bytes, 0) else {
        return;
    };
    if let Some(w) = window_of(e.tgid, e.window_id) {
        w.launch(&e);
    }
}

/// What a `CUPTI_EVENTS` entry of one window is handed to: the snapshot's aggregate
/// ([`Window`]) or `ethand record`'s GPU tracks.
pub trait CuptiSink {
    /// The probe could not read all it was given (the entry holds what it read).
    fn partial(&mut self);
    fn records(&mut self, recs: &[CuptiRec]);
    /// A kernel name's bytes (NUL-terminated within), for its id.
    fn name(&mut self, id: u32, bytes: &[u8]);
    fn event(&mut self, e: CuptiWindowEvent);
}

impl CuptiSink for Window {
    fn partial(&mut self) {
        self.partial += 1;
    }
    fn records(&mut self, recs: &[CuptiRec]) {
        Window::records(self, recs);
    }
    fn name(&mut self, id: u32, bytes: &[u8]) {
        Window::name(self, id, bytes);
    }
    fn event(&mut self, e: CuptiWindowEvent) {
        Window::event(self, e);
    }
}

/// One `CUPTI_EVENTS` entry, to the sink `sink_of(tgid, window_id)` gives; an entry of no
/// open window, too short for what it says it holds, or of an unknown kind is dropped.
pub fn apply<'a, S: CuptiSink + 'a>(
    bytes: &[u8],
    sink_of: impl FnOnce(u32, u64) -> Option<&'a mut S>,
) {
    let Some(h) = read::<CuptiEventHeader>(bytes, 0) else {
        return;
    };
    let Some(w) = sink_of(h.tgid, h.window_id) else {
        return;
    };
    if h.partial != 0 {
        w.partial();
    }
    let body = size_of::<CuptiEventHeader>();
    match h.what {
        cupti_event::BATCH => {
            let n = (h.n as usize).min(CUPTI_BATCH as usize);
            let recs: Vec<CuptiRec> = (0..n)
                .map_while(|i| read::<CuptiRec>(bytes, body + i * size_of::<CuptiRec>()))
                .collect();
            w.records(&recs);
        }
        cupti_event::NAME => {
            let end = (body + CUPTI_NAME_MAX).min(bytes.len());
            if let Some(name) = bytes.get(body..end) {
                w.name(h.n, name);
            }
        }
        cupti_event::WINDOW => {
            if let Some(e) = read::<CuptiWindowEvent>(bytes, body) {
                w.event(e);
            }
        }
        _ => {}
    }
}

/// A `T` (repr(C), integers only) at `off` of a ring-buffer entry, if the entry holds it.
fn read<T: Copy>(bytes: &[u8], off: usize) -> Option<T> {
    let b = bytes.get(off..off.checked_add(size_of::<T>())?)?;
    // SAFETY: `b` holds size_of::<T>() bytes; T is repr(C) and valid for any bit pattern.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) })
}

/// Why the library could not record (`ethand_cupti_window_event::reason` of FAILED).
fn failure(e: &CuptiWindowEvent) -> String {
    match e.reason {
        1 => "no libcupti found in the process (set ETHAND_CUPTI_LIB, or install the CUDA toolkit's or the nvidia-cuda-cupti wheel's)".into(),
        2 => "the libcupti found lacks a function the library needs (too old a CUDA)".into(),
        3 => format!("cuptiSubscribe failed (CUPTI error {})", e.result),
        4 => format!("cuptiActivityRegisterCallbacks failed (CUPTI error {})", e.result),
        5 => format!("cuptiActivityEnable failed (CUPTI error {})", e.result),
        r => format!("failed at step {r} (CUPTI error {})", e.result),
    }
}

/// Time covered by at least one of `iv`.
pub fn union_ns(mut iv: Vec<(u64, u64)>) -> u64 {
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in iv {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    total + cur.map_or(0, |(s, e)| e - s)
}

/// Intervals merged into disjoint ones, in order.
fn merged(mut iv: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    iv.retain(|(s, e)| e > s);
    iv.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(iv.len());
    for (s, e) in iv {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Time covered by at least one of `a` and at least one of `b`.
pub fn intersection_ns(a: Vec<(u64, u64)>, b: Vec<(u64, u64)>) -> u64 {
    let (a, b) = (merged(a), merged(b));
    let (mut i, mut j, mut total) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        total += e.saturating_sub(s);
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersection_of_two_interval_sets() {
        assert_eq!(intersection_ns(vec![], vec![(0, 10)]), 0);
        assert_eq!(intersection_ns(vec![(0, 10)], vec![(5, 20)]), 5);
        // Overlaps within a set count once.
        assert_eq!(
            intersection_ns(vec![(0, 10), (5, 15), (30, 40)], vec![(8, 32), (35, 36)]),
            7 + 2 + 1
        );
        assert_eq!(intersection_ns(vec![(0, 10)], vec![(10, 20)]), 0);
        // Against a brute force on a grid, hostile shapes included (empty and reversed).
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m
        };
        for _ in 0..500 {
            let mut set = |n: u64| -> Vec<(u64, u64)> {
                (0..next(n)).map(|_| (next(200), next(200))).collect()
            };
            let (a, b) = (set(8), set(8));
            let covered = |iv: &[(u64, u64)], t: u64| iv.iter().any(|(s, e)| *s <= t && t < *e);
            let brute = (0..200)
                .filter(|t| covered(&a, *t) && covered(&b, *t))
                .count() as u64;
            assert_eq!(intersection_ns(a.clone(), b.clone()), brute, "{a:?} {b:?}");
        }
    }

    #[test]
    fn union_of_overlapping_and_apart_intervals() {
        assert_eq!(union_ns(vec![]), 0);
        assert_eq!(
            union_ns(vec![(10, 20), (15, 30), (40, 50), (0, 5)]),
            5 + 20 + 10
        );
        assert_eq!(union_ns(vec![(10, 20), (20, 30)]), 20);
        assert_eq!(union_ns(vec![(10, 100), (20, 30)]), 90);
    }

    fn kernel(name_id: u32, start: u64, end: u64) -> CuptiRec {
        CuptiRec {
            kind: cupti_rec_kind::KERNEL,
            name_id,
            device: 0,
            start,
            end,
            ..Default::default()
        }
    }

    fn ev(state: u32, mono: u64, records: u64) -> CuptiWindowEvent {
        CuptiWindowEvent {
            state,
            clock_mono: mono,
            // The test's kernels are on the same clock.
            clock_cupti: mono - 1_000,
            records,
            cupti_version: 130500,
            ..Default::default()
        }
    }

    /// Budget, hostile ids and names, losses: what a process sends cannot grow the window
    /// past its bounds, and what went missing is counted.
    #[test]
    fn a_window_is_bounded_and_counts_its_losses() {
        let mut w = Window::new(3);
        w.event(ev(cupti_window_state::OPENED, 1_000, 0));
        w.name(7, b"gemm\0junk");
        w.name(u32::MAX - 1, b"out of range");
        w.records(&[
            kernel(7, 100, 200),
            kernel(7, 150, 250),
            kernel(CUPTI_NONE, 300, 310),
            kernel(7, 400, 500),
        ]);
        assert!(!w.done());
        w.event(ev(cupti_window_state::CLOSED, 2_000, 6));
        assert!(w.done());
        let (p, _) = w.finish(42);
        assert_eq!(p.state, ActivityState::Recorded);
        assert_eq!(p.records, 3);
        // 6 handed over, 3 summed, 1 over the budget: 2 lost on the way.
        assert_eq!(p.records_lost_by_ethand, 2);
        assert_eq!(p.window_ns, Some(1_000));
        assert_eq!(p.devices[0].busy_ns, 150 + 10);
        assert_eq!(p.devices[0].kernel_ns, 210);
        assert_eq!(p.kernels[0].name.as_deref(), Some("gemm"));
        assert_eq!(p.kernels[0].count, 2);
        assert_eq!(p.kernels[1].name, None);
        assert!(p.detail.unwrap().contains("budget of 3"));
    }

    /// A kernel CUPTI timed from before the window's open counts from the open, as busy
    /// time does; one wholly before it counts none; the detail says how many.
    #[test]
    fn kernel_time_counts_from_the_windows_open() {
        let mut w = Window::new(100);
        // CUPTI's clock at the open: 1_000.
        w.event(ev(cupti_window_state::OPENED, 2_000, 0));
        w.name(7, b"add\0");
        w.records(&[
            kernel(7, 500, 1_300),
            kernel(7, 100, 900),
            kernel(7, 1_400, 1_500),
        ]);
        w.event(ev(cupti_window_state::CLOSED, 3_000, 3));
        let (p, _) = w.finish(42);
        assert_eq!(p.kernels[0].count, 3);
        assert_eq!(p.kernels[0].gpu_ns, 300 + 100);
        assert_eq!(p.kernels[0].max_ns, 300);
        assert_eq!(p.devices[0].busy_ns, 300 + 100);
        assert_eq!(p.devices[0].kernel_ns, 400);
        assert!(
            p.detail
                .unwrap()
                .contains("2 kernels began before the window opened")
        );
    }

    /// A window ended by another asked of its process says so, with the span it covers;
    /// one ended at its deadline says nothing of it.
    #[test]
    fn a_window_cut_short_by_another_says_so() {
        for (reason, cut) in [
            (cupti_close_reason::ANOTHER_WINDOW, true),
            (cupti_close_reason::DEADLINE, false),
        ] {
            let mut w = Window::new(100);
            w.event(ev(cupti_window_state::OPENED, 2_000, 0));
            w.event(CuptiWindowEvent {
                reason,
                ..ev(cupti_window_state::CLOSED, 1_500_002_000, 0)
            });
            let (p, _) = w.finish(42);
            assert_eq!(p.window_ns, Some(1_500_000_000));
            let says = p.detail.unwrap_or_default();
            assert_eq!(says.contains("ended this one after 1.5 s"), cut, "{says}");
        }
    }

    fn entry(h: CuptiEventHeader, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        // SAFETY: the header is repr(C), integers only.
        v.extend_from_slice(unsafe {
            std::slice::from_raw_parts((&raw const h).cast::<u8>(), size_of::<CuptiEventHeader>())
        });
        v.extend_from_slice(body);
        v
    }

    fn rec_bytes(r: &CuptiRec) -> Vec<u8> {
        // SAFETY: the record is repr(C), integers only.
        unsafe {
            std::slice::from_raw_parts((r as *const CuptiRec).cast::<u8>(), size_of::<CuptiRec>())
        }
        .to_vec()
    }

    /// Entries as a hostile process could make them (its own library replaced, or the probe
    /// functions called by hand): a batch claiming more records than it holds, one of another
    /// window, a name with no NUL, a short window event, an unknown kind. Nothing is read
    /// past an entry and only the window the entry names is touched.
    #[test]
    fn hostile_entries_are_bounded() {
        let mut w = Window::new(1000);
        let mut other = Window::new(1000);
        let hdr = |what, n, window_id| CuptiEventHeader {
            what,
            tgid: 7,
            n,
            partial: 0,
            window_id,
        };
        let route = |bytes: &[u8], w: &mut Window, other: &mut Window| {
            apply(bytes, |tgid, id| match (tgid, id) {
                (7, 1) => Some(w),
                (7, 2) => Some(other),
                _ => None,
            })
        };
        let k = rec_bytes(&kernel(3, 10, 20));
        // Claims u32::MAX records, holds two (and a torn third).
        let mut body = [k.clone(), k.clone(), k[..40].to_vec()].concat();
        route(
            &entry(hdr(cupti_event::BATCH, u32::MAX, 1), &body),
            &mut w,
            &mut other,
        );
        assert_eq!(w.received, 2);
        // Another window's, and no window's: not this one.
        route(
            &entry(hdr(cupti_event::BATCH, 1, 2), &k),
            &mut w,
            &mut other,
        );
        route(
            &entry(hdr(cupti_event::BATCH, 1, 9), &k),
            &mut w,
            &mut other,
        );
        assert_eq!((w.received, other.received), (2, 1));
        // A name of 300 bytes without a NUL: cut at the entry's room.
        body = vec![b'x'; 300];
        route(
            &entry(hdr(cupti_event::NAME, 3, 1), &body),
            &mut w,
            &mut other,
        );
        assert_eq!(w.names.get(&3).map(String::len), Some(CUPTI_NAME_MAX));
        // A window event cut short, an unknown kind, a bare header, nothing.
        route(
            &entry(hdr(cupti_event::WINDOW, 0, 1), &[0u8; 10]),
            &mut w,
            &mut other,
        );
        route(&entry(hdr(99, 0, 1), &k), &mut w, &mut other);
        route(
            &entry(hdr(cupti_event::BATCH, 1, 1), &[]),
            &mut w,
            &mut other,
        );
        route(&[1, 2, 3], &mut w, &mut other);
        assert!(!w.done());
        assert_eq!(w.received, 2);
    }

    #[test]
    fn refusal_and_silence_are_told_apart() {
        let mut w = Window::new(10);
        w.event(CuptiWindowEvent {
            state: cupti_window_state::REFUSED,
            result: 39,
            ..Default::default()
        });
        assert_eq!(w.finish(1).0.state, ActivityState::Refused);
        assert_eq!(Window::new(10).finish(1).0.state, ActivityState::NoAnswer);
    }
}
