use super::*;

#[test]
fn durations_parse_within_an_hour() {
    assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("1h").unwrap(), MAX_DURATION);
    for bad in [
        "0",
        "-1",
        "x",
        "nan",
        "inf",
        "1e300",
        "18446744073709551615",
        "61m",
        "2h",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_duration(" 61m ").unwrap_err().to_string(),
        "\"61m\" is longer than ethand record allows (1 h)"
    );
    assert_eq!(
        parse_duration("x").unwrap_err().to_string(),
        "\"x\" is not a duration like 10s, 500ms or 2m"
    );
}

fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut l = Vec::new();
    f(&mut l);
    String::from_utf8(l).unwrap()
}

#[test]
fn numbers_are_formatted_exactly() {
    assert_eq!(s(|l| push_u64(l, 0)), "0");
    assert_eq!(s(|l| push_u64(l, u64::MAX)), u64::MAX.to_string());
    assert_eq!(s(|l| push_i64(l, -38)), "-38");
    assert_eq!(s(|l| push_i64(l, i64::MIN)), i64::MIN.to_string());
    assert_eq!(s(|l| push_us(l, 0)), "0.000");
    assert_eq!(s(|l| push_us(l, 1_234_005)), "1234.005");
    assert_eq!(s(|l| push_ts(l, 1_500, 2_000)), "-0.500");
    assert_eq!(s(|l| push_ts(l, 2_000_070, 1_000)), "1999.070");
}

mod formats {
    //! Both outputs from the same events: every slice and instant of the JSON trace is in the
    //! Perfetto trace (decoded with Perfetto's own definitions, import rules checked) at the
    //! same times with the same arguments, and nothing else is.
    use std::collections::BTreeMap;

    use ethand_common::{RecordEvent, record_kind, record_off};
    use ethand_perfetto::decode::{Value as PValue, decode};
    use serde_json::Value;

    use super::super::json::JsonEncoder;
    use super::super::perfetto::PerfettoEncoder;
    use super::super::trace::{Encoder, Ending, TraceEvent, TraceWriter};

    const PID: u32 = 4_190_001;
    const T0: u64 = 5_000_000_000;

    /// (category, name, pid, tid, start ns, end ns or none for an instant, arguments).
    type Row = (
        String,
        String,
        u32,
        u32,
        u64,
        Option<u64>,
        BTreeMap<String, String>,
    );

    fn ev(kind: u32, tid: u32, cpu: u32, start: u64, dur: u64, args: [u64; 4]) -> RecordEvent {
        RecordEvent {
            kind,
            tgid: PID,
            tid,
            cpu,
            start_ns: T0 + start,
            dur_ns: dur,
            arg0: args[0],
            arg1: args[1],
            arg2: args[2],
            arg3: args[3],
        }
    }

