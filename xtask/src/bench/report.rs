//! Turns the samples into the numbers that matter (medians, added ns per event, ratios, the
//! per-switch cost, the targets) and renders them, with ethand's per-program run times: a text
//! table for the terminal and `docs/performance.md`.
//!
//! Invariant: a number is printed only if it was measured; a mode that did not run shows
//! "not run" (with its reason in the document), never a made-up or zero value.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs;
use std::path::Path;
use std::process::Command;

use super::modes::{BPFTRACE_SCRIPT, Mode, ProgramCost};
use super::workloads::{Iters, Measurement, Workload};

/// Added ns per syscall that ethand must stay within.
pub const SYSCALL_TARGET_NS: f64 = 150.0;
/// Added ns per context switch that ethand must stay within.
pub const SWITCH_TARGET_NS: f64 = 50.0;
/// Context switches (each after a wake-up) in one ping-pong round trip.
const SWITCHES_PER_ROUND_TRIP: f64 = 2.0;
/// ethand's programs whose run time the report shows: the per-syscall and per-switch paths.
const COSTED_PROGRAMS: [&str; 4] = [
    "sys_enter_btf",
    "sys_exit_btf",
    "sched_switch_btf",
    "sched_wakeup_btf",
];

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

    /// Added ns per context switch, including the wake-up before it, measured directly:
    /// `mode` is a scheduler-only mode (its tracer does not see the round trip's syscalls), and
    /// a ping-pong round trip is exactly 2 switches and 2 wake-ups:
    /// `switch_added = (pingpong[mode] - pingpong[none]) / 2`.
    pub fn switch_added_ns(&self, mode: Mode) -> Option<f64> {
        Some(self.added_ns(Workload::Pingpong, mode)? / SWITCHES_PER_ROUND_TRIP)
    }

    /// The noise of [`Self::switch_added_ns`]: the round trip's, halved.
    pub fn switch_noise_ns(&self, mode: Mode) -> Option<f64> {
        Some(self.added_noise_ns(Workload::Pingpong, mode)? / SWITCHES_PER_ROUND_TRIP)
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
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
    /// `programs[]` of `ethand status --json` from the untimed run with BPF statistics on, or
    /// why there is none.
    pub program_costs: Result<Vec<ProgramCost>, String>,
    pub machine: Machine,
    /// /proc/loadavg's 1, 5 and 15 minute averages before the first run and after the last.
    pub load_before: String,
    pub load_after: String,
    /// The suites beyond the per-event table (daemon at scale, serving, record, GPU
    /// training), each rendered by its own module, in the order they ran.
    pub sections: Vec<Section>,
}

/// One suite's part of the report: a `## title` and its Markdown body (tables, the command
/// or configuration that made them, targets with PASS/FAIL), plus a terminal summary.
pub struct Section {
    pub title: String,
    pub markdown: String,
    pub text: String,
    /// The suite's measurements as data (every round's figures), for the run's JSON record;
    /// None for the suites whose tables are the record.
    pub record: Option<serde_json::Value>,
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

/// A limit on ethand's added cost, and what was measured against it.
struct Target {
    what: &'static str,
    /// The mode the value comes from.
    mode: Mode,
    /// ethand's added ns, and its noise.
    value: Option<f64>,
    noise: Option<f64>,
    limit: f64,
    /// The kernel's floor for the same event (a `floor*` mode) and its added ns.
    floor: (Mode, Option<f64>),
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
    /// The per-event table as data, for scripts (`xtask bench --json`; scripts/gpu-event-costs.sh):
    /// per workload and mode that ran, the median ns per event, the added ns over `none` and
    /// its noise (null with fewer than 3 rounds), and the per-switch cost of each
    /// scheduler-only mode. Modes that did not run are listed with the reason.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        let r = self.results;
        let mut workloads = Map::new();
        for w in Workload::ALL {
            let mut modes = Map::new();
            for mode in Mode::ALL.into_iter().filter(|m| self.ran(*m)) {
                let Some(median) = r.median_ns(w, mode) else {
                    continue;
                };
                let (added, noise) = if mode == Mode::None {
                    (None, None)
                } else {
                    (r.added_ns(w, mode), r.added_noise_ns(w, mode))
                };
                // Every round's figure, in run order: the record the medians come from.
                let samples_ns: Vec<f64> =
                    r.runs(w, mode).iter().map(|m| m.ns_per_event()).collect();
                modes.insert(
                    mode.name().into(),
                    json!({
                        "median_ns": median,
                        "added_ns": added,
                        "added_noise_ns": noise,
                        "samples_ns": samples_ns,
                    }),
                );
            }
            if !modes.is_empty() {
                workloads.insert(
                    w.name().into(),
                    json!({"label": w.label(), "unit": w.unit(), "modes": modes}),
                );
            }
        }
        let mut switch = Map::new();
        for mode in [Mode::EthandSched, Mode::BpftraceSched, Mode::FloorSched] {
            if let (true, Some(added)) = (self.ran(mode), r.switch_added_ns(mode)) {
                switch.insert(
                    mode.name().into(),
                    json!({"added_ns": added, "added_noise_ns": r.switch_noise_ns(mode)}),
                );
            }
        }
        let not_run: Map<String, Value> = self
            .info
            .not_run
            .iter()
            .map(|(m, why)| (m.name().to_string(), Value::from(why.as_str())))
            .collect();
        let sections: Map<String, Value> = self
            .info
            .sections
            .iter()
            .filter_map(|sec| Some((sec.title.clone(), sec.record.clone()?)))
            .collect();
        let m = &self.info.machine;
        json!({
            "command": self.info.command,
            "date": m.date,
            "machine": {
                "kernel": m.kernel,
                "cpus": m.cpus,
                "cpu_model": m.cpu_model,
                "commit": m.commit,
                "ethand_version": m.ethand_version,
                "bpftrace_version": m.bpftrace_version,
            },
            "rounds": self.info.rounds,
            "quick": self.info.quick,
            "workloads": workloads,
            "per_switch": switch,
            "not_run": not_run,
            "sections": sections,
        })
    }

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

