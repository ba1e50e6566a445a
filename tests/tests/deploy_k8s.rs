//! deploy/kubernetes: every manifest parses, and the DaemonSet asks for exactly the
//! capabilities and host mounts docs/cluster.md explains, no more. Needs no cluster.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use serde_norway::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn yaml(rel: &str) -> Value {
    let text = read(&format!("deploy/kubernetes/{rel}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    let mut cur = v;
    for p in path {
        cur = cur
            .get(*p)
            .unwrap_or_else(|| panic!("no {p} in path {path:?} of {v:?}"));
    }
    cur
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string"))
}

fn seq<'a>(v: &'a Value, path: &[&str]) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("{path:?} is not a list"))
}

fn strings(v: &Value, path: &[&str]) -> Vec<String> {
    seq(v, path)
        .iter()
        .map(|x| x.as_str().expect("string").to_string())
        .collect()
}

#[test]
fn every_manifest_parses_and_kustomization_lists_existing_files() {
    let mut files = Vec::new();
    for d in [dir(), dir().join("runtimes")] {
        for e in fs::read_dir(&d).expect("deploy/kubernetes") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "yaml") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 8, "{files:?}");
    for f in &files {
        let text = fs::read_to_string(f).expect("read");
        let v: Value = serde_norway::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not YAML: {e}", f.display()));
        let name = f.file_name().unwrap().to_string_lossy();
        if name != "kustomization.yaml" {
            assert!(
                v.get("apiVersion").is_some() && v.get("kind").is_some(),
                "{name}"
            );
        }
    }
    let k = yaml("kustomization.yaml");
    for r in strings(&k, &["resources"]) {
        assert!(dir().join(&r).is_file(), "kustomization names missing {r}");
    }
    // The optional runtime patches it mentions exist.
    let text = read("deploy/kubernetes/kustomization.yaml");
    for p in ["runtimes/crio.yaml", "runtimes/docker.yaml"] {
        assert!(text.contains(p) && dir().join(p).is_file(), "{p}");
    }
}

