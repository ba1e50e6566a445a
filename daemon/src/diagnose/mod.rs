//! The diagnosis engine: turns a process tree's snapshot into named signals and evaluates
//! the rules (data, not code: `rules.toml` embedded, plus `diagnosis.rules_dir`) over them.
//!
//! `signals/`: the signal catalog (every signal declared once: name, unit, meaning, how to
//! get it, computation; docs/diagnosis.md's table is generated from it); `rules.rs`: rule
//! files, checked against the catalog; `expr.rs`: the expression language of the rules'
//! fields; `detail.rs`: where a finding was found; `tree.rs`: facts the signals and the
//! details share; this file: evaluation.
mod detail;
pub mod expr;
mod memory;
mod rules;
pub mod signals;
mod tree;

use std::collections::BTreeMap;

use ethand_snapshot::{
    TreeSnapshot,
    diagnosis::{Evidence, Finding, NotEvaluated},
};

pub use self::rules::{BUILTIN_RULES, Rule, RuleError, RuleSpecState, load_rules, parse_rules};

/// Every signal the tree measures (see docs/diagnosis.md).
pub fn signals(t: &TreeSnapshot) -> BTreeMap<String, f64> {
    signals::compute(t)
}

/// Fills the tree's `findings` and `not_evaluated` from the rules.
pub fn apply(t: &mut TreeSnapshot, rules: &[Rule]) {
    let (findings, not_evaluated) = evaluate(t, rules);
    t.findings = findings;
    t.not_evaluated = not_evaluated;
}

/// Evaluates the rules over the tree; findings ranked by impact, highest first.
pub fn diagnose(t: &TreeSnapshot, rules: &[Rule]) -> Vec<Finding> {
    evaluate(t, rules).0
}

/// Findings ranked by impact, and the rules that could not run for a missing signal. A rule
/// about GPUs on a tree that uses none does not apply: it is neither.
pub fn evaluate(t: &TreeSnapshot, rules: &[Rule]) -> (Vec<Finding>, Vec<NotEvaluated>) {
    let s = signals(t);
    let uses_gpu = tree::uses_accelerator(t);
    let mut not_evaluated = Vec::new();
    let runnable: Vec<&Rule> = rules
        .iter()
        .filter(|r| {
            // An entry is met by any one of its signals; a missing one names them all.
            let missing: Vec<String> = r
                .needs
                .iter()
                .filter(|alts| !alts.iter().any(|n| s.contains_key(n.as_str())))
                .flatten()
                .fold(Vec::new(), |mut v, n| {
                    if !v.contains(n) {
                        v.push(n.clone());
                    }
                    v
                });
            if missing.is_empty() {
                return true;
            }
            let about_gpu = r
                .needs
                .iter()
                .flatten()
                .any(|n| signals::about_accelerator(n));
            if about_gpu && !uses_gpu {
                return false;
            }
            not_evaluated.push(NotEvaluated {
                rule: r.id.clone(),
                title: r.title.clone(),
                // Two signals of one source need one sentence.
                how: missing
                    .iter()
                    .map(|m| signals::how_to_get(m, t))
                    .fold(Vec::<String>::new(), |mut v, h| {
                        if !v.contains(&h) {
                            v.push(h);
                        }
                        v
                    })
                    .join(" "),
                missing,
            });
            false
        })
        .collect();
    let fired: Vec<&Rule> = runnable.into_iter().filter(|r| r.when.truth(&s)).collect();
    let mut out: Vec<Finding> = fired
        .iter()
        .filter(|r| {
            !r.suppressed_by
                .iter()
                .any(|id| fired.iter().any(|f| &f.id == id))
        })
        .map(|r| {
            let evidence = r
                .evidence
                .iter()
                .filter_map(|name| {
                    let unit = signals::find(name)?.unit;
                    s.get(name).map(|v| Evidence {
                        signal: name.clone(),
                        value: *v,
                        unit: unit.as_str().into(),
                    })
                })
                .collect();
            Finding {
                id: r.id.clone(),
                title: r.title.clone(),
                severity: r.severity,
                evidence,
                explanation: signals::quote(&r.explanation, &s),
                advice: r.advice.clone(),
                estimated_speedup: r
                    .speedup
                    .as_ref()
                    .and_then(|e| e.eval(&s))
                    .filter(|v| v.is_finite() && *v >= 1.0),
                impact: r
                    .impact
                    .as_ref()
                    .and_then(|e| e.eval(&s))
                    .filter(|v| v.is_finite())
                    .map_or(0.0, |v| v.clamp(0.0, 1.0)),
                detail: detail::detail(&r.id, t),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.impact
            .partial_cmp(&a.impact)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.id.cmp(&b.id))
    });
    (out, not_evaluated)
}

#[cfg(test)]
mod tests;
