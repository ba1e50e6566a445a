//! The stack sample of a snapshot: the Python frames of a tree's threads, read from outside
//! the processes (by the reader, as each process's owner: `python_readers.rs`) a few dozen
//! times a second for a short while. Each sample of a thread counts
//! - toward the runtime call the thread is inside at that moment (`GPU_INFLIGHT`, the timed
//!   calls: syncs, collectives, allocations at level `calls`; inside that function before and
//!   after the read), at the Python stack it was called from:
//!   sampled this way, a site's share is its share of the time spent in the call, which is
//!   what a slow job loses;
//! - toward the thread's profile: its innermost Python line, and its whole stack for a flame
//!   graph.
//!
//! **Invariant:** nothing here stops or writes to a profiled process, and a process the
//! reader cannot read is a note, never an error of the snapshot.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use ethand_reader::ThreadStack;
use ethand_snapshot::stacks::{
    CallSite, CallSites, Frame, MAX_FOLDED, MAX_SITES, SiteBasis, StackSample, ThreadProfile, fold,
};
use ethand_userspace_probes::catalog::CATALOG;

use crate::pipeline::{
    collector::GpuInflightReader,
    procinfo::unix_ms,
    python_readers::{PythonReaders, ReadError},
    reader::ReaderHandle,
};

/// Most Python processes of one tree sampled (a DataLoader with many workers, a launcher with
/// eight ranks); the rest are noted.
pub const MAX_PROCESSES: usize = 32;

/// Samples the Python processes among `pids` every `1 / rate_hz` s for `duration`. None when
/// none of them runs Python.
pub fn sample(
    reader: &ReaderHandle,
    pids: &[u32],
    duration: Duration,
    rate_hz: u32,
    inflight: Option<&GpuInflightReader>,
) -> Option<StackSample> {
    let started_unix_ms = unix_ms();
    let t0 = Instant::now();
    let cpu0 = thread_cpu_ns();
    let mut notes = Vec::new();
    let mut readers = PythonReaders::new(reader);
    let mut python = 0usize;
    for &pid in pids {
        if readers.pids().len() >= MAX_PROCESSES {
            if ethand_reader::python::looks_like_python(pid) {
                python += 1;
            }
            continue;
        }
        match readers.open(pid) {
            Ok(true) => python += 1,
            Ok(false) => {}
            Err(e) => {
                python += 1;
                notes.push(e);
            }
        }
    }
    if python == 0 {
        return None;
    }
    let opened = readers.pids();
    let versions: Vec<String> = opened
        .iter()
        .map(|pid| format!("{pid}: Python {}", readers.version(*pid).unwrap_or("?")))
        .collect();
    if python > opened.len() + notes.len() {
        notes.push(format!(
            "{} more Python processes not sampled (at most {MAX_PROCESSES} per snapshot)",
            python - opened.len() - notes.len()
        ));
    }
    let mut acc = Acc::default();
    let period = Duration::from_secs(1) / rate_hz.max(1);
    let mut read_errors: HashMap<u32, (u64, String)> = HashMap::new();
    let mut next = t0;
    while !readers.is_empty() && t0.elapsed() < duration {
        for pid in readers.pids() {
            // Inside the same runtime function before and after the read: the stack read in
            // between is where that function is called from. One call spanning the read (a
            // wait of milliseconds) makes it exact; calls shorter than the read (~0.1-0.5 ms)
            // count when the thread is in one at both ends, which in a loop of such calls is
            // the loop's line.
            let before = inflight.map(GpuInflightReader::by_thread);
            let stacks = readers.stacks(pid);
            let after = inflight.map(GpuInflightReader::by_thread);
            acc.reads += 1;
            let in_call: HashMap<u32, u16> = match (before, after) {
                (Some(b), Some(a)) => b
                    .into_iter()
                    .filter(|(tid, (op, _))| a.get(tid).is_some_and(|(o, _)| o == op))
                    .map(|(tid, (op, _))| (tid, op))
                    .collect(),
                _ => HashMap::new(),
            };
            match stacks {
                Ok(stacks) => {
                    for t in stacks {
                        acc.add(pid, t, &in_call);
                    }
                }
                // A torn read (the thread moved on mid-read) loses this sample only.
                Err(ReadError::Torn(e)) => {
                    let slot = read_errors.entry(pid).or_default();
                    slot.0 += 1;
                    slot.1 = e;
                }
                Err(ReadError::Lost(note)) => notes.push(note),
            }
        }
        acc.rounds += 1;
        wait_tick(&mut next, period);
    }
    for (pid, (n, last)) in read_errors {
        // Torn reads of a busy process (a frame freed mid-read) are expected without stopping
        // it; only many of them are worth a note.
        if n * 4 > acc.rounds {
            notes.push(format!(
                "process {pid}: {n} of {} reads failed (last: {last})",
                acc.rounds
            ));
        }
    }
    let reads = acc.reads;
    Some(acc.finish(
        StackSample {
            method: format!(
                "Python frames read from outside the process (py-spy's reader, in ethand's \
                 sandboxed reader as the process's owner; the process is not stopped) \
                 {rate_hz} times a second; a sample counts toward a runtime call when \
                 the thread was inside that function before and after the read (the timed calls: \
                 syncs, collectives, allocations at level calls). Sampled: {}",
                versions.join(", ")
            ),
            started_unix_ms,
            duration_ms: t0.elapsed().as_millis() as u64,
            rate_hz,
            reads,
            sampler_cpu_ns: cpu0.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a)),
            notes,
            ..StackSample::default()
        },
        &mut readers,
    ))
}

