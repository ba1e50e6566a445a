//! The GPU activity a real PyTorch loop made on the H200 (tests/fixtures/gpu-activity/), read
//! with this build's snapshot types: the loop's four kernels per step came in equal counts, the
//! per-device figures agree with the kernel list, the idle split and busy time fill the window,
//! and the copies from pageable memory are the slow ones.
use std::path::Path;

use ethand_snapshot::kernels::{ActivityState, MemoryKind};
use ethand_tests::TreeSnapshot;

fn fixture() -> TreeSnapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-activity/h200-torch-injected.json");
    serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("a tree snapshot")
}

#[test]
fn a_real_window_is_whole_and_consistent() {
    let t = fixture();
    let a = t.gpu_activity.expect("gpu_activity");
    let p = &a.processes[0];
    assert_eq!(p.state, ActivityState::Recorded);
    assert_eq!(
        (p.records_dropped_by_cupti, p.records_lost_by_ethand),
        (0, 0)
    );
    // fp32 matmul, bf16 matmul, the add, the bf16-to-fp32 copy kernel: once per step each.
    let counts: Vec<u64> = p.kernels.iter().map(|k| k.count).collect();
    assert_eq!(counts, vec![2404; 4], "{:?}", p.kernels);
    assert!(p.kernels[0].name.as_deref().unwrap_or("").contains("sgemm"));
    let dev = &p.devices[0];
    assert_eq!(dev.kernels, counts.iter().sum::<u64>());
    assert_eq!(
        dev.kernel_ns,
        p.kernels.iter().map(|k| k.gpu_ns).sum::<u64>()
    );
    // One stream: kernels never overlap, so busy is their sum.
    assert_eq!(dev.busy_ns, dev.kernel_ns);
    let idle = dev.idle.as_ref().expect("idle split");
    let window = p.window_ns.expect("window");
    let filled =
        dev.busy_ns + idle.host_wait_ns + idle.kernel_wait_ns + idle.copy_ns + idle.unattributed_ns;
    assert!(
        filled.abs_diff(window) < window / 1000,
        "{filled} of {window}"
    );
    assert_eq!(idle.gaps, dev.kernels - 1);
    // Pinned and pageable copies of the same bytes: pageable ones take longer.
    let rate = |m: MemoryKind| {
        let c = p.copies.iter().find(|c| c.src == m).expect("copy kind");
        c.bytes as f64 / c.gpu_ns as f64
    };
    assert!(rate(MemoryKind::Pinned) > 3.0 * rate(MemoryKind::Pageable));
}

/// The kernels PyTorch and cuBLAS really launched, each told to be what the loop did: the fp32
/// matmul (CUTLASS), the bf16 matmul (cuBLAS's nvjet), the add, and the cast (a copy kernel).
#[test]
fn real_kernel_names_get_their_type() {
    use ethand_snapshot::kernels::KernelClass;
    let t = fixture();
    let p = &t.gpu_activity.expect("gpu_activity").processes[0];
    let classes: Vec<KernelClass> = p
        .kernels
        .iter()
        .map(|k| KernelClass::of(k.name.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        classes,
        vec![
            KernelClass::Gemm,
            KernelClass::Gemm,
            KernelClass::Elementwise,
            KernelClass::Memory
        ],
        "{:?}",
        p.kernels
    );
}
