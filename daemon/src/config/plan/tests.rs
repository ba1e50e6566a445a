use super::*;

#[test]
fn the_profile_needs_its_rate_and_the_stack_window() {
    let mut cfg = Config::defaults();
    let p = Plan::resolve(&cfg);
    assert!(p.cpu_profile.is_ok() && p.stack_sample.is_some());
    cfg.diagnosis.stack_sample_ms = 0;
    let p = Plan::resolve(&cfg);
    assert!(p.cpu_profile.is_err() && p.stack_window().is_zero());
    cfg.diagnosis.stack_sample_ms = 500;
    cfg.diagnosis.cpu_profile_hz = 0;
    assert!(Plan::resolve(&cfg).cpu_profile.is_err());
    cfg.diagnosis.launch_sample_ms = 0;
    assert_eq!(Plan::resolve(&cfg).launch_sample, None);
}

#[test]
fn runtimes_are_typed_in_their_order_and_none_probes_none() {
    let mut cfg = Config::defaults();
    cfg.gpu.runtimes = vec!["hccl".into(), "cuda".into()];
    assert_eq!(
        Plan::resolve(&cfg).gpu.runtimes,
        [Runtime::Cuda, Runtime::Hccl]
    );
    cfg.gpu.runtimes.clear();
    let p = Plan::resolve(&cfg);
    assert!(p.gpu.runtimes.is_empty());
    // The CPU profile still opens perf events; without it, nothing does.
    assert!(p.opens_perf_events());
    cfg.diagnosis.cpu_profile_hz = 0;
    assert!(!Plan::resolve(&cfg).opens_perf_events());
    cfg.gpu.runtimes = vec!["nccl".into()];
    assert!(Plan::resolve(&cfg).opens_perf_events());
}

#[test]
fn syscall_keys_follow_max_processes_with_a_floor() {
    let mut cfg = Config::defaults();
    cfg.daemon.max_processes = 16;
    assert_eq!(Plan::resolve(&cfg).maps.syscall_keys, 1024);
    cfg.daemon.max_processes = 50_000;
    assert_eq!(Plan::resolve(&cfg).maps.syscall_keys, 50_000);
    cfg.maps.threads = 12_345;
    assert_eq!(Plan::resolve(&cfg).maps.configured.threads, 12_345);
}

#[test]
fn probe_families_are_the_ones_switched_on() {
    let mut cfg = Config::defaults();
    cfg.probes.net = false;
    cfg.probes.prefer_btf = false;
    cfg.probes.syscall_batching = false;
    cfg.probes.kernel_charges = false;
    let p = Plan::resolve(&cfg).probes;
    assert!(!p.enabled(ProbeFamily::Net) && p.enabled(ProbeFamily::Sched));
    assert!(!p.prefer_btf && !p.syscall_batching && !p.kernel_charges);
    cfg.probes.turn_families_off();
    let p = Plan::resolve(&cfg).probes;
    assert!(p.families.is_empty());
    assert!(ProbeFamily::ALL.iter().all(|f| !p.enabled(*f)));
    assert_eq!(p.tracepoints, cfg.probes.tracepoints);
}

#[test]
fn intervals_and_deadlines_are_durations() {
    let mut cfg = Config::defaults();
    cfg.daemon.interval_ms = 500;
    cfg.daemon.history_seconds = 60;
    cfg.daemon.bpf_stats_window_ms = 200;
    cfg.daemon.bpf_stats_period_ms = 10_000;
    cfg.reader.symbolize_timeout_ms = 1500;
    cfg.reader.python_read_timeout_ms = 40;
    cfg.devices.interval_ms = 2000;
    cfg.daemon.level_switch_interval_seconds = 7;
    let p = Plan::resolve(&cfg);
    assert_eq!(p.collect.interval, Duration::from_millis(500));
    assert_eq!(p.collect.bpf_stats_window, Duration::from_millis(200));
    assert_eq!(p.collect.bpf_stats_period, Duration::from_secs(10));
    assert_eq!(p.reader.symbolize_timeout, Duration::from_millis(1500));
    assert_eq!(p.reader.python_read_timeout, Duration::from_millis(40));
    assert_eq!(p.devices.interval, Duration::from_secs(2));
    assert_eq!(p.serve.level_switch_every, Duration::from_secs(7));
    // One device reading per round over the history, at least two.
    assert_eq!(p.serve.device_history_rounds, 120);
    cfg.daemon.history_seconds = 0;
    assert_eq!(Plan::resolve(&cfg).serve.device_history_rounds, 2);
}

#[test]
fn device_libraries_and_the_selection_come_through() {
    let mut cfg = Config::defaults();
    cfg.devices.nvml_library = String::new();
    cfg.devices.dcmi_library = "/opt/dcmi/libdcmi.so".into();
    cfg.prometheus.selection_hold_seconds = 30;
    cfg.prometheus.top_n = 7;
    cfg.daemon.user = "ethand".into();
    let p = Plan::resolve(&cfg);
    assert_eq!(p.devices.collectors.nvml_library, None);
    assert_eq!(
        p.devices.collectors.dcmi_library.as_deref(),
        Some(std::path::Path::new("/opt/dcmi/libdcmi.so"))
    );
    assert_eq!(p.serve.selection.hold_ms, 30_000);
    assert_eq!(p.serve.selection.top_n, 7);
    assert_eq!(p.reader.user, "ethand");
    assert_eq!(p.gpu.level, cfg.gpu.level);
}
