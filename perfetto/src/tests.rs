//! The writer against Perfetto's own definitions: what goes in comes back out, exactly,
//! through `decode` (which checks the import rules), whatever the order of arrival.
use super::*;
use crate::decode::{Value, decode};

/// A slice or instant as given to the writer.
#[derive(Clone, Debug, PartialEq)]
struct Given {
    track: TrackId,
    name: String,
    start: u64,
    end: Option<u64>,
    args: Vec<(String, Value)>,
}

/// A small deterministic generator (no dependency for tests).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Threads that each run calls containing syscalls (nested), reported when they end, plus
/// long blocked slices and instants, interleaved across threads as a kernel emits them.
fn workload(
    w: &mut TraceWriter<Vec<u8>>,
    threads: usize,
    per_thread: usize,
    rng: &mut Rng,
) -> Vec<Given> {
    let proc_track = w.process_track(100, "python3").unwrap();
    let mut given = Vec::new();
    // Per thread: what it reports, in its own end order.
    let mut queues: Vec<Vec<(u64, Given)>> = Vec::new();
    for t in 0..threads {
        let tid = 100 + t as u32;
        let track = w
            .thread_track(proc_track, 100, tid, &format!("worker-{t}"))
            .unwrap();
        let mut now = 1_000_000_000 + rng.below(1000);
        let mut q = Vec::new();
        for i in 0..per_thread {
            match rng.below(10) {
                // A call with syscalls inside: the syscalls end (and are reported) first.
                0..=5 => {
                    let start = now;
                    let mut t2 = start + 1 + rng.below(50);
                    let inner = rng.below(3);
                    for _ in 0..inner {
                        let s = t2;
                        let e = s + 1 + rng.below(2000);
                        q.push((
                            e,
                            Given {
                                track,
                                name: "ioctl".into(),
                                start: s,
                                end: Some(e),
                                args: vec![
                                    ("ret".into(), Value::Int(-(rng.below(3) as i64))),
                                    ("cpu".into(), Value::Uint(rng.below(8))),
                                ],
                            },
                        ));
                        t2 = e + rng.below(20);
                    }
                    let end = t2 + rng.below(100);
                    q.push((
                        end,
                        Given {
                            track,
                            name: "cuLaunchKernel".into(),
                            start,
                            end: Some(end),
                            args: vec![
                                ("library".into(), Value::Str("libcuda.so.1".into())),
                                ("bytes".into(), Value::Uint(i as u64)),
                            ],
                        },
                    ));
                    now = end + rng.below(1000);
                }
                // Blocked for up to two seconds: longer than the window, often late.
                6 => {
                    let end = now + rng.below(2_000_000_000);
                    q.push((
                        end,
                        Given {
                            track,
                            name: "futex".into(),
                            start: now,
                            end: Some(end),
                            args: vec![("blocked".into(), Value::Bool(true))],
                        },
                    ));
                    now = end;
                }
                // A sample, reported up to 20 ms late.
                _ => {
                    let stack = format!("main\nstep\nfn_{}", rng.below(5));
                    q.push((
                        now + rng.below(20_000_000),
                        Given {
                            track,
                            name: "cpu_sample".into(),
                            start: now,
                            end: None,
                            args: vec![
                                ("stack".into(), Value::Str(stack)),
                                ("share".into(), Value::Double(0.25)),
                            ],
                        },
                    ));
                    now += 1 + rng.below(10_000);
                }
            }
        }
        queues.push(q);
    }
    // Arrival: by report time across threads (each thread's own order kept).
    let mut all: Vec<(u64, usize, usize, Given)> = Vec::new();
    for (t, q) in queues.into_iter().enumerate() {
        for (i, (at, g)) in q.into_iter().enumerate() {
            all.push((at, t, i, g));
        }
    }
    all.sort_by_key(|a| (a.0, a.1, a.2));
    for (_, _, _, g) in all {
        let args: Vec<Arg<'_>> = g
            .args
            .iter()
            .map(|(k, v)| match v {
                Value::Int(i) => Arg::Int(k, *i),
                Value::Uint(u) => Arg::Uint(k, *u),
                Value::Bool(b) => Arg::Bool(k, *b),
                Value::Double(d) => Arg::Double(k, *d),
                Value::Str(s) => Arg::Str(k, s),
            })
            .collect();
        match g.end {
            Some(e) => w
                .slice(g.track, &g.name, "cat", g.start, e - g.start, &args)
                .unwrap(),
            None => w.instant(g.track, &g.name, "cat", g.start, &args).unwrap(),
        }
        given.push(g);
    }
    given
}