#[derive(Default)]
struct ThreadAcc {
    name: Option<String>,
    samples: u64,
    active: u64,
    in_call: u64,
    /// Innermost frame: samples.
    lines: HashMap<Frame, u64>,
    /// Whole stack, innermost first: samples.
    stacks: HashMap<Vec<Frame>, u64>,
}

/// CPU time of the calling thread (ns).
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    (unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0)
        .then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[derive(Default)]
struct Acc {
    rounds: u64,
    reads: u64,
    threads: HashMap<(u32, u32), ThreadAcc>,
    /// (pid, op) -> stack (innermost first) -> samples.
    sites: HashMap<(u32, u16), HashMap<Vec<Frame>, u64>>,
}

impl Acc {
    fn add(&mut self, pid: u32, t: ThreadStack, in_call: &HashMap<u32, u16>) {
        let Some(first) = t.frames.first().cloned() else {
            return;
        };
        // A thread the interpreter gives no OS id for is kept apart under id 0.
        let tid = t.tid.unwrap_or(0);
        let op = t.tid.and_then(|tid| in_call.get(&tid).copied());
        let th = self.threads.entry((pid, tid)).or_default();
        if th.name.is_none() {
            th.name = t.name;
        }
        th.samples += 1;
        th.active += u64::from(t.active);
        th.in_call += u64::from(op.is_some());
        *th.lines.entry(first).or_default() += 1;
        if let Some(op) = op {
            *self
                .sites
                .entry((pid, op))
                .or_default()
                .entry(t.frames.clone())
                .or_default() += 1;
        }
        *th.stacks.entry(t.frames).or_default() += 1;
    }

    fn finish(self, mut out: StackSample, readers: &mut PythonReaders<'_>) -> StackSample {
        let mut sources = Sources::new(&self, readers);
        for ((pid, op), stacks) in self.sites {
            let Some(spec) = CATALOG.get(op as usize) else {
                continue;
            };
            let total = stacks.values().sum();
            let (sites, other) = top(stacks, MAX_SITES);
            out.call_sites.push(CallSites {
                pid,
                call: spec.name.to_string(),
                category: spec.category.as_str().to_string(),
                basis: SiteBasis::Samples,
                total,
                sites: sites
                    .into_iter()
                    .map(|(frames, count)| CallSite {
                        source: sources.of(pid, &frames),
                        frames,
                        count,
                        time_ns: None,
                    })
                    .collect(),
                other,
                unattributed: None,
            });
        }
        out.call_sites
            .sort_by(|a, b| b.total.cmp(&a.total).then(a.pid.cmp(&b.pid)));
        for ((pid, tid), th) in self.threads {
            let (lines, _) = top(th.lines, MAX_SITES);
            let (stacks, folded_other) = top(th.stacks, MAX_FOLDED);
            let (folded, frames) = fold(stacks);
            out.threads.push(ThreadProfile {
                pid,
                tid,
                name: th
                    .name
                    .or_else(|| crate::pipeline::procinfo::thread_comm(pid, tid))
                    .unwrap_or_default(),
                main_thread: pid == tid,
                samples: th.samples,
                active_samples: th.active,
                in_runtime_call_samples: th.in_call,
                top_lines: lines
                    .into_iter()
                    .map(|(f, count)| {
                        let frames = vec![f];
                        CallSite {
                            source: sources.of(pid, &frames),
                            frames,
                            count,
                            time_ns: None,
                        }
                    })
                    .collect(),
                folded,
                folded_other,
                frames,
            });
        }
        out.threads.sort_by(|a, b| {
            (b.main_thread, b.active_samples, b.samples)
                .cmp(&(a.main_thread, a.active_samples, a.samples))
                .then((a.pid, a.tid).cmp(&(b.pid, b.tid)))
        });
        out
    }
}

/// The `n` largest counts (ties in key order, so that the output is stable) and the sum of
/// the rest.
/// The `n` highest counts (ties by key) and the sum of the rest.
pub(crate) fn top<K: Ord>(m: HashMap<K, u64>, n: usize) -> (Vec<(K, u64)>, u64) {
    let mut v: Vec<(K, u64)> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other = v.iter().skip(n).map(|(_, c)| c).sum();
    v.truncate(n);
    (v, other)
}

