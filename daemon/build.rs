// Builds the eBPF programs with the pinned nightly and embeds them (include_bytes_aligned!).
fn main() -> anyhow::Result<()> {
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ethand-ebpf",
            root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf/ethand-ebpf"),
            ..Default::default()
        }],
        aya_build::Toolchain::Custom("nightly-2026-06-25"),
    )
}
