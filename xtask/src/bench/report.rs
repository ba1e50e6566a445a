//! Turns the samples into the numbers that matter (medians, added ns per event, ratios, the
//! per-switch derivation, the targets) and renders them: a text table for the terminal and
//! `docs/performance.md`.
//!
//! Invariant: a number is printed only if it was measured; a mode that did not run shows
//! "not run" (with its reason in the document), never a made-up or zero value.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs;
use std::path::Path;
use std::process::Command;

use super::modes::{BPFTRACE_SCRIPT, Mode};
use super::workloads::{Iters, Measurement, Workload};

/// Added ns per syscall that ethand must stay within.
pub const SYSCALL_TARGET_NS: f64 = 150.0;
/// Added ns per context switch that ethand must stay within.
pub const SWITCH_TARGET_NS: f64 = 50.0;

/// Every measurement, by workload and mode, in the order they ran.
#[derive(Default)]
pub struct Results {
    samples: BTreeMap<(Workload, Mode), Vec<Measurement>>,
}

impl Results {
    pub fn push(&mut self, w: Workload, mode: Mode, m: Measurement) {
        self.samples.entry((w, mode)).or_default().push(m);
    }

    fn runs(&self, w: Workload, mode: Mode) -> &[Measurement] {
        self.samples.get(&(w, mode)).map_or(&[], Vec::as_slice)
    }

    /// Median over the runs of `f` (None without runs).
    fn median_of(&self, w: Workload, mode: Mode, f: impl Fn(&Measurement) -> f64) -> Option<f64> {
        median(self.runs(w, mode).iter().map(f).collect())
    }

    pub fn median_ns(&self, w: Workload, mode: Mode) -> Option<f64> {
        self.median_of(w, mode, Measurement::ns_per_event)
    }

    /// Median ns per event under `mode` minus the median with nothing attached.
    pub fn added_ns(&self, w: Workload, mode: Mode) -> Option<f64> {
        Some(self.median_ns(w, mode)? - self.median_ns(w, Mode::None)?)
    }

    /// The spread of the runs: median absolute deviation of ns per event (None with fewer
    /// than 3 runs, where it means nothing).
    fn spread_ns(&self, w: Workload, mode: Mode) -> Option<f64> {
        let runs = self.runs(w, mode);
        let med = self.median_ns(w, mode).filter(|_| runs.len() >= 3)?;
        median(
            runs.iter()
                .map(|m| (m.ns_per_event() - med).abs())
                .collect(),
        )
    }

    /// The noise of [`Self::added_ns`]: the spreads of both medians combined.
    pub fn added_noise_ns(&self, w: Workload, mode: Mode) -> Option<f64> {
        Some(
            self.spread_ns(w, mode)?
                .hypot(self.spread_ns(w, Mode::None)?),
        )
    }

    /// Added ns per context switch. A ping-pong round trip is 2 switches (each with the
    /// wake-up that caused it) and 4 syscalls (2 writes, 2 reads); the syscalls' share is
    /// taken from the getpid loop:
    /// `switch_added = (round_trip_added - 4 * syscall_added) / 2`.
    pub fn switch_added_ns(&self, mode: Mode) -> Option<f64> {
        let round_trip = self.added_ns(Workload::Pingpong, mode)?;
        let syscall = self.added_ns(Workload::Getpid, mode)?;
        Some((round_trip - 4.0 * syscall) / 2.0)
    }