#[test]
fn daemonset_capabilities_and_mounts_are_the_documented_ones() {
    let ds = yaml("daemonset.yaml");
    assert_eq!(s(&ds, &["kind"]), "DaemonSet");
    let pod = at(&ds, &["spec", "template", "spec"]);
    assert_eq!(at(pod, &["hostPID"]).as_bool(), Some(true), "hostPID");
    assert_eq!(
        at(pod, &["hostNetwork"]).as_bool(),
        Some(false),
        "hostNetwork"
    );
    assert_eq!(
        at(pod, &["automountServiceAccountToken"]).as_bool(),
        Some(false)
    );
    let c = &seq(pod, &["containers"])[0];
    let sc = at(c, &["securityContext"]);
    assert_eq!(at(sc, &["privileged"]).as_bool(), Some(false));
    assert_eq!(at(sc, &["allowPrivilegeEscalation"]).as_bool(), Some(false));
    assert_eq!(at(sc, &["readOnlyRootFilesystem"]).as_bool(), Some(true));
    assert_eq!(strings(sc, &["capabilities", "drop"]), ["ALL"]);
    let caps = strings(sc, &["capabilities", "add"]);
    assert_eq!(
        caps,
        [
            "BPF",
            "PERFMON",
            "SYS_PTRACE",
            "DAC_READ_SEARCH",
            "SYSLOG",
            "SETUID",
            "SETGID"
        ]
    );

    // Each capability is explained in the docs, and SYS_ADMIN's absence too.
    let docs = read("docs/cluster.md");
    for cap in caps.iter().chain(&["SYS_ADMIN".to_string()]) {
        assert!(
            docs.contains(&format!("`{cap}`")),
            "docs/cluster.md does not explain {cap}"
        );
    }

    // Host paths: exactly tracefs and the runtime metadata (read-only); no /proc, bpffs or
    // cgroupfs (docs/cluster.md says why).
    let mut host = BTreeSet::new();
    for v in seq(pod, &["volumes"]) {
        if let Some(p) = v.get("hostPath") {
            host.insert((s(v, &["name"]).to_string(), s(p, &["path"]).to_string()));
        }
    }
    let want: BTreeSet<(String, String)> = [
        ("tracefs", "/sys/kernel/tracing"),
        (
            "containerd-tasks",
            "/run/containerd/io.containerd.runtime.v2.task",
        ),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(host, want);
    for (_, p) in &host {
        assert!(
            docs.contains(p.as_str()),
            "docs/cluster.md does not mention {p}"
        );
    }
    for absent in ["/sys/fs/bpf", "/sys/fs/cgroup", "/proc"] {
        assert!(
            docs.contains(absent),
            "docs/cluster.md must say why {absent} is not mounted"
        );
    }
    let mounts = seq(c, &["volumeMounts"]);
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|m| s(m, &["name"]) == name)
            .unwrap_or_else(|| panic!("no mount of {name}"))
    };
    let ro = |m: &Value| m.get("readOnly").and_then(Value::as_bool) == Some(true);
    assert!(ro(mount("containerd-tasks")) && ro(mount("config")));
    // Mounted where the default attribution config looks (same path as on the host).
    let defaults = read("daemon/src/default.toml");
    let m = s(mount("containerd-tasks"), &["mountPath"]);
    assert!(
        defaults.contains(&format!("\"{m}/k8s.io\"")),
        "{m}/k8s.io is not in attribution.containerd_dirs"
    );
    for (file, dirs_key) in [
        ("runtimes/crio.yaml", "crio"),
        ("runtimes/docker.yaml", "docker"),
    ] {
        let p = yaml(file);
        let c = &seq(&p, &["spec", "template", "spec", "containers"])[0];
        let m = &seq(c, &["volumeMounts"])[0];
        assert!(ro(m), "{file}: read-only");
        let path = s(m, &["mountPath"]);
        assert!(
            defaults.contains(&format!("\"{path}\"")),
            "{file}: {path} not in {dirs_key}_dirs"
        );
        let v = &seq(&p, &["spec", "template", "spec", "volumes"])[0];
        assert_eq!(
            s(v, &["hostPath", "path"]),
            path,
            "{file}: same path inside and out"
        );
    }

    // NODE_NAME from the downward API.
    let env = seq(c, &["env"]);
    let node = env
        .iter()
        .find(|e| s(e, &["name"]) == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        s(node, &["valueFrom", "fieldRef", "fieldPath"]),
        "spec.nodeName"
    );
    // Limits, GPU tolerations, the config and account it names exist.
    assert!(at(c, &["resources", "limits"]).get("memory").is_some());
    assert!(
        seq(pod, &["tolerations"])
            .iter()
            .any(|t| s(t, &["key"]) == "nvidia.com/gpu")
    );
    let cm = yaml("configmap.yaml");
    let cm_name = s(&cm, &["metadata", "name"]);
    assert!(
        seq(pod, &["volumes"]).iter().any(|v| v
            .get("configMap")
            .is_some_and(|x| s(x, &["name"]) == cm_name))
    );
    let sa = yaml("serviceaccount.yaml");
    assert_eq!(
        s(pod, &["serviceAccountName"]),
        s(&sa, &["metadata", "name"])
    );
    // /metrics listens where the port points, and the PodMonitor scrapes that port.
    let toml = s(&cm, &["data", "ethand.toml"]);
    let port = &seq(c, &["ports"])[0];
    let n = at(port, &["containerPort"]).as_u64().expect("port");
    assert!(
        toml.contains(&format!("listen = \"0.0.0.0:{n}\"")),
        "{toml}"
    );
    assert!(
        toml.contains("bpf_stats = \"off\""),
        "no SYS_ADMIN: no BPF stats"
    );
    assert!(
        toml.contains("workload_labels = true"),
        "pod labels on device series, as dcgm-exporter in Kubernetes"
    );
    let pm = yaml("podmonitor.yaml");
    let ep = &seq(&pm, &["spec", "podMetricsEndpoints"])[0];
    assert_eq!(s(ep, &["port"]), s(port, &["name"]));
    let sel = at(&pm, &["spec", "selector", "matchLabels"]);
    let labels = at(&ds, &["spec", "template", "metadata", "labels"]);
    for (k, v) in sel.as_mapping().expect("map") {
        assert_eq!(
            labels.get(k.as_str().unwrap()),
            Some(v),
            "PodMonitor selects the pods"
        );
    }
}
