use super::*;

fn run(ns_per_event: f64) -> Measurement {
    Measurement {
        elapsed_ns: (ns_per_event * 1000.0) as u64,
        events: 1000,
        ..Measurement::default()
    }
}

fn info(not_run: &[Mode], program_costs: Result<Vec<ProgramCost>, String>) -> RunInfo {
    RunInfo {
        command: "cargo xtask bench".into(),
        rounds: 1,
        quick: true,
        iters: Iters::QUICK,
        io_dir: "/var/tmp".into(),
        not_run: not_run
            .iter()
            .map(|&m| (m, "not requested".to_string()))
            .collect(),
        ready_output: BTreeMap::new(),
        program_costs,
        load_before: "0.00 0.00 0.00".into(),
        load_after: "0.00 0.00 0.00".into(),
        sections: Vec::new(),
        machine: Machine {
            date: "d".into(),
            kernel: "k".into(),
            cpus: 2,
            cpu_model: "c".into(),
            commit: "x".into(),
            ethand_version: "not run".into(),
            bpftrace_version: "v".into(),
        },
    }
}

#[test]
fn medians() {
    assert_eq!(median(vec![]), None);
    assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
}

#[test]
fn switch_cost_is_half_the_sched_only_round_trip_added() {
    let mut r = Results::default();
    for (none, sched) in [(3000.0, 3100.0), (3200.0, 3260.0), (2900.0, 3040.0)] {
        r.push(Workload::Pingpong, Mode::None, run(none));
        r.push(Workload::Pingpong, Mode::EthandSched, run(sched));
    }
    // The full mode's figures play no part.
    r.push(Workload::Getpid, Mode::None, run(100.0));
    r.push(Workload::Getpid, Mode::Ethand, run(150.0));
    r.push(Workload::Pingpong, Mode::Ethand, run(9000.0));
    // Medians: none 3000, ethand-sched 3100: +100 per round trip, +50 per switch.
    assert_eq!(r.switch_added_ns(Mode::EthandSched), Some(50.0));
    // Spreads: none |3000-3000|,|3200-3000|,|2900-3000| -> 100; sched 0, 160, 60 -> 60.
    let noise = r.switch_noise_ns(Mode::EthandSched).unwrap();
    assert!((noise - 100f64.hypot(60.0) / 2.0).abs() < 1e-9);
    assert_eq!(r.switch_added_ns(Mode::BpftraceSched), None);
}

