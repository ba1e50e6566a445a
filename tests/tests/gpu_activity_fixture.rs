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

fn h100(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-activity")
        .join(name)
}

fn h100_snapshot(name: &str) -> TreeSnapshot {
    serde_json::from_slice(&std::fs::read(h100(name)).expect("fixture")).expect("a tree snapshot")
}

/// Unix seconds of nvidia-smi's `YYYY/MM/DD HH:MM:SS.mmm` (UTC on the GPU machine).
fn smi_time(s: &str) -> f64 {
    let n: Vec<f64> = s
        .split(['/', ' ', ':'])
        .map(|x| x.trim().parse::<f64>().expect("number"))
        .collect();
    let (y, m, d) = (n[0] as i64, n[1] as i64, n[2] as i64);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    days as f64 * 86_400.0 + n[3] * 3600.0 + n[4] * 60.0 + n[5]
}

/// Mean of NVML's utilization.gpu samples inside a snapshot's activity window.
fn nvml_mean_in_window(t: &TreeSnapshot) -> (f64, usize) {
    let a = t.gpu_activity.as_ref().expect("gpu_activity");
    let start = a.started_unix_ms as f64 / 1000.0;
    let end = start + a.processes[0].window_ns.expect("window") as f64 / 1e9;
    let csv = std::fs::read_to_string(h100("h100-nvml-util.csv")).expect("csv");
    let inside: Vec<f64> = csv
        .lines()
        .filter_map(|l| {
            let (time, util) = l.split_once(',')?;
            let u = util.trim().strip_suffix('%')?.trim().parse::<f64>().ok()?;
            let t = smi_time(time);
            (start..=end).contains(&t).then_some(u / 100.0)
        })
        .collect();
    (
        inside.iter().sum::<f64>() / inside.len() as f64,
        inside.len(),
    )
}

#[test]
fn nvidia_smi_times_read_as_unix_seconds() {
    assert_eq!(smi_time("1970/01/01 00:00:00.000"), 0.0);
    assert_eq!(smi_time("2026/12/07 11:07:36.508"), 1_796_641_656.508);
    assert_eq!(smi_time("2000/03/01 00:00:01.250"), 951_868_801.25);
}

/// PyTorch kernels only, back to back (H100): busy from the union of kernel intervals agrees
/// with NVML's utilization.gpu over the same window, whose definition it shares.
#[test]
fn kernel_busy_agrees_with_nvml_without_copies() {
    let t = h100_snapshot("h100-torch-kernels-only.json");
    let dev = &t.gpu_activity.as_ref().expect("gpu_activity").processes[0].devices[0];
    let busy = dev.busy_fraction.expect("busy");
    let (nvml, n) = nvml_mean_in_window(&t);
    assert!(n >= 25, "{n} NVML samples in the window");
    // Measured: 0.971 against 0.997.
    assert!((busy - nvml).abs() < 0.03, "busy {busy} NVML {nvml}");
    assert_eq!(dev.idle.as_ref().expect("idle").copy_ns, 0);
}

/// A JAX training step started with the library (H100, jax 0.11.2): XLA's fused kernels get
/// their type, the host batch put on the GPU each step is one pinned copy of its 16 MiB (JAX
/// stages numpy's pageable memory itself), NVML's utilization counts those copies (it matches
/// kernels-or-copies, not kernels alone), and JAX's start-up growth is no out-of-memory alarm.
#[test]
fn a_real_jax_step() {
    use ethand_snapshot::kernels::{CopyKind, KernelClass};
    let t = h100_snapshot("h100-jax-injected.json");
    let p = &t.gpu_activity.as_ref().expect("gpu_activity").processes[0];
    assert_eq!(p.state, ActivityState::Recorded);
    assert_eq!(
        (p.records_dropped_by_cupti, p.records_lost_by_ethand),
        (0, 0)
    );
    let gemm: Vec<&str> = p
        .kernels
        .iter()
        .filter(|k| {
            k.name
                .as_deref()
                .unwrap_or("")
                .starts_with("gemm_fusion_dot")
        })
        .map(|k| k.name.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(gemm.len(), 4, "{:?}", p.kernels);
    assert!(
        p.kernels
            .iter()
            .take(4)
            .all(|k| k.class == KernelClass::Gemm)
    );
    // Forward 2, backward 4 matrix products per step: 2 fused into one kernel name.
    let steps = p.copies.iter().map(|c| c.count).sum::<u64>();
    assert_eq!(p.kernels[0].count, 2 * steps);
    let c = &p.copies[0];
    assert_eq!(p.copies.len(), 1);
    assert_eq!(
        (c.kind, c.src, c.dst),
        (
            CopyKind::HostToDevice,
            MemoryKind::Pinned,
            MemoryKind::Device
        )
    );
    assert_eq!(c.bytes, c.count * 1024 * 4096 * 4);
    let dev = &p.devices[0];
    let busy = dev.busy_fraction.expect("busy");
    let copy_only = dev.idle.as_ref().expect("idle").copy_ns as f64 / p.window_ns.unwrap() as f64;
    let (nvml, _) = nvml_mean_in_window(&t);
    // Measured: kernels 0.134, kernels or copies 0.325, NVML 0.329.
    assert!(
        (busy + copy_only - nvml).abs() < 0.03,
        "{busy} + {copy_only} vs {nvml}"
    );
    assert!(nvml - busy > 0.15, "{busy} vs {nvml}");
    let out = ethand_tests::ethand(&[
        "diagnose",
        h100("h100-jax-injected.json").to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert!(!ids.contains(&"near_oom"), "{ids:?}");
}

/// torch.profiler holding CUPTI when the daemon's window opened (H100, PyTorch 2.11, CUPTI
/// 13.0, `scripts/gpu-busy-vs-nvml.sh`'s `prof` case): the library stepped aside, said so, and
/// recorded nothing; the job ran on (its steps line came after the window).
#[test]
fn a_real_profiler_makes_the_library_step_aside() {
    let t = h100_snapshot("h100-torch-profiler-refused.json");
    let a = t.gpu_activity.expect("gpu_activity");
    assert_eq!(a.processes.len(), 1, "{a:?}");
    let p = &a.processes[0];
    assert_eq!(p.state, ActivityState::Refused, "{p:?}");
    assert!(
        p.detail.as_deref().unwrap_or("").contains("stepped aside"),
        "{p:?}"
    );
    assert_eq!((p.records, p.cupti_version), (0, Some(130001)), "{p:?}");
    assert!(p.devices.is_empty() && p.kernels.is_empty(), "{p:?}");
}
