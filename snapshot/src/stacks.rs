//! Where in the code: the call sites of GPU/NPU runtime calls and where a tree's threads
//! spend their time, as frames (function, file, line). Two producers fill the same types:
//! user stacks the kernel takes at each probed call (exact counts per site, cumulative like
//! the other GPU counters: [`crate::gpu::GpuProcessStats::call_sites`]) and the Python
//! frames of a tree's threads sampled while a snapshot is taken ([`StackSample`]).
use serde::{Deserialize, Serialize};

/// Most frames kept per stack (innermost first): enough to reach a training script's line
/// from deep inside a framework.
pub const MAX_FRAMES: usize = 64;
/// Most call sites kept per (process, call); the rest are summed in `other`.
pub const MAX_SITES: usize = 8;
/// Most distinct stacks kept per sampled thread for the flame graph; the rest summed.
pub const MAX_FOLDED: usize = 512;

#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    /// A Python function's frame, read from the interpreter's state.
    Python,
    /// A machine-code frame of the process (binary or shared library).
    #[default]
    Native,
    /// A kernel frame.
    Kernel,
}

/// One frame. Everything here was chosen by the profiled process (names, paths): outputs
/// escape it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub kind: FrameKind,
    /// Function name (demangled); None where the address has no symbol (a stripped binary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Source file: the script of a Python frame, the DWARF file of a native one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The binary or library a native frame is in (path as the process maps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// A native frame's offset in `module` (file offset), kept when it has no symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Why a native frame has no function name although its file may have one: the reader
    /// timed out or failed on it, or may not read the file ("not readable by the process's
    /// user", "replaced on disk"). None: symbolized, or the file has no symbol there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
}

/// One call site: the stack above the runtime call (the runtime library's own frames
/// dropped), innermost first.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CallSite {
    pub frames: Vec<Frame>,
    /// Calls from this site (kernel stacks: exact) or samples that found a thread inside the
    /// call from it (Python sampling), per the enclosing [`CallSites::basis`].
    pub count: u64,
    /// Host time inside the calls from this site, where the calls were timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// The source text of the innermost frame that has a file and line (trimmed, at most 200
    /// characters), read from the process's view of the file (/proc/PID/root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SiteBasis {
    /// Every call counted with the user stack the kernel took at its entry.
    #[default]
    Calls,
    /// Periodic samples of the threads' Python frames, counted when the thread was inside
    /// the call at that moment (so weighted by time spent in the call).
    Samples,
}

/// The call sites of one runtime function in one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CallSites {
    pub pid: u32,
    /// The runtime symbol ("cuStreamSynchronize").
    pub call: String,
    /// launch, copy, alloc, free, sync, collective, ... as in `GpuSymbolStats::category`.
    pub category: String,
    pub basis: SiteBasis,
    /// Calls (or samples) in all, `sites` and `other` included.
    pub total: u64,
    /// Highest count first, at most [`MAX_SITES`].
    pub sites: Vec<CallSite>,
    /// Calls (or samples) from sites beyond the first [`MAX_SITES`].
    pub other: u64,
    /// Calls whose stack could not be taken (the kernel's stack map full, a stack it could not
    /// walk); they are in `total` but in no site. None: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unattributed: Option<u64>,
}

/// Python frames of a tree's threads, sampled while a snapshot was taken.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StackSample {
    /// How the frames were read and what that costs the sampled processes.
    pub method: String,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    /// Samples per second per process.
    pub rate_hz: u32,
    /// Reads of a process's Python stacks made (each: every thread of one process).
    #[serde(default)]
    pub reads: u64,
    /// CPU time the sampling thread of ethand spent (the cost of the sample; the sampled
    /// processes are not stopped). None where the clock could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_cpu_ns: Option<u64>,
    /// Per (process, runtime call): where the threads were when a sample found them inside
    /// the call.
    pub call_sites: Vec<CallSites>,
    /// Per sampled thread, busiest first.
    pub threads: Vec<ThreadProfile>,
    /// Processes of the tree that could not be sampled, and why (not Python, no permission,
    /// an interpreter version the reader does not know).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Where one thread was over a stack sample.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadProfile {
    pub pid: u32,
    pub tid: u32,
    /// The interpreter's name for the thread ("MainThread"), else the kernel's.
    pub name: String,
    pub main_thread: bool,
    /// Samples that found the thread (with at least one Python frame).
    pub samples: u64,
    /// Of them: running or runnable on a CPU (not idle in a wait).
    pub active_samples: u64,
    /// Of them: inside a probed GPU/NPU runtime call.
    pub in_runtime_call_samples: u64,
    /// Innermost Python line by samples, highest first (at most [`MAX_SITES`]): where the
    /// thread's time went.
    pub top_lines: Vec<CallSite>,
    /// Whole stacks (outermost first, as indexes into `frames`) with their samples, for a
    /// flame graph; at most [`MAX_FOLDED`] kept, the rest in `folded_other`.
    pub folded: Vec<FoldedStack>,
    #[serde(default)]
    pub folded_other: u64,
    /// The frames `folded` refers to.
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FoldedStack {
    /// Outermost first: indexes into [`ThreadProfile::frames`].
    pub frames: Vec<u32>,
    pub samples: u64,
}

