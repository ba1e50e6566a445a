//! The GPU machine's run of the in-kernel CPython walk (issue 41), kept as a fixture
//! (tests/fixtures/gpu-pyframes/: scripts/gpu-pyframes.sh on an H100, PyTorch 2.11 on Python
//! 3.12.3, ethand at its defaults): the snapshot of `workload.py` taken after the process
//! exited must count each marked line's calls exactly, through PyTorch's own Python frames
//! (`torch.cuda.synchronize`) and its C++ (`.item()`), although every call ended before the
//! snapshot. Parsed with this build's snapshot types, so a schema change that loses it fails
//! here without a GPU.
use std::path::{Path, PathBuf};

use ethand_snapshot::{
    TreeSnapshot,
    gpu::PythonWalk,
    stacks::{CallSites, FrameKind},
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests/fixtures/gpu-pyframes")
        .join(name)
}

/// Calls per (call, marker of the innermost frame in the workload) in one process.
fn by_marker(sites: &[CallSites], source: &str) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for cs in sites {
        for s in &cs.sites {
            let Some(f) = s.frames.iter().find(|f| {
                f.kind == FrameKind::Python
                    && f.file
                        .as_deref()
                        .is_some_and(|p| p.ends_with("pyframes_workload.py"))
            }) else {
                continue;
            };
            let line = f.line.expect("a line") as usize;
            let text = source
                .lines()
                .nth(line - 1)
                .expect("the line is in the workload");
            let marker = text.rsplit("# ").next().unwrap_or("").to_string();
            out.push((cs.call.clone(), marker, s.count));
        }
    }
    out.sort();
    out
}

#[test]
fn an_exited_pytorch_process_keeps_exact_python_lines_per_call() {
    let snap: TreeSnapshot = serde_json::from_str(
        &std::fs::read_to_string(fixture("snapshot-exited.json")).expect("fixture"),
    )
    .expect("a snapshot of this schema");
    let source = std::fs::read_to_string(fixture("workload.py")).expect("workload");
    let p = snap
        .processes
        .iter()
        .find(|p| p.gpu.is_some())
        .expect("the GPU process");
    assert!(!p.alive, "the snapshot was taken after the process exited");
    let gpu = p.gpu.as_ref().expect("gpu");
    assert_eq!(
        gpu.python_walk,
        Some(PythonWalk::Walked {
            version: "3.12".into()
        })
    );
    let got = by_marker(&gpu.call_sites, &source);
    let count = |call: &str, marker: &str| -> u64 {
        got.iter()
            .filter(|(c, m, _)| c == call && m == marker)
            .map(|(_, _, n)| n)
            .sum()
    };
    // torch.cuda.synchronize() is one cuCtxSynchronize_v2 a call; `.item()` one
    // device-to-host copy and one stream synchronization.
    assert_eq!(count("cuCtxSynchronize_v2", "F_LINE"), 3000, "{got:?}");
    assert_eq!(count("cuCtxSynchronize_v2", "G_LINE"), 1000, "{got:?}");
    assert_eq!(count("cuStreamSynchronize", "ITEM_LINE"), 2000, "{got:?}");
    assert_eq!(count("cuMemcpyDtoHAsync_v2", "ITEM_LINE"), 2000, "{got:?}");
}
