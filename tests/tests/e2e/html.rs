//! The HTML report: `ethand snapshot --pid P --html FILE` from a running daemon must write one
//! self-contained file that a real browser renders into a non-blank page. Needs headless
//! Chromium (`scripts/setup.sh --tests` installs it); the screenshot is kept for humans at
//! /tmp/ethand-test-html-PID.png and /work/html-report-screenshot.png (the report: /work/html-report.html).
use std::{
    collections::HashSet,
    fs,
    io::BufReader,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use ethand_tests::{Daemon, RemoveOnDrop, run_with_timeout, serial, temp_path, text};

use crate::workload;

/// Where a copy of the screenshot goes for the lead engineer to look at.
const SHOWCASE: &str = "/work/html-report-screenshot.png";
/// And the report itself.
const SHOWCASE_HTML: &str = "/work/html-report.html";

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(p) = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
            return p;
        }
    }
    panic!(
        "no chromium on PATH: the HTML report test screenshots the report with headless \
         Chromium; install it with `scripts/setup.sh --tests` (CI does)"
    );
}

/// (width, height, RGBA pixels) of a PNG.
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 4]>) {
    let f = fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut dec = png::Decoder::new(BufReader::new(f));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = dec.read_info().expect("PNG header");
    let mut buf = vec![0; r.output_buffer_size().expect("PNG size")];
    let info = r.next_frame(&mut buf).expect("PNG frame");
    let px = buf[..info.line_size * info.height as usize]
        .chunks(info.line_size)
        .flat_map(|row| {
            let n = match info.color_type {
                png::ColorType::Rgba => 4,
                png::ColorType::Rgb => 3,
                png::ColorType::GrayscaleAlpha => 2,
                _ => 1,
            };
            row.chunks(n)
                .take(info.width as usize)
                .map(move |c| match n {
                    4 => [c[0], c[1], c[2], c[3]],
                    3 => [c[0], c[1], c[2], 255],
                    2 => [c[0], c[0], c[0], c[1]],
                    _ => [c[0], c[0], c[0], 255],
                })
                .collect::<Vec<_>>()
        })
        .collect();
    (info.width, info.height, px)
}

#[test]
fn html_report_is_self_contained_and_renders_in_a_browser() {
    let _serial = serial();
    let chromium = chromium();
    let d = Daemon::start("html", "");
    // A main process and two children competing for one CPU: CPU, run-queue wait, a tree.
    let mut w = workload(&["runq", "6000"]);
    w.send_byte();
    thread::sleep(Duration::from_secs(4));

    let html = temp_path("html", "html");
    let _rm = RemoveOnDrop(html.clone());
    let pid = w.pid.to_string();
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &pid,
        "--html",
        html.to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "ethand snapshot --html failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(&format!("process tree of {pid}")),
        "the terminal output is still printed with --html: {}",
        text(&out.stdout)
    );
    drop(w);

    let h = fs::read_to_string(&html).expect("the report file");
    let _ = fs::copy(&html, SHOWCASE_HTML);
    eprintln!(
        "observed: report {} bytes, {} charts",
        h.len(),
        h.matches("<svg").count()
    );
    assert!(h.starts_with("<!DOCTYPE html>"), "not an HTML document");
    assert!(
        h.contains(&format!("pid {pid}")),
        "root pid missing from the report"
    );
    assert!(
        h.contains("<svg"),
        "no chart: the daemon's timeline should have points"
    );
    for bad in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "<script",
        "<link",
    ] {
        assert!(
            !h.contains(bad),
            "report is not self-contained: contains {bad:?}"
        );
    }
    assert!(
        !h.contains("http://") && !h.contains("https://"),
        "report references an external URL"
    );
    assert!(h.contains("ethand-workload"), "process names listed");

    // Screenshot with headless Chromium, then look at the pixels.
    let png = temp_path("html", "png");
    let profile = temp_path("html-chromium", "profile");
    let _ = fs::remove_file(&png);
    let shot = run_with_timeout(
        Command::new(&chromium)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--window-size=1280,2000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--screenshot={}", png.display()))
            .arg(format!("file://{}", html.display())),
        Duration::from_secs(90),
    );
    let _ = fs::remove_dir_all(&profile);
    assert!(
        png.is_file(),
        "chromium wrote no screenshot ({}): {}",
        shot.status,
        text(&shot.stderr)
    );
    let (wd, ht, px) = decode_png(&png);
    assert_eq!((wd, ht), (1280, 2000), "screenshot size");
    // The background is the most frequent colour.
    let mut freq = std::collections::HashMap::new();
    for p in &px {
        *freq.entry(*p).or_insert(0usize) += 1;
    }
    let (bg, _) = freq.iter().max_by_key(|(_, n)| **n).expect("pixels");
    let differ = px.iter().filter(|p| *p != bg).count() as f64 / px.len() as f64;
    let colours: HashSet<_> = px.iter().collect();
    let _ = fs::copy(&png, SHOWCASE);
    eprintln!(
        "observed: screenshot {} ({SHOWCASE}): {:.1} % of pixels differ from the background {bg:?}, {} distinct colours",
        png.display(),
        100.0 * differ,
        colours.len()
    );
    assert!(
        differ > 0.02,
        "the screenshot is blank: {:.2} % non-background",
        100.0 * differ
    );
    assert!(
        colours.len() >= 64,
        "the screenshot has only {} colours",
        colours.len()
    );
}
