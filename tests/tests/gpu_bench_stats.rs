//! The training benchmark's statistics without a GPU: tests/gpu/test_bench_stats.py runs
//! train_bench.py's analysis and verdicts, and pool_runs.py's pooling, on synthetic runs whose
//! answer is known by construction (an exact 2 % slowdown must FAIL, noise without an effect
//! must not PASS, a speed reference that explains the noise must narrow the interval, a
//! reference ethand slowed must not be trusted). Needs `python3` (scripts/setup.sh --tests).
use std::{path::Path, process::Command};

#[test]
fn bench_statistics_give_the_known_answers() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gpu/test_bench_stats.py");
    let out = Command::new("python3")
        .arg(&script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "python3 {}: {e} (scripts/setup.sh --tests installs it)",
                script.display()
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stderr}",
        script.display()
    );
    // unittest reports on stderr; make sure the tests really ran.
    assert!(
        stderr.contains("Ran 13 tests"),
        "unexpected unittest output:\n{stderr}"
    );
}
