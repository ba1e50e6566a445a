//! Each kernel of a window joined to the launch call that made it. The launch programs
//! (ebpf/ethand-ebpf/src/cupti.rs) give every launch call of the process inside its window:
//! thread, entry and return on CLOCK_MONOTONIC, and its call site (user stack id, caller,
//! Python stack). CUPTI gives each kernel the time the host queued it, on CUPTI's clock,
//! which the window's two clock pairs (read back to back by the library at its open and
//! close) map to CLOCK_MONOTONIC. A kernel belongs to the launch call whose [entry, return]
//! holds that time: one thread's launch calls never overlap, so only launches of two threads
//! at the same moment can both hold it, and such a kernel is counted as ambiguous, never put
//! on either site. Everything here comes from the recorded process (its library) and is
//! bounded: at most the window's budget of launches is kept.
use std::collections::HashMap;

use ethand_common::{CuptiWindowEvent, LaunchEvent};
use ethand_snapshot::kernels::LaunchSites;

use super::idle::KernelSpan;

/// A launch call site as the kernel keys it: (`LAUNCH_STACKS` id, caller, Python stack).
pub type SiteKey = (u32, u64, u64);

/// Distinct call sites kept per window: the process chooses its stacks; launches from sites
/// beyond these count on the site without frames.
const MAX_SITE_KEYS: usize = 16_384;
/// The site key of launches whose site is not kept.
const NO_SITE: SiteKey = (ethand_common::GPU_STACK_UNATTRIBUTED, 0, 0);

/// How far before a kernel's queued time a launch call that holds it may have entered: a
/// launch blocks while the device's launch queue is full, but not for longer than this.
const MAX_LAUNCH_NS: u64 = 1_000_000_000;

/// One launch call, its site interned.
#[derive(Clone, Copy, Debug)]
struct Launch {
    entry: u64,
    ret: u64,
    tid: u32,
    site: u32,
}

/// The launch calls of one window, as their events arrive.
#[derive(Clone, Default)]
pub struct Launches {
    max: u64,
    calls: Vec<Launch>,
    sites: Vec<SiteKey>,
    site_ids: HashMap<SiteKey, u32>,
    pub over_budget: u64,
}

/// What the kernels of one site came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JoinedSite {
    pub key: SiteKey,
    pub kernels: u64,
    pub gpu_ns: u64,
    /// Per kernel name id: (kernels, GPU time).
    pub by_name: HashMap<u32, (u64, u64)>,
    /// Those kernels by name, most GPU time first (filled from `by_name` once the window's
    /// names are known).
    pub top: Vec<ethand_snapshot::kernels::KernelStat>,
}

/// A window's join: its counts, and its sites (frames still to be read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Joined {
    pub counts: LaunchSites,
    pub sites: Vec<JoinedSite>,
}

/// CUPTI's clock to CLOCK_MONOTONIC: the line through the window's two clock pairs (one pair
/// when the other is not usable: the clocks then taken to run at the same rate).
#[derive(Clone, Copy, Debug)]
pub struct ClockMap {
    cupti: u64,
    mono: u64,
    /// (monotonic ns, CUPTI ns) elapsed between the pairs; (1, 1): the same rate.
    rate: (u64, u64),
}

impl ClockMap {
    pub fn new(open: &CuptiWindowEvent, close: &CuptiWindowEvent) -> Self {
        let dc = close.clock_cupti.saturating_sub(open.clock_cupti);
        let dm = close.clock_mono.saturating_sub(open.clock_mono);
        // Rates further than 0.1 % apart are not two clocks' drift: one pair is wrong.
        let sane = dc > 0 && dm > 0 && dc.abs_diff(dm) <= dc / 1000;
        Self {
            cupti: open.clock_cupti,
            mono: open.clock_mono,
            rate: if sane { (dm, dc) } else { (1, 1) },
        }
    }

    pub fn mono(&self, cupti_ns: u64) -> u64 {
        let d = i128::from(cupti_ns) - i128::from(self.cupti);
        let m = i128::from(self.mono) + d * i128::from(self.rate.0) / i128::from(self.rate.1);
        m.clamp(0, i128::from(u64::MAX)) as u64
    }
}

impl Launches {
    pub fn new(max: u64) -> Self {
        Self {
            max,
            ..Self::default()
        }
    }

    pub fn add(&mut self, e: &LaunchEvent) {
        if self.calls.len() as u64 >= self.max {
            self.over_budget += 1;
            return;
        }
        let mut key = (e.stack_id, e.caller, e.py_stack);
        if self.site_ids.len() >= MAX_SITE_KEYS && !self.site_ids.contains_key(&key) {
            key = NO_SITE;
        }
        let next = self.sites.len() as u32;
        let site = *self.site_ids.entry(key).or_insert_with(|| {
            self.sites.push(key);
            next
        });
        self.calls.push(Launch {
            entry: e.entry_ns,
            ret: e.return_ns.max(e.entry_ns),
            tid: e.tid,
            site,
        });
    }

