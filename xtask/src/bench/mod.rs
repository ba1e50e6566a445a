//! `cargo xtask bench`: ethand's overhead per event against no tracing and against bpftrace.
//!
//! - `workloads`: the five timed loops (and the record suite's load generator), each run in a
//!   child process;
//! - `modes`: what is attached while they run (nothing, ethand, bpftrace, and each tracer with
//!   its scheduler probes only), as stop-on-drop guards;
//! - `report`: medians, added cost, ratios, targets; the terminal table and `docs/performance.md`.
//!
//! This module only validates the options, interleaves rounds x modes x workloads, and then
//! reads ethand's per-program run times in one extra, untimed run.

pub mod floor;
mod gpu_results;
pub mod map_read;
mod modes;
mod pyframes;
mod record;
mod report;
pub mod scale;
mod series;
mod serving;
mod stacks;
pub mod workloads;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use std::{env, fs, process, thread};

use anyhow::{Context, Result, bail, ensure};

use modes::{Mode, ProgramCost, Tools};
use report::{Machine, Report, Results, RunInfo};
use workloads::{Iters, Workload};

/// Pause after a mode's workloads, so that a tracer's teardown does not run into the next mode.
const SETTLE: Duration = Duration::from_millis(500);

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Rounds; each round runs every workload under every mode.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// The ethand binary [default: $CARGO_TARGET_DIR/release/ethand, i.e. target/release/ethand,
    /// built with `cargo build --release -p ethand` if missing].
    #[arg(long, value_name = "PATH")]
    ethand: Option<PathBuf>,
    /// The bpftrace binary; if it is not found, the bpftrace columns say "not run".
    #[arg(long, value_name = "PATH", default_value = "bpftrace")]
    bpftrace: PathBuf,
    /// Where to write the Markdown report [default: docs/performance.md in the workspace].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Write the run's record as JSON here (per workload and mode: median, added ns, its noise
    /// and every round's sample; the per-switch cost; the machine) [default: a full run that
    /// writes docs/performance.md keeps it as bench/results/events/DATE.json].
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Fewer iterations (a tenth): a smoke run, too noisy to publish.
    #[arg(long)]
    quick: bool,
    /// The modes to run; `none` (the baseline) is required.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mode::ALL)]
    modes: Vec<Mode>,
    /// Directory of the O_DIRECT test file; must be on a block device (not tmpfs).
    #[arg(long, value_name = "DIR", default_value = workloads::DEFAULT_IO_DIR)]
    io_dir: PathBuf,
    /// The suites to run: `events` is the per-event table against bpftrace; the others are
    /// sections after it.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Suite::ALL)]
    suites: Vec<Suite>,
    /// The training benchmark's results: docs/perf-gpu-training.md (the section links to it
    /// and carries its generated pooled figure) or a `gpu-bench.md` of `scripts/gpu-bench.sh`
    /// (included whole).
    #[arg(long, value_name = "PATH")]
    gpu_results: Option<PathBuf>,
    /// Suites `scale` and `serving`: also profile the daemon with `perf record` (during the
    /// loaded window; during the GETs of /metrics): top symbols in the report, full reports in
    /// $TMPDIR/ethand-bench-{scale,serving}-perf.txt.
    #[arg(long)]
    perf: bool,
}

/// The parts of the bench. Every suite interleaves its own comparisons; the report holds them
/// all.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, clap::ValueEnum)]
pub enum Suite {
    /// Per-event cost of each probe family against bpftrace (the main table).
    Events,
    /// The daemon with 1,000 live processes and 100 births/s: its CPU share and RSS.
    Scale,
    /// /metrics with 10,000 series, OTLP export of the same, `ethand snapshot` latency.
    Serving,
    /// `ethand record`: events per second into the ring buffer before drops.
    Record,
    /// A real Prometheus scraping the daemon at its defaults for 10 minutes under the scale
    /// load (head series, flapping), and the daemon's VmHWM under heavy churn.
    Series,
    /// Call-site stacks of probed GPU calls, per call; the snapshot's CPU profile, as the
    /// slowdown of a busy and a launch-bound loop during its window.
    Stacks,
    /// The in-kernel walk of a CPython caller's frames at a GPU call, per call, at two depths.
    Pyframes,
}

