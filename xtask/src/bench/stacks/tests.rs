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

/// A section as one text: its Markdown, its terminal text and its JSON record, in that order.
fn rendered(sec: &Section) -> String {
    let record = serde_json::to_string_pretty(&sec.record).expect("a JSON value");
    format!(
        "{}\n=== markdown ===\n{}=== text ===\n{}=== record ===\n{record}\n",
        sec.title, sec.markdown, sec.text
    )
}

fn cost(name: &str, run_count: u64, run_time_ns: u64) -> ProgramCost {
    ProgramCost {
        name: name.into(),
        run_count,
        run_time_ns,
    }
}

/// Three rounds of every measurement, in the order `run` makes them, with a call site missing
/// in one round and a profile without samples in another.
fn three_rounds() -> Section {
    let sizes = Sizes {
        rounds: 3,
        copies: 200_000,
        chunk_s: 9.0,
    };
    let mut copies = Vec::new();
    for round in 0..3 {
        for k in 0..StackMode::ALL.len() {
            let mode = StackMode::ALL[(round + k) % StackMode::ALL.len()];
            for depth in DEPTHS {
                let (r, d) = (round as f64, f64::from(depth));
                let ns_per_call = match mode {
                    StackMode::None => 8.0 + r + d * 1.5,
                    StackMode::Off => 9500.0 + 50.0 * r + d,
                    StackMode::On => 11_000.0 + 300.0 * r + 40.0 * d,
                };
                let site = (mode == StackMode::On && !(depth == 32 && round == 2)).then(|| Site {
                    total: if round == 1 { 219_990 } else { 220_000 },
                    sites: 2,
                    top: (depth == 4 || round == 0).then_some(200_000),
                    frames: depth as usize + 3,
                });
                let run = CopyRun {
                    ns_per_call,
                    site,
                    calls: 220_000,
                };
                copies.push((mode, depth, run));
            }
        }
    }
    let mut chunks = Vec::new();
    for round in 0..3 {
        for lp in Loop::ALL {
            for k in 0..Snap::ALL.len() {
                let snap = Snap::ALL[(round + k) % Snap::ALL.len()];
                let r = round as f64;
                let slowdown = match (lp, snap) {
                    (_, Snap::None) => 0.001 * (r - 1.0),
                    (Loop::Busy, Snap::Plain) => 0.0005 * r,
                    (Loop::Busy, Snap::Profile) => 0.002 + 0.001 * r,
                    (Loop::Launch, Snap::Plain) => 0.92 + 0.01 * r,
                    (Loop::Launch, Snap::Profile) => 0.91 + 0.02 * r,
                };
                let profile = snap == Snap::Profile;
                let window_ms = match (lp, profile) {
                    (_, false) => 2000.0,
                    (Loop::Busy, true) => 2000.0 + 500.0 * r,
                    (Loop::Launch, true) => 3019.0 + 7.0 * r,
                };
                let no_samples = lp == Loop::Launch && round == 1;
                let run = ChunkRun {
                    slowdown,
                    window_ms,
                    samples: (profile && !no_samples).then_some(198 + 50 * round as u64),
                    expected_samples: profile.then_some(window_ms * 0.099),
                    top_function: match lp {
                        _ if !profile || round == 2 => None,
                        Loop::Busy => Some(("spin".to_string(), 0.97 - 0.01 * r)),
                        Loop::Launch => Some(("libcuda.so.1".to_string(), 0.41)),
                    },
                };
                chunks.push((lp, snap, run));
            }
        }
    }
    let costs = [
        (
            StackMode::Off,
            Ok(vec![
                cost("gpu_enter", 1000, 350_000),
                cost("gpu_enter_multi_1", 10, 9000),
                cost("gpu_exit", 1000, 90_000),
            ]),
        ),
        (StackMode::On, Ok(vec![cost("gpu_enter", 1000, 2_100_000)])),
    ];
    let profile_costs = Ok(vec![
        cost("profile_cpu", 600, 900_000),
        cost("profile_switch", 0, 0),
    ]);
    section(&sizes, &copies, &chunks, &costs, &profile_costs)
}

/// A quick run with little in it: the deep copies and the launch loop missing, no call site,
/// no program run times.
fn sparse() -> Section {
    let mut copies = Vec::new();
    for round in 0..QUICK.rounds {
        for mode in StackMode::ALL {
            let run = CopyRun {
                ns_per_call: 100.0 * (round as f64 + 1.0),
                site: None,
                calls: 22_000,
            };
            copies.push((mode, 4, run));
        }
    }
    let chunks: Vec<_> = Snap::ALL
        .into_iter()
        .map(|snap| {
            let run = ChunkRun {
                slowdown: -0.004,
                window_ms: 1990.0,
                samples: None,
                expected_samples: None,
                top_function: None,
            };
            (Loop::Busy, snap, run)
        })
        .collect();
    let failed = || Err("ethand exited before the statistics were read".to_string());
    let costs = [(StackMode::Off, failed()), (StackMode::On, failed())];
    section(&QUICK, &copies, &chunks, &costs, &failed())
}

/// The section's text is what the code rendered before `section` was split (its output then
/// is the fixture): the tables of docs/performance.md must not change with the code's shape.
/// A change meant to show in the page updates the fixture in the same commit.
#[test]
fn section_renders_as_before() {
    assert_eq!(
        rendered(&three_rounds()),
        include_str!("../testdata/stacks-three-rounds.txt")
    );
    assert_eq!(
        rendered(&sparse()),
        include_str!("../testdata/stacks-sparse.txt")
    );
}
