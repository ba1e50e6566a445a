//! Rule files: the built-in `rules.toml` and the `*.toml` files of `diagnosis.rules_dir`,
//! parsed and checked against the signal catalog. A rule that names a signal the catalog
//! does not have is refused with the file, the rule and the field: it would be silently false.
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tracing::info;

use super::{expr, expr::Expr, signals};

/// The built-in rules.
pub const BUILTIN_RULES: &str = include_str!("rules.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    rule: Vec<RuleSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    title: String,
    #[serde(default = "warning")]
    severity: String,
    #[serde(default)]
    when: String,
    #[serde(default)]
    evidence: Vec<String>,
    #[serde(default)]
    explanation: String,
    #[serde(default)]
    advice: Vec<String>,
    speedup: Option<String>,
    impact: Option<String>,
    #[serde(default)]
    suppressed_by: Vec<String>,
    #[serde(default)]
    needs: Vec<String>,
}

fn yes() -> bool {
    true
}
fn warning() -> String {
    "warning".into()
}

/// A parsed rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub title: String,
    pub severity: ethand_snapshot::diagnosis::Severity,
    pub when: Expr,
    pub evidence: Vec<String>,
    pub explanation: String,
    pub advice: Vec<String>,
    pub speedup: Option<Expr>,
    pub impact: Option<Expr>,
    /// Rules that explain this one: when one of them fires, this finding is left out.
    pub suppressed_by: Vec<String>,
    /// Signals without which the rule cannot decide: when one is missing the rule is
    /// reported as not evaluated (with how to get the signal), never as "nothing found".
    /// Each entry is satisfied by any one of its signals (`"a | b"` in the file: a rule that
    /// decides from either of two sources).
    pub needs: Vec<Vec<String>>,
    /// Where it came from (built-in or a file), for error messages and `ethand status`.
    pub origin: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("{origin}: {msg}")]
    Invalid { origin: String, msg: String },
}

/// Parses one rules file. Every error names the file, the rule and the field.
pub fn parse_rules(
    text: &str,
    origin: &str,
) -> Result<Vec<(RuleSpecState, Option<Rule>)>, RuleError> {
    let file: RuleFile = toml::from_str(text).map_err(|e| RuleError::Invalid {
        origin: origin.into(),
        msg: e.to_string().trim().replace('\n', " "),
    })?;
    let mut out = Vec::new();
    for spec in file.rule {
        let unknown = |field: &str, name: &str| RuleError::Invalid {
            origin: origin.into(),
            msg: format!("rule {:?}: {field}: {}", spec.id, unknown_signal(name)),
        };
        let bad = |field: &str, e: expr::ParseError| RuleError::Invalid {
            origin: origin.into(),
            msg: format!("rule {:?}: {field}: {e}", spec.id),
        };
        if !spec.enabled {
            out.push((RuleSpecState::Disabled(spec.id.clone()), None));
            continue;
        }
        if spec.when.trim().is_empty() || spec.title.is_empty() {
            return Err(RuleError::Invalid {
                origin: origin.into(),
                msg: format!("rule {:?}: needs a title and a `when` condition", spec.id),
            });
        }
        let Some(severity) = ethand_snapshot::diagnosis::Severity::parse(&spec.severity) else {
            return Err(RuleError::Invalid {
                origin: origin.into(),
                msg: format!(
                    "rule {:?}: severity {:?} is not critical, warning or info",
                    spec.id, spec.severity
                ),
            });
        };
        let when = expr::parse(&spec.when).map_err(|e| bad("when", e))?;
        let speedup = spec
            .speedup
            .as_deref()
            .map(expr::parse)
            .transpose()
            .map_err(|e| bad("speedup", e))?;
        let impact = spec
            .impact
            .as_deref()
            .map(expr::parse)
            .transpose()
            .map_err(|e| bad("impact", e))?;
        for (field, e) in [
            ("when", Some(&when)),
            ("speedup", speedup.as_ref()),
            ("impact", impact.as_ref()),
        ] {
            if let Some(name) = e.and_then(|e| e.signals().find(|n| signals::find(n).is_none())) {
                return Err(unknown(field, name));
            }
        }
        if let Some(name) = signals::quoted(&spec.explanation).find(|n| signals::find(n).is_none())
        {
            return Err(unknown("explanation", name));
        }
        let needs: Vec<Vec<String>> = spec
            .needs
            .iter()
            .map(|n| n.split('|').map(|a| a.trim().to_string()).collect())
            .collect();
        let needed: Vec<String> = needs.iter().flatten().cloned().collect();
        for (field, names) in [("evidence", &spec.evidence), ("needs", &needed)] {
            if let Some(name) = names.iter().find(|n| signals::find(n).is_none()) {
                return Err(unknown(field, name));
            }
        }
        out.push((
            RuleSpecState::Enabled(spec.id.clone()),
            Some(Rule {
                id: spec.id,
                title: spec.title,
                severity,
                when,
                evidence: spec.evidence,
                explanation: spec.explanation,
                advice: spec.advice,
                speedup,
                impact,
                suppressed_by: spec.suppressed_by,
                needs,
                origin: origin.into(),
            }),
        ));
    }
    Ok(out)
}

#[derive(Debug)]
pub enum RuleSpecState {
    Enabled(String),
    Disabled(String),
}

/// Built-in rules overlaid with the `*.toml` files of `dir` (sorted by name). A file that
/// cannot be read or holds a broken rule is a configuration error: the caller stops (exit 2)
/// rather than run without the rules its operator wrote.
pub fn load_rules(dir: &Path) -> Result<Vec<Rule>, RuleError> {
    let mut rules: Vec<Rule> = parse_rules(BUILTIN_RULES, "built-in rules.toml")
        .expect("the embedded rules are valid")
        .into_iter()
        .filter_map(|(_, r)| r)
        .collect();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        // No rules directory: the built-in rules alone (the default's /etc/ethand/rules.d
        // does not exist until someone writes a rule).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(RuleError::Invalid {
                origin: dir.display().to_string(),
                msg: format!("cannot read the rules directory: {e}"),
            });
        }
    };
    files.sort();
    for f in files {
        let origin = f.display().to_string();
        let text = std::fs::read_to_string(&f).map_err(|e| RuleError::Invalid {
            origin: origin.clone(),
            msg: e.to_string(),
        })?;
        for (state, rule) in parse_rules(&text, &origin)? {
            let id = match &state {
                RuleSpecState::Enabled(id) | RuleSpecState::Disabled(id) => id.clone(),
            };
            if let Some(old) = rules.iter().find(|r| r.id == id) {
                info!(rule = %id, replaced = %old.origin, by = %origin, "diagnosis rule overridden");
            }
            rules.retain(|r| r.id != id);
            if let Some(r) = rule {
                rules.push(r);
            }
        }
        info!(file = %origin, "diagnosis rules loaded");
    }
    Ok(rules)
}

/// "unknown signal "gpu.sm_busy" (did you mean gpu.sm_busy_ratio? docs/diagnosis.md lists
/// the signals)".
fn unknown_signal(name: &str) -> String {
    let near = signals::all()
        .map(|s| (strsim::jaro_winkler(name, s.name), s.name))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match near {
        Some((_, n)) => format!(
            "unknown signal {name:?} (did you mean {n}? docs/diagnosis.md lists the signals)"
        ),
        None => format!("unknown signal {name:?} (docs/diagnosis.md lists the signals)"),
    }
}
