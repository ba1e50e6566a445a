//! Everything ethand parses out of /proc/PID: stat, status, cgroup (and the container, pod
//! and QoS found in the cgroup path), environ (through the allow-list), maps (lines, and the
//! GPU/NPU runtime libraries), the reader's owner and start time, and the container
//! runtimes' metadata files.
#![no_main]
use ethand::{attribution, procinfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some((comm, _ppid, _start)) = procinfo::parse_stat(&text) {
        assert!(text.contains(&comm));
    }
    let _ = procinfo::parse_uid(&text);
    let cgroup = procinfo::parse_cgroup(&text);
    let _ = attribution::parse_cgroup_path(&cgroup);
    let _ = attribution::parse_cgroup_path(&text);
    let allow = ["JOB_ID".to_string(), "RANK".to_string()];
    let env = attribution::filter_environ(data, &allow);
    assert!(env.keys().all(|k| allow.contains(k)), "{env:?}");
    for lib in ethand_userspace_probes::parse_maps(42, &text) {
        assert!(lib.pid == 42 && lib.host_path().starts_with("/proc/42/root/"), "{lib:?}");
    }
    for line in data.split(|&c| c == b'\n') {
        if let Some(v) = ethand_userspace_probes::procmaps::parse_line(line) {
            assert!(v.name.len() <= line.len(), "{v:?}");
        }
    }
    let _ = ethand_reader::owner::parse_status(&text);
    let _ = ethand_reader::owner::parse_start(&text);
    let _ = attribution::parse_containerd_config(data);
    let _ = attribution::parse_crio_config(data);
    let _ = attribution::parse_docker_config(data);
});