    /// ethand's added cost over bpftrace's, `modes` being the (ethand, bpftrace) modes compared.
    fn ratio(&self, modes: (Mode, Mode), ethand: Option<f64>, bpftrace: Option<f64>) -> String {
        match (ethand, bpftrace) {
            _ if !self.ran(modes.0) || !self.ran(modes.1) => "not run".into(),
            (Some(e), Some(b)) if b > 0.0 => format!("{:.2}", e / b),
            _ => "n/a".into(),
        }
    }

    /// The table's rows: one per workload under the full modes; after the ping-pong, the
    /// ping-pong under the scheduler-only modes and the per-switch cost taken from it.
    fn rows(&self) -> Vec<[String; 8]> {
        let r = self.results;
        let mut rows = Vec::new();
        for w in Workload::ALL {
            rows.push(self.workload_row(w, w.label().to_string(), (Mode::Ethand, Mode::Bpftrace)));
            if w == Workload::Pingpong {
                let sched = (Mode::EthandSched, Mode::BpftraceSched);
                rows.push(self.workload_row(
                    w,
                    format!(
                        "{}, scheduler probes only ({}, {})",
                        w.label(),
                        sched.0.name(),
                        sched.1.name()
                    ),
                    sched,
                ));
                let added = |mode| r.switch_added_ns(mode);
                let added_cell = |mode| self.added_cell(mode, added(mode), r.switch_noise_ns(mode));
                rows.push([
                    "context switch (direct: ping-pong with scheduler probes only, / 2)".into(),
                    "per switch, including its wakeup".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    added_cell(sched.0),
                    added_cell(sched.1),
                    self.ratio(sched, added(sched.0), added(sched.1)),
                ]);
            }
        }
        rows
    }

    /// One workload's row, with `modes` (ethand's, bpftrace's) in the tracer columns.
    fn workload_row(&self, w: Workload, label: String, modes: (Mode, Mode)) -> [String; 8] {
        let r = self.results;
        let added = |mode| r.added_ns(w, mode);
        let added_cell = |mode| self.added_cell(mode, added(mode), r.added_noise_ns(w, mode));
        [
            label,
            w.unit().to_string(),
            self.cell(Mode::None, r.median_ns(w, Mode::None), fmt_ns),
            self.cell(modes.0, r.median_ns(w, modes.0), fmt_ns),
            self.cell(modes.1, r.median_ns(w, modes.1), fmt_ns),
            added_cell(modes.0),
            added_cell(modes.1),
            self.ratio(modes, added(modes.0), added(modes.1)),
        ]
    }