fn sorted(mut v: Vec<Given>) -> Vec<Given> {
    v.sort_by(|a, b| {
        (a.track, a.start, a.end, &a.name)
            .partial_cmp(&(b.track, b.start, b.end, &b.name))
            .unwrap()
    });
    v
}

/// The trace decoded under the import rules, and its events as given to the writer.
fn decoded(bytes: &[u8]) -> (crate::decode::Decoded, Vec<Given>) {
    let d = decode(bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
    let got = d
        .events
        .iter()
        .map(|e| Given {
            track: e.track,
            name: e.name.clone(),
            start: e.start_ns,
            end: e.end_ns,
            args: e.args.clone(),
        })
        .collect();
    (d, got)
}

fn roundtrip(
    opts: Options,
    threads: usize,
    per_thread: usize,
    seed: u64,
) -> (Stats, usize, Vec<Given>, Vec<Given>) {
    let mut w = TraceWriter::new(Vec::new(), opts).unwrap();
    let given = workload(&mut w, threads, per_thread, &mut Rng(seed));
    let (bytes, stats) = w.finish().unwrap();
    assert_eq!(bytes.len() as u64, stats.written_bytes);
    let (d, got) = decoded(&bytes);
    assert_eq!(d.sequences as u64, stats.sequences);
    (stats, bytes.len(), sorted(given), sorted(got))
}

#[test]
fn every_slice_and_instant_comes_back_exactly_at_the_defaults() {
    let (stats, len, given, got) = roundtrip(Options::default(), 16, 4000, 7);
    eprintln!(
        "{} events, {len} bytes ({:.1} B/event), {stats:?}",
        given.len(),
        len as f64 / given.len() as f64
    );
    assert_eq!(given.len(), got.len());
    assert_eq!(given, got);
    assert!(
        stats.late_slices > 0,
        "the 2 s blocked slices are late: {stats:?}"
    );
    assert!(
        (len as f64) < given.len() as f64 * 12.0,
        "{len} bytes for {} events",
        given.len()
    );
}

/// A tiny window, a tiny late batch and a full window: many late sequences and forced
/// departures; still every event, every sequence ordered.
#[test]
fn a_small_window_and_late_batches_lose_nothing() {
    let opts = Options {
        reorder_window_ns: 1_000_000,
        max_pending: 64,
        max_late: 100,
        chunk_bytes: 4096,
        level: 1,
    };
    let (stats, _, given, got) = roundtrip(opts, 8, 2000, 11);
    assert!(stats.sequences > 3, "{stats:?}");
    assert!(stats.forced > 0, "{stats:?}");
    assert!(stats.max_pending <= 65, "{stats:?}");
    assert_eq!(given, got);
}

/// The decoder is not a rubber stamp: a trace that breaks a rule is refused.
#[test]
fn the_checker_refuses_broken_traces() {
    // An event on a track never described.
    let mut w = TraceWriter::new(Vec::new(), Options::default()).unwrap();
    w.slice(99, "x", "c", 10, 5, &[]).unwrap();
    let (bytes, _) = w.finish().unwrap();
    let e = decode(&bytes).unwrap_err();
    assert!(e.contains("undescribed track 99"), "{e}");
    // Truncated output is not a trace.
    let mut w = TraceWriter::new(Vec::new(), Options::default()).unwrap();
    let t = w.track(None, "t", None).unwrap();
    w.slice(t, "x", "c", 10, 5, &[]).unwrap();
    let (bytes, _) = w.finish().unwrap();
    assert!(decode(&bytes[..bytes.len() - 3]).is_err());
    // An end with nothing open (hand-made: the writer cannot produce one).
    let mut p = Vec::new();
    proto::uint(&mut p, 10, 1);
    proto::message(&mut p, 60, |t| proto::uint(t, 1, 5));
    let mut trace = Vec::new();
    proto::bytes(&mut trace, 1, &p);
    let mut p = Vec::new();
    proto::uint(&mut p, 8, 100);
    proto::uint(&mut p, 58, 3);
    proto::uint(&mut p, 10, 1);
    proto::message(&mut p, 11, |e| {
        proto::uint(e, 9, TYPE_SLICE_END);
        proto::uint(e, 11, 5);
    });
    proto::bytes(&mut trace, 1, &p);
    let e = decode(&trace).unwrap_err();
    assert!(e.contains("nothing open"), "{e}");
}

/// Equal timestamps: the outer slice begins first and ends last.
#[test]
fn equal_timestamps_nest() {
    let mut w = TraceWriter::new(Vec::new(), Options::default()).unwrap();
    let t = w.track(None, "t", None).unwrap();
    // Inner [10, 20) reported first, outer [10, 20) after: same bounds; inner [10,15).
    w.slice(t, "inner", "c", 10, 5, &[]).unwrap();
    w.slice(t, "outer", "c", 10, 10, &[]).unwrap();
    let (bytes, _) = w.finish().unwrap();
    let d = decode(&bytes).unwrap();
    let mut names: Vec<(&str, u64, Option<u64>)> = d
        .events
        .iter()
        .map(|e| (e.name.as_str(), e.start_ns, e.end_ns))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![("inner", 10, Some(15)), ("outer", 10, Some(20))]
    );
}