impl Suite {
    pub const ALL: [Suite; 7] = [
        Suite::Events,
        Suite::Scale,
        Suite::Serving,
        Suite::Record,
        Suite::Series,
        Suite::Stacks,
        Suite::Pyframes,
    ];
}

/// What a suite beyond the per-event table gets to run with.
pub struct SuiteCtx<'a> {
    /// None when ethand is not part of this run.
    pub ethand: Option<&'a Path>,
    /// A private directory, removed after the run.
    pub tmp: &'a Path,
    pub quick: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?
        .to_path_buf();
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    ensure!(
        args.io_dir.is_dir(),
        "--io-dir {} is not a directory",
        args.io_dir.display()
    );

    let (mut modes, mut not_run) = requested_modes(&args.modes)?;
    let (ethand, bpftrace) =
        find_tracers(&mut modes, &mut not_run, args.ethand, &args.bpftrace, &root)?;
    let iters = if args.quick {
        Iters::QUICK
    } else {
        Iters::FULL
    };
    let tmp = TempDir::new("ethand-bench")?;
    // The uprobe workload's stand-in libcuda, probed by path by the bpftrace mode.
    let cuda = if args.suites.contains(&Suite::Events) {
        Some(workloads::build_cuda_standin(&root, tmp.path())?)
    } else {
        None
    };
    let tools = Tools {
        ethand,
        bpftrace,
        cuda,
    };
    let load_before = report::load_average();

    let events = args.suites.contains(&Suite::Events);
    let (results, ready_output) = run_event_rounds(
        &modes,
        &tools,
        tmp.path(),
        &iters,
        &args.io_dir,
        args.rounds,
        events,
    )?;

    let program_costs = measure_program_costs(&tools, events, tmp.path(), &iters, &args.io_dir);

    let ctx = SuiteCtx {
        ethand: tools.ethand.as_deref(),
        tmp: tmp.path(),
        quick: args.quick,
    };
    let mut sections = run_suites(&args.suites, &ctx, args.perf)?;
    let out_was_default = args.out.is_none();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("docs").join("performance.md"));
    if let Some(path) = &args.gpu_results {
        let raw = fs::read_to_string(path)
            .with_context(|| format!("reading --gpu-results {}", path.display()))?;
        sections.push(gpu_results::section(&raw, path, &out));
    }

    let machine = Machine::detect(&root, tools.ethand.as_deref(), tools.bpftrace.as_deref());
    let info = RunInfo {
        command: command_line(),
        rounds: args.rounds,
        quick: args.quick,
        iters,
        io_dir: args.io_dir.display().to_string(),
        not_run,
        ready_output,
        program_costs,
        machine,
        load_before,
        load_after: report::load_average(),
        sections,
    };
    let report = Report {
        results: &results,
        info: &info,
    };
    print!("\n{}", report.text());
    write_page(&out, &report)?;
    // A published run (default page, full length) keeps its record, raw samples included,
    // under bench/results/events/: the page holds the current tables, the records the history.
    let published = out_was_default && !args.quick;
    let record = record_path(args.json.clone(), published, &info.machine.date, &root);
    if let Some(path) = &record {
        write_record(path, &report)?;
    }
    Ok(())
}

/// `--modes` without repeats, which must include `none`; and the modes left out, with why.
fn requested_modes(requested: &[Mode]) -> Result<(Vec<Mode>, BTreeMap<Mode, String>)> {
    let mut modes: Vec<Mode> = Vec::new();
    for m in requested {
        if !modes.contains(m) {
            modes.push(*m);
        }
    }
    ensure!(
        modes.contains(&Mode::None),
        "--modes must include `none`: it is the baseline every added cost is measured against"
    );
    let not_run: BTreeMap<Mode, String> = Mode::ALL
        .into_iter()
        .filter(|m| !modes.contains(m))
        .map(|m| (m, "not requested (--modes)".to_string()))
        .collect();
    Ok((modes, not_run))
}

