//! Suite `stacks`: what the stacks of issue 27 cost.
//!
//! - **Call-site stacks** (`gpu.call_stacks`, on by default): a stand-in `cuMemcpyHtoD_v2`
//!   called from a known depth of frames, with no ethand, with ethand's probes without the
//!   stack, and with it (the default), interleaved over rounds; the stack's own cost per call is
//!   the difference of the last two. The call site ethand reports is checked against the
//!   calls made and the frames nested.
//! - **The snapshot's CPU profile**: a busy loop and a launch-bound loop (stand-in
//!   `cuLaunchKernel` plus ~10 us of host work per launch) time fixed chunks of work; a
//!   snapshot runs in the middle, without and with its native profile (and none at all as the
//!   control). The loop's slowdown inside the window is against the seconds around it, as
//!   `scripts/gpu-sample-cost.sh` measures real training.
//! - The BPF programs' run time of each (untimed runs with `daemon.bpf_stats = "always"`).
//!
//! The workloads are one C program ([`PROGRAM`]), built with frame pointers so that the kernel's
//! stack walks go as deep as the frames nested.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use std::{env, fs};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value as Json, json};

use super::SuiteCtx;
use super::modes::{self, ProgramCost, Tracer};
use super::report::{Section, median};
use super::workloads;

const PROGRAM: &str = include_str!("stacked_calls.c");

/// Frames between `main` and the probed call: shallow (a C call path) and deep (a framework's).
const DEPTHS: [u32; 2] = [4, 32];

struct Sizes {
    rounds: usize,
    /// cuMemcpyHtoD_v2 calls per run (after a tenth of warm-up).
    copies: u64,
    /// Seconds of chunks per profile run.
    chunk_s: f64,
}

const FULL: Sizes = Sizes {
    rounds: 5,
    copies: 200_000,
    chunk_s: 9.0,
};
const QUICK: Sizes = Sizes {
    rounds: 2,
    copies: 20_000,
    chunk_s: 8.0,
};

/// When the snapshot starts, after the loop's `go`; and the spans before and after its window
/// that the loop's speed inside is compared with (minus a margin at each edge).
const SNAPSHOT_AFTER: Duration = Duration::from_millis(2500);
const AROUND_S: f64 = 2.0;
const MARGIN_S: f64 = 0.2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StackMode {
    None,
    Off,
    On,
}

impl StackMode {
    const ALL: [StackMode; 3] = [StackMode::None, StackMode::Off, StackMode::On];

