//! Where a device's idle time went: the time of the window that no kernel covers, split by
//! what the GPU was waiting for. A gap between two kernels is host wait up to the moment the
//! host queued the next kernel (nothing was queued) and kernel wait after it (queued, not yet
//! running: launch latency, or work ahead of it in its stream); the part of a gap where a copy
//! or memset ran is copy time. Gaps before the first and after the last kernel of the window,
//! and gaps before a kernel CUPTI gave no queued time, are unattributed: work queued outside
//! the window may have run there. All times are CUPTI's clock and come from the recorded
//! process: they are clamped to the window and summed with saturation, so the parts always add
//! up to the window less its busy time, whatever the process sent.
use ethand_snapshot::kernels::IdleSplit;

/// One kernel: when it ran, and when the host queued it (0: unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelSpan {
    pub start: u64,
    pub end: u64,
    pub queued: u64,
}

/// Copy and memset intervals, merged, with the time they cover up to each one.
struct Covered {
    spans: Vec<(u64, u64)>,
    /// `before[i]`: time covered by `spans[..i]`.
    before: Vec<u64>,
}

impl Covered {
    fn new(mut iv: Vec<(u64, u64)>) -> Self {
        iv.retain(|(s, e)| e > s);
        iv.sort_unstable();
        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(iv.len());
        for (s, e) in iv {
            match spans.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => spans.push((s, e)),
            }
        }
        let mut before = Vec::with_capacity(spans.len() + 1);
        let mut sum = 0u64;
        before.push(0);
        for (s, e) in &spans {
            sum = sum.saturating_add(e - s);
            before.push(sum);
        }
        Self { spans, before }
    }

    /// Time of [a, b) that some span covers.
    fn within(&self, a: u64, b: u64) -> u64 {
        if b <= a {
            return 0;
        }
        // Spans are disjoint and sorted: those ending after `a` and starting before `b`.
        let first = self.spans.partition_point(|(_, e)| *e <= a);
        let last = self.spans.partition_point(|(s, _)| *s < b);
        if first >= last {
            return 0;
        }
        let mut t = self.before[last] - self.before[first];
        let (fs, _) = self.spans[first];
        let (_, le) = self.spans[last - 1];
        t -= fs.max(a) - fs;
        t -= le - le.min(b);
        t
    }
}

