//! What the stand-in collector tests share.
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `tests/standins/<source>` with `cc` into `<file>` in a fresh directory (named
/// after `variant`, with `defines` on the command line); None (the test is skipped, and says
/// why) when there is no C compiler.
pub fn build_standin(source: &str, file: &str, variant: &str, defines: &[&str]) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/standins")
        .join(source);
    let dir = std::env::temp_dir().join(format!(
        "ethand-standin-{}-{}-{variant}",
        source.trim_end_matches(".c"),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join(file);
    let out = match Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .args(defines)
        .arg(&src)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipped: no C compiler (`cc`) to build the {source} stand-in: {e}");
            return None;
        }
        Err(e) => panic!("running cc: {e}"),
    };
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(lib)
}