    /// Joins `kernels` (with the name id of each) to the launch calls.
    pub fn join(mut self, kernels: &[(KernelSpan, u32)], clock: ClockMap) -> Joined {
        self.calls.sort_unstable_by_key(|l| (l.entry, l.tid));
        let mut counts = LaunchSites {
            launches: self.calls.len() as u64,
            kernels: kernels.len() as u64,
            launches_over_budget: self.over_budget,
            ..Default::default()
        };
        let mut sites: Vec<JoinedSite> = self
            .sites
            .iter()
            .map(|key| JoinedSite {
                key: *key,
                ..Default::default()
            })
            .collect();
        for (k, name_id) in kernels {
            if k.queued == 0 {
                counts.kernels_without_queued_time += 1;
                continue;
            }
            match self.holding(clock.mono(k.queued)) {
                Hold::One(site) => {
                    counts.kernels_joined += 1;
                    let s = &mut sites[site as usize];
                    let ns = k.end.saturating_sub(k.start);
                    s.kernels += 1;
                    s.gpu_ns = s.gpu_ns.saturating_add(ns);
                    let n = s.by_name.entry(*name_id).or_default();
                    n.0 += 1;
                    n.1 = n.1.saturating_add(ns);
                }
                Hold::None => counts.kernels_without_launch += 1,
                Hold::Several => counts.kernels_ambiguous += 1,
            }
        }
        sites.retain(|s| s.kernels > 0);
        Joined { counts, sites }
    }

    /// The site of the one launch call whose [entry, return] holds `t`.
    fn holding(&self, t: u64) -> Hold {
        let after = self.calls.partition_point(|l| l.entry <= t);
        let mut found: Option<&Launch> = None;
        for l in self.calls[..after].iter().rev() {
            if t.saturating_sub(l.entry) > MAX_LAUNCH_NS {
                break;
            }
            if l.ret < t {
                continue;
            }
            match found {
                None => found = Some(l),
                // The same thread cannot be in two launches at once: its events are the
                // process's to make, and a second one is not believed either.
                Some(_) => return Hold::Several,
            }
        }
        found.map_or(Hold::None, |l| Hold::One(l.site))
    }
}