    fn targets(&self) -> [Target; 2] {
        let r = self.results;
        [
            Target {
                what: "added per syscall (getpid loop)",
                mode: Mode::Ethand,
                value: r.added_ns(Workload::Getpid, Mode::Ethand),
                noise: r.added_noise_ns(Workload::Getpid, Mode::Ethand),
                limit: SYSCALL_TARGET_NS,
                floor: (
                    Mode::FloorClock,
                    r.added_ns(Workload::Getpid, Mode::FloorClock),
                ),
            },
            Target {
                what: "added per context switch, including its wakeup (direct: ping-pong under \
                       ethand-sched)",
                mode: Mode::EthandSched,
                value: r.switch_added_ns(Mode::EthandSched),
                noise: r.switch_noise_ns(Mode::EthandSched),
                limit: SWITCH_TARGET_NS,
                floor: (Mode::FloorSched, r.switch_added_ns(Mode::FloorSched)),
            },
        ]
    }

    /// One line per target: PASS or FAIL by the median, unless the noise is larger than the
    /// margin to the limit: then the run cannot tell, and says so.
    fn target_lines(&self) -> Vec<String> {
        self.targets()
            .into_iter()
            .map(
                |Target {
                     what,
                     mode,
                     value,
                     noise,
                     limit,
                     floor,
                 }| {
                    let head = format!("ethand {what} <= {limit:.0} ns:");
                    let line = match value {
                        _ if !self.ran(mode) => {
                            format!("{head} not measured ({} not run)", mode.name())
                        }
                        None => format!("{head} not measured"),
                        Some(v) => match noise {
                            Some(n) => format!(
                                "{head} {} ±{} ns -> {}",
                                fmt_added(v),
                                fmt_ns(n),
                                verdict(v, Some(n), limit)
                            ),
                            None => {
                                format!("{head} {} ns -> {}", fmt_added(v), verdict(v, None, limit))
                            }
                        },
                    };
                    match (value, floor.1) {
                        (Some(v), Some(f)) if self.ran(floor.0) => format!(
                            "{line}; the kernel's floor for the same event (mode {}) is {} ns, \
                             ethand's own work above it {} ns",
                            floor.0.name(),
                            fmt_added(f),
                            fmt_added(v - f)
                        ),
                        _ => line,
                    }
                },
            )
            .collect()
    }

    /// ethand's added cost next to the kernel's floor for the same events: what empty programs
    /// on the same hooks add (`floor`, `floor-sched`) and with the clock read a timed syscall
    /// needs (`floor-clock`).
    fn floor_rows(&self) -> Vec<[String; 6]> {
        let r = self.results;
        let cell = |mode, v: Option<f64>| self.cell(mode, v, fmt_added);
        let above = |e: Option<f64>, f: Option<f64>| match (e, f) {
            (Some(e), Some(f)) => fmt_added(e - f),
            _ => "-".into(),
        };
        let mut rows = Vec::new();
        for w in [Workload::Getpid, Workload::Pingpong] {
            let e = r.added_ns(w, Mode::Ethand);
            let fc = r.added_ns(w, Mode::FloorClock);
            rows.push([
                w.label().to_string(),
                w.unit().to_string(),
                cell(Mode::Ethand, e),
                cell(Mode::Floor, r.added_ns(w, Mode::Floor)),
                cell(Mode::FloorClock, fc),
                above(e, fc),
            ]);
        }
        let e = r.switch_added_ns(Mode::EthandSched);
        let f = r.switch_added_ns(Mode::FloorSched);
        rows.push([
            "context switch (ping-pong with scheduler probes only, / 2)".into(),
            "per switch, including its wakeup".into(),
            cell(Mode::EthandSched, e),
            cell(Mode::FloorSched, f),
            "- (no helper: ethand reads the run queue's clock)".into(),
            above(e, f),
        ]);
        rows
    }

    /// The per-program table: (program, runs, ns/run) for [`COSTED_PROGRAMS`], or why there
    /// are no figures.
    fn program_rows(&self) -> Result<Vec<[String; 3]>, String> {
        let costs = self.info.program_costs.as_ref().map_err(Clone::clone)?;
        Ok(COSTED_PROGRAMS
            .iter()
            .map(|&name| match costs.iter().find(|c| c.name == name) {
                Some(c) => [
                    name.to_string(),
                    c.run_count.to_string(),
                    c.ns_per_run().map_or_else(|| "no runs".into(), fmt_ns),
                ],
                None => [name.to_string(), "-".into(), "not loaded".into()],
            })
            .collect())
    }

