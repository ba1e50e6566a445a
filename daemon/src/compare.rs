//! `ethand compare BEFORE.json AFTER.json [--json | --csv]`: two `ethand snapshot --json`
//! files of a workload (e.g. before and after a change), compared by
//! `ethand_exporters::report::compare`. Needs no daemon and no privileges.
use std::{
    io::{IsTerminal as _, Write as _},
    path::Path,
};

use ethand_exporters::{report, snapshot::TreeSnapshot};

/// Output format of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Terminal table (colors when stdout is a terminal and NO_COLOR is unset).
    Text,
    Json,
    Csv,
}

/// Reads one snapshot file; the error names the file and, for bad JSON, the line and column.
pub fn load(path: &Path) -> Result<TreeSnapshot, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let t: TreeSnapshot = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not an ethand snapshot (the output of `ethand snapshot --pid PID --json`): {e}",
            path.display()
        )
    })?;
    if t.schema_version > ethand_exporters::snapshot::SCHEMA_VERSION {
        return Err(format!(
            "{} has snapshot schema version {}; this ethand reads version {} and older",
            path.display(),
            t.schema_version,
            ethand_exporters::snapshot::SCHEMA_VERSION
        ));
    }
    Ok(t)
}

/// As [`run`], and when `html` is given also writes the comparison there as HTML.
pub fn run_with_html(
    html: Option<&Path>,
    before: &Path,
    after: &Path,
    format: Format,
) -> anyhow::Result<u8> {
    if let Some(out) = html {
        if let (Ok(b), Ok(a)) = (load(before), load(after)) {
            let page = ethand_exporters::html::render_comparison_html(&report::compare(&b, &a));
            crate::outfile::write(out, page.as_bytes())
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
            eprintln!("ethand: comparison written to {}", out.display());
        }
    }
    run(before, after, format)
}

/// Runs the command; returns the exit code (0, or 2 when a file is missing or not a snapshot).
pub fn run(before: &Path, after: &Path, format: Format) -> anyhow::Result<u8> {
    let (b, a) = match (load(before), load(after)) {
        (Ok(b), Ok(a)) => (b, a),
        (b, a) => {
            for e in [b.err(), a.err()].into_iter().flatten() {
                eprintln!("ethand: error: {e}");
            }
            return Ok(crate::EXIT_USAGE);
        }
    };
    let c = report::compare(&b, &a);
    let out = match format {
        Format::Json => serde_json::to_string_pretty(&c)? + "\n",
        Format::Csv => report::comparison_to_csv(&c),
        Format::Text => {
            let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            report::render_comparison(&c, color)
        }
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(0),
        // `ethand compare ... | head`: not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(e.into()),
    }
}