    fn name(self) -> &'static str {
        match self {
            StackMode::None => "none",
            StackMode::Off => "ethand, call_stacks off",
            StackMode::On => "ethand, call_stacks on (default)",
        }
    }

    fn sections(self) -> &'static str {
        match self {
            StackMode::Off => "[gpu]\ncall_stacks = false\n",
            _ => "",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loop {
    Busy,
    Launch,
}

impl Loop {
    const ALL: [Loop; 2] = [Loop::Busy, Loop::Launch];

    fn name(self) -> &'static str {
        match self {
            Loop::Busy => "busy loop (arithmetic)",
            Loop::Launch => "launch-bound loop (stand-in cuLaunchKernel + ~10 us of host work)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Loop::Busy => "busy",
            Loop::Launch => "launch",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Snap {
    /// No snapshot: the same span of the run is the window.
    None,
    /// `ethand snapshot --no-stack-sample`: its launch sample where the loop launches.
    Plain,
    /// `ethand snapshot --cpu-profile`.
    Profile,
}

impl Snap {
    const ALL: [Snap; 3] = [Snap::None, Snap::Plain, Snap::Profile];

    fn name(self) -> &'static str {
        match self {
            Snap::None => "no snapshot",
            Snap::Plain => "snapshot without profile",
            Snap::Profile => "snapshot with profile",
        }
    }

    fn args(self) -> Option<&'static [&'static str]> {
        match self {
            Snap::None => None,
            Snap::Plain => Some(&["--no-stack-sample"]),
            Snap::Profile => Some(&["--cpu-profile"]),
        }
    }
}

/// One copy run under a stack mode.
struct CopyRun {
    ns_per_call: f64,
    /// The call sites ethand reported (call_stacks on); the calls made, warm-up included.
    site: Option<Site>,
    calls: u64,
}

/// One chunked run with a snapshot (or none) in it.
struct ChunkRun {
    /// Inside the window against the spans around it: + is slower.
    slowdown: f64,
    window_ms: f64,
    /// The loop thread's samples in the profile, and what a thread on a CPU all the window
    /// gets at the profile's rate.
    samples: Option<u64>,
    expected_samples: Option<f64>,
    top_function: Option<(String, f64)>,
}

pub fn run(ctx: &SuiteCtx) -> Result<Section> {
    let ethand = ctx.ethand.context("the stacks suite needs ethand")?;
    let sizes = if ctx.quick { &QUICK } else { &FULL };
    let dir = ctx.tmp.join("stacks");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?;
    let cuda = workloads::build_cuda_standin(root, &dir)?;
    let program = build_program(&dir)?;

    // Call-site stacks: rounds x stack modes (order rotated) x depths.
    let mut copies: Vec<(StackMode, u32, CopyRun)> = Vec::new();
    for round in 0..sizes.rounds {
        for k in 0..StackMode::ALL.len() {
            let mode = StackMode::ALL[(round + k) % StackMode::ALL.len()];
            let mut tracer = match mode {
                StackMode::None => None,
                _ => Some(modes::start_ethand(ethand, &dir, "", mode.sections())?),
            };
            for depth in DEPTHS {
                let r = copy_run(&program, &cuda, depth, sizes.copies, tracer.as_mut(), mode)?;
                eprintln!(
                    "[bench] stacks round {}/{}: {}, depth {depth}: {:.0} ns per call",
                    round + 1,
                    sizes.rounds,
                    mode.name(),
                    r.ns_per_call
                );
                copies.push((mode, depth, r));
            }
            if let Some(t) = tracer {
                t.finish()?;
            }
        }
    }

    // The CPU profile: one daemon at its defaults; rounds x loops x snapshots (rotated).
    let mut chunks: Vec<(Loop, Snap, ChunkRun)> = Vec::new();
    {
        let mut tracer = modes::start_ethand(ethand, &dir, "", "")?;
        for round in 0..sizes.rounds {
            for lp in Loop::ALL {
                for k in 0..Snap::ALL.len() {
                    let snap = Snap::ALL[(round + k) % Snap::ALL.len()];
                    let last_ms = chunks
                        .iter()
                        .rev()
                        .find(|(l, s, _)| *l == lp && *s != Snap::None)
                        .map(|(_, _, r)| r.window_ms);
                    let r = chunk_run(
                        &program,
                        &cuda,
                        &dir,
                        lp,
                        snap,
                        sizes.chunk_s,
                        &mut tracer,
                        last_ms,
                    )?;
                    eprintln!(
                        "[bench] stacks round {}/{}: {}, {}: {:+.2} % inside a {:.0} ms window",
                        round + 1,
                        sizes.rounds,
                        lp.key(),
                        snap.name(),
                        100.0 * r.slowdown,
                        r.window_ms
                    );
                    chunks.push((lp, snap, r));
                }
            }
        }
        tracer.finish()?;
    }

    // Program run times, untimed.
    eprintln!("[bench] stacks: BPF program run times (bpf_stats = \"always\", untimed)");
    let deep = DEPTHS[DEPTHS.len() - 1];
    let mut costs: Vec<(StackMode, Result<Vec<ProgramCost>, String>)> = Vec::new();
    for mode in [StackMode::Off, StackMode::On] {
        let c = modes::ethand_program_costs(ethand, &dir, mode.sections(), |t| {
            copy_run(&program, &cuda, deep, sizes.copies, Some(t), mode).map(|_| ())
        })
        .map_err(|e| format!("{e:#}"));
        costs.push((mode, c));
    }
    let profile_costs = modes::ethand_program_costs(ethand, &dir, "", |t| {
        for lp in Loop::ALL {
            chunk_run(
                &program,
                &cuda,
                &dir,
                lp,
                Snap::Profile,
                sizes.chunk_s,
                t,
                None,
            )?;
        }
        Ok(())
    })
    .map_err(|e| format!("{e:#}"));

    Ok(section(sizes, &copies, &chunks, &costs, &profile_costs))
}

/// Compiles [`PROGRAM`] into `dir` with frame pointers.
fn build_program(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("stacked_calls.c");
    let out = dir.join("stacked_calls");
    fs::write(&src, PROGRAM).with_context(|| format!("writing {}", src.display()))?;
    let cc = env::var_os("CC").unwrap_or_else(|| "cc".into());
    let res = Command::new(&cc)
        .args([
            "-O2",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-inline",
            "-Wall",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .with_context(|| format!("running {}", cc.to_string_lossy()))?;
    ensure!(
        res.status.success(),
        "compiling the stacks workload failed: {}",
        String::from_utf8_lossy(&res.stderr).trim()
    );
    Ok(out)
}

fn copy_run(
    program: &Path,
    cuda: &Path,
    depth: u32,
    iters: u64,
    tracer: Option<&mut Tracer>,
    mode: StackMode,
) -> Result<CopyRun> {
    let mut cmd = Command::new(program);
    cmd.arg("calls")
        .arg(cuda)
        .arg(depth.to_string())
        .arg(iters.to_string());
    let tracer = RefCell::new(tracer);
    let site: RefCell<Option<Site>> = RefCell::new(None);
    let m = workloads::measure_child(
        "stacked_calls calls",
        cmd,
        |pid| match tracer.borrow_mut().as_deref_mut() {
            Some(t) => t.wait_library(pid, cuda),
            None => Ok(()),
        },
        |pid, m| {
            if mode == StackMode::On
                && let Some(t) = tracer.borrow_mut().as_deref_mut()
            {
                *site.borrow_mut() = Some(call_site(t, pid, m.calls.unwrap_or(m.events))?);
            }
            Ok(())
        },
    )?;
    Ok(CopyRun {
        ns_per_call: m.ns_per_event(),
        site: site.into_inner(),
        calls: m.calls.unwrap_or(m.events),
    })
}

/// What ethand reported of cuMemcpyHtoD_v2's call sites in one process.
#[derive(Clone, Copy)]
struct Site {
    /// Calls over all sites.
    total: u64,
    sites: usize,
    /// Calls at the busiest site, and the frames of its stack.
    top: Option<u64>,
    frames: usize,
}

/// cuMemcpyHtoD_v2's call sites in process `pid`, polled until they count `expected` calls
/// or 5 s pass (the daemon collects every second).
fn call_site(t: &mut Tracer, pid: u32, expected: u64) -> Result<Site> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        // A process born since the daemon's last collection is not known to it yet.
        let snap = match t.ethand_snapshot(pid, &[]) {
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => {
                thread::sleep(Duration::from_millis(250));
                continue;
            }
            Ok(s) => s.context("the tracer is not ethand")?,
        };
        let site = snap
            .get("processes")
            .and_then(Json::as_array)
            .and_then(|ps| {
                ps.iter()
                    .find(|p| p.get("pid").and_then(Json::as_u64) == Some(u64::from(pid)))
            })
            .and_then(|p| p.pointer("/gpu/call_sites"))
            .and_then(Json::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("call").and_then(Json::as_str) == Some("cuMemcpyHtoD_v2"))
            })
            .map(|c| Site {
                total: c.get("total").and_then(Json::as_u64).unwrap_or(0),
                sites: c.get("sites").and_then(Json::as_array).map_or(0, Vec::len),
                top: c.pointer("/sites/0/count").and_then(Json::as_u64),
                frames: c
                    .pointer("/sites/0/frames")
                    .and_then(Json::as_array)
                    .map_or(0, Vec::len),
            });
        match site {
            Some(s) if s.total == expected => return Ok(s),
            _ if std::time::Instant::now() > deadline => {
                return site.with_context(|| {
                    format!("ethand reported no call site of cuMemcpyHtoD_v2 for pid {pid}")
                });
            }
            _ => thread::sleep(Duration::from_millis(250)),
        }
    }
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The thread that takes the snapshot during a chunk run: (when it asked, unix ms; the
/// snapshot, None without one).
type SnapshotTaker = thread::JoinHandle<Result<(f64, Option<Json>)>>;

#[allow(clippy::too_many_arguments)]
fn chunk_run(
    program: &Path,
    cuda: &Path,
    dir: &Path,
    lp: Loop,
    snap: Snap,
    seconds: f64,
    tracer: &mut Tracer,
    nominal_ms: Option<f64>,
) -> Result<ChunkRun> {
    let out = dir.join("chunks.txt");
    let mut cmd = Command::new(program);
    cmd.arg("chunks");
    match lp {
        Loop::Busy => cmd.arg("-"),
        Loop::Launch => cmd.arg(cuda),
    };
    cmd.arg(seconds.to_string()).arg(&out);
    let (bin, socket) = tracer.ethand_api().context("the tracer is not ethand")?;
    let taker: RefCell<Option<SnapshotTaker>> = RefCell::new(None);
    let tracer = RefCell::new(tracer);
    workloads::measure_child(
        "stacked_calls chunks",
        cmd,
        |pid| {
            if lp == Loop::Launch {
                tracer.borrow_mut().wait_library(pid, cuda)?;
            }
            *taker.borrow_mut() = Some(thread::spawn(move || {
                thread::sleep(SNAPSHOT_AFTER);
                let asked = unix_ms();
                let snap = match snap.args() {
                    Some(args) => Some(modes::snapshot_json(&bin, &socket, pid, args)?),
                    None => None,
                };
                Ok((asked, snap))
            }));
            Ok(())
        },
        |_, _| Ok(()),
    )?;
    let taker = taker.into_inner().context("no snapshot thread")?;
    let (asked, snapshot) = taker
        .join()
        .map_err(|_| anyhow::anyhow!("the snapshot thread panicked"))??;
    let text = fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let chunks: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let (end, len) = l.split_once(' ')?;
            Some((end.parse::<f64>().ok()? / 1e6, len.parse::<f64>().ok()?))
        })
        .collect();
    ensure!(!chunks.is_empty(), "the chunk loop wrote no chunks");

    // The window: the profile's, else the launch sample's, else as long as the last one.
    let window = |key: &str| -> Option<(f64, f64)> {
        let w = snapshot.as_ref()?.get(key)?;
        Some((
            w.get("started_unix_ms")?.as_f64()?,
            w.get("duration_ms")?.as_f64()?,
        ))
    };
    let (start, dur) = match snap {
        Snap::Profile => window("cpu_profile").context(
            "`ethand snapshot --cpu-profile` returned no cpu_profile (is diagnosis.cpu_profile_hz 0?)",
        )?,
        _ => window("launch_sample").unwrap_or((asked, nominal_ms.unwrap_or(2000.0))),
    };
    let Some(slowdown) = slowdown(&chunks, start, dur) else {
        bail!(
            "the chunk loop did not cover the window and {AROUND_S} s on each side \
             (window {start:.0} + {dur:.0} ms; chunks {:.0} to {:.0})",
            chunks[0].0,
            chunks[chunks.len() - 1].0
        );
    };

    // The loop's own thread in the profile.
    let profile = snapshot.as_ref().and_then(|s| s.get("cpu_profile"));
    let thread = profile.and_then(|p| {
        let pid = p
            .get("threads")?
            .as_array()?
            .first()?
            .get("pid")?
            .as_u64()?;
        p.get("threads")?
            .as_array()?
            .iter()
            .find(|t| t.get("tid").and_then(Json::as_u64) == Some(pid))
    });
    let samples = thread.and_then(|t| t.get("samples")?.as_u64());
    let expected_samples = profile.and_then(|p| Some(p.get("rate_hz")?.as_f64()? * dur / 1e3));
    let top_function = thread.and_then(|t| {
        let top = t.get("top_functions")?.as_array()?.first()?;
        let name = top
            .pointer("/frame/function")
            .and_then(Json::as_str)
            .or_else(|| top.pointer("/frame/module").and_then(Json::as_str))?;
        let n = top.get("samples")?.as_f64()?;
        Some((name.to_string(), n / samples? as f64))
    });
    Ok(ChunkRun {
        slowdown,
        window_ms: dur,
        samples,
        expected_samples,
        top_function,
    })
}