enum Hold {
    One(u32),
    None,
    Several,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tid: u32, entry: u64, ret: u64, stack_id: u32) -> LaunchEvent {
        LaunchEvent {
            tgid: 1,
            tid,
            window_id: 1,
            entry_ns: entry,
            return_ns: ret,
            stack_id,
            caller: 0,
            py_stack: 0,
            ..Default::default()
        }
    }

    fn pair(cupti: u64, mono: u64) -> CuptiWindowEvent {
        CuptiWindowEvent {
            clock_cupti: cupti,
            clock_mono: mono,
            ..Default::default()
        }
    }

    fn kernel(queued: u64, start: u64, ns: u64) -> KernelSpan {
        KernelSpan {
            start,
            end: start + ns,
            queued,
        }
    }

    /// Two threads launching from two sites, CUPTI's clock 1e12 ns ahead of the monotonic
    /// one: every kernel on the site of the call that queued it, with its exact GPU time; a
    /// kernel queued where both threads were inside a launch, one queued outside every call
    /// and one without a queued time are counted apart.
    #[test]
    fn kernels_join_the_launch_that_queued_them() {
        const OFF: u64 = 1_000_000_000_000;
        let mut l = Launches::new(100);
        // Thread 10 launches A from site 1 every 10 us (calls of 3 us); thread 11 launches B
        // from site 2 at 5 us past, calls of 2 us; at 100 us both are inside a call.
        for i in 0..5u64 {
            l.add(&ev(10, 1_000 + i * 10_000, 4_000 + i * 10_000, 1));
            l.add(&ev(11, 6_000 + i * 10_000, 8_000 + i * 10_000, 2));
        }
        l.add(&ev(10, 100_000, 103_000, 1));
        l.add(&ev(11, 101_000, 104_000, 2));
        let clock = ClockMap::new(&pair(OFF, 0), &pair(OFF + 1_000_000, 1_000_000));
        let mut kernels = Vec::new();
        for i in 0..5u64 {
            kernels.push((kernel(OFF + 2_000 + i * 10_000, OFF + 500_000, 7_000), 100));
            kernels.push((
                kernel(OFF + 7_000 + i * 10_000, OFF + 600_000, 1_000 + i),
                200,
            ));
        }
        kernels.push((kernel(OFF + 102_000, OFF + 700_000, 5), 100));
        kernels.push((kernel(OFF + 90_000, OFF + 700_000, 5), 100));
        kernels.push((kernel(0, OFF + 800_000, 5), 100));
        let j = l.join(&kernels, clock);
        assert_eq!(j.counts.launches, 12);
        assert_eq!(j.counts.kernels, 13);
        assert_eq!(j.counts.kernels_joined, 10);
        assert_eq!(j.counts.kernels_ambiguous, 1);
        assert_eq!(j.counts.kernels_without_launch, 1);
        assert_eq!(j.counts.kernels_without_queued_time, 1);
        let site = |id: u32| j.sites.iter().find(|s| s.key.0 == id).unwrap();
        assert_eq!((site(1).kernels, site(1).gpu_ns), (5, 35_000));
        assert_eq!((site(2).kernels, site(2).gpu_ns), (5, 5_010));
        assert_eq!(site(1).by_name[&100], (5, 35_000));
        assert_eq!(site(2).by_name[&200], (5, 5_010));
    }

    /// A clock pair off by a millisecond moves the queued times out of every launch call:
    /// the kernels are counted as without a launch, never put on another site.
    #[test]
    fn a_skewed_clock_leaves_kernels_unjoined() {
        let mut l = Launches::new(100);
        for i in 0..10u64 {
            l.add(&ev(10, i * 10_000, i * 10_000 + 2_000, 1));
        }
        let kernels: Vec<(KernelSpan, u32)> = (0..10u64)
            .map(|i| (kernel(i * 10_000 + 1_000, 0, 10), 1))
            .collect();
        let exact = ClockMap::new(&pair(0, 0), &pair(1_000_000, 1_000_000));
        assert_eq!(l.clone().join(&kernels, exact).counts.kernels_joined, 10);
        // The pair says CUPTI's clock is 5 ms behind: every queued time lands after the
        // last launch.
        let skewed = ClockMap::new(&pair(0, 5_000_000), &pair(1_000_000, 6_000_000));
        let j = l.join(&kernels, skewed);
        assert_eq!(j.counts.kernels_joined, 0);
        assert_eq!(j.counts.kernels_without_launch, 10);
        assert!(j.sites.is_empty());
    }

    /// The two pairs' rates give the line (a clock 100 ppm fast is followed); pairs that
    /// disagree by more than 0.1 % are not believed beyond the first.
    #[test]
    fn the_clock_map_follows_the_pairs() {
        let m = ClockMap::new(&pair(1_000, 0), &pair(1_000 + 1_000_100, 1_000_000));
        assert_eq!(m.mono(1_000 + 1_000_100), 1_000_000);
        assert_eq!(m.mono(1_000 + 500_050), 500_000);
        let m = ClockMap::new(&pair(0, 10), &pair(1_000_000, 3_000_000));
        assert_eq!(m.mono(500), 510);
        // Before the first pair, and a queued time near 0: clamped, not wrapped.
        let m = ClockMap::new(&pair(10_000, 5), &pair(20_000, 10_005));
        assert_eq!(m.mono(1), 0);
    }

    /// A process launching from more sites than are kept: the rest count on the site
    /// without frames, nothing is lost.
    #[test]
    fn sites_beyond_the_limit_share_one() {
        let mut l = Launches::new(100_000);
        let n = MAX_SITE_KEYS as u64 + 10;
        for i in 0..n {
            l.add(&ev(1, i * 10, i * 10 + 5, i as u32));
        }
        let kernels: Vec<(KernelSpan, u32)> =
            (0..n).map(|i| (kernel(i * 10 + 2, 0, 1), 1)).collect();
        let j = l.join(
            &kernels,
            ClockMap::new(&pair(0, 0), &pair(1_000_000, 1_000_000)),
        );
        assert_eq!(j.counts.kernels_joined, n);
        assert_eq!(j.sites.len(), MAX_SITE_KEYS + 1);
        let rest = j
            .sites
            .iter()
            .find(|s| s.key == NO_SITE)
            .expect("the shared site");
        assert_eq!(rest.kernels, 10);
    }

    /// The budget keeps the first launches and counts the rest.
    #[test]
    fn launches_over_the_budget_are_counted() {
        let mut l = Launches::new(2);
        for i in 0..5 {
            l.add(&ev(1, i * 10, i * 10 + 5, 1));
        }
        let j = l.join(&[], ClockMap::new(&pair(0, 0), &pair(0, 0)));
        assert_eq!(j.counts.launches, 2);
        assert_eq!(j.counts.launches_over_budget, 3);
    }
}