    /// Two threads as the kernel reports them (each slice when it ends): scheduler slices, a
    /// GPU call around two syscalls, a failing syscall, a 3 s blocked slice (longer than the
    /// reorder window), overlapping block requests, samples, a slice cut at the end.
    fn record(tw: &mut TraceWriter) {
        let rwbs = u64::from_le_bytes(*b"WS\0\0\0\0\0\0");
        let events = [
            ev(record_kind::ON_CPU, PID, 1, 0, 1_000, [0; 4]),
            ev(record_kind::SYSCALL, PID, 1, 2_000, 500, [16, 0, 0, 0]),
            ev(
                record_kind::SYSCALL,
                PID,
                1,
                3_000,
                700,
                [16, (-11i64) as u64, 0, 0],
            ),
            ev(record_kind::GPU, PID, 1, 1_500, 5_000, [0, 4096, 0, 0]),
            ev(
                record_kind::OFF_CPU,
                PID,
                0,
                1_000,
                9_000,
                [record_off::PREEMPTED, 0, 0, 0],
            ),
            ev(
                record_kind::BLOCK,
                PID,
                0,
                4_000,
                20_000,
                [8 << 20, 2048, 65536, rwbs],
            ),
            ev(
                record_kind::BLOCK,
                PID,
                0,
                5_000,
                10_000,
                [8 << 20, 4096, 4096, rwbs],
            ),
            ev(
                record_kind::OFF_CPU,
                PID + 1,
                0,
                100,
                3_000_000_000,
                [record_off::BLOCKED, 0, 0, 0],
            ),
            ev(
                record_kind::ON_CPU,
                PID + 1,
                1,
                3_000_000_100,
                50_000,
                [0; 4],
            ),
            ev(record_kind::ON_CPU, PID, u32::MAX, 3_100_000_000, 7, [0; 4]),
        ];
        for e in &events {
            tw.event(e).unwrap();
        }
        let stack = ["do_syscall_64", "main"];
        tw.emit(&TraceEvent::CpuSample {
            pid: PID,
            tid: PID,
            ts: T0 + 1_200,
            stack: &stack,
        })
        .unwrap();
        let frames = vec![
            "train.py:41 in step()".to_string(),
            "train.py:9 in <module>".to_string(),
        ];
        tw.learn_thread(PID, PID + 1).unwrap();
        tw.emit(&TraceEvent::PythonSample {
            pid: PID,
            tid: PID + 1,
            ts: T0 + 3_000_000_120,
            frames: &frames,
            active: true,
            gil: false,
        })
        .unwrap();
        // A GPU call of a Python thread, with its frames (held, then written by `GpuPython`).
        let sync = ev(
            record_kind::GPU,
            PID + 1,
            1,
            3_000_000_200,
            2_000,
            [0, 0, 0, 7],
        );
        tw.gpu(&sync, &frames).unwrap();
    }