/// The ethand and bpftrace binaries the modes need (root required for any tracing mode). A
/// missing bpftrace drops its modes, into `not_run`.
fn find_tracers(
    modes: &mut Vec<Mode>,
    not_run: &mut BTreeMap<Mode, String>,
    ethand: Option<PathBuf>,
    bpftrace: &Path,
    root: &Path,
) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    let tracing = modes.iter().any(|&m| m != Mode::None);
    ensure!(
        !tracing || unsafe { libc::geteuid() } == 0,
        "the ethand and bpftrace modes load BPF programs: run as root, or use --modes none"
    );
    let ethand = if modes.iter().any(|m| m.runs_ethand()) {
        Some(resolve_ethand(ethand, root)?)
    } else {
        None
    };
    let bpftrace = if modes.iter().any(|m| m.runs_bpftrace()) {
        let found = find_executable(bpftrace);
        if found.is_none() {
            let why = format!("{} not found", bpftrace.display());
            for m in modes.iter().filter(|m| m.runs_bpftrace()) {
                eprintln!("[bench] {} mode skipped: {why}", m.name());
                not_run.insert(*m, why.clone());
            }
            modes.retain(|m| !m.runs_bpftrace());
        }
        found
    } else {
        None
    };
    Ok((ethand, bpftrace))
}

/// The per-event table's runs: rounds x modes (order rotated) x the mode's workloads, none
/// unless `events`. Returns the measurements and what each tracer said when first ready.
fn run_event_rounds(
    modes: &[Mode],
    tools: &Tools,
    tmp: &Path,
    iters: &Iters,
    io_dir: &Path,
    rounds: u32,
    events: bool,
) -> Result<(Results, BTreeMap<Mode, String>)> {
    let mut results = Results::default();
    let mut ready_output = BTreeMap::new();
    for round in (0..rounds as usize).filter(|_| events) {
        for k in 0..modes.len() {
            let mode = modes[(round + k) % modes.len()];
            eprintln!("[bench] round {}/{}, {}", round + 1, rounds, mode.name());
            let mut tracer = modes::attach(mode, tools, tmp)?;
            if let Some(t) = &tracer {
                ready_output
                    .entry(mode)
                    .or_insert_with(|| t.ready_output.clone());
            }
            for &w in mode.workloads() {
                let m = modes::measure(
                    w,
                    iters.of(w),
                    io_dir,
                    tracer.as_mut(),
                    tools.cuda.as_deref(),
                )?;
                eprintln!(
                    "[bench]   {:<9} {:>10} ns per {}",
                    w.name(),
                    format!("{:.1}", m.ns_per_event()),
                    w.unit()
                );
                results.push(w, mode, m);
            }
            if let Some(t) = tracer {
                t.finish()?;
            }
            thread::sleep(SETTLE);
        }
    }
    Ok((results, ready_output))
}

/// ethand's per-program run times in one untimed run under getpid and ping-pong, or why
/// there are none.
fn measure_program_costs(
    tools: &Tools,
    events: bool,
    tmp: &Path,
    iters: &Iters,
    io_dir: &Path,
) -> Result<Vec<ProgramCost>, String> {
    match &tools.ethand {
        Some(_) if !events => Err("the events suite was not run (--suites)".to_string()),
        Some(bin) => {
            eprintln!(
                "[bench] BPF program run times: ethand with bpf_stats = \"always\", under getpid \
                 and ping-pong (untimed)"
            );
            modes::ethand_program_costs(bin, tmp, "", |_| {
                for w in [Workload::Getpid, Workload::Pingpong] {
                    workloads::measure(w, iters.of(w), io_dir)?;
                }
                Ok(())
            })
            .map_err(|e| {
                eprintln!("[bench] BPF program run times not measured: {e:#}");
                format!("failed: {e:#}")
            })
        }
        None => Err("ethand not run".to_string()),
    }
}

/// The sections of the suites beyond the per-event table, in Suite order. A suite that fails
/// gets a section that says so (record's failure ends the run).
fn run_suites(suites: &[Suite], ctx: &SuiteCtx, perf: bool) -> Result<Vec<report::Section>> {
    let mut sections: Vec<report::Section> = Vec::new();
    // Each suite module pushes its section here, in Suite order.
    if suites.contains(&Suite::Scale) {
        sections.push(scale::run(ctx, perf).unwrap_or_else(|e| scale::failed("scale", e)));
    }
    if suites.contains(&Suite::Serving) {
        sections.push(serving::run(ctx, perf).unwrap_or_else(|e| scale::failed("serving", e)));
    }
    if suites.contains(&Suite::Record) {
        match ctx.ethand {
            Some(_) => sections.push(record::run(ctx)?),
            None => eprintln!("[bench] record suite skipped: ethand not run (--modes)"),
        }
    }
    if suites.contains(&Suite::Series) {
        sections.push(series::run(ctx).unwrap_or_else(|e| scale::failed("series", e)));
    }
    if suites.contains(&Suite::Stacks) {
        match ctx.ethand {
            Some(_) => {
                sections.push(stacks::run(ctx).unwrap_or_else(|e| scale::failed("stacks", e)))
            }
            None => eprintln!("[bench] stacks suite skipped: ethand not run (--modes)"),
        }
    }
    if suites.contains(&Suite::Pyframes) {
        match ctx.ethand {
            Some(_) => {
                sections.push(pyframes::run(ctx).unwrap_or_else(|e| scale::failed("pyframes", e)))
            }
            None => eprintln!("[bench] pyframes suite skipped: ethand not run (--modes)"),
        }
    }
    Ok(sections)
}

