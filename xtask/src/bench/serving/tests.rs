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