/// The mean chunk time inside the window [`start_ms`, +`dur_ms`) against the mean of the
/// [`AROUND_S`] before and after it ([`MARGIN_S`] off each edge), minus 1: + is slower. `chunks`
/// are (end, unix ms; length). None unless each of the three spans has chunks.
fn slowdown(chunks: &[(f64, f64)], start_ms: f64, dur_ms: f64) -> Option<f64> {
    let mean_in = |a: f64, b: f64| -> Option<f64> {
        let v: Vec<f64> = chunks
            .iter()
            .filter(|(end, _)| *end >= a && *end < b)
            .map(|(_, len)| *len)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let (m, a) = (MARGIN_S * 1e3, AROUND_S * 1e3);
    let inside = mean_in(start_ms, start_ms + dur_ms)?;
    let before = mean_in(start_ms - m - a, start_ms - m)?;
    let after = mean_in(start_ms + dur_ms + m, start_ms + dur_ms + m + a)?;
    Some(inside / ((before + after) / 2.0) - 1.0)
}

/// One cell for a value per round: "X (every round)" when all rounds agree, else each.
fn per_round(cells: &[String], sep: &str) -> String {
    match cells {
        [] => "-".into(),
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|c| c == first) => {
            format!("{first} (each of {} rounds)", cells.len())
        }
        _ => cells.join(sep),
    }
}

