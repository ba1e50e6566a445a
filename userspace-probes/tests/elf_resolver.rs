//! The ELF resolver against real shared objects built here with `cc`: weak exports (libnccl
//! ships its API as weak symbols), aliases at one address, versioned duplicates (a hidden
//! compat version must never win over the default one) and IFUNCs.
use std::{path::PathBuf, process::Command};

use ethand_userspace_probes::elf::{SymbolTable, Unresolved};

const SRC: &str = r#"
volatile int sink;
int pncclAllReduce(void) { sink += 1; return 0; }
int ncclAllReduce(void) __attribute__((weak, alias("pncclAllReduce")));
int cuLaunchKernel(void) { sink += 2; return 0; }
int old_impl(void) { sink += 3; return 1; }
int new_impl(void) { sink += 4; return 2; }
__asm__(".symver old_impl,cuMemAlloc@OLD_1");
__asm__(".symver new_impl,cuMemAlloc@@NEW_2");
static int real(void) { return 5; }
static void *resolver(void) { return (void *)real; }
int cuIfunc(void) __attribute__((ifunc("resolver")));
"#;

const MAP: &str = "OLD_1 { global: cuMemAlloc; }; NEW_2 { global: *; } OLD_1;\n";

fn build() -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ethand-elf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let c = dir.join("t.c");
    let map = dir.join("t.map");
    std::fs::write(&c, SRC).ok()?;
    std::fs::write(&map, MAP).ok()?;
    let so = dir.join("libtest.so");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&c)
        .arg(format!("-Wl,--version-script={}", map.display()))
        .status()
        .ok()?
        .success();
    ok.then_some(so)
}

#[test]
fn weak_alias_version_and_ifunc() {
    let Some(so) = build() else {
        panic!(
            "cannot build the test library with cc (build-essential is installed by scripts/setup.sh)"
        );
    };
    let t = SymbolTable::read(&so).unwrap();
    let r = t.resolve([
        "ncclAllReduce",
        "pncclAllReduce",
        "cuLaunchKernel",
        "cuIfunc",
        "cuNothing",
    ]);
    // Weak export resolves; its strong twin at the same address is reported as an alias.
    let nccl = r[0].1.clone().expect("weak symbol resolves");
    assert_eq!(r[1].1, Err(Unresolved::AliasOf("ncclAllReduce".into())));
    assert!(r[2].1.is_ok());
    assert_ne!(r[2].1.clone().unwrap(), nccl);
    assert_eq!(r[3].1, Err(Unresolved::Ifunc));
    assert_eq!(r[4].1, Err(Unresolved::Missing));
    // The default version (new_impl) wins over the hidden compat one (old_impl).
    let versioned = t.resolve(["cuMemAlloc", "new_impl", "old_impl"]);
    let chosen = versioned[0].1.clone().unwrap();
    assert_eq!(
        versioned[1].1,
        Err(Unresolved::AliasOf("cuMemAlloc".into()))
    );
    assert_ne!(
        versioned[2].1,
        Err(Unresolved::AliasOf("cuMemAlloc".into())),
        "{chosen:#x}"
    );
}
