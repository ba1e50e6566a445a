//! A real Prometheus server (Debian's `prometheus` package) for the tests that check the
//! deploy files against live data: started with a scrape config of our own, queried through
//! its HTTP API, killed and its data directory removed on drop (panics included).
use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{free_port, text};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// The Prometheus binary: `$PROMETHEUS_BIN`, else `/usr/bin/prometheus`, else `prometheus`
/// on PATH.
pub fn prometheus_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROMETHEUS_BIN") {
        return PathBuf::from(p);
    }
    let debian = Path::new("/usr/bin/prometheus");
    if debian.is_file() {
        return debian.to_path_buf();
    }
    PathBuf::from("prometheus")
}

/// A running Prometheus with its own temporary directory (config, TSDB, log).
pub struct PrometheusServer {
    child: Option<Child>,
    pub dir: PathBuf,
    pub port: u16,
}

impl PrometheusServer {
    /// Starts Prometheus scraping `targets` (host:port) every second under
    /// `job_name: ethand`, with `rule_files` (absolute paths) evaluated every second, and
    /// waits until it is ready.
    pub fn start(name: &str, targets: &[String], rule_files: &[PathBuf]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ethand-test-prometheus-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data")).expect("create the Prometheus directory");
        let rules: String = rule_files
            .iter()
            .map(|p| format!("  - {:?}\n", p.display().to_string()))
            .collect();
        let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n{rules}\
             scrape_configs:\n  - job_name: ethand\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let log = fs::File::create(dir.join("prometheus.log")).expect("create prometheus.log");
        let child = Command::new(prometheus_bin())
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (Debian: apt-get install prometheus; scripts/setup.sh --tests): {e}",
                    prometheus_bin().display()
                )
            });
        let mut s = Self {
            child: Some(child),
            dir,
            port,
        };
        s.wait_ready();
        s
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .expect("running")
                .try_wait()
                .expect("try_wait")
            {
                panic!(
                    "prometheus exited at start ({st}); log:\n{}",
                    self.log_text()
                );
            }
            if self.get("/-/ready").is_ok_and(|(code, _)| code == 200) {
                return;
            }
            assert!(
                t0.elapsed() < READY_TIMEOUT,
                "prometheus not ready after {READY_TIMEOUT:?}; log:\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET `path_and_query` (HTTP/1.0): (status code, body).
    pub fn get(&self, path_and_query: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(HTTP_TIMEOUT))?;
        write!(
            s,
            "GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.port
        )?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        let resp = text(&resp);
        let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((code, body.to_string()))
    }

    /// GET an API path and parse its JSON envelope; panics on transport errors only.
    pub fn api(&self, path_and_query: &str) -> Value {
        let (code, body) = self
            .get(path_and_query)
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path_and_query}: HTTP {code}, not JSON ({e}): {body}"))
    }

    /// An instant query now: the API's answer (`status`, `data.result` or `error`).
    pub fn query(&self, expr: &str) -> Value {
        self.api(&format!("/api/v1/query?query={}", url_encode(expr)))
    }

    /// Values of `label` over the series that match `selector` (Grafana's
    /// `label_values(selector, label)`).
    pub fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let v = self.api(&format!("/api/v1/series?match[]={}", url_encode(selector)));
        assert_eq!(v["status"], "success", "series {selector}: {v}");
        let mut out: Vec<String> = v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s[label].as_str().map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Scrapes that succeeded so far (within the last 10 minutes), all targets.
    pub fn successful_scrapes(&self) -> usize {
        let v = self.query("sum(sum_over_time(up[10m]))");
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(0, |f| f as usize)
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        if thread::panicking() {
            eprintln!("---- prometheus log ----\n{}", self.log_text());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encoding of a query-string value (RFC 3986 unreserved characters kept).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ------------------------------------------------------------------ the deploy files

/// `deploy/` of the repository.
pub const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

/// The Grafana dashboards of `deploy/grafana`: (file name, parsed JSON), by name.
pub fn dashboards() -> Vec<(String, Value)> {
    let dir = Path::new(DEPLOY).join("grafana");
    let mut out: Vec<(String, Value)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let body = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {name}: {e}"));
            let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no dashboards in {}", dir.display());
    out
}

/// The panels of a dashboard that show data: rows flattened (collapsed rows keep theirs in
/// `panels`), the rows themselves left out.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

/// The `expr` of every target of a panel.
pub fn exprs(panel: &Value) -> Vec<&str> {
    panel["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .collect()
}

/// Metric names in a PromQL expression: the identifiers outside strings and label matchers
/// that start with `ethand_` or `DCGM_`, plus Prometheus' own `up`; in order, deduplicated.
pub fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out: Vec<String> = Vec::new();
    let (mut i, mut depth_braces) = (0, 0usize);
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            // A string literal: skip it (escapes included).
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'{' {
            depth_braces += 1;
            i += 1;
        } else if c == b'}' {
            depth_braces = depth_braces.saturating_sub(1);
            i += 1;
        } else if (c.is_ascii_alphabetic() || c == b'_')
            && (i == 0 || !ident(b[i - 1]) && b[i - 1] != b'$')
        {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let metric = word.starts_with("ethand_") || word.starts_with("DCGM_") || word == "up";
            if metric && depth_braces == 0 && !out.iter().any(|w| w == word) {
                out.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}