/// Not a check: where the writer's time goes (`cargo test --release -p ethand-perfetto --
/// --ignored --nocapture cost`).
#[test]
#[ignore]
fn cost() {
    for level in [0u32, 1, 3, 6] {
        let opts = Options {
            level,
            ..Options::default()
        };
        let mut w = TraceWriter::new(Vec::new(), opts).unwrap();
        let t = w.track(None, "t", None).unwrap();
        let n = 1_000_000u64;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            let args = [
                Arg::Uint("nr", 39),
                Arg::Int("ret", 1234),
                Arg::Uint("cpu", i % 2),
            ];
            w.slice(
                t,
                "getpid",
                "syscall",
                1_000_000 + i * 1000,
                300 + i % 7,
                &args,
            )
            .unwrap();
        }
        let (out, st) = w.finish().unwrap();
        let el = t0.elapsed();
        eprintln!(
            "level {level}: {:.0} ns/event, {:.2} B/event, raw {:.1} B/event",
            el.as_nanos() as f64 / n as f64,
            out.len() as f64 / n as f64,
            st.raw_bytes as f64 / n as f64
        );
    }
}

/// A private, empty directory for a ring's segments, removed after.
struct Dir(std::path::PathBuf);
impl Dir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ethand-ring-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        Self(d)
    }
    fn is_empty(&self) -> bool {
        std::fs::read_dir(&self.0).unwrap().next().is_none()
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ring_roundtrip(
    dir: &Dir,
    opts: Options,
    keep_ns: u64,
    max_bytes: Option<u64>,
) -> (RingStats, Vec<u8>, Vec<Given>, Vec<Given>) {
    let ring = RingOptions {
        dir: dir.0.clone(),
        keep_ns,
        max_bytes,
    };
    let mut w = TraceWriter::ring(Vec::new(), opts, ring).unwrap();
    let given = workload(&mut w, 8, 6000, &mut Rng(5));
    let stats = w.stop_rotating(0).unwrap().expect("a ring");
    let (bytes, _) = w.finish().unwrap();
    assert!(dir.is_empty(), "segments left behind");
    let (_, got) = decoded(&bytes);
    (stats, bytes, sorted(given), sorted(got))
}

/// A ring keeps the end of the trace: every event from where it begins, the slices open
/// there at their true start, nothing invented, and what it dropped counted exactly.
#[test]
fn a_ring_keeps_the_last_seconds_whole() {
    let dir = Dir::new("keep");
    let keep_ns = 2_000_000_000;
    let (stats, bytes, given, got) = ring_roundtrip(&dir, Options::default(), keep_ns, None);
    let last = given
        .iter()
        .map(|g| g.end.unwrap_or(g.start))
        .max()
        .unwrap();
    let first = given.iter().map(|g| g.start).min().unwrap();
    eprintln!(
        "{} events over {:.1} s, ring of {:.1} s: {stats:?}, {} bytes",
        given.len(),
        (last - first) as f64 / 1e9,
        keep_ns as f64 / 1e9,
        bytes.len()
    );
    assert!(stats.segments_dropped > 0, "{stats:?}");
    let from = stats.kept_from_ns.unwrap();
    // Segments of an eighth of the time kept (more only where events were sparse).
    assert!(stats.segments_kept <= 10, "{stats:?}");
    for g in &got {
        assert!(given.contains(g), "invented: {g:?}");
    }
    // Every event of the last keep_ns, and of the kept segments.
    let kept: Vec<&Given> = given
        .iter()
        .filter(|g| g.start >= from.min(last - keep_ns))
        .collect();
    for g in &kept {
        assert!(got.contains(g), "lost from the kept range: {g:?}");
    }
    let before: Vec<&Given> = got.iter().filter(|g| g.start < from).collect();
    assert!(
        before.iter().all(|g| g.end.is_some_and(|e| e >= from)),
        "before the kept range only slices open at its start"
    );
    assert!(stats.slices_begun_again > 0, "{stats:?}");
    assert_eq!(
        got.len() as u64 + stats.events_dropped - stats.slices_begun_again,
        given.len() as u64,
        "{stats:?}"
    );
}

/// A byte budget bounds the ring whatever the time asked.
#[test]
fn a_ring_stays_within_its_bytes() {
    let dir = Dir::new("bytes");
    let opts = Options {
        chunk_bytes: 16 << 10,
        ..Options::default()
    };
    let max = 256 << 10;
    let (stats, bytes, given, got) = ring_roundtrip(&dir, opts, 3_600_000_000_000, Some(max));
    eprintln!("{stats:?}, {} bytes", bytes.len());
    assert!(stats.segments_dropped > 0, "{stats:?}");
    // The kept segments, the newest of at most an eighth of the budget plus a chunk.
    assert!(
        (bytes.len() as u64) <= max + max / 8 + (16 << 10),
        "{} bytes",
        bytes.len()
    );
    let from = stats.kept_from_ns.unwrap();
    for g in given.iter().filter(|g| g.start >= from) {
        assert!(got.contains(g), "lost from the kept range: {g:?}");
    }
}

/// A flow's two ends come back on their slices, whether the end is written on the main
/// sequence or, arriving seconds late (a GPU record), on a late one.
#[test]
fn flows_come_back_on_both_ends_on_time_and_late() {
    let mut w = TraceWriter::new(Vec::new(), Options::default()).unwrap();
    let p = w.process_track(7, "job").unwrap();
    let thread = w.thread_track(p, 7, 7, "main").unwrap();
    let gpu = w.track(Some(p), "GPU 0 stream 0", Some(100_000)).unwrap();
    let s = 1_000_000_000;
    for i in 0..10u64 {
        let at = s + i * 10_000_000;
        w.slice_in_flow(
            thread,
            "cuLaunchKernel",
            "gpu",
            at,
            5_000,
            &[],
            Flow::Out(100 + i),
        )
        .unwrap();
    }
    // Kernels: the first five in time, the rest a second after their launch was written.
    for i in 0..5u64 {
        let at = s + i * 10_000_000 + 20_000;
        w.slice_in_flow(gpu, "k", "gpu_kernel", at, 10_000, &[], Flow::In(100 + i))
            .unwrap();
    }
    w.slice(thread, "later", "gpu", s + 2_000_000_000, 1, &[])
        .unwrap();
    for i in 5..10u64 {
        let at = s + i * 10_000_000 + 20_000;
        w.slice_in_flow(gpu, "k", "gpu_kernel", at, 10_000, &[], Flow::In(100 + i))
            .unwrap();
    }
    let (bytes, stats) = w.finish().unwrap();
    // Kernels 5-8 began before launch 9 had left: late (kernel 9 did not).
    assert_eq!(stats.late_slices, 4, "{stats:?}");
    let d = decode(&bytes).unwrap();
    let outs: Vec<(u64, Vec<u64>)> = d
        .events
        .iter()
        .filter(|e| e.name == "cuLaunchKernel")
        .map(|e| (e.start_ns, e.flows_out.clone()))
        .collect();
    let ins: Vec<(u64, Vec<u64>)> = d
        .events
        .iter()
        .filter(|e| e.name == "k")
        .map(|e| (e.start_ns - 20_000, e.flows_in.clone()))
        .collect();
    let want: Vec<(u64, Vec<u64>)> = (0..10u64)
        .map(|i| (s + i * 10_000_000, vec![100 + i]))
        .collect();
    assert_eq!(outs, want);
    let mut ins = ins;
    ins.sort();
    assert_eq!(ins, want);
    assert!(
        d.events
            .iter()
            .filter(|e| e.name == "later")
            .all(|e| e.flows_out.is_empty() && e.flows_in.is_empty())
    );
}