    /// The table, the TCP throughput, the targets and the program run times, aligned for a
    /// terminal.
    pub fn text(&self) -> String {
        let rows: Vec<Vec<String>> = self.rows().into_iter().map(Vec::from).collect();
        let mut out = aligned(&COLUMNS, &rows, 2);
        out += &format!(
            "\nloopback TCP throughput (median): {}\n\n",
            self.throughput()
        );
        for t in self.target_lines() {
            out += &t;
            out += "\n";
        }
        out += &format!("\n{FLOOR_TITLE}\n");
        let rows: Vec<Vec<String>> = self.floor_rows().into_iter().map(Vec::from).collect();
        out += &aligned(&FLOOR_COLUMNS, &rows, 2);
        out += &format!("\n{PROGRAMS_TITLE}\n");
        match self.program_rows() {
            Ok(rows) => {
                let rows: Vec<Vec<String>> = rows.into_iter().map(Vec::from).collect();
                out += &aligned(&PROGRAM_COLUMNS, &rows, 1);
            }
            Err(why) => out += &format!("not measured: {why}\n"),
        }
        for sec in &self.info.sections {
            out += &format!("\n{}\n{}\n", sec.title, sec.text.trim_end());
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        self.write_markdown(&mut s).expect("writing to a String");
        s
    }

    fn write_markdown(&self, s: &mut String) -> fmt::Result {
        self.write_header(s)?;
        self.write_results(s)?;
        self.write_floor(s)?;
        self.write_program_times(s)?;
        // The other suites' sections, in the order they ran.
        for sec in &self.info.sections {
            writeln!(s, "\n## {}\n", sec.title)?;
            writeln!(s, "{}", sec.markdown.trim_end())?;
        }
        self.write_method_and_checks(s)?;
        self.write_bpftrace_reference(s)
    }

    /// The title, what the page is, and how the run was made: command, machine, sizes, the
    /// modes that did not run.
    fn write_header(&self, s: &mut String) -> fmt::Result {
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
        writeln!(
            s,
            "Analysis of where the cost goes: [performance-analysis.md](performance-analysis.md).\n"
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
             (in `{}`), TCP {} sends of 64 KiB ({} MiB), uprobe {} cuLaunchKernel calls",
            info.rounds,
            it.getpid,
            it.pingpong,
            it.odirect,
            info.io_dir,
            it.tcp_sends,
            it.tcp_sends * 64 / 1024,
            it.uprobe
        )?;
        for (mode, why) in &info.not_run {
            writeln!(s, "- Mode `{}` not run: {why}", mode.name())?;
        }
        Ok(())
    }

    /// The per-event table, the TCP throughput and the targets.
    fn write_results(&self, s: &mut String) -> fmt::Result {
        writeln!(s, "\n## Results\n")?;
        writeln!(
            s,
            "Medians over the rounds. *added* = median under the mode minus the median with \
             nothing attached, ± its noise (the median absolute deviations of both medians, \
             combined; shown from 3 rounds on); *ratio* = ethand's added cost as a fraction of \
             bpftrace's. In the two scheduler-only rows the ethand and bpftrace columns are the \
             modes `ethand-sched` and `bpftrace-sched`.\n"
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
        Ok(())
    }

    /// The kernel's floor next to ethand's added cost.
    fn write_floor(&self, s: &mut String) -> fmt::Result {
        writeln!(s, "\n## {FLOOR_TITLE}\n")?;
        writeln!(s, "{}\n", FLOOR_NOTE.trim())?;
        writeln!(s, "| {} |", FLOOR_COLUMNS.join(" | "))?;
        writeln!(s, "|{}", "---|".repeat(FLOOR_COLUMNS.len()))?;
        for row in self.floor_rows() {
            writeln!(s, "| {} |", row.join(" | "))?;
        }
        Ok(())
    }

    /// ethand's programs' run times, or why there are none.
    fn write_program_times(&self, s: &mut String) -> fmt::Result {
        writeln!(s, "\n## {PROGRAMS_TITLE}\n")?;
        writeln!(s, "{}\n", PROGRAMS_NOTE.trim())?;
        match self.program_rows() {
            Ok(rows) => {
                writeln!(s, "| {} |", PROGRAM_COLUMNS.join(" | "))?;
                writeln!(s, "|{}", "---|".repeat(PROGRAM_COLUMNS.len()))?;
                for row in rows {
                    writeln!(s, "| {} |", row.join(" | "))?;
                }
            }
            Err(why) => writeln!(s, "Not measured: {why}")?,
        }
        Ok(())
    }

    /// How the per-event table was measured, and the checks of its events.
    fn write_method_and_checks(&self, s: &mut String) -> fmt::Result {
        writeln!(s, "\n## Method (per-event table)\n")?;
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
        writeln!(
            s,
            "- cuLaunchKernel calls ethand counted per call made, warm-up included (`gpu.launches` \
             of the workload process in `ethand snapshot --pid PID --json`, read before it \
             exits; expected 1): {}",
            self.launch_count_check()
        )?;
        for (mode, out) in &self.info.ready_output {
            writeln!(
                s,
                "\nWhat `{}` reported when it was ready:\n\n```\n{}\n```",
                mode.name(),
                out.trim()
            )?;
        }

        writeln!(
            s,
            "\nThe raw samples (ns per event, in run order) are in this run's record under \
             `bench/results/events/` (`cargo xtask bench --json`).\n"
        )
    }

    /// The bpftrace script of the bpftrace modes, and which part the scheduler-only one runs.
    fn write_bpftrace_reference(&self, s: &mut String) -> fmt::Result {
        writeln!(
            s,
            "\n## The bpftrace reference (`xtask/src/bench/accounting.bt`)\n"
        )?;
        writeln!(
            s,
            "The `bpftrace-sched` mode runs the part between `// [sched]` and `// [/sched]`, with \
             an END block of the `clear()` calls of that part's maps.\n"
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

    /// `1.00 (55000 of 55000, 55000 of 55000)`: ethand's launch counts against the calls made,
    /// per run under the ethand mode.
    fn launch_count_check(&self) -> String {
        if !self.ran(Mode::Ethand) {
            return "not measured (ethand not run)".into();
        }
        let runs: Vec<(u64, u64)> = self
            .results
            .runs(Workload::Uprobe, Mode::Ethand)
            .iter()
            .filter_map(|m| Some((m.counted?, m.calls?)))
            .collect();
        if runs.is_empty() {
            return "not measured".into();
        }
        let ratio = median(runs.iter().map(|&(c, n)| c as f64 / n as f64).collect());
        let exact = runs.iter().all(|&(c, n)| c == n);
        let each: Vec<String> = runs.iter().map(|(c, n)| format!("{c} of {n}")).collect();
        format!(
            "{:.2} ({}){}",
            ratio.unwrap_or(0.0),
            each.join(", "),
            if exact { ", exact" } else { ", NOT exact" }
        )
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
turn (the order rotates from round to round), and under each mode the five workloads run one
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
- **ethand-sched**: as **ethand**, with CFG also turning off every probe family but the
  scheduler's (`[probes]` `syscalls`, `block`, `net`, `lifecycle` = false): only
  sched_switch and sched_wakeup_new are attached (and sched_wakeup, on kernels that do not keep
  each task's run-queue wait). Runs the ping-pong only.
- **bpftrace-sched**: as **bpftrace**, with only the scheduler part of the script
  (sched_wakeup, sched_switch, sched_process_exit; generated from the script below). Runs the
  ping-pong only.
- **floor**, **floor-clock**, **floor-sched**: `xtask floor-probes`, empty BPF programs on the
  hooks ethand's per-syscall and per-switch paths use (see *The kernel's floor* above). floor
  and floor-clock run the getpid loop and the ping-pong, floor-sched the ping-pong only.

The scheduler-only and floor modes take their turn in the same rounds as the others.

Every workload runs pinned to one CPU (the last one allowed) together with the process or
thread it talks to, so the whole path of an event, tracer included, is serialized on that CPU
and the elapsed time is its cost, not what parallelism hides or migrations add. The workloads,
and what one event is:

- **getpid loop**: `syscall(SYS_getpid)`; one event is one syscall.
- **pipe ping-pong**: two processes pass one byte back and forth over two pipes; one round trip
  is 2 context switches (each after a wake-up), 2 writes and 2 reads.
- **context switch (direct)**: `(pingpong[X-sched] - pingpong[none]) / 2`, per switch including
  the wake-up before it. Under a scheduler-only mode the tracer sees none of the round trip's 4
  syscalls, and a round trip is exactly 2 switches and 2 wake-ups (the Checks below count the
  switches), so the difference is the scheduler probes' cost alone: no syscall share is
  estimated and subtracted. Its ± is the ping-pong's, halved. A target is PASS or FAIL only
  where the margin to the limit is larger than that noise; otherwise it is reported
  inconclusive.
- **O_DIRECT**: 4 KiB `pwrite` and `pread` alternately, on blocks of an 8 MiB file written (and
  fsynced) before the timed loop; one event is one syscall plus one block request.
- **loopback TCP**: 64 KiB `write()`s to a receiver thread over 127.0.0.1; one event is one
  send() call, and the receiver's reads (and the switches between the two threads) are part of
  its cost.
- **uprobe**: a stand-in libcuda (`tests/standins/cuda.c`, the end-to-end tests' library,
  compiled at bench start with `cc -O2 -fPIC -shared` as `libcuda.so.1` in the bench's temporary
  directory) is loaded with `dlopen`, then `cuLaunchKernel` is called in a loop (a tenth as
  warm-up, then the timed calls); one event is one call, i.e. one uprobe hit. The timing starts
  only once the tracer has attached to that library: the workload prints `ready` after
  `dlopen` and waits for `go` on stdin; under ethand, which finds libraries by rescanning
  `/proc/PID/maps` (`[gpu]` `rescan_interval_ms`, 2 s by default) and attaches once per file,
  `go` comes when `ethand status --json` lists the file (by inode) in `gpu_libraries` as
  attached; bpftrace attached by path when it started. ethand runs at its default GPU level,
  `process`: an entry uprobe only on launches (no uretprobe), whose program adds 1 to the
  call count of (process, start time, op) in one hash map; the bpftrace script does
  `@launches[pid] = count()` on an entry uprobe. After the loop, with the workload process
  still alive, `ethand snapshot --pid PID --json` must show exactly the calls made (see
  Checks).

Noise: an added cost means something only where it exceeds its ± (IO latency on a virtual disk
varies by far more than a tracer adds per request). Run the bench on an otherwise idle machine:
the load averages above show how idle it was.
";

const FLOOR_TITLE: &str = "The kernel's floor: empty programs on the same hooks";
const FLOOR_NOTE: &str = "
What any BPF accounting on these hooks costs before it does any work, measured in the same
rounds: the `floor` modes run `xtask floor-probes` (`xtask/src/bench/floor.rs`), which attaches
hand-assembled raw tracepoint programs (`r0 = 0; exit`; the same dispatch as ethand's `tp_btf`
programs) to `sys_enter`, `sys_exit` and `sched_switch` (`floor`), the same with one
`bpf_ktime_get_ns()` in each syscall program, which timing a syscall needs (`floor-clock`), or to
the scheduler hook only (`floor-sched`). Each also puts one on `sched_wakeup` only where ethand
does, on kernels that do not keep each task's run-queue wait themselves (what each floor mode
attached is in *Checks*). A program on `sys_enter` or `sys_exit` also
sends every syscall of every task through the kernel's slow syscall path. *Above the floor* is
ethand's added cost minus `floor-clock`'s (`floor-sched`'s for the switch): its own work.
";
const FLOOR_COLUMNS: [&str; 6] = [
    "workload",
    "unit",
    "ethand added (ns)",
    "empty programs added (floor, floor-sched)",
    "with a clock read per syscall program (floor-clock)",
    "ethand above the floor",
];
const PROGRAMS_TITLE: &str = "BPF program run time (ns/run, kernel BPF statistics)";
const PROGRAM_COLUMNS: [&str; 3] = ["program", "runs", "ns/run"];
const PROGRAMS_NOTE: &str = "
For information; not part of the timed modes. After the rounds, one more `ethand run` (default
probes, plus `[daemon]` `bpf_stats = \"always\"`) ran during one getpid run and one ping-pong run;
then `ethand status --json` gave each program's `run_count` and `run_time_ns`, and ns/run is
their quotient. The counts are system-wide (every syscall and switch on the machine meanwhile).
The kernel times the program alone: the tracepoint dispatch around it is not included, nor the
statistics' own cost (about 100 ns per run, which is why no timed mode turns them on).
";

/// PASS or FAIL by the median; "inconclusive" when the noise is larger than the margin to the
/// limit, since a rerun could then land on either side.
fn verdict(value: f64, noise: Option<f64>, limit: f64) -> String {
    let verdict = if value <= limit { "PASS" } else { "FAIL" };
    match noise {
        Some(n) if n > (value - limit).abs() => {
            format!("inconclusive (noise ±{} ns)", fmt_ns(n))
        }
        Some(_) => verdict.into(),
        None => format!("{verdict} (no noise estimate: fewer than 3 rounds)"),
    }
}

/// `rows` under `header`, columns padded to their widest cell: the first `left` columns
/// left-aligned, the others right-aligned.
fn aligned(header: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        cells.join("  ").trim_end().to_string() + "\n"
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = line(&header);
    for row in rows {
        out += &line(row);
    }
    out
}

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
mod tests;
