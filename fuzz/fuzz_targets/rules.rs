//! Diagnosis rules: the TOML rules file (built in, or `diagnosis.rules_dir`) and the
//! expression language of its `when` / `speedup` / `impact` fields, parsed and evaluated.
#![no_main]
use std::collections::BTreeMap;

use ethand::{diagnose, expr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let signals: BTreeMap<String, f64> = [
        ("a", 0.5),
        ("b", 0.0),
        ("gpu.device_idle_ratio", 0.4),
        ("cpu.main_thread_busy_ratio", f64::NAN),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Ok(rules) = diagnose::parse_rules(text, "fuzz.toml") {
        for rule in rules.into_iter().filter_map(|(_, r)| r) {
            let _ = rule.when.truth(&signals);
            let _ = rule.speedup.map(|e| e.eval(&signals));
            let _ = rule.impact.map(|e| e.eval(&signals));
        }
    }
    match expr::parse(text) {
        Ok(e) => {
            let _ = e.eval(&signals);
        }
        Err(e) => assert!(e.pos <= text.len(), "{e} past the end"),
    }
});
