//! Where a key sits in a TOML text: the line an error names.

pub(super) fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

pub(super) fn line_of(text: &str, offset: Option<usize>) -> usize {
    offset
        .map(|o| text[..o.min(text.len())].matches('\n').count() + 1)
        .unwrap_or(0)
}

/// The table header a line sits under (`[a.b]` -> "a.b"), tracking headers line by line.
pub(super) fn table_of(line: &str) -> Option<String> {
    let l = line.trim();
    if l.starts_with('[') && !l.starts_with("[[") {
        let inner = l.trim_start_matches('[').split(']').next().unwrap_or("");
        return Some(
            inner
                .split('.')
                .map(|p| p.trim().trim_matches('"'))
                .collect::<Vec<_>>()
                .join("."),
        );
    }
    None
}

pub(super) fn key_of(line: &str) -> Option<&str> {
    let l = line.trim_start();
    if l.starts_with('#') || l.starts_with('[') {
        return None;
    }
    let (k, _) = l.split_once('=')?;
    Some(k.trim().trim_matches('"'))
}

/// Full path ("prometheus.top_n") of the key assigned on the line holding `offset`.
pub(super) fn key_path_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let mut table = String::new();
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        if let Some(t) = table_of(line) {
            table = t;
        }
        if offset < pos + line.len() {
            return match key_of(line) {
                Some(k) if table.is_empty() => k.to_string(),
                Some(k) => format!("{table}.{k}"),
                None => table,
            };
        }
        pos += line.len();
    }
    String::new()
}

/// Line (1-based) in `text` where the key with full path `path` is assigned.
pub(super) fn find_path_line(text: &str, path: &str) -> Option<usize> {
    let mut table = String::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(t) = table_of(line) {
            // An unknown table is named by its header.
            if t == path {
                return Some(i + 1);
            }
            table = t;
            continue;
        }
        if let Some(k) = key_of(line) {
            let full = if table.is_empty() {
                k.to_string()
            } else {
                format!("{table}.{k}")
            };
            if full == path {
                return Some(i + 1);
            }
        }
    }
    None
}
