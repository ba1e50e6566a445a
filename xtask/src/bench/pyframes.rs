//! Suite `pyframes`: what walking a CPython caller's frames at a GPU call costs (issue 41).
//!
//! A Python program (this machine's `python3`) calls the stand-in libcuda's
//! `cuMemcpyHtoD_v2` (which returns at once) through ctypes from a function nested
//! at a known depth of Python frames (5: a script; 50: a framework's, beyond the walk's 32),
//! with no ethand, with ethand taking the call's native stack but not walking Python
//! (`gpu.python_frames = false`), and at the defaults (the walk on), interleaved over rounds.
//! The walk's own cost per call is the difference of the last two. At the defaults the call
//! site ethand reports is checked: every timed call at the leaf's line, exactly.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value as Json, json};

use super::SuiteCtx;
use super::modes::{self, Tracer};
use super::report::{Section, median};
use super::workloads;

/// The program: `python3 PROGRAM LIBCUDA DEPTH CALLS`, the bench's handshake protocol.
const PROGRAM: &str = r#"import ctypes, select, sys, time
lib = ctypes.CDLL(sys.argv[1])
copy = lib.cuMemcpyHtoD_v2
copy.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
buf = ctypes.create_string_buffer(64)
depth, n = int(sys.argv[2]), int(sys.argv[3])
def leaf():
    copy(0x1000, buf, 64)  # LEAF_LINE
def nest(d, k):
    if d > 1:
        return nest(d - 1, k)
    for _ in range(k):
        leaf()
def warm():
    copy(0x1000, buf, 64)
print("ready", flush=True)
# A call now and then until `go`: the daemon reads a GPU process's interpreter at its first call.
while not select.select([sys.stdin], [], [], 0.05)[0]:
    warm()
sys.stdin.readline()
nest(depth, n // 10)
t0 = time.perf_counter_ns()
nest(depth, n)
elapsed = time.perf_counter_ns() - t0
print(f"elapsed_ns={elapsed} events={n} calls={n + n // 10}", flush=True)
sys.stdin.read()
"#;

/// Python frames between the module and the probed call (the leaf included).
const DEPTHS: [u32; 2] = [5, 50];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    None,
    Native,
    Walk,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::None, Mode::Native, Mode::Walk];

    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Native => "ethand, python_frames off",
            Mode::Walk => "ethand, defaults (python_frames on)",
        }
    }

    fn sections(self) -> &'static str {
        match self {
            Mode::Native => "[gpu]\npython_frames = false\n",
            _ => "",
        }
    }
}

struct Run {
    ns_per_call: f64,
    /// Calls at the leaf's line ethand reported, and the calls made (defaults only).
    at_leaf: Option<(u64, u64)>,
}

pub fn run(ctx: &SuiteCtx) -> Result<Section> {
    let ethand = ctx.ethand.context("the pyframes suite needs ethand")?;
    let (rounds, calls) = if ctx.quick { (2, 20_000) } else { (5, 100_000) };
    let dir = ctx.tmp.join("pyframes");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?;
    let cuda = workloads::build_cuda_standin(root, &dir)?;
    let script = dir.join("pyframes.py");
    std::fs::write(&script, PROGRAM).with_context(|| format!("writing {}", script.display()))?;
    let mut runs: Vec<(Mode, u32, Run)> = Vec::new();
    for round in 0..rounds {
        for k in 0..Mode::ALL.len() {
            let mode = Mode::ALL[(round + k) % Mode::ALL.len()];
            let mut tracer = match mode {
                Mode::None => None,
                _ => Some(modes::start_ethand(ethand, &dir, "", mode.sections())?),
            };
            for depth in DEPTHS {
                let r = one_run(&script, &cuda, depth, calls, tracer.as_mut(), mode)?;
                eprintln!(
                    "[bench] pyframes round {}/{rounds}: {}, depth {depth}: {:.0} ns per call",
                    round + 1,
                    mode.name(),
                    r.ns_per_call
                );
                runs.push((mode, depth, r));
            }
            if let Some(t) = tracer {
                t.finish()?;
            }
        }
    }
    Ok(section(rounds, calls, &runs))
}

fn one_run(
    script: &Path,
    cuda: &Path,
    depth: u32,
    calls: u64,
    tracer: Option<&mut Tracer>,
    mode: Mode,
) -> Result<Run> {
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .arg(cuda)
        .arg(depth.to_string())
        .arg(calls.to_string());
    let tracer = RefCell::new(tracer);
    let at_leaf = RefCell::new(None);
    let m = workloads::measure_child(
        "pyframes",
        cmd,
        |pid| match tracer.borrow_mut().as_deref_mut() {
            Some(t) => {
                t.wait_library(pid, cuda)?;
                if mode == Mode::Walk {
                    wait_walked(t, pid)?;
                }
                Ok(())
            }
            None => Ok(()),
        },
        |pid, m| {
            if mode == Mode::Walk
                && let Some(t) = tracer.borrow_mut().as_deref_mut()
            {
                let made = m.calls.unwrap_or(m.events);
                *at_leaf.borrow_mut() = Some((leaf_calls(t, pid, made)?, made));
            }
            Ok(())
        },
    )?;
    Ok(Run {
        ns_per_call: m.ns_per_event(),
        at_leaf: at_leaf.into_inner(),
    })
}