/// Median and median absolute deviation.
fn median_mad(v: &[f64]) -> Option<(f64, f64)> {
    let m = median(v.to_vec())?;
    let mad = median(v.iter().map(|x| (x - m).abs()).collect())?;
    Some((m, mad))
}

fn fmt_pm(v: &[f64], scale: f64, unit: &str) -> String {
    match median_mad(v) {
        Some((m, mad)) if v.len() >= 3 => {
            format!("{:+.2}{unit} ±{:.2}", m * scale, mad * scale)
        }
        Some((m, _)) => format!("{:+.2}{unit}", m * scale),
        None => "not measured".into(),
    }
}

fn program_ns(costs: &Result<Vec<ProgramCost>, String>, prefix: &str) -> String {
    match costs {
        Err(why) => format!("not measured: {why}"),
        Ok(c) => {
            let (runs, ns) = c
                .iter()
                .filter(|p| p.name == prefix || p.name.starts_with(&format!("{prefix}_multi")))
                .fold((0u64, 0u64), |(r, t), p| {
                    (r + p.run_count, t + p.run_time_ns)
                });
            if runs == 0 {
                "no runs".into()
            } else {
                format!("{:.0} ns ({runs} runs)", ns as f64 / runs as f64)
            }
        }
    }
}

fn section(
    sizes: &Sizes,
    copies: &[(StackMode, u32, CopyRun)],
    chunks: &[(Loop, Snap, ChunkRun)],
    costs: &[(StackMode, Result<Vec<ProgramCost>, String>)],
    profile_costs: &Result<Vec<ProgramCost>, String>,
) -> Section {
    let mut md = String::new();
    let mut text = String::new();
    let _ = writeln!(
        md,
        "Suite `stacks` (`xtask/src/bench/stacks.rs`): {} rounds, each stack mode and snapshot \
         kind once per round in rotated order. The workloads are one C program built with frame \
         pointers, pinned to one CPU; the stand-in libcuda is `tests/standins/cuda.c`.\n",
        sizes.rounds
    );
    let record_copies = write_copies_table(&mut md, &mut text, sizes, copies, costs);
    let record_chunks = write_profile_table(&mut md, &mut text, sizes, chunks, profile_costs);
    let record = json!({
        "rounds": sizes.rounds,
        "copies_per_run": sizes.copies,
        "chunk_seconds": sizes.chunk_s,
        "copies": record_copies,
        "profile": record_chunks,
    });
    Section {
        title: "Call-site stacks and the CPU profile (suite `stacks`)".to_string(),
        markdown: md,
        text,
        record: Some(record),
    }
}

