//! The configuration's parsing, validation and error positions.
use super::*;

#[test]
fn defaults_parse_and_validate() {
    let c = Config::defaults();
    assert_eq!(c.daemon.interval_ms, 1000);
    assert!(c.validate().is_ok());
    assert_eq!(c.listen_addr().ip().to_string(), "127.0.0.1");
}

#[test]
fn overlay_changes_only_given_keys() {
    let c = Config::from_overlay("[daemon]\ninterval_ms = 250\n", "t").unwrap();
    assert_eq!(c.daemon.interval_ms, 250);
    assert_eq!(c.prometheus.top_n, Config::defaults().prometheus.top_n);
}

#[test]
fn unknown_key_names_itself_and_line() {
    let e = Config::from_overlay("[daemon]\n\ninterval_mss = 5\n", "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("interval_mss"), "{e}");
    assert!(e.starts_with("f.toml:3:"), "{e}");
}

#[test]
fn wrong_type_names_key_and_line() {
    let e = Config::from_overlay("[prometheus]\ntop_n = \"ten\"\n", "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f.toml:2: prometheus.top_n:"), "{e}");
}

#[test]
fn same_key_name_in_two_tables_points_at_the_right_one() {
    let text = "[prometheus]\nenabled = true\n\n[probes]\nsched = true\nenabled_typo = 1\n\n[maps]\nsyscalls = 5\n";
    let e = Config::from_overlay(text, "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f.toml:6: probes.enabled_typo:"), "{e}");
    let text = "[probes]\nsyscalls = true\n[maps]\nsyscalls = \"many\"\n";
    let e = Config::from_overlay(text, "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f.toml:4: maps.syscalls:"), "{e}");
}

#[test]
fn bad_listen_address() {
    let e = Config::from_overlay("[prometheus]\nlisten = \"localhost:notaport\"\n", "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("prometheus.listen"), "{e}");
    assert!(e.starts_with("f.toml:2:"), "{e}");
}

#[test]
fn otlp_section_parses_and_bad_values_name_their_key() {
    let c = Config::from_overlay(
        "[otlp]\nenabled = true\nprotocol = \"http/protobuf\"\n[otlp.headers]\nauthorization = \"Bearer x\"\n[otlp.resource_attributes]\n\"deployment.environment\" = \"prod\"\n",
        "f.toml",
    )
    .unwrap();
    assert!(c.otlp.enabled);
    assert_eq!(c.otlp.headers["authorization"], "Bearer x");
    assert_eq!(c.otlp.resource_attributes["deployment.environment"], "prod");
    assert_eq!(c.otlp.node_name_env, "NODE_NAME");
    for (text, key, line) in [
        ("[otlp]\nprotocol = \"http\"\n", "otlp.protocol", 2),
        (
            "[otlp]\n\nendpoint = \"collector:4317\"\n",
            "otlp.endpoint",
            3,
        ),
        (
            "[otlp]\nendpoint = \"https://c:4317\"\n",
            "otlp.endpoint",
            2,
        ),
        ("[otlp]\ninterval_ms = 10\n", "otlp.interval_ms", 2),
        (
            "[otlp]\ninterval_ms = 1000\ntimeout_ms = 2000\n",
            "otlp.timeout_ms",
            3,
        ),
        (
            "[otlp.headers]\n\"bad header\" = \"x\"\n",
            "otlp.headers.bad header",
            2,
        ),
    ] {
        let e = Config::from_overlay(text, "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{text:?}: {e}");
        assert!(e.starts_with(&format!("f.toml:{line}:")), "{text:?}: {e}");
    }
}

#[test]
fn bad_enum_value_names_key() {
    let e = Config::from_overlay("[daemon]\nbpf_stats = \"sometimes\"\n", "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f.toml:2:"), "{e}");
}

/// Every value that would break the daemon, silence it or name nothing is refused with
/// its key and line (values seen accepted, or failing late with no key, in testing).
#[test]
fn out_of_range_values_name_key_and_line() {
    let long_socket = format!("/run/{}", "s".repeat(120));
    for (text, key, line) in [
        ("[daemon]\nlog = \"inf\"\n", "daemon.log", 2),
        ("[daemon]\nlog = \"\"\n", "daemon.log", 2),
        ("[daemon]\nlog = \"info,ethand=loud\"\n", "daemon.log", 2),
        ("[daemon]\nmax_processes = 0\n", "daemon.max_processes", 2),
        (
            "[daemon]\n\nhistory_seconds = 0\n",
            "daemon.history_seconds",
            3,
        ),
        ("[daemon]\nsocket = \"\"\n", "daemon.socket", 2),
        (
            &format!("[daemon]\nsocket = {long_socket:?}\n"),
            "daemon.socket",
            2,
        ),
        (
            "[daemon]\nbpf_stats_period_ms = 0\n",
            "daemon.bpf_stats_period_ms",
            2,
        ),
        (
            "[daemon]\napi_max_connections = 0\n",
            "daemon.api_max_connections",
            2,
        ),
        ("[daemon]\nuser = \"a:b\"\n", "daemon.user", 2),
        ("[maps]\nthreads = 0\n", "maps.threads", 2),
        ("[maps]\nsock_owner = 100000000\n", "maps.sock_owner", 2),
        ("[maps]\ngpu_stacks = 1000000\n", "maps.gpu_stacks", 2),
        ("[maps]\ngpu_sites = 10\n", "maps.gpu_sites", 2),
        (
            "[prometheus]\nmax_connections = 0\n",
            "prometheus.max_connections",
            2,
        ),
        (
            "[prometheus]\nmax_connections = 4\nmax_connections_per_peer = 5\n",
            "prometheus.max_connections_per_peer",
            3,
        ),
        ("[prometheus]\ntimeout_ms = 1\n", "prometheus.timeout_ms", 2),
        (
            "[prometheus]\ncomms = [\"a-name-longer-than-15\"]\n",
            "prometheus.comms",
            2,
        ),
        (
            "[gpu]\nrescan_interval_ms = 99999999999\n",
            "gpu.rescan_interval_ms",
            2,
        ),
        (
            "[devices]\ncounters_interval_ms = 0\n",
            "devices.counters_interval_ms",
            2,
        ),
        // Beyond TOML's 64-bit integers: refused by the parser, still named.
        (
            "[daemon]\ninterval_ms = 99999999999999999999\n",
            "daemon.interval_ms",
            2,
        ),
        ("[maps]\nthreads = -1\n", "maps.threads", 2),
        // An unknown table, at its header's line.
        ("\n[deamon]\ninterval_ms = 100\n", "deamon", 2),
    ] {
        let e = Config::from_overlay(text, "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{text:?}: {e}");
        assert!(e.starts_with(&format!("f.toml:{line}:")), "{text:?}: {e}");
    }
    for ok in [
        "[daemon]\nlog = \"warn,ethand=debug\"\n",
        "[daemon]\nlog = \"ethand::gpu=trace\"\n",
        "[daemon]\nlog = \"OFF\"\n",
        "[maps]\nthreads = 64\n",
        "[prometheus]\ncomms = [\"python3\"]\n",
    ] {
        Config::from_overlay(ok, "f.toml").unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
    assert!(check_socket_path(Path::new(&"/".repeat(SOCKET_PATH_MAX))).is_ok());
    assert!(check_socket_path(Path::new(&"/".repeat(SOCKET_PATH_MAX + 1))).is_err());
}

#[test]
fn syntax_error_has_line() {
    let e = Config::from_overlay("[daemon]\ninterval_ms = = 3\n", "f.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f.toml:2:"), "{e}");
}
