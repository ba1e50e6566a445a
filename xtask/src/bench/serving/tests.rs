use super::*;

#[test]
fn spread() {
    let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
    assert_eq!((s.n, s.median, s.p95, s.max), (5, 3.0, 5.0, 5.0));
    assert_eq!(Spread::of(&[1.0, 2.0]).median, 1.5);
    assert_eq!(Spread::of(&[]).n, 0);
}

#[test]
fn messages_with_length_chunks_and_eof() {
    let mut buf = Vec::new();
    let raw = b"POST /v1/metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\
                Transfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n1;ext\r\nz\r\n0\r\n\r\n";
    let mut r = &raw[..];
    let m = read_message(&mut r, &mut buf, false).unwrap().unwrap();
    assert!(m.head.starts_with("POST"));
    assert_eq!(m.body, b"abc");
    let m = read_message(&mut r, &mut buf, false).unwrap().unwrap();
    assert_eq!(m.body, b"xyz");
    assert!(read_message(&mut r, &mut buf, false).unwrap().is_none());
    let mut r = &b"HTTP/1.1 200 OK\r\n\r\nline\n"[..];
    let m = read_message(&mut r, &mut Vec::new(), true)
        .unwrap()
        .unwrap();
    assert_eq!(m.body, b"line\n");
}

#[test]
fn series_counts() {
    let text = "# HELP a x\n# TYPE a counter\na_total 1\nethand_process_cpu{pid=\"1\"} 2\n\n";
    assert_eq!(count_series(text), (2, 1));
    let text = "ethand_process_cpu_seconds_total{pid=\"7\",comm=\"a\"} 1\n\
                ethand_process_cpu_seconds_total{pid=\"8\"} 1\n\
                ethand_process_cpu_seconds_total{pid=\"7\",comm=\"b\"} 1\n";
    assert_eq!(selected_pids(text), 2);
    assert_eq!(
        short_config("a\npids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]\nb"),
        "a\npids = [1, 2, 3, ...]  # 14 pids of load processes\nb"
    );
}

/// A section as one text: its Markdown, then its terminal text.
fn rendered(sec: &Section) -> String {
    assert!(sec.record.is_none(), "the serving tables are the record");
    format!(
        "{}\n=== markdown ===\n{}=== text ===\n{}",
        sec.title, sec.markdown, sec.text
    )
}

/// `n` timings from `lo` ms upwards, the last one an outlier.
fn timings(n: usize, lo: f64) -> Spread {
    let mut xs: Vec<f64> = (0..n).map(|i| lo + 0.25 * i as f64).collect();
    if let Some(last) = xs.last_mut() {
        *last *= 3.0;
    }
    Spread::of(&xs)
}

/// The ~10k series phase: everything measured, the profile's top included.
fn target_phase() -> Phase {
    let pids: Vec<String> = (0..140).map(|i| (4000 + i).to_string()).collect();
    Phase {
        config: format!(
            "[prometheus]\ntop_n = 0\npids = [{}]\n\n[otlp]\nenabled = true",
            pids.join(", ")
        ),
        selected: 140,
        series: 10_214,
        process_series: 9_800,
        scrape_ms: timings(50, 9.5),
        scrape_bytes: Spread::of(&[1_180_000.0, 1_180_400.0, 1_181_000.0]),
        otlp_exporter_ms: Some(timings(10, 6.0)),
        otlp_receive_ms: timings(10, 1.1),
        otlp_bytes: Spread::of(&[402_000.0, 403_000.0]),
        otlp_failed: 0,
        snapshot: Some(((timings(20, 30.0), 5120), (timings(20, 33.0), 61_440))),
        cli_baseline: Some(((timings(20, 1.5), 14), (timings(20, 4.0), 2048))),
        perf_top: Some(Ok(
            "  12.00%  ethand  [.] prometheus_client::encoding::text::encode\n   \
             8.50%  ethand  [.] alloc::fmt::format"
                .to_string(),
        )),
    }
}

/// Every load process selected: no snapshot runs, no exporter figure, a failed profile.
fn all_phase() -> Phase {
    Phase {
        config: "[prometheus]\ncomms = [\"ethand-load\"]".to_string(),
        selected: 1000,
        series: 70_214,
        process_series: 70_000,
        scrape_ms: timings(10, 61.0),
        scrape_bytes: Spread::of(&[8_400_000.0]),
        otlp_exporter_ms: None,
        otlp_receive_ms: timings(5, 7.5),
        otlp_bytes: Spread::of(&[2_900_000.0, 2_950_000.0, 3_010_000.0]),
        otlp_failed: 2,
        snapshot: None,
        cli_baseline: None,
        perf_top: Some(Err("perf not found".to_string())),
    }
}

fn results(all: Phase, target: Phase, quick: bool) -> Results {
    Results {
        spec: LoadSpec::FULL,
        all,
        target,
        pid: 4000,
        counts: Counts::new(quick),
    }
}

/// The section's text is what the code rendered before `section` was split (its output then
/// is the fixture): the tables of docs/performance.md must not change with the code's shape.
/// A change meant to show in the page updates the fixture in the same commit.
#[test]
fn section_renders_as_before() {
    let full = results(all_phase(), target_phase(), false);
    assert_eq!(
        rendered(&full.section()),
        include_str!("../testdata/serving-full.txt")
    );
    // The phases' other branches: under 10k series, no snapshot, no profile asked for.
    let mut target = all_phase();
    target.series = 9_990;
    target.perf_top = None;
    let mut all = target_phase();
    all.perf_top = Some(Err("perf record exited with 1".to_string()));
    let swapped = results(all, target, true);
    assert_eq!(
        rendered(&swapped.section()),
        include_str!("../testdata/serving-swapped.txt")
    );
}