/// ns per call of the copy runs under `mode` at `depth`, in round order.
fn ns_per_call(copies: &[(StackMode, u32, CopyRun)], mode: StackMode, depth: u32) -> Vec<f64> {
    copies
        .iter()
        .filter(|(m, d, _)| *m == mode && *d == depth)
        .map(|(_, _, r)| r.ns_per_call)
        .collect()
}

/// `a - b` per round: the runs of one round are at the same index of each mode's list.
fn paired(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

/// The call-site stacks' table (a row per depth) and the entry program's run times under it;
/// returns the record of each depth.
fn write_copies_table(
    md: &mut String,
    text: &mut String,
    sizes: &Sizes,
    copies: &[(StackMode, u32, CopyRun)],
    costs: &[(StackMode, Result<Vec<ProgramCost>, String>)],
) -> Vec<Json> {
    let _ = writeln!(md, "### Call-site stacks: cost per probed call\n");
    let _ = writeln!(
        md,
        "`cuMemcpyHtoD_v2` of the stand-in, {} calls per run after a tenth of warm-up, called \
         from a chain of nested frames. Medians over the rounds (± median absolute deviation); \
         *stack* = call_stacks on minus off, paired per round. The probes' level is the \
         default (`calls`), which probes copies.\n",
        sizes.copies
    );
    let _ = writeln!(
        md,
        "| frames nested | none (ns/call) | {} | {} | added by the probes | added by the stack | \
         stack / probes | call site reported (calls counted / made) | frames in its stack |",
        StackMode::Off.name(),
        StackMode::On.name()
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut record_copies = Vec::new();
    for depth in DEPTHS {
        record_copies.push(write_copies_row(md, text, copies, depth));
    }
    let _ = writeln!(
        md,
        "\nThe entry program per call (BPF run-time statistics, one untimed run at {} frames): \
         call_stacks off {}, on {}. Most of a probed call's time is the uprobe's trap into the \
         kernel and back, which no program shortens (the *none* column has no trap).\n",
        DEPTHS[DEPTHS.len() - 1],
        program_ns(&costs[0].1, "gpu_enter"),
        program_ns(&costs[1].1, "gpu_enter"),
    );
    record_copies
}

/// One depth's row of the call-site stacks' table and its terminal line; returns its record.
fn write_copies_row(
    md: &mut String,
    text: &mut String,
    copies: &[(StackMode, u32, CopyRun)],
    depth: u32,
) -> Json {
    let (none, off, on) = (
        ns_per_call(copies, StackMode::None, depth),
        ns_per_call(copies, StackMode::Off, depth),
        ns_per_call(copies, StackMode::On, depth),
    );
    let probes = paired(&off, &none);
    let stack = paired(&on, &off);
    let med = |v: &[f64]| median(v.to_vec()).map_or("-".into(), |m| format!("{m:.0}"));
    let ratio = match (median(stack.clone()), median(probes.clone())) {
        (Some(s), Some(p)) if p > 0.0 => format!("{:.2}", s / p),
        _ => "-".into(),
    };
    let sites: Vec<&CopyRun> = copies
        .iter()
        .filter(|(m, d, _)| *m == StackMode::On && *d == depth)
        .map(|(_, _, r)| r)
        .collect();
    // The warm-up loop and the timed loop call from two sites.
    let counted = sites
        .iter()
        .map(|r| match r.site {
            Some(s) => format!(
                "{} / {} at {} sites (busiest {})",
                s.total,
                r.calls,
                s.sites,
                s.top.map_or("-".into(), |t| t.to_string())
            ),
            None => format!("none / {}", r.calls),
        })
        .collect::<Vec<_>>();
    let counted = per_round(&counted, "; ");
    let frames = sites
        .iter()
        .map(|r| r.site.map_or("-".into(), |s| s.frames.to_string()))
        .collect::<Vec<_>>();
    let frames = per_round(&frames, ", ");
    let _ = writeln!(
        md,
        "| {depth} | {} | {} | {} | {} | {} | {ratio} | {counted} | {frames} |",
        med(&none),
        med(&off),
        med(&on),
        fmt_pm(&probes, 1.0, " ns"),
        fmt_pm(&stack, 1.0, " ns"),
    );
    let _ = writeln!(
        text,
        "stacks: depth {depth}: none {} ns, probes {}, stack {} per call",
        med(&none),
        fmt_pm(&probes, 1.0, " ns"),
        fmt_pm(&stack, 1.0, " ns")
    );
    json!({
        "frames_nested": depth,
        "ns_per_call": {"none": none, "call_stacks_off": off, "call_stacks_on": on},
        "calls": sites.iter().map(|r| r.calls).collect::<Vec<_>>(),
        "site_calls_total": sites.iter().map(|r| r.site.map(|s| s.total)).collect::<Vec<_>>(),
        "busiest_site_calls": sites.iter().map(|r| r.site.and_then(|s| s.top)).collect::<Vec<_>>(),
        "busiest_site_frames": sites.iter().map(|r| r.site.map(|s| s.frames)).collect::<Vec<_>>(),
    })
}

/// The CPU profile's table (a row per loop) and the profile's programs' run times; returns
/// the record of each loop.
fn write_profile_table(
    md: &mut String,
    text: &mut String,
    sizes: &Sizes,
    chunks: &[(Loop, Snap, ChunkRun)],
    profile_costs: &Result<Vec<ProgramCost>, String>,
) -> Vec<Json> {
    let _ = writeln!(
        md,
        "### The snapshot's CPU profile: the loop's slowdown in its window\n"
    );
    let _ = writeln!(
        md,
        "Each run: {} s of fixed ~1 ms chunks of work; {:.1} s after it starts, `ethand snapshot \
         --pid LOOP` (daemon at its defaults). Slowdown = the mean chunk time inside the \
         snapshot's window against the {AROUND_S} s before and after it ({MARGIN_S} s off each \
         edge); + is slower. Window: the profile's (`--cpu-profile`), else the launch sample's \
         (`--no-stack-sample`, where the loop launches), else a span as long at the same time \
         (no snapshot: the method's own noise). *Profile's own cost* = with minus without, \
         paired per round. Medians over the rounds, ± median absolute deviation.\n",
        sizes.chunk_s,
        SNAPSHOT_AFTER.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| loop | {} | {} | {} | profile's own cost | window | samples of the loop's thread \
         (expected at the rate) | its top function |",
        Snap::None.name(),
        Snap::Plain.name(),
        Snap::Profile.name()
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut record_chunks = Vec::new();
    for lp in Loop::ALL {
        record_chunks.push(write_profile_row(md, text, chunks, lp));
    }
    let _ = writeln!(
        md,
        "\nA snapshot of a tree that launches also samples its launches over the window (a \
         uprobe on `cuLaunchKernel`, level `calls`): here each launch then traps into the kernel \
         (the *added by the probes* column above), longer than the loop's ~10 us of host work \
         between launches, hence the launch loop's slowdown with or without the profile. On a \
         GPU, launches are far cheaper to trap relative to a step: see the GPU rows below."
    );
    let _ = writeln!(
        md,
        "\nThe profile's programs per run (BPF run-time statistics, one untimed profile of each \
         loop): `profile_cpu` {}, `profile_switch` {} (every context switch on the node while \
         attached, most of them ending at the filter).",
        program_ns(profile_costs, "profile_cpu"),
        program_ns(profile_costs, "profile_switch"),
    );
    record_chunks
}

/// One loop's row of the CPU profile's table and its terminal line; returns its record.
fn write_profile_row(
    md: &mut String,
    text: &mut String,
    chunks: &[(Loop, Snap, ChunkRun)],
    lp: Loop,
) -> Json {
    let of = |s: Snap| -> Vec<&ChunkRun> {
        chunks
            .iter()
            .filter(|(l, sn, _)| *l == lp && *sn == s)
            .map(|(_, _, r)| r)
            .collect()
    };
    let slow = |s: Snap| -> Vec<f64> { of(s).iter().map(|r| r.slowdown).collect() };
    let own = paired(&slow(Snap::Profile), &slow(Snap::Plain));
    let prof = of(Snap::Profile);
    let window = median(prof.iter().map(|r| r.window_ms).collect())
        .map_or("-".into(), |w| format!("{:.0} ms", w));
    let samples = prof
        .iter()
        .map(|r| match (r.samples, r.expected_samples) {
            (Some(s), Some(e)) => format!("{s} ({e:.0})"),
            (None, Some(e)) => format!("none ({e:.0})"),
            _ => "-".into(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let top = prof
        .iter()
        .filter_map(|r| r.top_function.as_ref())
        .map(|(f, share)| format!("`{f}` {:.0} %", share * 100.0))
        .next_back()
        .unwrap_or_else(|| "-".into());
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {window} | {samples} | {top} |",
        lp.name(),
        fmt_pm(&slow(Snap::None), 100.0, " %"),
        fmt_pm(&slow(Snap::Plain), 100.0, " %"),
        fmt_pm(&slow(Snap::Profile), 100.0, " %"),
        fmt_pm(&own, 100.0, " %"),
    );
    let _ = writeln!(
        text,
        "stacks: {}: profile's own cost {}",
        lp.key(),
        fmt_pm(&own, 100.0, " %")
    );
    json!({
        "loop": lp.key(),
        "slowdown": {
            "no_snapshot": slow(Snap::None),
            "snapshot_without_profile": slow(Snap::Plain),
            "snapshot_with_profile": slow(Snap::Profile),
        },
        "window_ms": prof.iter().map(|r| r.window_ms).collect::<Vec<_>>(),
        "samples": prof.iter().map(|r| r.samples).collect::<Vec<_>>(),
        "expected_samples": prof.iter().map(|r| r.expected_samples).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests;
