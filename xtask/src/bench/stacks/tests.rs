use super::*;

/// Chunks of `len` ns ending every `len` ns from `from` ms to `to` ms.
fn steady(from: f64, to: f64, len: f64) -> Vec<(f64, f64)> {
    let step = len / 1e6;
    let n = ((to - from) / step) as usize;
    (1..=n).map(|i| (from + i as f64 * step, len)).collect()
}

#[test]
fn slowdown_is_the_window_against_the_spans_around_it() {
    // 1 ms chunks, then 1.25 ms ones during a 3 s window at 10 s: 25 % slower.
    let mut chunks = steady(0.0, 10_000.0, 1e6);
    chunks.extend(steady(10_000.0, 13_000.0, 1.25e6));
    chunks.extend(steady(13_000.0, 20_000.0, 1e6));
    // (The window starts after the last 1 ms chunk ends, at 10 s exactly.)
    let s = slowdown(&chunks, 10_000.5, 2_999.5).unwrap();
    assert!((s - 0.25).abs() < 1e-9, "{s}");
    // Before slower than after: the window is against their mean (1.5 ms and 1 ms).
    let mut chunks = steady(0.0, 10_000.0, 1.5e6);
    chunks.extend(steady(10_000.0, 20_000.0, 1e6));
    let s = slowdown(&chunks, 10_100.0, 3_000.0).unwrap();
    assert!((s - (1.0 / 1.25 - 1.0)).abs() < 1e-9, "{s}");
}

#[test]
fn slowdown_needs_chunks_on_both_sides() {
    let chunks = steady(9_000.0, 20_000.0, 1e6);
    // Nothing in the 2 s before (6.9 to 8.9 s), then nothing in the 2 s after (20.7 s on).
    assert_eq!(slowdown(&chunks, 9_100.0, 2_000.0), None);
    assert_eq!(slowdown(&chunks, 18_500.0, 2_000.0), None);
    assert!(slowdown(&chunks, 12_000.0, 2_000.0).is_some());
}

#[test]
fn per_round_cells_collapse_when_equal() {
    let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        per_round(&v(&["7", "7", "7"]), ", "),
        "7 (each of 3 rounds)"
    );
    assert_eq!(per_round(&v(&["7", "8"]), ", "), "7, 8");
    assert_eq!(per_round(&v(&["7"]), ", "), "7");
    assert_eq!(per_round(&[], ", "), "-");
}

#[test]
fn median_mad_and_cells() {
    assert_eq!(median_mad(&[1.0, 2.0, 10.0]), Some((2.0, 1.0)));
    assert_eq!(fmt_pm(&[], 1.0, " ns"), "not measured");
    assert_eq!(fmt_pm(&[0.01, 0.02], 100.0, " %"), "+1.50 %");
    assert_eq!(fmt_pm(&[0.01, 0.02, 0.04], 100.0, " %"), "+2.00 % ±1.00");
}
