//! The deploy files (`deploy/prometheus`, `deploy/grafana`) without a daemon: promtool checks
//! the alerting rules and runs their unit tests, every alert has a test, every metric a rule
//! or a panel uses exists in ethand's catalog with the type its functions need, and the
//! dashboards are importable and self-describing. Needs `promtool` on PATH (Debian's
//! `prometheus` package; scripts/setup.sh --tests). tests/e2e/dashboards.rs runs every
//! panel's query against a live daemon.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ethand_tests::{
    prometheus_server::{DEPLOY, dashboards, exprs, metric_names, panels},
    run_with_timeout, text,
};
use serde_json::Value;
use serde_norway::Value as Yaml;

fn prom_dir() -> PathBuf {
    Path::new(DEPLOY).join("prometheus")
}

fn yaml(name: &str) -> Yaml {
    let p = prom_dir().join(name);
    let body = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_norway::from_str(&body).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `promtool ARGS` in deploy/prometheus; panics with its output unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = run_with_timeout(
        Command::new("promtool").args(args).current_dir(prom_dir()),
        Duration::from_secs(120),
    );
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{all}",
        args.join(" "),
        out.status
    );
    println!("promtool {}:\n{all}", args.join(" "));
    all
}

/// (alert name, rule) of every alerting rule.
fn alerts() -> Vec<(String, Yaml)> {
    let rules = yaml("ethand-alerts.yml");
    let mut out = Vec::new();
    for g in rules["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            if let Some(a) = r["alert"].as_str() {
                out.push((a.to_string(), r.clone()));
            }
        }
    }
    out
}

