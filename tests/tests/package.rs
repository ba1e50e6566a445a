//! The Debian package (`cargo xtask deb`, built by scripts/test.sh before the tests):
//! installed with dpkg, `ethand --version` and `systemd-analyze verify` on the installed unit,
//! every shipped file where it belongs, completions that load, then removed and purged
//! cleanly. Needs root; refuses to touch a machine where ethand is already installed.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn deb() -> PathBuf {
    if let Some(p) = std::env::var_os("ETHAND_DEB") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../target/debian/ethand_{}_amd64.deb",
        env!("CARGO_PKG_VERSION")
    ));
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo xtask deb --binary target/release/ethand` (scripts/test.sh does)",
        p.display()
    );
    p
}

fn run(prog: &str, args: &[&str]) -> Output {
    Command::new(prog)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"))
}

fn ok(prog: &str, args: &[&str]) -> String {
    let o = run(prog, args);
    assert!(
        o.status.success(),
        "{prog} {args:?} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${Status}", "ethand"])
        .stdout
        .starts_with(b"install ok installed")
}

/// Purges the package when the test ends, also when it fails.
struct Purge;
impl Drop for Purge {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "ethand"]);
    }
}

const FILES: &[&str] = &[
    "/usr/bin/ethand",
    "/lib/systemd/system/ethand.service",
    "/etc/ethand/ethand.toml",
    "/usr/share/ethand/rules/builtin.toml",
    "/usr/share/man/man1/ethand.1.gz",
    "/usr/share/bash-completion/completions/ethand",
    "/usr/share/zsh/vendor-completions/_ethand",
    "/usr/share/fish/vendor_completions.d/ethand.fish",
    "/usr/share/doc/ethand/copyright",
    "/usr/lib/sysusers.d/ethand.conf",
];

#[test]
fn deb_installs_verifies_and_removes_cleanly() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "dpkg -i needs root");
    assert!(
        !installed(),
        "ethand is installed on this machine already; this test installs and purges it"
    );
    let deb = deb();
    let deb = deb.to_str().expect("utf-8 path");
    // The package's own metadata.
    let info = ok(
        "dpkg-deb",
        &["--field", deb, "Package", "Version", "Depends"],
    );
    eprintln!("observed: {info}");
    assert!(info.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))));
    let contents = ok("dpkg-deb", &["--contents", deb]);
    for f in FILES {
        assert!(
            contents.contains(&format!(".{f}\n")),
            "{f} not in the package"
        );
    }
    for dir in ["grafana", "prometheus", "kubernetes"] {
        assert!(
            contents.contains(&format!("./usr/share/ethand/{dir}/")),
            "no deploy/{dir} files in the package"
        );
    }

    let _purge = Purge;
    ok("dpkg", &["--install", deb]);
    assert!(installed(), "dpkg says ethand is not installed");
    for f in FILES {
        assert!(Path::new(f).exists(), "{f} missing after install");
    }
    // The postinst created the daemon's user (the unit's User=) and the API socket's group
    // (daemon.socket_group), a system user that cannot log in.
    let group = ok("getent", &["group", "ethand"]);
    eprintln!("observed: group after install: {}", group.trim());
    let user = ok("getent", &["passwd", "ethand"]);
    eprintln!("observed: user after install: {}", user.trim());
    let fields: Vec<&str> = user.trim().split(':').collect();
    let uid: u32 = fields[2].parse().expect("uid");
    assert!(uid > 0 && uid < 1000, "not a system user: {user}");
    assert_eq!(
        fields[3],
        group.trim().split(':').nth(2).expect("gid"),
        "primary group"
    );
    assert!(fields[6].ends_with("nologin"), "a login shell: {user}");
    let version = ok("/usr/bin/ethand", &["--version"]);
    eprintln!("observed: {}", version.trim());
    assert_eq!(
        version.trim(),
        format!("ethand {}", env!("CARGO_PKG_VERSION"))
    );
    // The installed unit, man page lookup included (man:ethand(1) in Documentation=).
    let v = run(
        "systemd-analyze",
        &["verify", "/lib/systemd/system/ethand.service"],
    );
    let err = String::from_utf8_lossy(&v.stderr);
    eprintln!("observed: systemd-analyze verify: {} {err:?}", v.status);
    assert!(
        v.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {err}"
    );
    // The shipped config is the embedded default and the daemon accepts it.
    let shown = ok(
        "/usr/bin/ethand",
        &["config", "show", "--config", "/etc/ethand/ethand.toml"],
    );
    assert!(shown.contains("[daemon]"), "config show: {shown}");
    assert_eq!(
        fs::read_to_string("/etc/ethand/ethand.toml").expect("read conffile"),
        ok("/usr/bin/ethand", &["config", "default"])
    );
    // Completions load in bash and know the subcommands.
    let words = ok(
        "bash",
        &[
            "-c",
            "source /usr/share/bash-completion/completions/ethand && COMP_WORDS=(ethand sn) COMP_CWORD=1 && _ethand ethand sn ethand && printf '%s\\n' \"${COMPREPLY[@]}\"",
        ],
    );
    eprintln!("observed: bash completes `ethand sn` to {words:?}");
    assert!(
        words.lines().any(|w| w == "snapshot"),
        "bash completion of `ethand sn`: {words:?}"
    );
    let man = ok("man", &["-P", "cat", "/usr/share/man/man1/ethand.1.gz"]);
    assert!(
        man.contains("snapshot") && man.contains("record"),
        "man page lacks the subcommands"
    );

    // Remove keeps the conffile (Debian policy); purge takes everything.
    ok("dpkg", &["--remove", "ethand"]);
    assert!(
        !Path::new("/usr/bin/ethand").exists(),
        "binary left after remove"
    );
    assert!(
        !Path::new("/lib/systemd/system/ethand.service").exists(),
        "unit left after remove"
    );
    assert!(
        Path::new("/etc/ethand/ethand.toml").exists(),
        "conffile removed by remove"
    );
    ok("dpkg", &["--purge", "ethand"]);
    for f in FILES {
        assert!(!Path::new(f).exists(), "{f} left after purge");
    }
    assert!(
        !Path::new("/etc/ethand").exists(),
        "/etc/ethand left after purge"
    );
    assert!(!installed());
}