    /// The noise of [`Self::switch_added_ns`], propagated through its formula.
    pub fn switch_noise_ns(&self, mode: Mode) -> Option<f64> {
        let round_trip = self.added_noise_ns(Workload::Pingpong, mode)?;
        let syscall = self.added_noise_ns(Workload::Getpid, mode)?;
        Some(round_trip.hypot(4.0 * syscall) / 2.0)
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// How the run was made: everything the document's header states.
pub struct RunInfo {
    pub command: String,
    pub rounds: u32,
    pub quick: bool,
    pub iters: Iters,
    pub io_dir: String,
    /// Modes that did not run, with the reason.
    pub not_run: BTreeMap<Mode, String>,
    /// What each tracer said when it became ready, from its first attach.
    pub ready_output: BTreeMap<Mode, String>,
    pub machine: Machine,
    /// /proc/loadavg's 1, 5 and 15 minute averages before the first run and after the last.
    pub load_before: String,
    pub load_after: String,
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub struct Machine {
    pub date: String,
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub commit: String,
    pub ethand_version: String,
    pub bpftrace_version: String,
}

impl Machine {
    pub fn detect(root: &Path, ethand: Option<&Path>, bpftrace: Option<&Path>) -> Machine {
        let cpu_model = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let commit = match (
            first_line(Command::new("git").arg("-C").arg(root).args([
                "rev-parse",
                "--short",
                "HEAD",
            ])),
            first_line(
                Command::new("git")
                    .arg("-C")
                    .arg(root)
                    .args(["status", "--porcelain"]),
            ),
        ) {
            (Some(c), Some(_)) => format!("{c} (with uncommitted changes)"),
            (Some(c), None) => c,
            (None, _) => "unknown".into(),
        };
        let version = |bin: Option<&Path>| {
            bin.and_then(|b| first_line(Command::new(b).arg("--version")))
                .unwrap_or_else(|| "not run".into())
        };
        Machine {
            date: first_line(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
                .unwrap_or_else(|| "unknown".into()),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            commit,
            ethand_version: version(ethand),
            bpftrace_version: version(bpftrace),
        }
    }
}

/// First non-empty line of a successful command's stdout.
fn first_line(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

pub struct Report<'a> {
    pub results: &'a Results,
    pub info: &'a RunInfo,
}

const COLUMNS: [&str; 8] = [
    "workload",
    "unit",
    "none (ns/event)",
    "ethand (ns/event)",
    "bpftrace (ns/event)",
    "ethand added",
    "bpftrace added",
    "ethand/bpftrace ratio",
];

impl Report<'_> {
    fn ran(&self, mode: Mode) -> bool {
        !self.info.not_run.contains_key(&mode)
    }

    /// A measured value, or why there is none.
    fn cell(&self, mode: Mode, value: Option<f64>, fmt: fn(f64) -> String) -> String {
        match value {
            _ if !self.ran(mode) => "not run".into(),
            Some(v) => fmt(v),
            None => "-".into(),
        }
    }

    /// An added cost with its noise: `+12.3 ±4.5`.
    fn added_cell(&self, mode: Mode, added: Option<f64>, noise: Option<f64>) -> String {
        let cell = self.cell(mode, added, fmt_added);
        match (added, noise) {
            (Some(_), Some(n)) => format!("{cell} ±{}", fmt_ns(n)),
            _ => cell,
        }
    }

    fn ratio(&self, ethand: Option<f64>, bpftrace: Option<f64>) -> String {
        match (ethand, bpftrace) {
            _ if !self.ran(Mode::Ethand) || !self.ran(Mode::Bpftrace) => "not run".into(),
            (Some(e), Some(b)) if b > 0.0 => format!("{:.2}", e / b),
            _ => "n/a".into(),
        }
    }

    /// The table's rows: one per workload, plus the per-switch row derived from ping-pong.
    fn rows(&self) -> Vec<[String; 8]> {
        let r = self.results;
        let mut rows = Vec::new();
        for w in Workload::ALL {
            let added = |mode| r.added_ns(w, mode);
            let added_cell = |mode| self.added_cell(mode, added(mode), r.added_noise_ns(w, mode));
            rows.push([
                w.label().to_string(),
                w.unit().to_string(),
                self.cell(Mode::None, r.median_ns(w, Mode::None), fmt_ns),
                self.cell(Mode::Ethand, r.median_ns(w, Mode::Ethand), fmt_ns),
                self.cell(Mode::Bpftrace, r.median_ns(w, Mode::Bpftrace), fmt_ns),
                added_cell(Mode::Ethand),
                added_cell(Mode::Bpftrace),
                self.ratio(added(Mode::Ethand), added(Mode::Bpftrace)),
            ]);
            if w == Workload::Pingpong {
                let added = |mode| r.switch_added_ns(mode);
                let added_cell = |mode| self.added_cell(mode, added(mode), r.switch_noise_ns(mode));
                rows.push([
                    "context switch (derived)".into(),
                    "switch".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    added_cell(Mode::Ethand),
                    added_cell(Mode::Bpftrace),
                    self.ratio(added(Mode::Ethand), added(Mode::Bpftrace)),
                ]);
            }
        }
        rows
    }

    /// The targets, as (what, ethand's added ns, its noise, the limit).
    fn targets(&self) -> [(&'static str, Option<f64>, Option<f64>, f64); 2] {
        let r = self.results;
        [
            (
                "added per syscall (getpid loop)",
                r.added_ns(Workload::Getpid, Mode::Ethand),
                r.added_noise_ns(Workload::Getpid, Mode::Ethand),
                SYSCALL_TARGET_NS,
            ),
            (
                "added per context switch (derived)",
                r.switch_added_ns(Mode::Ethand),
                r.switch_noise_ns(Mode::Ethand),
                SWITCH_TARGET_NS,
            ),
        ]
    }

    /// One line per target: PASS or FAIL by the median, and whether the margin to the limit
    /// is within the noise (then a rerun on a quieter machine may decide differently).
    fn target_lines(&self) -> Vec<String> {
        self.targets()
            .into_iter()
            .map(|(what, value, noise, limit)| {
                let head = format!("ethand {what} <= {limit:.0} ns:");
                match value {
                    _ if !self.ran(Mode::Ethand) => format!("{head} not measured (ethand not run)"),
                    None => format!("{head} not measured"),
                    Some(v) => {
                        let verdict = if v <= limit { "PASS" } else { "FAIL" };
                        match noise {
                            Some(n) if (v - limit).abs() <= n => format!(
                                "{head} {} ±{} ns -> {verdict} (the margin is within the noise)",
                                fmt_added(v),
                                fmt_ns(n)
                            ),
                            Some(n) => {
                                format!("{head} {} ±{} ns -> {verdict}", fmt_added(v), fmt_ns(n))
                            }
                            None => format!("{head} {} ns -> {verdict}", fmt_added(v)),
                        }
                    }
                }
            })
            .collect()
    }

    /// The table, the TCP throughput and the targets, aligned for a terminal.
    pub fn text(&self) -> String {
        let rows = self.rows();
        let width = |i: usize| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([COLUMNS[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..COLUMNS.len()).map(width).collect();
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i < 2 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_string() + "\n"
        };
        let mut out = line(&COLUMNS.map(String::from));
        for row in &rows {
            out += &line(row);
        }
        out += &format!(
            "\nloopback TCP throughput (median): {}\n\n",
            self.throughput()
        );
        for t in self.target_lines() {
            out += &t;
            out += "\n";
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        self.write_markdown(&mut s).expect("writing to a String");
        s
    }

    fn write_markdown(&self, s: &mut String) -> fmt::Result {
        let info = self.info;
        let m = &info.machine;
        writeln!(
            s,
            "# Performance: what ethand costs the workloads it watches\n"
        )?;
        writeln!(
            s,
            "Generated by `cargo xtask bench` (`xtask/src/bench/`). Rerun it to update this page; \
             do not edit the numbers by hand.\n"
        )?;
        if info.quick {
            writeln!(
                s,
                "> **Quick run** (`--quick`): a smoke test with few iterations. These numbers are \
                 too noisy to quote; run `cargo xtask bench` without `--quick` for the real ones.\n"
            )?;
        }
        writeln!(s, "- Command: `{}`", info.command)?;
        writeln!(s, "- Date: {}", m.date)?;
        writeln!(
            s,
            "- Machine: Linux {}, {} CPUs, {}",
            m.kernel, m.cpus, m.cpu_model
        )?;
        writeln!(s, "- Commit: {}", m.commit)?;
        writeln!(
            s,
            "- Load average (1/5/15 min): {} before, {} after",
            info.load_before, info.load_after
        )?;
        writeln!(
            s,
            "- ethand: {}; bpftrace: {}",
            m.ethand_version, m.bpftrace_version
        )?;
        let it = &info.iters;
        writeln!(
            s,
            "- Rounds: {}; events per run: getpid {}, ping-pong {} round trips, O_DIRECT {} ops \
             (in `{}`), TCP {} sends of 64 KiB ({} MiB)",
            info.rounds,
            it.getpid,
            it.pingpong,
            it.odirect,
            info.io_dir,
            it.tcp_sends,
            it.tcp_sends * 64 / 1024
        )?;
        for (mode, why) in &info.not_run {
            writeln!(s, "- Mode `{}` not run: {why}", mode.name())?;
        }

        writeln!(s, "\n## Results\n")?;
        writeln!(
            s,
            "Medians over the rounds. *added* = median under the mode minus the median with \
             nothing attached, ± its noise (the median absolute deviations of both medians, \
             combined; shown from 3 rounds on); *ratio* = ethand's added cost as a fraction of \
             bpftrace's.\n"
        )?;
        writeln!(s, "| {} |", COLUMNS.join(" | "))?;
        writeln!(s, "|{}", "---|".repeat(COLUMNS.len()))?;
        for row in self.rows() {
            writeln!(s, "| {} |", row.join(" | "))?;
        }
        writeln!(
            s,
            "\nLoopback TCP throughput (median): {}\n",
            self.throughput()
        )?;

        writeln!(s, "## Targets\n")?;
        for t in self.target_lines() {
            writeln!(s, "- {t}")?;
        }

        writeln!(s, "\n## Method\n")?;
        writeln!(s, "{}", METHOD.trim())?;

        writeln!(s, "\n## Checks\n")?;
        writeln!(
            s,
            "- Context switches per ping-pong round trip (getrusage of both processes; expected 2): {}",
            self.per_event_check(Workload::Pingpong, |m| m.switches)
        )?;
        writeln!(
            s,
            "- Block requests per O_DIRECT op (the device's sysfs stat, other IO on it included; \
             expected 1): {}",
            self.per_event_check(Workload::Odirect, |m| m.block_requests)
        )?;
        for (mode, out) in &info.ready_output {
            writeln!(
                s,
                "\nWhat `{}` reported when it was ready:\n\n```\n{}\n```",
                mode.name(),
                out.trim()
            )?;
        }

        writeln!(s, "\n## Raw samples (ns per event, in run order)\n")?;
        writeln!(s, "| workload | mode | samples |\n|---|---|---|")?;
        for w in Workload::ALL {
            for mode in Mode::ALL.into_iter().filter(|&m| self.ran(m)) {
                let samples: Vec<String> = self
                    .results
                    .runs(w, mode)
                    .iter()
                    .map(|m| fmt_ns(m.ns_per_event()))
                    .collect();
                writeln!(
                    s,
                    "| {} | {} | {} |",
                    w.name(),
                    mode.name(),
                    samples.join(", ")
                )?;
            }
        }

        writeln!(
            s,
            "\n## The bpftrace reference (`xtask/src/bench/accounting.bt`)\n"
        )?;
        writeln!(s, "```\n{}\n```", BPFTRACE_SCRIPT.trim())
    }

    /// `none 2.00, ethand 2.01, ...`: the median of a per-event count for each mode that ran.
    fn per_event_check(&self, w: Workload, f: fn(&Measurement) -> Option<u64>) -> String {
        let parts: Vec<String> = Mode::ALL
            .into_iter()
            .filter(|&mode| self.ran(mode))
            .filter_map(|mode| {
                let runs = self.results.runs(w, mode).iter();
                let v = median(
                    runs.filter_map(|m| Some(f(m)? as f64 / m.events as f64))
                        .collect(),
                )?;
                Some(format!("{} {v:.2}", mode.name()))
            })
            .collect();
        parts.join(", ")
    }

    fn throughput(&self) -> String {
        let mbps = |mode| {
            self.results.median_of(Workload::Tcp, mode, |m| {
                m.bytes.unwrap_or(0) as f64 * 1e3 / m.elapsed_ns as f64
            })
        };
        let base = mbps(Mode::None);
        let parts: Vec<String> = Mode::ALL
            .into_iter()
            .filter(|&mode| self.ran(mode))
            .filter_map(|mode| {
                let v = mbps(mode)?;
                let change = match base {
                    Some(b) if mode != Mode::None => format!(" ({:+.1} %)", (v - b) / b * 100.0),
                    _ => String::new(),
                };
                Some(format!("{} {v:.0} MB/s{change}", mode.name()))
            })
            .collect();
        parts.join(", ")
    }
}

const METHOD: &str = "
One run of `cargo xtask bench` interleaves everything: in each round, every mode is set up in
turn (the order rotates from round to round), and under each mode the four workloads run one
after the other, each in a fresh child process (`xtask workload NAME`) that times only its
steady loop (wall-clock). Drift of the machine over the run thus hits all modes alike.

- **none**: nothing attached.
- **ethand**: `ethand run --config CFG` with its default probes (CFG only moves the socket and the
  /metrics port); the workloads start once `ethand status` answers, and the daemon gets SIGTERM
  after them.
- **bpftrace**: the script below, which does in-kernel the accounting ethand does (syscall
  count/errors/time per process and syscall, on/off-CPU time, switches and run-queue wait per
  thread, block request latency per device, socket bytes per process) the usual bpftrace way:
  classic tracepoints and hash maps. The workloads start once all its probes are attached; it
  gets SIGINT after them and its output is discarded.

Every workload runs pinned to one CPU (the last one allowed) together with the process or
thread it talks to, so the whole path of an event, tracer included, is serialized on that CPU
and the elapsed time is its cost, not what parallelism hides or migrations add. The workloads,
and what one event is:

- **getpid loop**: `syscall(SYS_getpid)`; one event is one syscall.
- **pipe ping-pong**: two processes pass one byte back and forth over two pipes; one round trip
  is 2 context switches (each after a wake-up), 2 writes and 2 reads.
- **context switch (derived)**: `switch_added = (round_trip_added - 4 x syscall_added) / 2`, with
  `syscall_added` from the getpid loop. It charges the wake-ups to the switches; if a tracer
  spends more on read/write than on getpid (e.g. latency histograms for blocking syscalls), that
  difference lands here too.
- **O_DIRECT**: 4 KiB `pwrite` and `pread` alternately, on blocks of an 8 MiB file written (and
  fsynced) before the timed loop; one event is one syscall plus one block request.
- **loopback TCP**: 64 KiB `write()`s to a receiver thread over 127.0.0.1; one event is one
  send() call, and the receiver's reads (and the switches between the two threads) are part of
  its cost.

Noise: an added cost means something only where it exceeds its ± (IO latency on a virtual disk
varies by far more than a tracer adds per request). Run the bench on an otherwise idle machine:
the load averages above show how idle it was.
";

fn fmt_ns(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn fmt_added(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:+.0}")
    } else {
        format!("{v:+.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ns_per_event: f64) -> Measurement {
        Measurement {
            elapsed_ns: (ns_per_event * 1000.0) as u64,
            events: 1000,
            ..Measurement::default()
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn switch_cost_is_round_trip_minus_four_syscalls_over_two() {
        let mut r = Results::default();
        r.push(Workload::Getpid, Mode::None, run(100.0));
        r.push(Workload::Getpid, Mode::Ethand, run(150.0)); // +50 per syscall
        r.push(Workload::Pingpong, Mode::None, run(3000.0));
        r.push(Workload::Pingpong, Mode::Ethand, run(3300.0)); // +300 per round trip
        assert_eq!(r.added_ns(Workload::Getpid, Mode::Ethand), Some(50.0));
        assert_eq!(r.switch_added_ns(Mode::Ethand), Some((300.0 - 200.0) / 2.0));
        assert_eq!(r.switch_added_ns(Mode::Bpftrace), None);
    }

    #[test]
    fn modes_that_did_not_run_say_so() {
        let mut r = Results::default();
        for w in Workload::ALL {
            r.push(w, Mode::None, run(1000.0));
            r.push(w, Mode::Bpftrace, run(2000.0));
        }
        let info = RunInfo {
            command: "cargo xtask bench --modes none,bpftrace".into(),
            rounds: 1,
            quick: true,
            iters: Iters::QUICK,
            io_dir: "/var/tmp".into(),
            not_run: BTreeMap::from([(Mode::Ethand, "not requested".into())]),
            ready_output: BTreeMap::new(),
            load_before: "0.00 0.00 0.00".into(),
            load_after: "0.00 0.00 0.00".into(),
            machine: Machine {
                date: "d".into(),
                kernel: "k".into(),
                cpus: 2,
                cpu_model: "c".into(),
                commit: "x".into(),
                ethand_version: "not run".into(),
                bpftrace_version: "v".into(),
            },
        };
        let report = Report {
            results: &r,
            info: &info,
        };
        let md = report.markdown();
        assert!(md.contains(
            "| getpid loop | syscall | 1000 | not run | 2000 | not run | +1000 | not run |"
        ));
        assert!(md.contains("not measured (ethand not run)"));
        assert!(!md.contains("PASS") && !md.contains("FAIL"));
    }
}
