//! The diagnosis of a snapshot: its findings, and the rules that could not run.
use std::fmt::Write as _;

use ethand_snapshot::{
    TreeSnapshot,
    diagnosis::{Finding, NotEvaluated},
};

use super::clean;
use crate::format::in_unit;
use crate::text;

/// The diagnosis part of a snapshot alone (`ethand diagnose FILE`).
pub fn diagnosis(t: &TreeSnapshot) -> String {
    let mut o = String::new();
    findings(&mut o, &t.findings, &t.not_evaluated);
    // Rule text may come from a file: nothing raw reaches the terminal.
    text::for_terminal_keep_lines(&o)
}

pub(super) fn findings(o: &mut String, f: &[Finding], not_run: &[NotEvaluated]) {
    if f.is_empty() && not_run.is_empty() {
        let _ = writeln!(o, "DIAGNOSIS: no bottleneck found by the rules\n");
        return;
    }
    if f.is_empty() {
        // Not a clean bill of health: some rules could not look.
        let _ = writeln!(
            o,
            "DIAGNOSIS: no finding among the rules that could run; {} could not (below)",
            not_run.len()
        );
        not_evaluated(o, not_run);
        return;
    }
    let _ = writeln!(
        o,
        "DIAGNOSIS ({} finding{}, highest impact first)",
        f.len(),
        if f.len() == 1 { "" } else { "s" }
    );
    for (i, x) in f.iter().enumerate() {
        let gain = x
            .estimated_speedup
            .map(|s| format!(" — up to ~{s:.1}x if fixed"))
            // A rule gives an estimate only where one was checked against a measured fix.
            .unwrap_or_else(|| " — no speed-up estimate".to_string());
        let _ = writeln!(
            o,
            "{}. [{}] {}{}",
            i + 1,
            clean(x.severity.as_str()),
            clean(&x.title),
            gain
        );
        let ev: Vec<String> = x
            .evidence
            .iter()
            .map(|e| format!("{} = {}", clean(&e.signal), in_unit(e.value, &e.unit)))
            .collect();
        if !ev.is_empty() {
            let _ = writeln!(o, "   evidence: {}", ev.join(", "));
        }
        for d in &x.detail {
            let _ = writeln!(o, "   where: {}", clean(d));
        }
        let _ = writeln!(o, "   why: {}", clean(&x.explanation));
        for a in &x.advice {
            let _ = writeln!(o, "   - {}", clean(a));
        }
    }
    if not_run.is_empty() {
        let _ = writeln!(o);
    } else {
        let _ = writeln!(
            o,
            "NOT EVALUATED ({} rule{} could not run: a signal was not measured)",
            not_run.len(),
            if not_run.len() == 1 { "" } else { "s" }
        );
        not_evaluated(o, not_run);
    }
}

/// The rules that could not run, each with the signals it lacks and how to get them.
fn not_evaluated(o: &mut String, n: &[NotEvaluated]) {
    for x in n {
        let missing: Vec<String> = x.missing.iter().map(|m| clean(m)).collect();
        let _ = writeln!(
            o,
            "Could not run: {} ({}): missing {}; {}",
            clean(&x.rule),
            clean(&x.title),
            if missing.is_empty() {
                "(not stated)".to_string()
            } else {
                missing.join(", ")
            },
            clean(&x.how)
        );
    }
    let _ = writeln!(o);
}