/// The Markdown page at `out`.
fn write_page(out: &Path, report: &Report) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(out, report.markdown()).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("[bench] wrote {}", out.display());
    Ok(())
}

/// Where the run's record goes: `--json`, else for a published run
/// bench/results/events/DATE.json (`date` as [`Machine`] has it), else nowhere.
fn record_path(json: Option<PathBuf>, published: bool, date: &str, root: &Path) -> Option<PathBuf> {
    json.or_else(|| {
        published.then(|| {
            let stamp = date.replace(" UTC", "Z").replace([' ', ':'], "-");
            root.join("bench/results/events")
                .join(format!("{stamp}.json"))
        })
    })
}

/// The run's JSON record at `path`.
fn write_record(path: &Path, report: &Report) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let body = serde_json::to_string_pretty(&report.json())?;
    fs::write(path, body + "\n").with_context(|| format!("writing {}", path.display()))?;
    eprintln!("[bench] wrote {}", path.display());
    Ok(())
}

/// The ethand binary to run: the one given, else the workspace's release build (built now if
/// missing). Fails unless it is an executable file.
fn resolve_ethand(given: Option<PathBuf>, root: &Path) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => {
            let target = env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target"));
            let path = target.join("release").join("ethand");
            if !path.exists() {
                build_ethand(root)?;
            }
            path
        }
    };
    ensure!(
        is_executable(&path),
        "ethand binary {} is missing or not executable: build it with \
         `cargo build --release -p ethand`, pass --ethand PATH, or leave ethand out with \
         --modes none,bpftrace,bpftrace-sched",
        path.display()
    );
    Ok(path)
}

fn build_ethand(root: &Path) -> Result<()> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    eprintln!("[bench] building ethand: cargo build --release -p ethand");
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "ethand"])
        .current_dir(root)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!(
            "`cargo build --release -p ethand` failed ({status}): install the toolchain with \
             scripts/setup.sh, pass --ethand PATH, or leave ethand out with \
             --modes none,bpftrace,bpftrace-sched"
        );
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` itself if it contains a `/`, else its first executable match in `$PATH`.
pub(super) fn find_executable(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return is_executable(name).then(|| name.to_path_buf());
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// This run's command line, as the user would type it.
fn command_line() -> String {
    let mut cmd = String::from("cargo xtask bench");
    for arg in env::args().skip(2) {
        cmd.push(' ');
        if arg.contains(|c: char| c.is_whitespace() || "'\"$\\".contains(c)) {
            cmd.push_str(&format!("'{}'", arg.replace('\'', r"'\''")));
        } else {
            cmd.push_str(&arg);
        }
    }
    cmd
}

/// A private directory for configs, scripts and logs, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Result<TempDir> {
        let path = env::temp_dir().join(format!("{prefix}.{}", process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_runs_keep_their_record_by_date() {
        let root = Path::new("/repo");
        // The name of bench/results/events/2026-12-01-18-11Z.json, from Machine's date.
        assert_eq!(
            record_path(None, true, "2026-12-01 18:11 UTC", root),
            Some(PathBuf::from(
                "/repo/bench/results/events/2026-12-01-18-11Z.json"
            ))
        );
        assert_eq!(record_path(None, false, "2026-12-01 18:11 UTC", root), None);
        let given = PathBuf::from("/tmp/run.json");
        assert_eq!(
            record_path(Some(given.clone()), false, "d", root),
            Some(given)
        );
    }
}
