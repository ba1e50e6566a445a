//! `ethand diagnose FILE`: the diagnosis rules over a saved snapshot.
use std::path::Path;

use crate::diagnose;

/// `ethand diagnose FILE`: the rules (built-in plus the rules directory) over a saved
/// snapshot. Prints the findings and the rules that could not run; exit 0, or 2 when the file
/// cannot be read or is not a snapshot (as `ethand compare`), or a rules file is broken.
pub fn run(cfg: &crate::config::Config, file: &Path, json: bool) -> anyhow::Result<u8> {
    let mut tree = match crate::commands::compare::load(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ethand: error: {e}");
            return Ok(crate::EXIT_USAGE);
        }
    };
    let rules = diagnose::load_rules(&cfg.diagnosis.rules_dir)?;
    diagnose::apply(&mut tree, &rules);
    if json {
        let v = serde_json::json!({
            "root_pid": tree.root_pid,
            "findings": tree.findings,
            "not_evaluated": tree.not_evaluated,
        });
        crate::write_stdout(serde_json::to_string_pretty(&v)? + "\n")?;
    } else {
        crate::write_stdout(ethand_exporters::terminal::diagnosis(&tree))?;
    }
    Ok(0)
}