impl Frame {
    /// "train.py:41 in step()" / "libfoo.so+0x1234" / "main (app.c:12)": a short label.
    pub fn label(&self) -> String {
        let file = self
            .file
            .as_deref()
            .map(|f| f.rsplit('/').next().unwrap_or(f));
        match (self.kind, self.function.as_deref(), file, self.line) {
            (FrameKind::Python, f, Some(file), Some(l)) => {
                format!("{file}:{l} in {}()", f.unwrap_or("?"))
            }
            (_, Some(f), Some(file), Some(l)) => format!("{f} ({file}:{l})"),
            (_, Some(f), _, _) => f.to_string(),
            (_, None, _, _) => {
                let m = self.module.as_deref().unwrap_or("?");
                let m = m.rsplit('/').next().unwrap_or(m);
                let at = match self.offset {
                    Some(o) => format!("{m}+{o:#x}"),
                    None => m.to_string(),
                };
                match &self.unresolved {
                    Some(why) => format!("{at} ({why})"),
                    None => at,
                }
            }
        }
    }
}

impl CallSite {
    /// The frame that names the site: the innermost Python frame where there is one (the
    /// script's line, not the framework's C++), else the innermost frame.
    pub fn key_frame(&self) -> Option<&Frame> {
        key_frame(&self.frames)
    }
}

/// The frame that names a stack: the innermost Python frame where there is one (the script's
/// line, not the framework's C++), else the innermost frame.
pub fn key_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| f.kind == FrameKind::Python)
        .or_else(|| frames.first())
}

impl CallSites {
    /// The busiest site and its share of `total` (0-1).
    pub fn top(&self) -> Option<(&CallSite, f64)> {
        let s = self.sites.first()?;
        (self.total > 0).then(|| (s, s.count as f64 / self.total as f64))
    }
}