#[test]
fn promtool_checks_rules_and_config() {
    let out = promtool(&["check", "rules", "ethand-alerts.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    promtool(&["check", "config", "prometheus.yml"]);
}

#[test]
fn promtool_unit_tests_pass() {
    let out = promtool(&["test", "rules", "ethand-alerts.test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert is named by a test case, at least once with alerts expected (a firing case).
#[test]
fn every_alert_has_a_firing_test() {
    let tests = yaml("ethand-alerts.test.yml");
    let mut named: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in tests["tests"].as_sequence().expect("tests") {
        for c in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = c["alertname"].as_str().expect("alertname").to_string();
            let firing = c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty());
            let e = named.entry(name).or_default();
            if firing {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
    }
    let alerts = alerts();
    assert!(alerts.len() >= 11, "{} alerts", alerts.len());
    let mut missing = Vec::new();
    for (a, _) in &alerts {
        let (firing, quiet) = named.get(a).copied().unwrap_or_default();
        println!("{a}: {firing} firing case(s), {quiet} not-firing case(s)");
        if firing == 0 {
            missing.push(a.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "alerts without a firing test case: {missing:?}"
    );
    let known: BTreeSet<&str> = alerts.iter().map(|(a, _)| a.as_str()).collect();
    let stale: Vec<&String> = named
        .keys()
        .filter(|n| !known.contains(n.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "tests name alerts that do not exist: {stale:?}"
    );
}

/// Alerts carry a severity, a summary and a description.
#[test]
fn alerts_are_documented() {
    for (a, r) in alerts() {
        let sev = r["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&sev),
            "{a}: severity {sev:?} (critical or warning)"
        );
        for k in ["summary", "description"] {
            let v = r["annotations"][k].as_str().unwrap_or("");
            assert!(
                v.len() > 20,
                "{a}: annotation {k} missing or too short: {v:?}"
            );
        }
    }
}

/// What a metric name is: a catalog family's type, a histogram's series, or Prometheus' own.
fn kind_of(catalog: &BTreeMap<&str, &str>, name: &str) -> Option<&'static str> {
    if name == "up" {
        return Some("gauge");
    }
    match catalog.get(name) {
        Some(&"counter") => return Some("counter"),
        Some(&"gauge") => return Some("gauge"),
        Some(&"histogram") => return None, // only its _bucket/_sum/_count exist
        _ => {}
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && catalog.get(base) == Some(&"histogram")
        {
            return Some("histogram series");
        }
    }
    None
}

/// Problems of one expression: unknown metric names, and counter functions (`rate`,
/// `increase`, `irate`) over gauges or gauge functions (`delta`, `deriv`, `predict_linear`)
/// over counters.
fn check_expr(catalog: &BTreeMap<&str, &str>, expr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for m in metric_names(expr) {
        if kind_of(catalog, &m).is_none() {
            problems.push(format!("unknown metric {m}"));
        }
    }
    for (func, wants) in [
        ("rate(", "counter"),
        ("increase(", "counter"),
        ("delta(", "gauge"),
        ("deriv(", "gauge"),
        ("predict_linear(", "gauge"),
    ] {
        let mut from = 0;
        while let Some(pos) = expr[from..].find(func) {
            let at = from + pos;
            from = at + func.len();
            let before = expr[..at].chars().last();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && func != "rate(" {
                continue;
            }
            // The first metric inside the call.
            let Some(m) = metric_names(&expr[from..]).into_iter().next() else {
                continue;
            };
            let kind = kind_of(catalog, &m).unwrap_or("unknown");
            let ok = match wants {
                "counter" => kind == "counter" || kind == "histogram series",
                _ => kind == "gauge",
            };
            if !ok {
                problems.push(format!("{func}) over {m}, a {kind}"));
            }
        }
    }
    problems
}

/// Every metric the rules and the dashboards use is one ethand exports (docs/metrics.md),
/// with the type its functions need.
#[test]
fn every_metric_used_exists() {
    let catalog_rows = ethand_exporters::prometheus::metric_catalog();
    let catalog: BTreeMap<&str, &str> = catalog_rows.iter().map(|(n, t, _)| (*n, *t)).collect();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (a, r) in alerts() {
        let expr = r["expr"].as_str().expect("expr");
        used.extend(metric_names(expr));
        for p in check_expr(&catalog, expr) {
            problems.push(format!("alert {a}: {p}"));
        }
    }
    for (file, d) in dashboards() {
        for p in panels(&d) {
            for expr in exprs(p) {
                used.extend(metric_names(expr));
                for pr in check_expr(&catalog, expr) {
                    problems.push(format!("{file} / {}: {pr}", p["title"]));
                }
            }
        }
    }
    println!("{} metric names used: {used:?}", used.len());
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The dashboards import into Grafana and explain themselves: a Prometheus input, a
/// datasource variable that every panel and target uses, a node variable, a unit and a
/// description on every panel, rates over `$__rate_interval` or a fixed window.
#[test]
fn dashboards_are_importable_and_described() {
    let mut uids = BTreeSet::new();
    let all = dashboards();
    assert!(all.len() >= 4, "{} dashboards", all.len());
    for (file, d) in &all {
        let uid = d["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no uid"));
        assert!(uids.insert(uid.to_string()), "{file}: uid {uid} used twice");
        assert!(
            d["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{file}: title"
        );
        assert!(d["id"].is_null(), "{file}: id must be null to import");
        let inputs = d["__inputs"].as_array().expect("__inputs");
        assert!(
            inputs.iter().any(|i| i["pluginId"] == "prometheus"),
            "{file}: no Prometheus datasource input"
        );
        let vars = d["templating"]["list"].as_array().expect("templating.list");
        let var = |name: &str| vars.iter().find(|v| v["name"] == name);
        assert_eq!(
            var("datasource").map(|v| v["type"].clone()),
            Some(Value::from("datasource")),
            "{file}: datasource variable"
        );
        assert!(
            var("instance").is_some(),
            "{file}: no instance (node) variable"
        );
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"]["uid"], "${datasource}",
                "{file}: variable {}",
                v["name"]
            );
        }
        let mut ids = BTreeSet::new();
        for p in panels(d) {
            let title = p["title"].as_str().unwrap_or("");
            assert!(!title.is_empty(), "{file}: panel without title");
            assert!(
                ids.insert(p["id"].to_string()),
                "{file}: panel id {} twice",
                p["id"]
            );
            assert!(
                p["description"].as_str().is_some_and(|s| s.len() > 20),
                "{file} / {title}: no description"
            );
            assert!(
                p["fieldConfig"]["defaults"]["unit"]
                    .as_str()
                    .is_some_and(|u| !u.is_empty()),
                "{file} / {title}: no unit"
            );
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file} / {title}");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{file} / {title}: no targets");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file} / {title}");
                let expr = t["expr"].as_str().unwrap_or("");
                assert!(!expr.is_empty(), "{file} / {title}: empty expr");
                assert!(
                    !expr.contains("[$__interval]"),
                    "{file} / {title}: rate over $__interval (use $__rate_interval): {expr}"
                );
                assert!(
                    expr.contains("instance=~\"$instance\""),
                    "{file} / {title}: not filtered by $instance: {expr}"
                );
            }
        }
        println!("{file}: {} panels", ids.len());
    }
}