/// Source lines of the sites and top lines, asked of the reader in one request per process
/// (as its owner: a file the owner may not read gives none).
struct Sources {
    lines: HashMap<(u32, String, u32), Option<String>>,
}

impl Sources {
    fn new(acc: &Acc, readers: &mut PythonReaders<'_>) -> Self {
        let mut wanted: HashMap<u32, Vec<(String, u32)>> = HashMap::new();
        let mut want = |pid: u32, frames: &[Frame]| {
            if let Some(f) = frames.iter().find(|f| f.file.is_some() && f.line.is_some()) {
                let key = (f.file.clone().unwrap_or_default(), f.line.unwrap_or(0));
                let v = wanted.entry(pid).or_default();
                if !v.contains(&key) {
                    v.push(key);
                }
            }
        };
        for ((pid, _), stacks) in &acc.sites {
            for frames in stacks.keys() {
                want(*pid, frames);
            }
        }
        for ((pid, _), th) in &acc.threads {
            for f in th.lines.keys() {
                want(*pid, std::slice::from_ref(f));
            }
        }
        let mut lines = HashMap::new();
        for (pid, list) in wanted {
            // Only Python sources: a frame's file name is the process's to choose.
            let list: Vec<(String, u32)> = list
                .into_iter()
                .filter(|(f, _)| f.ends_with(".py"))
                .collect();
            let got = readers.source_lines(pid, &list);
            for ((file, line), text) in list.into_iter().zip(got) {
                lines.insert((pid, file, line), text);
            }
        }
        Self { lines }
    }

    fn of(&mut self, pid: u32, frames: &[Frame]) -> Option<String> {
        let f = frames
            .iter()
            .find(|f| f.file.is_some() && f.line.is_some())?;
        self.lines.get(&(pid, f.file.clone()?, f.line?))?.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_snapshot::stacks::FrameKind;

    fn f(func: &str, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: Some(func.into()),
            file: Some("/nonexistent/t.py".into()),
            line: Some(line),
            ..Frame::default()
        }
    }

    fn stack(tid: u32, active: bool, frames: Vec<Frame>) -> ThreadStack {
        ThreadStack {
            tid: Some(tid),
            name: Some("MainThread".into()),
            active,
            owns_gil: true,
            frames,
        }
    }

    #[test]
    fn samples_count_toward_the_call_the_thread_is_inside_and_its_profile() {
        // cuStreamSynchronize's op id, whatever the catalog's order.
        let op = CATALOG
            .iter()
            .position(|s| s.name == "cuStreamSynchronize")
            .unwrap() as u16;
        let in_sync = HashMap::from([(10, op)]);
        let mut acc = Acc::default();
        for _ in 0..3 {
            acc.add(
                10,
                stack(10, false, vec![f("step", 41), f("<module>", 90)]),
                &in_sync,
            );
        }
        acc.add(
            10,
            stack(10, true, vec![f("load", 7), f("<module>", 88)]),
            &HashMap::new(),
        );
        // A thread with no Python frame is no sample.
        acc.add(10, stack(11, true, vec![]), &HashMap::new());
        let reader =
            ReaderHandle::unavailable(&crate::config::Plan::defaults().reader, "test".into());
        let out = acc.finish(StackSample::default(), &mut PythonReaders::new(&reader));
        assert_eq!(out.call_sites.len(), 1);
        let c = &out.call_sites[0];
        assert_eq!(
            (c.pid, c.call.as_str(), c.category.as_str()),
            (10, "cuStreamSynchronize", "sync")
        );
        assert_eq!((c.total, c.other, c.sites.len()), (3, 0, 1));
        assert_eq!(c.sites[0].frames[0].line, Some(41));
        assert_eq!(out.threads.len(), 1);
        let t = &out.threads[0];
        assert!(t.main_thread);
        assert_eq!(
            (t.samples, t.active_samples, t.in_runtime_call_samples),
            (4, 1, 3)
        );
        assert_eq!(t.top_lines[0].frames[0].line, Some(41));
        assert_eq!(t.top_lines[0].count, 3);
        // Folded stacks are outermost first.
        let s = &t.folded[0];
        assert_eq!(s.samples, 3);
        assert_eq!(
            t.frames[s.frames[0] as usize].function.as_deref(),
            Some("<module>")
        );
        assert_eq!(t.frames[s.frames[1] as usize].line, Some(41));
        // A file that cannot be read has no source text, not an error.
        assert_eq!(c.sites[0].source, None);
    }
}

/// Sleeps until the tick after `next`, one `period` on; when behind (slow reads), skips the
/// missed ticks rather than burst.
pub(crate) fn wait_tick(next: &mut Instant, period: Duration) {
    *next += period;
    let now = Instant::now();
    if *next > now {
        std::thread::sleep(*next - now);
    } else {
        *next = now;
    }
}
