//! What the GPU-driving process's main thread does in the snapshot's sample windows: copying
//! through the runtime, writing a checkpoint, waiting for a file to reach the disk. A rule
//! that blames the input pipeline checks these first: a busy main thread that copies or
//! checkpoints is not preparing input.
//!
//! From the native CPU profile (on-CPU stacks, whose runtime frames carry the API's exported
//! names, and the stacks where it blocked) and the Python stack sample. Each is a share of the
//! sample's window; absent when the snapshot has no such sample of the main thread.
use ethand_snapshot::stacks::{CpuThreadProfile, Frame, FrameKind, ThreadProfile};
use ethand_userspace_probes::catalog::{CATALOG, Category};

use super::{Ctx, HowToGet, Signal, Unit};

/// Python functions that write a checkpoint, by the file that defines them (a suffix of the
/// frame's path) and the function's name. Serialization below them (pickling, the device to
/// host copy of each tensor, the zip writer) counts as the checkpoint's.
const CHECKPOINT_WRITERS: &[(&str, &[&str])] = &[
    ("torch/serialization.py", &["save", "_save", "_legacy_save"]),
    ("safetensors/torch.py", &["save_file", "save"]),
    ("safetensors/numpy.py", &["save_file", "save"]),
    (
        "torch/distributed/checkpoint/state_dict_saver.py",
        &["save", "_save_state_dict", "save_state_dict"],
    ),
    ("lightning/pytorch/trainer/trainer.py", &["save_checkpoint"]),
    ("pytorch_lightning/trainer/trainer.py", &["save_checkpoint"]),
    (
        "transformers/trainer.py",
        &["_save_checkpoint", "save_model"],
    ),
    ("orbax/checkpoint/checkpointer.py", &["save"]),
    (
        "numpy/lib/_npyio_impl.py",
        &["save", "savez", "savez_compressed"],
    ),
];

/// Kernel functions a thread blocks under while it forces written data to the disk.
const FILE_SYNC_KERNEL: &[&str] = &[
    "__x64_sys_fsync",
    "__x64_sys_fdatasync",
    "__arm64_sys_fsync",
    "__arm64_sys_fdatasync",
    "do_fsync",
    "ksys_sync_file_range",
    "__x64_sys_msync",
    "__arm64_sys_msync",
    "vfs_fsync_range",
];

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "main.runtime_copy_ratio",
        unit: Unit::Ratio,
        doc: "share of the CPU profile's window the GPU process's main thread spent inside a runtime copy call (on a CPU: a pageable copy is staged by the CPU; or blocked in one)",
        how_to_get: HowToGet::CpuProfile,
        compute: |c| {
            let (th, window_s, rate) = main_cpu_profile(c)?;
            let on_cpu = samples_where(th, |f| is_runtime(f, Category::Copy)) / rate;
            let blocked = waited_where(th, |f| is_runtime(f, Category::Copy));
            Some(((on_cpu + blocked) / window_s).min(1.0))
        },
    },
    Signal {
        name: "main.checkpoint_ratio",
        unit: Unit::Ratio,
        doc: "share of the stack sample in which the GPU process's main thread was inside a checkpoint writer (torch.save, safetensors, torch.distributed.checkpoint, Lightning, transformers, orbax, numpy.save)",
        how_to_get: HowToGet::StackSample,
        compute: |c| {
            let th = main_python_profile(c)?;
            let inside: u64 = th
                .folded
                .iter()
                .filter(|s| {
                    s.frames
                        .iter()
                        .any(|&i| th.frames.get(i as usize).is_some_and(is_checkpoint_writer))
                })
                .map(|s| s.samples)
                .sum();
            Some(inside as f64 / th.samples as f64)
        },
    },
    Signal {
        name: "main.file_sync_wait_ratio",
        unit: Unit::Ratio,
        doc: "share of the CPU profile's window the GPU process's main thread was blocked forcing files to disk (fsync, fdatasync, sync_file_range, msync; waits the profile kept)",
        how_to_get: HowToGet::CpuProfile,
        compute: |c| {
            let (th, window_s, _) = main_cpu_profile(c)?;
            let kernel_sync = |f: &Frame| {
                f.kind == FrameKind::Kernel
                    && f.function
                        .as_deref()
                        .is_some_and(|n| FILE_SYNC_KERNEL.contains(&n))
            };
            Some((waited_where(th, kernel_sync) / window_s).min(1.0))
        },
    },
];

/// The GPU process's main thread in the CPU profile, the profile's window (s) and its rate.
fn main_cpu_profile<'t>(c: &Ctx<'t>) -> Option<(&'t CpuThreadProfile, f64, f64)> {
    let driver = c.driver?;
    let p = c.t.cpu_profile.as_ref()?;
    let window_s = p.duration_ms as f64 / 1000.0;
    if window_s <= 0.0 || p.rate_hz == 0 {
        return None;
    }
    let th = p
        .threads
        .iter()
        .find(|t| t.pid == driver.pid && t.main_thread)?;
    Some((th, window_s, f64::from(p.rate_hz)))
}

/// The GPU process's main thread in the Python stack sample, when it was sampled.
fn main_python_profile<'t>(c: &Ctx<'t>) -> Option<&'t ThreadProfile> {
    let driver = c.driver?;
    c.t.stack_sample
        .as_ref()?
        .threads
        .iter()
        .find(|t| t.pid == driver.pid && t.main_thread && t.samples > 0)
}

/// On-CPU samples whose stack holds a frame `hit` accepts. Samples of stacks the profile
/// did not keep (`folded_other`) are counted in the same proportion as the kept ones.
fn samples_where(th: &CpuThreadProfile, hit: impl Fn(&Frame) -> bool) -> f64 {
    let kept: u64 = th.folded.iter().map(|s| s.samples).sum();
    if kept == 0 {
        return 0.0;
    }
    let inside: u64 = th
        .folded
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|&i| th.frames.get(i as usize).is_some_and(&hit))
        })
        .map(|s| s.samples)
        .sum();
    inside as f64 * (kept + th.folded_other) as f64 / kept as f64
}

/// Seconds of the kept waits whose stack holds a frame `hit` accepts.
fn waited_where(th: &CpuThreadProfile, hit: impl Fn(&Frame) -> bool) -> f64 {
    th.wait_sites
        .iter()
        .filter(|s| s.frames.iter().any(&hit))
        .map(|s| s.time_ns.unwrap_or(0) as f64 / 1e9)
        .sum()
}

/// A native frame of a probed runtime API function of `category` (libcuda's exported names:
/// `cuMemcpyHtoDAsync_v2`; the runtime's own frames below it are unnamed in a stripped
/// driver, the API frame is not).
fn is_runtime(f: &Frame, category: Category) -> bool {
    f.kind == FrameKind::Native
        && f.function.as_deref().is_some_and(|name| {
            CATALOG
                .iter()
                .any(|s| s.category == category && s.name == name)
        })
}

fn is_checkpoint_writer(f: &Frame) -> bool {
    let (Some(file), Some(function)) = (f.file.as_deref(), f.function.as_deref()) else {
        return false;
    };
    f.kind == FrameKind::Python
        && CHECKPOINT_WRITERS
            .iter()
            .any(|(suffix, names)| file.ends_with(suffix) && names.contains(&function))
}
