//! CPU and Python samples: symbolized while their processes live, written as instants on
//! their threads' tracks.
use std::collections::HashMap;

use aya::maps::{MapData, PerCpuArray, StackTraceMap};

use crate::{
    commands::python_samples::PySample,
    pipeline::{reader::ReaderHandle, symbols},
};

use super::trace::{TraceEvent, TraceWriter};

/// Symbolizes the pending CPU samples and writes them as instants on their threads' tracks.
/// Frames are cached per (process, stack id): ids are stable for the recording (a stack
/// never replaces another in the map).
pub(super) struct Samples {
    pub(super) reader: ReaderHandle,
    pub(super) kernel: Option<symbols::KernelSymbols>,
    /// (pid, user stack id) -> labels, innermost first.
    pub(super) user_labels: HashMap<(u32, i64), Vec<String>>,
    pub(super) kernel_labels: HashMap<i64, Vec<String>>,
    pub(super) written: u64,
}

impl Samples {
    pub(super) fn new(reader: ReaderHandle) -> Self {
        Self {
            reader,
            kernel: symbols::Kallsyms::open().load(),
            user_labels: HashMap::new(),
            kernel_labels: HashMap::new(),
            written: 0,
        }
    }

    pub(super) fn ips(stacks: &StackTraceMap<MapData>, id: i64) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        let st = stacks.get(&id, 0).ok()?;
        Some(st.frames().iter().map(|f| f.ip).collect())
    }

    pub(super) fn write(
        &mut self,
        tw: &mut TraceWriter,
        stacks: &StackTraceMap<MapData>,
    ) -> std::io::Result<()> {
        let pending = std::mem::take(&mut tw.pending);
        if pending.is_empty() {
            return Ok(());
        }
        // New user stacks, per process, symbolized in one go each.
        let mut new: HashMap<u32, Vec<(i64, Vec<u64>)>> = HashMap::new();
        for e in &pending {
            let id = e.arg0 as i64;
            if !self.user_labels.contains_key(&(e.tgid, id))
                && !new
                    .get(&e.tgid)
                    .is_some_and(|v| v.iter().any(|(i, _)| *i == id))
            {
                let ips = Self::ips(stacks, id).unwrap_or_default();
                new.entry(e.tgid).or_default().push((id, ips));
            }
        }
        for (pid, list) in new {
            let stacks: Vec<Vec<u64>> = list.iter().map(|(_, ips)| ips.clone()).collect();
            let answer = self
                .reader
                .symbolize(pid, None, &stacks, false, false, false);
            for ((id, _), s) in list.into_iter().zip(answer.stacks) {
                self.user_labels
                    .insert((pid, id), s.frames.iter().map(|f| f.label()).collect());
            }
        }
        for e in &pending {
            let kid = e.arg1 as i64;
            if !self.kernel_labels.contains_key(&kid) {
                let ips = Self::ips(stacks, kid).unwrap_or_default();
                let labels = match &self.kernel {
                    Some(k) => k.frames(&ips).iter().map(|f| f.label()).collect(),
                    None => vec!["[kernel]".to_string(); ips.len()],
                };
                self.kernel_labels.insert(kid, labels);
            }
        }
        for e in &pending {
            tw.learn_thread(e.tgid, e.tid)?;
            let mut stack: Vec<&str> = self
                .kernel_labels
                .get(&(e.arg1 as i64))
                .map(|v| v.iter().map(String::as_str).collect())
                .unwrap_or_default();
            if let Some(u) = self.user_labels.get(&(e.tgid, e.arg0 as i64)) {
                stack.extend(u.iter().map(String::as_str));
            }
            tw.emit(&TraceEvent::CpuSample {
                pid: e.tgid,
                tid: e.tid,
                ts: e.start_ns,
                stack: &stack,
            })?;
            self.written += 1;
        }
        Ok(())
    }
}

/// Writes Python samples as instants on their threads' tracks; returns how many.
pub(super) fn write_python(
    tw: &mut TraceWriter,
    samples: impl Iterator<Item = PySample>,
) -> std::io::Result<u64> {
    let mut n = 0;
    for s in samples {
        tw.learn_thread(s.pid, s.tid)?;
        tw.emit(&TraceEvent::PythonSample {
            pid: s.pid,
            tid: s.tid,
            ts: s.ns,
            frames: &s.frames,
            active: s.active,
            gil: s.owns_gil,
        })?;
        n += 1;
    }
    Ok(n)
}

pub(super) fn drop_sum(m: &PerCpuArray<MapData, u64>, idx: u32) -> u64 {
    m.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
}