#[test]
fn floor_table_subtracts_the_floor_from_ethand() {
    let mut r = Results::default();
    r.push(Workload::Getpid, Mode::None, run(200.0));
    r.push(Workload::Getpid, Mode::Ethand, run(490.0));
    r.push(Workload::Getpid, Mode::Floor, run(365.0));
    r.push(Workload::Getpid, Mode::FloorClock, run(445.0));
    r.push(Workload::Pingpong, Mode::None, run(6000.0));
    r.push(Workload::Pingpong, Mode::EthandSched, run(6800.0));
    r.push(Workload::Pingpong, Mode::FloorSched, run(6100.0));
    let info = info(&[Mode::Bpftrace, Mode::BpftraceSched], Ok(Vec::new()));
    let rep = Report {
        results: &r,
        info: &info,
    };
    let rows = rep.floor_rows();
    // getpid: ethand +290, floor +165, floor-clock +245: 45 ns of ethand's own.
    assert_eq!(rows[0][2..], ["+290.0", "+165.0", "+245.0", "+45.0"]);
    // Ping-pong under the full modes: not measured here, no number made up.
    assert_eq!(rows[1][2..], ["-", "-", "-", "-"]);
    // Switch: (800 - 100) / 2 above a floor of +50 per switch.
    assert_eq!(rows[2][2], "+400.0");
    assert_eq!(rows[2][3], "+50.0");
    assert_eq!(rows[2][5], "+350.0");
    let lines = rep.target_lines();
    assert!(
        lines[0].ends_with(
            "the kernel's floor for the same event (mode floor-clock) is +245.0 ns, \
             ethand's own work above it +45.0 ns"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("(mode floor-sched) is +50.0 ns"),
        "{}",
        lines[1]
    );
}

#[test]
fn verdicts_are_inconclusive_within_the_noise() {
    assert_eq!(verdict(20.0, Some(10.0), 50.0), "PASS");
    assert_eq!(verdict(80.0, Some(10.0), 50.0), "FAIL");
    assert_eq!(
        verdict(-1.6, Some(183.2), 50.0),
        "inconclusive (noise ±183.2 ns)"
    );
    assert_eq!(
        verdict(70.0, Some(30.0), 50.0),
        "inconclusive (noise ±30.0 ns)"
    );
    assert_eq!(
        verdict(20.0, None, 50.0),
        "PASS (no noise estimate: fewer than 3 rounds)"
    );
}

#[test]
fn json_holds_what_the_table_shows() {
    let mut r = Results::default();
    // getpid: none 100/110/120 ns, ethand 300/330/360 ns: added 220, noise hypot(10, 30).
    for (none, ethand) in [(100.0, 300.0), (110.0, 330.0), (120.0, 360.0)] {
        r.push(Workload::Getpid, Mode::None, run(none));
        r.push(Workload::Getpid, Mode::Ethand, run(ethand));
    }
    // Ping-pong: none 3000, ethand-sched 3100 on every round: 50 ns per switch, noise 0.
    for _ in 0..3 {
        r.push(Workload::Pingpong, Mode::None, run(3000.0));
        r.push(Workload::Pingpong, Mode::EthandSched, run(3100.0));
    }
    let info = info(&[Mode::Bpftrace], Err("ethand not run".into()));
    let j = Report {
        results: &r,
        info: &info,
    }
    .json();
    let getpid = &j["workloads"]["getpid"]["modes"];
    assert_eq!(getpid["none"]["median_ns"], 110.0);
    assert!(getpid["none"]["added_ns"].is_null());
    assert_eq!(getpid["ethand"]["median_ns"], 330.0);
    assert_eq!(getpid["ethand"]["added_ns"], 220.0);
    let noise = getpid["ethand"]["added_noise_ns"].as_f64().unwrap();
    assert!((noise - 10f64.hypot(30.0)).abs() < 1e-9, "{noise}");
    assert_eq!(j["workloads"]["getpid"]["unit"], "syscall");
    assert!(j["workloads"]["getpid"]["modes"].get("bpftrace").is_none());
    assert!(
        j["workloads"].get("odirect").is_none(),
        "no samples, no entry"
    );
    assert_eq!(j["per_switch"]["ethand-sched"]["added_ns"], 50.0);
    assert_eq!(j["per_switch"]["ethand-sched"]["added_noise_ns"], 0.0);
    assert_eq!(j["not_run"]["bpftrace"], "not requested");
    assert_eq!(j["rounds"], 1);
}

#[test]
fn direct_switch_row_and_target() {
    let mut r = Results::default();
    for (none, sched, bt) in [(3000.0, 3100.0, 4000.0), (3200.0, 3260.0, 4200.0)] {
        r.push(Workload::Pingpong, Mode::None, run(none));
        r.push(Workload::Pingpong, Mode::EthandSched, run(sched));
        r.push(Workload::Pingpong, Mode::BpftraceSched, run(bt));
    }
    for noise in [0.0, 400.0, -400.0] {
        r.push(Workload::Pingpong, Mode::None, run(3100.0 + noise));
        r.push(Workload::Pingpong, Mode::EthandSched, run(3180.0 + noise));
        r.push(Workload::Pingpong, Mode::BpftraceSched, run(4100.0 + noise));
    }
    let info = info(&[], Err("ethand not run".into()));
    let report = Report {
        results: &r,
        info: &info,
    };
    let md = report.markdown();
    // Medians: none 3100, ethand-sched 3180, bpftrace-sched 4100.
    assert!(md.contains(
        "| context switch (direct: ping-pong with scheduler probes only, / 2) \
         | per switch, including its wakeup | - | - | - | +40.0 ±"
    ));
    assert!(md.contains(
        "| pipe ping-pong (1 CPU), scheduler probes only (ethand-sched, bpftrace-sched) \
         | round trip (2 switches + 4 syscalls) | 3100 | 3180 | 4100 | +80.0 ±"
    ));
    assert!(!md.contains("derived"));
    let line = report
        .target_lines()
        .into_iter()
        .find(|l| l.contains("context switch"))
        .unwrap();
    assert!(line.contains("+40.0 ±"), "{line}");
    assert!(line.contains("-> inconclusive (noise ±"), "{line}");
    assert!(md.contains("BPF program run time (ns/run, kernel BPF statistics)"));
    assert!(md.contains("Not measured: ethand not run"));
    assert!(md.contains(
        "\nAnalysis of where the cost goes: [performance-analysis.md](performance-analysis.md).\n"
    ));
    assert!(md.contains("raw samples (ns per event, in run order) are in this run's record"));
    let record = report.json();
    assert_eq!(
        record["workloads"]["pingpong"]["modes"]["ethand-sched"]["samples_ns"],
        serde_json::json!([3100.0, 3260.0, 3180.0, 3580.0, 2780.0])
    );
    assert!(
        record["workloads"]["getpid"]["modes"]
            .get("ethand-sched")
            .is_none()
    );
}

#[test]
fn program_run_times() {
    let cost = |name: &str, run_count, run_time_ns| ProgramCost {
        name: name.into(),
        run_count,
        run_time_ns,
    };
    let costs = vec![
        cost("block_issue", 10, 1000),
        cost("sys_enter_btf", 1000, 45_500),
        cost("sys_exit_btf", 1000, 61_000),
        cost("sched_switch_btf", 0, 0),
    ];
    let r = Results::default();
    let info = info(&[], Ok(costs));
    let report = Report {
        results: &r,
        info: &info,
    };
    assert_eq!(
        report.program_rows().unwrap(),
        [
            ["sys_enter_btf", "1000", "45.5"].map(String::from),
            ["sys_exit_btf", "1000", "61.0"].map(String::from),
            ["sched_switch_btf", "0", "no runs"].map(String::from),
            ["sched_wakeup_btf", "-", "not loaded"].map(String::from),
        ]
    );
    let text = report.text();
    assert!(
        text.contains(
            "BPF program run time (ns/run, kernel BPF statistics)\n\
             program           runs      ns/run\n\
             sys_enter_btf     1000        45.5\n"
        ),
        "{text}"
    );
    assert!(report.markdown().contains("| sys_exit_btf | 1000 | 61.0 |"));
}

#[test]
fn modes_that_did_not_run_say_so() {
    let mut r = Results::default();
    for w in Workload::ALL {
        r.push(w, Mode::None, run(1000.0));
        r.push(w, Mode::Bpftrace, run(2000.0));
    }
    r.push(Workload::Pingpong, Mode::BpftraceSched, run(1500.0));
    let info = info(
        &[Mode::Ethand, Mode::EthandSched],
        Err("ethand not run".into()),
    );
    let report = Report {
        results: &r,
        info: &info,
    };
    let md = report.markdown();
    assert!(
        md.contains(
            "| getpid loop | syscall | 1000 | not run | 2000 | not run | +1000 | not run |"
        )
    );
    assert!(
        md.contains(
            "| per switch, including its wakeup | - | - | - | not run | +250.0 | not run |"
        )
    );
    assert!(md.contains("not measured (ethand not run)"));
    assert!(md.contains("not measured (ethand-sched not run)"));
    for line in report.target_lines() {
        assert!(line.contains("not measured ("), "{line}");
    }
}

/// Every workload under every mode that runs it, `rounds` rounds, with the counts the Checks
/// read (switches, block requests, bytes, calls counted).
fn full_results(rounds: u64) -> Results {
    let mut r = Results::default();
    for round in 0..rounds {
        for (k, mode) in Mode::ALL.into_iter().enumerate() {
            for &w in mode.workloads() {
                let base = match w {
                    Workload::Getpid => 95.0,
                    Workload::Pingpong => 5200.0,
                    Workload::Odirect => 41_000.0,
                    Workload::Tcp => 9800.0,
                    // The uprobe (the paced load is no part of the table).
                    _ => 1900.0,
                };
                let ns = base * (1.0 + 0.08 * k as f64) + 7.0 * round as f64;
                let events = 1000;
                let calls = events + events / 10;
                r.push(
                    w,
                    mode,
                    Measurement {
                        elapsed_ns: (ns * events as f64) as u64,
                        events,
                        switches: (w == Workload::Pingpong).then_some(2 * events + round),
                        block_requests: (w == Workload::Odirect).then_some(events + 3 * round),
                        bytes: (w == Workload::Tcp).then_some(events * 65_536),
                        calls: (w == Workload::Uprobe).then_some(calls),
                        counted: (w == Workload::Uprobe && mode == Mode::Ethand)
                            .then_some(calls - round),
                    },
                );
            }
        }
    }
    r
}

fn published_info() -> RunInfo {
    let cost = |name: &str, run_count, run_time_ns| ProgramCost {
        name: name.into(),
        run_count,
        run_time_ns,
    };
    let mut info = info(
        &[],
        Ok(vec![
            cost("sys_enter_btf", 4_000_000, 150_000_000),
            cost("sys_exit_btf", 4_000_000, 210_000_000),
            cost("sched_switch_btf", 600_000, 63_000_000),
        ]),
    );
    info.command = "cargo xtask bench --rounds 3".into();
    info.rounds = 3;
    info.quick = false;
    info.iters = Iters::FULL;
    info.ready_output = BTreeMap::from([
        (Mode::Ethand, "ethand: ready\n".to_string()),
        (Mode::Bpftrace, "Attaching 12 probes...\n".to_string()),
    ]);
    info.sections = vec![
        Section {
            title: "Daemon at scale".into(),
            markdown: "| a | b |\n|---|---|\n| 1 | 2 |\n\n".into(),
            text: "scale: fine\n".into(),
            record: None,
        },
        Section {
            title: "Serving".into(),
            markdown: "No table.".into(),
            text: "serving: fine".into(),
            record: Some(serde_json::json!({"n": 1})),
        },
    ];
    info
}

/// The page is what the code rendered before `write_markdown` was split (its output then is
/// the fixture): docs/performance.md must not change with the code's shape.
/// A change meant to show in the page updates the fixture in the same commit.
#[test]
fn markdown_renders_as_before() {
    let results = full_results(3);
    let run_info = published_info();
    let report = Report {
        results: &results,
        info: &run_info,
    };
    assert_eq!(
        report.markdown(),
        include_str!("../testdata/report-published.txt")
    );
    // A quick run with one round, modes left out and no program run times.
    let results = full_results(1);
    let run_info = info(
        &[Mode::Bpftrace, Mode::BpftraceSched, Mode::FloorSched],
        Err("ethand not run".into()),
    );
    let report = Report {
        results: &results,
        info: &run_info,
    };
    assert_eq!(
        report.markdown(),
        include_str!("../testdata/report-quick.txt")
    );
}
