// Builds the eBPF programs with the pinned nightly and embeds them (include_bytes_aligned!),
// and builds libethand_cupti.so (cupti/, C) with the target's C compiler for the daemon to
// install (pipeline/gpu_activity.rs).
use std::{path::PathBuf, process::Command};

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    build_cupti_library()?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ethand-ebpf",
            root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf/ethand-ebpf"),
            ..Default::default()
        }],
        aya_build::Toolchain::Custom("nightly-2026-06-25"),
    )
}

fn build_cupti_library() -> anyhow::Result<()> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../cupti"));
    for f in ["ethand_cupti.c", "ethand_cupti.h"] {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("libethand_cupti.so");
    // cc picks the compiler for the target (CC_<target>, cross gcc) as for any C in a crate.
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .opt_level(2)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-std=c11",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pthread",
        "-Wl,-soname,libethand_cupti.so",
        "-Wl,-z,now",
        "-Wl,-z,relro",
        "-Wl,--no-undefined",
        "-o",
    ])
    .arg(&out)
    .arg(dir.join("ethand_cupti.c"))
    .arg("-ldl");
    let what = format!("{cmd:?}");
    let o = cmd.output().with_context(|| format!("running {what}"))?;
    if !o.status.success() {
        bail!(
            "{what}: {}\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}