/// The process's `gpu.python_walk` from a snapshot.
fn walk_state(s: &Json, pid: u32) -> Option<String> {
    process(s, pid)?
        .pointer("/gpu/python_walk/state")
        .and_then(Json::as_str)
        .map(str::to_string)
}

fn process(s: &Json, pid: u32) -> Option<&Json> {
    s.get("processes")?
        .as_array()?
        .iter()
        .find(|p| p.get("pid").and_then(Json::as_u64) == Some(u64::from(pid)))
}

/// Until the daemon has read the process's interpreter (it calls now and then meanwhile).
fn wait_walked(t: &mut Tracer, pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = t.ethand_snapshot(pid, &["--no-stack-sample"]) {
            last = walk_state(&s, pid);
            if last.as_deref() == Some("walked") {
                return Ok(());
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    bail!("pid {pid}'s Python frames were not walked within 20 s (last state {last:?})")
}

/// Calls at the leaf's line over `cuMemcpyHtoD_v2`'s sites, polled until they reach
/// `expected` or 5 s pass (code objects are read at the round after the calls).
fn leaf_calls(t: &mut Tracer, pid: u32, expected: u64) -> Result<u64> {
    let line = PROGRAM
        .lines()
        .position(|l| l.contains("LEAF_LINE"))
        .expect("marker") as u64
        + 1;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = t
            .ethand_snapshot(pid, &["--no-stack-sample"])?
            .and_then(|s| {
                let sites = process(&s, pid)?
                    .pointer("/gpu/call_sites")?
                    .as_array()?
                    .clone();
                let cs = sites
                    .iter()
                    .find(|c| c.get("call").and_then(Json::as_str) == Some("cuMemcpyHtoD_v2"))?;
                Some(
                    cs.get("sites")?
                        .as_array()?
                        .iter()
                        .filter(|s| {
                            s.pointer("/frames")
                                .and_then(Json::as_array)
                                .and_then(|f| {
                                    f.iter().find(|f| {
                                        f.get("kind").and_then(Json::as_str) == Some("python")
                                    })
                                })
                                .and_then(|f| f.get("line").and_then(Json::as_u64))
                                == Some(line)
                        })
                        .filter_map(|s| s.get("count").and_then(Json::as_u64))
                        .sum::<u64>(),
                )
            })
            .unwrap_or(0);
        if got == expected || Instant::now() > deadline {
            return Ok(got);
        }
        thread::sleep(Duration::from_millis(250));
    }
}

fn section(rounds: usize, calls: u64, runs: &[(Mode, u32, Run)]) -> Section {
    let ns = |mode: Mode, depth: u32| -> Vec<f64> {
        runs.iter()
            .filter(|(m, d, _)| *m == mode && *d == depth)
            .map(|(_, _, r)| r.ns_per_call)
            .collect()
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Stand-in `cuMemcpyHtoD_v2` (returns at once) called through ctypes from Python \
         (`python3`, {}), {calls} timed calls per run, {rounds} rounds, modes interleaved; \
         medians of ns per call.\n",
        python_version()
    );
    let _ = writeln!(
        md,
        "| Python frames | none | python_frames off | defaults (walk) | the walk per call | calls at the leaf's line |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let mut record = Vec::new();
    for depth in DEPTHS {
        let med = |mode| median(ns(mode, depth)).unwrap_or(f64::NAN);
        let (none, native, walk) = (med(Mode::None), med(Mode::Native), med(Mode::Walk));
        let leaf: Vec<String> = runs
            .iter()
            .filter(|(m, d, _)| *m == Mode::Walk && *d == depth)
            .filter_map(|(_, _, r)| r.at_leaf)
            .map(|(got, made)| format!("{got}/{made}"))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {none:.0} | {native:.0} | {walk:.0} | {:+.0} ns | {} |",
            depth + 1,
            walk - native,
            leaf.join(", ")
        );
        record.push(json!({
            "depth": depth + 1,
            "none_ns": ns(Mode::None, depth),
            "native_ns": ns(Mode::Native, depth),
            "walk_ns": ns(Mode::Walk, depth),
            "at_leaf": leaf,
        }));
    }
    Section {
        title: "Python frames at GPU calls".into(),
        text: md.clone(),
        markdown: md,
        record: Some(json!({ "pyframes": record })),
    }
}

fn python_version() -> String {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown version".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaf_line_is_found_and_the_walk_state_read() {
        assert!(PROGRAM.lines().any(|l| l.contains("LEAF_LINE")));
        let s = json!({"processes": [{"pid": 7, "gpu": {"python_walk": {"state": "walked", "version": "3.11"}}}]});
        assert_eq!(walk_state(&s, 7).as_deref(), Some("walked"));
        assert_eq!(walk_state(&s, 8), None);
    }
}
