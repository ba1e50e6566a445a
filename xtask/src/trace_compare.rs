//! `cargo xtask trace-compare TRACE.pftrace TRACE.json`: the two outputs of one
//! `ethand record -o TRACE.pftrace -o TRACE.json` (written from the same events) hold the same
//! slices and instants: category, name, start and end to the ns. The Perfetto trace is
//! decoded with Perfetto's own definitions, its import rules checked. Prints the counts per
//! category, the sizes and bytes per event; exit 1 on any difference. The GPU check runs it
//! on the machine where the traces were made (a JSON trace of a busy job does not travel).
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::Value;

#[derive(clap::Args)]
pub struct TraceCompareArgs {
    perfetto: PathBuf,
    json: PathBuf,
}

/// (category, name, start ns, end ns; None for an instant).
type Row = (String, String, u64, Option<u64>);

fn json_rows(v: &Value) -> Result<Vec<Row>> {
    let t0 = v["metadata"]["start_monotonic_ns"]
        .as_u64()
        .context("metadata.start_monotonic_ns")?;
    let ns = |x: &Value| -> Result<u64> {
        let us = x.as_f64().context("ts")?;
        Ok((t0 as i128 + (us * 1000.0).round() as i128) as u64)
    };
    let mut rows = Vec::new();
    let mut begins: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    for e in v["traceEvents"].as_array().context("traceEvents")? {
        let cat = e["cat"].as_str().unwrap_or_default().to_owned();
        let name = e["name"].as_str().unwrap_or_default().to_owned();
        match e["ph"].as_str().unwrap_or_default() {
            "X" => {
                let start = ns(&e["ts"])?;
                let dur = (e["dur"].as_f64().context("dur")? * 1000.0).round() as u64;
                rows.push((cat, name, start, Some(start + dur)));
            }
            "i" if cat != "ethand" => rows.push((cat, name, ns(&e["ts"])?, None)),
            "b" => {
                begins.insert(e["id"].as_u64().context("id")?, (name, ns(&e["ts"])?));
            }
            "e" => {
                let (name, start) = begins
                    .remove(&e["id"].as_u64().context("id")?)
                    .context("an async end without its begin")?;
                rows.push((cat, name, start, Some(ns(&e["ts"])?)));
            }
            _ => {}
        }
    }
    Ok(rows)
}

fn perfetto_rows(d: &ethand_perfetto::decode::Decoded) -> Vec<Row> {
    d.events
        .iter()
        .filter(|e| e.category != "ethand")
        .map(|e| {
            // Time on a CPU track is named after its thread; JSON calls it "running".
            let on_cpu = d.tracks[&e.track].name.starts_with("CPU ") && e.category == "sched";
            let name = if on_cpu {
                "running".into()
            } else {
                e.name.clone()
            };
            (e.category.clone(), name, e.start_ns, e.end_ns)
        })
        .collect()
}

pub fn run(args: TraceCompareArgs) -> Result<()> {
    let pb = std::fs::read(&args.perfetto)
        .with_context(|| format!("reading {}", args.perfetto.display()))?;
    let jb =
        std::fs::read(&args.json).with_context(|| format!("reading {}", args.json.display()))?;
    let d = ethand_perfetto::decode::decode(&pb)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.perfetto.display()))?;
    let j: Value = serde_json::from_slice(&jb).context("parsing the JSON trace")?;
    let (mut p, mut q) = (perfetto_rows(&d), json_rows(&j)?);
    p.sort();
    q.sort();
    let count = |rows: &[Row]| {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for r in rows {
            *m.entry(r.0.clone()).or_default() += 1;
        }
        m
    };
    let n = q.len().max(1) as f64;
    println!(
        "perfetto: {} bytes, {} events ({:.1} B/event), {} packets in {} compressed chunks, {} sequences",
        pb.len(),
        p.len(),
        pb.len() as f64 / n,
        d.packets,
        d.compressed_chunks,
        d.sequences
    );
    println!(
        "json:     {} bytes, {} events ({:.1} B/event); perfetto/json size {:.3}",
        jb.len(),
        q.len(),
        jb.len() as f64 / n,
        pb.len() as f64 / jb.len().max(1) as f64
    );
    println!("per category: perfetto {:?}", count(&p));
    println!("              json     {:?}", count(&q));
    if p != q {
        let only_p = p
            .iter()
            .filter(|r| q.binary_search(r).is_err())
            .take(5)
            .collect::<Vec<_>>();
        let only_q = q
            .iter()
            .filter(|r| p.binary_search(r).is_err())
            .take(5)
            .collect::<Vec<_>>();
        bail!("the traces differ: only in perfetto {only_p:?}; only in json {only_q:?}");
    }
    println!("same {} events in both", p.len());
    Ok(())
}
