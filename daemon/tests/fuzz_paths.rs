//! The library paths the fuzz targets call (`fuzz/fuzz_targets/*.rs`). `fuzz/` is a workspace
//! of its own that plain builds do not compile: this test compiles the same paths here, so
//! that moving a module cannot break them unseen. The inputs are trivial; the fuzzers do the
//! rest.
use ethand::{
    api, attribution,
    config::{Config, ConfigError},
    diagnose, expr, kernel, procinfo,
};

#[test]
fn the_fuzz_targets_paths_resolve() {
    // config.rs
    let shown = Config::from_overlay("", "fuzz.toml")
        .expect("empty overlay")
        .to_toml();
    assert!(Config::from_overlay(&shown, "shown.toml").is_ok());
    let _: Option<ConfigError> = None;
    // api_request.rs, tracefs_format.rs
    assert!(api::parse_request(b"").is_err());
    let _ = kernel::parse_format("");
    // procfs.rs
    let _ = procinfo::parse_stat("");
    let _ = procinfo::parse_uid("");
    let cgroup = procinfo::parse_cgroup("");
    let _ = attribution::parse_cgroup_path(&cgroup);
    let allow = ["JOB_ID".to_string(), "RANK".to_string()];
    assert!(attribution::filter_environ(b"", &allow).is_empty());
    let _ = attribution::parse_containerd_config(b"");
    let _ = attribution::parse_crio_config(b"");
    let _ = attribution::parse_docker_config(b"");
    // rules.rs
    assert!(diagnose::parse_rules("", "fuzz.toml").is_ok());
    assert!(expr::parse("1").is_ok());
}