/// The split of [open, close) less the kernels' union. `kernels` is sorted here.
pub fn split(
    kernels: &mut [KernelSpan],
    copies: Vec<(u64, u64)>,
    open: u64,
    close: u64,
) -> IdleSplit {
    let close = close.max(open);
    let copies = Covered::new(
        copies
            .into_iter()
            .map(|(s, e)| (s.clamp(open, close), e.clamp(open, close)))
            .collect(),
    );
    kernels.sort_unstable();
    let mut out = IdleSplit::default();
    // The part of [a, b) no copy covered goes to `unattributed`; the rest to `copy_ns`.
    let edge = |out: &mut IdleSplit, a: u64, b: u64| {
        let c = copies.within(a, b);
        out.copy_ns = out.copy_ns.saturating_add(c);
        out.unattributed_ns = out.unattributed_ns.saturating_add(b.saturating_sub(a) - c);
    };
    let mut busy_until: Option<u64> = None;
    for k in kernels.iter() {
        let (s, e) = (k.start.clamp(open, close), k.end.clamp(open, close));
        if e <= s {
            // Outside the window, or no time (the union has none of it either).
            continue;
        }
        match busy_until {
            None => edge(&mut out, open, s),
            Some(b) if s > b => {
                out.gaps += 1;
                if k.queued == 0 {
                    edge(&mut out, b, s);
                } else {
                    let q = k.queued.clamp(b, s);
                    let (host_copy, wait_copy) = (copies.within(b, q), copies.within(q, s));
                    out.copy_ns = out.copy_ns.saturating_add(host_copy + wait_copy);
                    out.host_wait_ns = out.host_wait_ns.saturating_add(q - b - host_copy);
                    out.kernel_wait_ns = out.kernel_wait_ns.saturating_add(s - q - wait_copy);
                }
            }
            Some(_) => {}
        }
        busy_until = Some(busy_until.map_or(e, |b| b.max(e)));
    }
    edge(&mut out, busy_until.unwrap_or(open), close);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(start: u64, end: u64, queued: u64) -> KernelSpan {
        KernelSpan { start, end, queued }
    }

    fn total(s: &IdleSplit) -> u64 {
        s.host_wait_ns + s.kernel_wait_ns + s.copy_ns + s.unattributed_ns
    }

    #[test]
    fn gaps_split_at_the_next_kernels_queued_time() {
        // Window [0, 1000). Kernels 100-200, 150-300 (overlapping), then a gap to 400 with the
        // next kernel queued at 350 (host 50, kernel wait 50), a gap 500-700 with a copy at
        // 520-560 and the kernel queued at 480, before the gap (all kernel wait but the copy),
        // then a kernel with no queued time after a gap 750-800.
        let mut ks = [
            k(400, 500, 350),
            k(100, 200, 90),
            k(150, 300, 120),
            k(700, 750, 480),
            k(800, 900, 0),
        ];
        let s = split(&mut ks, vec![(520, 560)], 0, 1000);
        assert_eq!(s.gaps, 3);
        assert_eq!(s.host_wait_ns, 50);
        assert_eq!(s.kernel_wait_ns, 50 + 160);
        assert_eq!(s.copy_ns, 40);
        // Before the first kernel (100), the gap of the unknown queue time (50), after the
        // last kernel (100).
        assert_eq!(s.unattributed_ns, 100 + 50 + 100);
        let busy = 200 + 100 + 50 + 100;
        assert_eq!(total(&s), 1000 - busy);
    }

    #[test]
    fn a_copy_across_the_queued_time_is_copy_time_on_both_sides() {
        // Gap 100-300, next kernel queued at 200, a copy 150-250.
        let mut ks = [k(0, 100, 0), k(300, 400, 200)];
        let s = split(&mut ks, vec![(150, 250)], 0, 400);
        assert_eq!(s.copy_ns, 100);
        assert_eq!(s.host_wait_ns, 50);
        assert_eq!(s.kernel_wait_ns, 50);
        assert_eq!(s.unattributed_ns, 0);
    }

    #[test]
    fn no_kernels_leave_the_window_unattributed_but_its_copies() {
        let s = split(&mut [], vec![(10, 20), (15, 30), (90, 200)], 0, 100);
        assert_eq!((s.copy_ns, s.unattributed_ns, s.gaps), (20 + 10, 70, 0));
    }

    /// What a hostile or confused process may send (times out of the window, queued after the
    /// start, ends before starts, u64::MAX): the parts still add up and nothing overflows.
    #[test]
    fn parts_add_up_whatever_the_times() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if m == 0 { rng } else { rng % m }
        };
        for round in 0..2000 {
            let span = if round % 10 == 0 { 0 } else { 10_000 };
            let mut ks: Vec<KernelSpan> = (0..next(20))
                .map(|_| k(next(span), next(span), next(span)))
                .collect();
            if round % 7 == 0 {
                ks.push(k(u64::MAX - 5, u64::MAX, u64::MAX));
            }
            let copies: Vec<(u64, u64)> = (0..next(5)).map(|_| (next(span), next(span))).collect();
            let (open, close) = (next(2000), 2000 + next(8000));
            let mut union: Vec<(u64, u64)> = ks
                .iter()
                .map(|x| (x.start.clamp(open, close), x.end.clamp(open, close)))
                .filter(|(s, e)| e > s)
                .collect();
            union.sort_unstable();
            let busy = super::super::aggregate::union_ns(union);
            let s = split(&mut ks, copies, open, close);
            assert_eq!(total(&s) + busy, close - open, "round {round}: {s:?}");
        }
    }
}
