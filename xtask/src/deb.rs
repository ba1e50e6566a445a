//! `cargo xtask deb`: the Debian package, assembled with dpkg-deb from what the repository
//! builds and holds. The man page and shell completions come from the binary itself
//! (`ethand man`, `ethand completions SHELL`), so they always match its command line.
//!
//! The binary is the glibc build (`cargo build --release -p ethand`): fully self-contained
//! except for glibc, because NVML and DCMI are opened with dlopen at run time, which a static
//! musl binary cannot do with the drivers' glibc libraries.
use std::{
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

#[derive(clap::Args)]
pub struct DebArgs {
    /// Package this binary instead of building one (cargo build --release --locked -p ethand).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Directory for the .deb (default: target/debian).
    #[arg(long)]
    out: Option<PathBuf>,
}

const CONTROL: &str = "\
Package: ethand
Version: {version}
Architecture: amd64
Maintainer: ethand developers <ethand@localhost>
Depends: libc6 (>= 2.34)
Recommends: prometheus
Section: admin
Priority: optional
Homepage: file:///usr/share/doc/ethand/README.md
Installed-Size: {size_kib}
Description: always-on eBPF observability daemon for GPU/NPU compute nodes
 eBPF programs on scheduler, syscall, block-IO and network tracepoints and
 uprobes on GPU/NPU runtime libraries (libcuda, libnccl, libascendcl, libhccl),
 aggregated in the kernel; the daemon joins them with NVML and DCMI device
 metrics per process and exports them to Prometheus and OpenTelemetry.
 Ships a systemd unit, Grafana dashboards and Prometheus alert rules.
";

// The maintainer scripts do what dh_installsystemd would: reload, enable and start on
// install where systemd runs, stop before removal; nothing without systemd.
// The daemon's user and the group of the API socket (daemon.socket_group) are created
// first, with or without systemd.
const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ] && ! getent passwd ethand >/dev/null; then
    if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers /usr/lib/sysusers.d/ethand.conf
    elif getent group ethand >/dev/null; then
        useradd --system --gid ethand --no-create-home --home-dir / --shell /usr/sbin/nologin ethand
    else
        useradd --system --user-group --no-create-home --home-dir / --shell /usr/sbin/nologin ethand
    fi
fi
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    if [ -z \"$2\" ]; then
        systemctl enable ethand.service >/dev/null || true
    fi
    systemctl restart ethand.service >/dev/null || true
fi
exit 0
";

const PRERM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
    systemctl stop ethand.service >/dev/null || true
fi
exit 0
";

const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    if [ \"$1\" = remove ] || [ \"$1\" = purge ]; then
        systemctl disable ethand.service >/dev/null 2>&1 || true
    fi
    systemctl daemon-reload >/dev/null || true
fi
if [ \"$1\" = purge ]; then
    rm -rf /etc/ethand/rules.d
fi
exit 0
";

pub fn run(args: DebArgs) -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_path_buf();
    let binary = match args.binary {
        Some(b) => b,
        None => {
            let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "--release", "--locked", "-p", "ethand"])
                .current_dir(&root)
                .status()
                .context("running cargo build")?;
            if !st.success() {
                bail!("cargo build --release -p ethand failed ({st})");
            }
            target_dir(&root).join("release/ethand")
        }
    };
    let out = args.out.unwrap_or_else(|| target_dir(&root).join("debian"));
    let deb = build(&root, &binary, &out)?;
    println!("{}", deb.display());
    Ok(())
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Stages the package tree under `out/stage` and builds `out/ethand_VERSION_amd64.deb`.
pub fn build(root: &Path, binary: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let stage = out.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let put = |rel: &str, bytes: &[u8], mode: u32| -> anyhow::Result<()> {
        let p = stage.join(rel);
        fs::create_dir_all(p.parent().context("parent")?)?;
        fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let read = |rel: &str| -> anyhow::Result<Vec<u8>> {
        fs::read(root.join(rel)).with_context(|| format!("reading {rel}"))
    };
    let ethand = |args: &[&str]| -> anyhow::Result<Vec<u8>> {
        let o = Command::new(binary)
            .args(args)
            .output()
            .with_context(|| format!("running {} {args:?}", binary.display()))?;
        if !o.status.success() {
            bail!(
                "{} {args:?} failed ({}): {}",
                binary.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(o.stdout)
    };

    put(
        "usr/bin/ethand",
        &fs::read(binary).with_context(|| format!("reading {}", binary.display()))?,
        0o755,
    )?;
    put(
        "lib/systemd/system/ethand.service",
        &read("systemd/ethand.service")?,
        0o644,
    )?;
    // Group ethand, whose members may use the API socket.
    put(
        "usr/lib/sysusers.d/ethand.conf",
        &read("systemd/ethand.sysusers")?,
        0o644,
    )?;
    // The embedded defaults, documented: a conffile the admin edits.
    put(
        "etc/ethand/ethand.toml",
        &ethand(&["config", "default"])?,
        0o644,
    )?;
    fs::create_dir_all(stage.join("etc/ethand/rules.d"))?;
    put(
        "usr/share/ethand/rules/builtin.toml",
        &read("daemon/src/diagnose/rules.toml")?,
        0o644,
    )?;
    for dir in ["deploy/grafana", "deploy/prometheus", "deploy/kubernetes"] {
        let Ok(entries) = fs::read_dir(root.join(dir)) else {
            continue;
        };
        let sub = dir.trim_start_matches("deploy/");
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_file() {
                put(
                    &format!("usr/share/ethand/{sub}/{name}"),
                    &fs::read(e.path())?,
                    0o644,
                )?;
            }
        }
    }
    put(
        "usr/share/man/man1/ethand.1.gz",
        &gzip(&ethand(&["man"])?)?,
        0o644,
    )?;
    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/ethand"),
        ("zsh", "usr/share/zsh/vendor-completions/_ethand"),
        ("fish", "usr/share/fish/vendor_completions.d/ethand.fish"),
    ] {
        put(path, &ethand(&["completions", shell])?, 0o644)?;
    }
    put("usr/share/doc/ethand/README.md", &read("README.md")?, 0o644)?;
    put(
        "usr/share/doc/ethand/copyright",
        format!(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
             Upstream-Name: ethand\n\nFiles: *\nLicense: {}\n",
            env!("CARGO_PKG_LICENSE")
        )
        .as_bytes(),
        0o644,
    )?;

    let size_kib = dir_size(&stage)?.div_ceil(1024);
    put(
        "DEBIAN/control",
        CONTROL
            .replace("{version}", version)
            .replace("{size_kib}", &size_kib.to_string())
            .as_bytes(),
        0o644,
    )?;
    put("DEBIAN/conffiles", b"/etc/ethand/ethand.toml\n", 0o644)?;
    put("DEBIAN/postinst", POSTINST.as_bytes(), 0o755)?;
    put("DEBIAN/prerm", PRERM.as_bytes(), 0o755)?;
    put("DEBIAN/postrm", POSTRM.as_bytes(), 0o755)?;

    let deb = out.join(format!("ethand_{version}_amd64.deb"));
    let st = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running dpkg-deb")?;
    if !st.success() {
        bail!("dpkg-deb --build failed ({st})");
    }
    fs::remove_dir_all(&stage)?;
    Ok(deb)
}

fn dir_size(p: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(p)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() {
            dir_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(n)
}

/// gzip -9n (no name, no time stamp: reproducible, as Debian wants man pages).
fn gzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut child = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running gzip")?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("gzip writer panicked"))??;
    if !out.status.success() {
        bail!("gzip failed ({})", out.status);
    }
    Ok(out.stdout)
}