/// A tree's threads profiled natively while a snapshot was taken: sampled on the CPU (a
/// perf event at `rate_hz`, user and kernel stacks) and every wait off the CPU counted and
/// timed, those of at least `offcpu_min_ns` also at the stacks of their switch-out.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuProfile {
    /// How the samples were taken and what that costs.
    pub method: String,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    /// On-CPU samples per second per thread that runs the whole time.
    pub rate_hz: u32,
    /// Waits shorter than this were not taken.
    pub offcpu_min_ns: u64,
    /// Samples and waits counted without a stack that the kernel could not store (its stack
    /// map slot taken), and samples lost with the count map full. None: not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_stacks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_samples: Option<u64>,
    /// Steal time during the window, all CPUs together: the hypervisor ran something else
    /// while this VM wanted to run. None: not accounted (not a VM, or an old kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stolen_ms: Option<u64>,
    /// Per profiled thread: main threads first, then by samples and waited time.
    pub threads: Vec<CpuThreadProfile>,
    /// What could not be profiled, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One thread's CPU profile.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuThreadProfile {
    pub pid: u32,
    pub tid: u32,
    /// The kernel's name for the thread (comm).
    pub name: String,
    pub main_thread: bool,
    /// On-CPU samples (each stands for 1 / `rate_hz` s on a CPU).
    pub samples: u64,
    /// Of them taken while the thread ran kernel code (a syscall, a fault).
    pub kernel_samples: u64,
    /// Samples by the file whose code the thread was running ("libcuda.so.1", "[kernel]",
    /// "[unknown]" for code in no mapped file, such as JIT output), highest first.
    pub by_module: Vec<Share>,
    /// Samples by the function the thread was running (the innermost frame), highest first
    /// (at most [`MAX_SITES`]).
    pub top_functions: Vec<FrameShare>,
    /// Whole on-CPU stacks (outermost first, kernel frames above user ones) for a flame graph;
    /// at most [`MAX_FOLDED`], the rest in `folded_other`.
    pub folded: Vec<FoldedStack>,
    #[serde(default)]
    pub folded_other: u64,
    /// The frames `folded` refers to.
    pub frames: Vec<Frame>,
    /// Every wait off the CPU (blocked, not preempted) that ended during the profile, whatever
    /// its length, and their time; waits still going at its end are counted up to then.
    /// (Files written before `long_waits` existed counted only the long waits here.)
    pub waits: u64,
    pub wait_ns: u64,
    /// Of `waits`, those of at least [`CpuProfile::offcpu_min_ns`]: the ones `wait_sites`
    /// lists by stack. None in files written before all waits were summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_waits: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_wait_ns: Option<u64>,
    /// Where the thread blocked (kernel frames first, then user ones; innermost first),
    /// longest waited first (at most [`MAX_SITES`]): the long waits only. `CallSite::count`:
    /// waits, `time_ns`: their time.
    pub wait_sites: Vec<CallSite>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Share {
    pub name: String,
    pub samples: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FrameShare {
    pub frame: Frame,
    pub samples: u64,
}

/// Stacks (innermost first) with their samples as `folded` (outermost first) indexes into one
/// frame table, in the order given: what [`ThreadProfile`] and [`CpuThreadProfile`] hold.
pub fn fold(stacks: Vec<(Vec<Frame>, u64)>) -> (Vec<FoldedStack>, Vec<Frame>) {
    let mut frames: Vec<Frame> = Vec::new();
    let mut index: std::collections::HashMap<Frame, u32> = std::collections::HashMap::new();
    let folded = stacks
        .into_iter()
        .map(|(stack, samples)| FoldedStack {
            frames: stack
                .into_iter()
                .rev()
                .map(|f| {
                    *index.entry(f.clone()).or_insert_with(|| {
                        frames.push(f);
                        frames.len() as u32 - 1
                    })
                })
                .collect(),
            samples,
        })
        .collect();
    (folded, frames)
}

impl CpuProfile {
    /// Samples a thread on a CPU the whole profile would have (0 when the profile is empty).
    pub fn full_samples(&self) -> f64 {
        self.duration_ms as f64 / 1000.0 * f64::from(self.rate_hz)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(f: &str, file: &str, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: Some(f.into()),
            file: Some(file.into()),
            line: Some(line),
            ..Frame::default()
        }
    }

    #[test]
    fn labels_say_file_line_and_function() {
        assert_eq!(
            py("step", "/w/train.py", 41).label(),
            "train.py:41 in step()"
        );
        let n = Frame {
            function: Some("sync_a".into()),
            file: Some("/src/app.c".into()),
            line: Some(12),
            ..Frame::default()
        };
        assert_eq!(n.label(), "sync_a (app.c:12)");
        let stripped = Frame {
            module: Some("/usr/lib/libx.so".into()),
            offset: Some(0x1234),
            ..Frame::default()
        };
        assert_eq!(stripped.label(), "libx.so+0x1234");
        let late = Frame {
            unresolved: Some("symbolization timed out".into()),
            ..stripped
        };
        assert_eq!(late.label(), "libx.so+0x1234 (symbolization timed out)");
    }

    #[test]
    fn the_key_frame_is_the_innermost_python_one() {
        let native = Frame {
            function: Some("at::native::item".into()),
            ..Frame::default()
        };
        let site = CallSite {
            frames: vec![
                native.clone(),
                py("step", "t.py", 9),
                py("main", "t.py", 20),
            ],
            count: 3,
            ..CallSite::default()
        };
        assert_eq!(site.key_frame().unwrap().line, Some(9));
        let only_native = CallSite {
            frames: vec![native],
            ..CallSite::default()
        };
        assert_eq!(
            only_native.key_frame().unwrap().function.as_deref(),
            Some("at::native::item")
        );
        let sites = CallSites {
            total: 4,
            sites: vec![site],
            other: 1,
            ..CallSites::default()
        };
        assert_eq!(sites.top().unwrap().1, 0.75);
    }
}
