//! Ring mode: the trace as a run of segments on disk, each decodable without the ones before
//! it (the main sequence cleared, every track described again, strings defined anew), the
//! oldest deleted once the newer ones cover the time to keep or pass the byte budget. A
//! recording can so stay on for hours and keep the last minute. On finish the kept segments
//! are written out in order; the slices still open when the first kept one began (their
//! begins were in a deleted segment) are begun again on a sequence of their own, at their
//! true start.
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::PathBuf;

/// How a ring keeps its segments.
#[derive(Clone, Debug)]
pub struct RingOptions {
    /// An empty directory only the writer can write to: the segments go there, and are
    /// deleted from there (the directory itself is the caller's).
    pub dir: PathBuf,
    /// Keep at least this much of the end of the trace (ns).
    pub keep_ns: u64,
    /// Keep at most about this many bytes of segments (the newest segment always stays).
    pub max_bytes: Option<u64>,
}

/// What a ring kept and dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    pub segments_kept: u64,
    pub segments_dropped: u64,
    /// Slices and instants in the dropped segments.
    pub events_dropped: u64,
    /// Where the kept trace begins (CLOCK_MONOTONIC ns): the first kept segment's start.
    pub kept_from_ns: Option<u64>,
    pub bytes_kept: u64,
    /// Slices open where the kept trace begins whose begins were dropped: begun again at
    /// their true start.
    pub slices_begun_again: u64,
}

struct Segment {
    path: PathBuf,
    first_ts: Option<u64>,
    /// The newest timestamp written to it.
    last_ts: u64,
    bytes: u64,
    events: u64,
    /// Begins of the slices open when this segment started (packets of a sequence of their
    /// own): written after it only when it is the first kept one and older ones were dropped.
    opening: Vec<u8>,
    opening_slices: u64,
}

pub(crate) struct Ring {
    opts: RingOptions,
    /// A segment lasts this long (an eighth of the time kept: the ring holds at most an
    /// eighth more than asked) ...
    segment_ns: u64,
    /// ... or holds this many bytes (an eighth of the byte budget).
    segment_bytes: u64,
    segments: VecDeque<Segment>,
    file: File,
    next: u64,
    stopped: bool,
    dropped: u64,
    events_dropped: u64,
}

impl Ring {
    pub(crate) fn new(opts: RingOptions) -> io::Result<Self> {
        let segment_ns = (opts.keep_ns / 8).max(100_000_000);
        let segment_bytes = opts.max_bytes.map_or(u64::MAX, |m| (m / 8).max(64 << 10));
        let (path, file) = create(&opts.dir, 0)?;
        Ok(Self {
            opts,
            segment_ns,
            segment_bytes,
            segments: VecDeque::from([Segment {
                path,
                first_ts: None,
                last_ts: 0,
                bytes: 0,
                events: 0,
                opening: Vec::new(),
                opening_slices: 0,
            }]),
            file,
            next: 1,
            stopped: false,
            dropped: 0,
            events_dropped: 0,
        })
    }

    fn current(&mut self) -> &mut Segment {
        self.segments.back_mut().expect("a ring has a segment")
    }

    /// Whether an event at `ts` starts a new segment (the first event starts the first).
    pub(crate) fn due(&mut self, ts: u64) -> bool {
        if self.stopped {
            return false;
        }
        let (segment_ns, segment_bytes) = (self.segment_ns, self.segment_bytes);
        let cur = self.current();
        match cur.first_ts {
            None => {
                cur.first_ts = Some(ts);
                false
            }
            Some(first) => ts >= first.saturating_add(segment_ns) || cur.bytes >= segment_bytes,
        }
    }

    /// An event leaves at `ts` (`counted`: a slice's begin or an instant, not an end).
    pub(crate) fn note(&mut self, ts: u64, counted: bool) {
        let cur = self.current();
        cur.last_ts = cur.last_ts.max(ts);
        cur.events += u64::from(counted);
    }

    pub(crate) fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.file.write_all(b)?;
        self.current().bytes += b.len() as u64;
        Ok(())
    }

    /// Starts the segment of `ts`, then deletes the oldest while the newer ones still
    /// cover the time kept and the bytes stay within the budget.
    pub(crate) fn next_segment(
        &mut self,
        ts: u64,
        opening: Vec<u8>,
        opening_slices: u64,
    ) -> io::Result<()> {
        let (path, file) = create(&self.opts.dir, self.next)?;
        self.next += 1;
        self.file = file;
        self.segments.push_back(Segment {
            path,
            first_ts: Some(ts),
            last_ts: ts,
            bytes: 0,
            events: 0,
            opening,
            opening_slices,
        });
        self.drop_before(ts)
    }

    /// Deletes the oldest segments while all they hold is older than the time kept before
    /// `now` (the end of the trace is at or after it), or the bytes pass the budget; the
    /// newest always stays.
    fn drop_before(&mut self, now: u64) -> io::Result<()> {
        let horizon = now.saturating_sub(self.opts.keep_ns);
        while self.segments.len() > 1 {
            let old = &self.segments[0];
            let bytes: u64 = self.segments.iter().map(|s| s.bytes).sum();
            let over = self.opts.max_bytes.is_some_and(|m| bytes > m);
            if old.last_ts >= horizon && !over {
                break;
            }
            let old = self.segments.pop_front().expect("two segments");
            fs::remove_file(&old.path)?;
            self.dropped += 1;
            self.events_dropped += old.events;
        }
        Ok(())
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// Events of the dropped time not in a segment (late slices still held).
    pub(crate) fn drop_events(&mut self, n: u64) {
        self.events_dropped += n;
    }

    /// The trace ends at `end`: segments older than the time kept before it go, and no
    /// segment is started or dropped after.
    pub(crate) fn stop(&mut self, end: u64) -> io::Result<()> {
        if !self.stopped {
            self.stopped = true;
            self.drop_before(end)?;
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> RingStats {
        RingStats {
            segments_kept: self.segments.len() as u64,
            segments_dropped: self.dropped,
            events_dropped: self.events_dropped,
            kept_from_ns: self.segments.front().and_then(|s| s.first_ts),
            bytes_kept: self.segments.iter().map(|s| s.bytes).sum(),
            slices_begun_again: match self.segments.front() {
                Some(s) if self.dropped > 0 => s.opening_slices,
                _ => 0,
            },
        }
    }

    /// The kept segments in order into `out`, then deleted.
    pub(crate) fn assemble(mut self, out: &mut impl Write) -> io::Result<()> {
        self.file.flush()?;
        let dropped_any = self.dropped > 0;
        for (i, s) in std::mem::take(&mut self.segments).into_iter().enumerate() {
            io::copy(&mut File::open(&s.path)?, out)?;
            // After the segment: its track descriptors come first.
            if i == 0 && dropped_any {
                out.write_all(&s.opening)?;
            }
            fs::remove_file(&s.path)?;
        }
        Ok(())
    }
}

impl Drop for Ring {
    /// A ring given up (an error) leaves no segment behind.
    fn drop(&mut self) {
        for s in &self.segments {
            let _ = fs::remove_file(&s.path);
        }
    }
}

/// A new segment file, never one that was there.
fn create(dir: &std::path::Path, n: u64) -> io::Result<(PathBuf, File)> {
    let path = dir.join(format!("segment-{n:06}.pftrace"));
    let file = File::options().write(true).create_new(true).open(&path)?;
    Ok((path, file))
}