    fn args_of<'a>(kv: impl Iterator<Item = (&'a str, String)>) -> BTreeMap<String, String> {
        // The arguments both formats carry (JSON has dur_us, Perfetto the block id and the
        // pid of CPU slices: where they are, not what happened).
        kv.filter(|(k, _)| !["dur_us", "id", "pid"].contains(k))
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    }

    fn json_rows(v: &Value) -> Vec<Row> {
        let mut rows = Vec::new();
        let mut begins: BTreeMap<u64, &Value> = BTreeMap::new();
        let ns = |e: &Value| T0 + (e["ts"].as_f64().unwrap() * 1000.0).round() as u64;
        for e in v["traceEvents"].as_array().unwrap() {
            let ph = e["ph"].as_str().unwrap();
            let text = |v: &Value| match v {
                Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
                    .join("\n"),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let args = |e: &Value| {
                args_of(
                    e["args"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.as_str(), text(v))),
                )
            };
            let pid = e["pid"].as_u64().unwrap_or(0) as u32;
            let tid = |e: &Value| e["args"]["tid"].as_u64().or(e["tid"].as_u64()).unwrap() as u32;
            match ph {
                "X" => {
                    let end = ns(e) + (e["dur"].as_f64().unwrap() * 1000.0).round() as u64;
                    rows.push((
                        e["cat"].as_str().unwrap().into(),
                        e["name"].as_str().unwrap().into(),
                        pid,
                        tid(e),
                        ns(e),
                        Some(end),
                        args(e),
                    ));
                }
                "i" if e["cat"] != "ethand" => rows.push((
                    e["cat"].as_str().unwrap().into(),
                    e["name"].as_str().unwrap().into(),
                    pid,
                    tid(e),
                    ns(e),
                    None,
                    args(e),
                )),
                "b" => {
                    begins.insert(e["id"].as_u64().unwrap(), e);
                }
                "e" => {
                    let b = begins[&e["id"].as_u64().unwrap()];
                    rows.push((
                        "block".into(),
                        b["name"].as_str().unwrap().into(),
                        pid,
                        tid(b),
                        ns(b),
                        Some(ns(e)),
                        args(b),
                    ));
                }
                _ => {}
            }
        }
        rows.sort();
        rows
    }

    fn perfetto_rows(bytes: &[u8]) -> Vec<Row> {
        let d = decode(bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
        let mut rows = Vec::new();
        for e in &d.events {
            if e.category == "ethand" {
                continue;
            }
            let text = |v: &PValue| match v {
                PValue::Int(i) => i.to_string(),
                PValue::Uint(u) => u.to_string(),
                PValue::Bool(b) => b.to_string(),
                PValue::Double(f) => f.to_string(),
                PValue::Str(s) => s.clone(),
            };
            let arg = |k: &str| e.args.iter().find(|(n, _)| n == k).map(|(_, v)| text(v));
            let args = args_of(e.args.iter().map(|(k, v)| (k.as_str(), text(v))));
            let track = &d.tracks[&e.track];
            // CPU tracks and block lanes name their thread in the arguments.
            let (pid, tid, name) = match d.thread_of(e.track) {
                Some((p, t)) => (
                    p as u32,
                    arg("tid").map_or(t as u32, |t| t.parse().unwrap()),
                    e.name.clone(),
                ),
                None if track.name.starts_with("CPU ") => (
                    arg("pid").unwrap().parse().unwrap(),
                    arg("tid").unwrap().parse().unwrap(),
                    "running".into(),
                ),
                None => {
                    let p = d.tracks[&track.parent.unwrap()].pid.unwrap() as u32;
                    (p, arg("tid").unwrap().parse().unwrap(), e.name.clone())
                }
            };
            rows.push((
                e.category.clone(),
                name,
                pid,
                tid,
                e.start_ns,
                e.end_ns,
                args,
            ));
        }
        rows.sort();
        rows
    }

    #[test]
    fn perfetto_and_json_carry_the_same_events() {
        let dir = tempfile::tempdir().unwrap();
        let (jp, pp) = (dir.path().join("t.json"), dir.path().join("t.pftrace"));
        let outputs: Vec<Box<dyn Encoder>> = vec![
            Box::new(JsonEncoder::new(std::fs::File::create(&jp).unwrap(), T0)),
            Box::new(PerfettoEncoder::new(std::fs::File::create(&pp).unwrap(), None).unwrap()),
        ];
        let mut tw = TraceWriter::new(outputs, vec![jp.clone(), pp.clone()]);
        record(&mut tw);
        let meta = serde_json::json!({"events": tw.events, "dropped": 3, "python_samples": null});
        tw.finish(&Ending {
            root: PID,
            t_end: T0 + 3_100_000_007,
            dropped: 3,
            meta: &meta,
        })
        .unwrap();
        let json: Value = serde_json::from_slice(&std::fs::read(&jp).unwrap()).unwrap();
        let (j, p) = (
            json_rows(&json),
            perfetto_rows(&std::fs::read(&pp).unwrap()),
        );
        assert_eq!(j.len(), 13, "{j:#?}");
        assert_eq!(j, p);
        // The Python frames of the GPU call, in both (one frame a line).
        let python = j
            .iter()
            .filter_map(|r| r.6.get("python"))
            .collect::<Vec<_>>();
        assert_eq!(python, ["train.py:41 in step()\ntrain.py:9 in <module>"]);
        // The drop marker and the summary are there too.
        let d = decode(&std::fs::read(&pp).unwrap()).unwrap();
        let summary = d.events.iter().find(|e| e.name == "ethand record").unwrap();
        assert!(
            summary
                .args
                .iter()
                .any(|(k, v)| k == "dropped" && *v == PValue::Uint(3))
        );
        assert!(
            !summary.args.iter().any(|(k, _)| k == "python_samples"),
            "null is left out"
        );
        assert!(
            d.events
                .iter()
                .any(|e| e.name == "ethand: 3 events dropped (ring buffer full)")
        );
    }
}
