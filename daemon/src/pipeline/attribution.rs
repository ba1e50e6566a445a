//! Who a process works for: its container and Kubernetes pod, its job and its rank.
//!
//! - The cgroup v2 path (already read by `procinfo`) names the container runtime, the container
//!   id, the pod UID and the QoS class: [`parse_cgroup_path`] knows the systemd-driver form
//!   (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
//!   cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`), the cgroupfs-driver
//!   form (`/kubepods/burstable/pod<uid>/<id>`), plain Docker (`/system.slice/docker-<id>.scope`,
//!   `/docker/<id>`), and the same paths seen from another cgroup namespace (`/../..` prefix)
//!   or nested inside another container (kind: `/system.slice/docker-<node>.scope/kubepods/...`).
//! - Pod name, namespace and container name come from the runtime's on-disk metadata: the OCI
//!   bundle `config.json` of containerd and CRI-O (annotations) and Docker's `config.v2.json`
//!   (labels). No network, no API server. Read once per container id and cached; any failure
//!   leaves the field unknown, never an error.
//! - Job and rank come from `/proc/PID/environ`, filtered through an allow-list: the buffer is
//!   scanned in place, only allow-listed keys are copied out, and the buffer is zeroed before it
//!   is freed. Nothing else from the environment is kept, logged or exported.
use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use ethand_snapshot::WorkloadIdentity;
use serde::Deserialize;

pub use crate::config::AttributionConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Containerd,
    Crio,
    Docker,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Crio => "cri-o",
            Self::Docker => "docker",
        }
    }
}

/// What a cgroup path alone tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupIds {
    /// None for the cgroupfs driver (a bare id): the metadata lookup then tries every runtime.
    pub runtime: Option<Runtime>,
    /// 64 lowercase hex digits.
    pub container_id: Option<String>,
    /// With dashes (`pod1234_5678` in systemd slice names becomes `1234-5678`).
    pub pod_uid: Option<String>,
    /// guaranteed, burstable, besteffort (Kubernetes pods only).
    pub qos_class: Option<&'static str>,
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID: a UUID (static pods: 32 hex digits, their config hash). `_` read as `-`.
fn pod_uid(s: &str) -> Option<String> {
    let uid = s.replace('_', "-").to_ascii_lowercase();
    let hex = uid.bytes().filter(|b| b.is_ascii_hexdigit()).count();
    let dashes = uid.bytes().filter(|&b| b == b'-').count();
    let ok = (uid.len() == 36 && hex == 32 && dashes == 4) || (uid.len() == 32 && hex == 32);
    ok.then_some(uid)
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or a bare `<id>`.
fn container_segment(seg: &str, parent: Option<&str>) -> Option<(Option<Runtime>, String)> {
    if let Some(scope) = seg.strip_suffix(".scope") {
        for (prefix, rt) in [
            ("cri-containerd-", Runtime::Containerd),
            ("crio-", Runtime::Crio),
            ("docker-", Runtime::Docker),
        ] {
            if let Some(id) = scope.strip_prefix(prefix) {
                // crio-conmon-<id>.scope is CRI-O's monitor, not the container: not matched.
                if is_container_id(id) {
                    return Some((Some(rt), id.to_ascii_lowercase()));
                }
            }
        }
        return None;
    }
    if is_container_id(seg) {
        let rt = (parent == Some("docker")).then_some(Runtime::Docker);
        return Some((rt, seg.to_ascii_lowercase()));
    }
    None
}

/// What one segment says about a Kubernetes pod hierarchy.
#[derive(Default)]
struct KubeSeg {
    qos: Option<&'static str>,
    pod_uid: Option<String>,
    /// The segment can only be the kubelet's (`kubepods-*.slice`, `pod<uuid>`).
    sure: bool,
}

/// The QoS class and pod UID of a kubepods segment, systemd or cgroupfs driver.
fn kube_segment(seg: &str) -> KubeSeg {
    let qos_of = |s: &str| match s {
        "burstable" => Some("burstable"),
        "besteffort" => Some("besteffort"),
        _ => None,
    };
    if let Some(rest) = seg
        .strip_suffix(".slice")
        .and_then(|s| s.strip_prefix("kubepods-"))
    {
        // kubepods-burstable.slice, kubepods-burstable-pod<uid>.slice, kubepods-pod<uid>.slice
        return match rest.split_once("pod") {
            Some((q, p)) => match pod_uid(p) {
                Some(uid) => KubeSeg {
                    // The pod slice names the QoS class; none: guaranteed.
                    qos: match q.trim_end_matches('-') {
                        "" => Some("guaranteed"),
                        q => qos_of(q),
                    },
                    pod_uid: Some(uid),
                    sure: true,
                },
                None => KubeSeg::default(),
            },
            None => KubeSeg {
                qos: qos_of(rest),
                pod_uid: None,
                sure: qos_of(rest).is_some(),
            },
        };
    }
    if let Some(uid) = seg.strip_prefix("pod").and_then(pod_uid) {
        return KubeSeg {
            qos: None,
            pod_uid: Some(uid),
            sure: true,
        };
    }
    KubeSeg {
        qos: qos_of(seg),
        ..Default::default()
    }
}

/// Parses a cgroup v2 path (as /proc/PID/cgroup shows it) into runtime, container id, pod UID
/// and QoS class. Inside a Kubernetes pod hierarchy the first container after the pod is the
/// container (nested ones, e.g. `init.scope` below it, are parts of it); elsewhere the
/// outermost container id is taken, the one whose metadata the host's runtime holds.
///
/// Read from another cgroup namespace (ethand in a pod), a path is relative to the reader's
/// root and starts with `/..`: it goes up to the common ancestor and down from there, so the
/// `kubepods` segment itself may be missing (`/../../kubepods-besteffort.slice/...`). Segments
/// only the kubelet makes (`kubepods-*.slice`, `pod<uuid>`) start a pod hierarchy then; a
/// cgroupfs-driver path that omits the QoS level leaves `qos_class` unknown.
pub fn parse_cgroup_path(path: &str) -> CgroupIds {
    let relative = path.starts_with("/..");
    let mut ids = CgroupIds::default();
    let mut in_kubepods = false;
    let mut parent: Option<&str> = None;
    for seg in path.split('/').filter(|s| !s.is_empty() && *s != "..") {
        let k = kube_segment(seg);
        if seg == "kubepods" || seg == "kubepods.slice" || (k.sure && !in_kubepods) {
            // A new (possibly nested: kind) Kubernetes hierarchy: it wins over what came before.
            ids = CgroupIds::default();
            in_kubepods = true;
        }
        if in_kubepods && ids.container_id.is_none() {
            if ids.pod_uid.is_none() {
                if k.qos.is_some() {
                    ids.qos_class = k.qos;
                }
                if k.pod_uid.is_some() {
                    ids.pod_uid = k.pod_uid;
                }
            } else if let Some((rt, id)) = container_segment(seg, parent) {
                ids.runtime = rt;
                ids.container_id = Some(id);
            }
        } else if !in_kubepods && ids.container_id.is_none() {
            if let Some((rt, id)) = container_segment(seg, parent) {
                ids.runtime = rt;
                ids.container_id = Some(id);
            }
        }
        parent = Some(seg);
    }
    if in_kubepods && !relative && ids.pod_uid.is_some() && ids.qos_class.is_none() {
        // Guaranteed pods sit directly under kubepods.
        ids.qos_class = Some("guaranteed");
    }
    ids
}

/// What the runtime's metadata says about a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerMeta {
    pub runtime: Option<Runtime>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub container: Option<String>,
    pub pod_uid: Option<String>,
}

/// The one part of an OCI `config.json` ethand reads. The file also holds the container's
/// environment (`process.env`): typed parsing skips it without keeping any of it.
#[derive(Deserialize)]
struct OciConfig {
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// The parts of Docker's `config.v2.json` ethand reads (`Config.Env` is skipped likewise).
#[derive(Deserialize)]
struct DockerConfig {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Config", default)]
    config: DockerInner,
}

#[derive(Deserialize, Default)]
struct DockerInner {
    #[serde(rename = "Labels", default)]
    labels: Option<HashMap<String, String>>,
}

fn get(m: &HashMap<String, String>, k: &str) -> Option<String> {
    m.get(k)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(String::from)
}

/// containerd's OCI bundle config.json (annotations set by its CRI plugin).
pub fn parse_containerd_config(json: &[u8]) -> Option<ContainerMeta> {
    let a = serde_json::from_slice::<OciConfig>(json).ok()?.annotations;
    Some(ContainerMeta {
        runtime: Some(Runtime::Containerd),
        pod: get(&a, "io.kubernetes.cri.sandbox-name"),
        namespace: get(&a, "io.kubernetes.cri.sandbox-namespace"),
        container: get(&a, "io.kubernetes.cri.container-name"),
        pod_uid: get(&a, "io.kubernetes.cri.sandbox-uid"),
    })
}

/// CRI-O's userdata/config.json (the kubelet's labels, copied into annotations).
pub fn parse_crio_config(json: &[u8]) -> Option<ContainerMeta> {
    let a = serde_json::from_slice::<OciConfig>(json).ok()?.annotations;
    Some(ContainerMeta {
        runtime: Some(Runtime::Crio),
        pod: get(&a, "io.kubernetes.pod.name"),
        namespace: get(&a, "io.kubernetes.pod.namespace"),
        container: get(&a, "io.kubernetes.container.name"),
        pod_uid: get(&a, "io.kubernetes.pod.uid"),
    })
}

/// Docker's config.v2.json: the kubelet's labels (dockershim, cri-dockerd) under Config.Labels;
/// a container that is not Kubernetes' gets its Docker name.
pub fn parse_docker_config(json: &[u8]) -> Option<ContainerMeta> {
    let d = serde_json::from_slice::<DockerConfig>(json).ok()?;
    let l = d.config.labels.unwrap_or_default();
    let pod = get(&l, "io.kubernetes.pod.name");
    let name = d.name.trim().trim_start_matches('/').to_string();
    let container = get(&l, "io.kubernetes.container.name")
        .or_else(|| (pod.is_none() && !name.is_empty()).then_some(name));
    Some(ContainerMeta {
        runtime: Some(Runtime::Docker),
        pod,
        namespace: get(&l, "io.kubernetes.pod.namespace"),
        container,
        pod_uid: get(&l, "io.kubernetes.pod.uid"),
    })
}

/// Most metadata files read: bigger ones (a huge spec) are not ours to parse.
const MAX_META_BYTES: u64 = 4 << 20;
/// Cached container ids before the cache starts over (containers come and go).
const MAX_CACHED: usize = 4096;

fn read_small(path: &Path) -> Option<Vec<u8>> {
    let len = std::fs::metadata(path).ok()?.len();
    (len <= MAX_META_BYTES)
        .then(|| std::fs::read(path).ok())
        .flatten()
}

/// Finds and parses the metadata of container `id`, trying `rt`'s directories (all runtimes'
/// when unknown).
pub fn lookup_container(cfg: &AttributionConfig, rt: Option<Runtime>, id: &str) -> ContainerMeta {
    type Parser = fn(&[u8]) -> Option<ContainerMeta>;
    let sources: [(Runtime, &[PathBuf], &str, Parser); 3] = [
        (
            Runtime::Containerd,
            &cfg.containerd_dirs,
            "config.json",
            parse_containerd_config,
        ),
        (
            Runtime::Crio,
            &cfg.crio_dirs,
            "userdata/config.json",
            parse_crio_config,
        ),
        (
            Runtime::Docker,
            &cfg.docker_dirs,
            "config.v2.json",
            parse_docker_config,
        ),
    ];
    for (r, dirs, file, parse) in sources {
        if rt.is_some_and(|want| want != r) {
            continue;
        }
        for d in dirs {
            if let Some(mut b) = read_small(&d.join(id).join(file)) {
                let m = parse(&b);
                // The file holds the container's environment too: zero it before freeing.
                b.iter_mut().for_each(|x| *x = 0);
                std::hint::black_box(&b);
                if let Some(m) = m {
                    return m;
                }
            }
        }
    }
    ContainerMeta {
        runtime: rt,
        ..Default::default()
    }
}

/// Keeps the allow-listed variables of an environ buffer (NUL-separated `KEY=VALUE`). Values
/// are cut to 128 bytes of printable ASCII (anything else becomes `_`).
pub fn filter_environ(buf: &[u8], allow: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in buf.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (key, value) = (&entry[..eq], &entry[eq + 1..]);
        let Some(k) = allow.iter().find(|a| a.as_bytes() == key) else {
            continue;
        };
        let v: String = value
            .iter()
            .take(128)
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '_' })
            .collect();
        out.insert(k.clone(), v);
    }
    out
}

/// The allow-listed variables of process `pid` (empty when unreadable or nothing is allowed).
/// The raw buffer never leaves this function and is zeroed before it is freed.
pub fn read_env(pid: u32, allow: &[String]) -> BTreeMap<String, String> {
    if allow.is_empty() {
        return BTreeMap::new();
    }
    let Ok(mut buf) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return BTreeMap::new();
    };
    let out = filter_environ(&buf, allow);
    buf.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&buf);
    out
}

/// `job_id` and `rank` (with the key each came from) from the filtered variables.
pub fn job_and_rank(
    env: &BTreeMap<String, String>,
    job_keys: &[String],
    rank_keys: &[String],
) -> (Option<(String, String)>, Option<(String, u32)>) {
    let job = job_keys.iter().find_map(|k| {
        let v = env.get(k)?;
        // torchrun's default rendezvous id is "none".
        (!v.is_empty() && v != "none").then(|| (k.clone(), v.clone()))
    });
    let rank = rank_keys
        .iter()
        .find_map(|k| Some((k.clone(), env.get(k)?.parse::<u32>().ok()?)));
    (job, rank)
}

/// Container part of an identity (None when the path names no container or pod).
fn container_identity(ids: &CgroupIds, meta: Option<&ContainerMeta>) -> Option<WorkloadIdentity> {
    if ids.container_id.is_none() && ids.pod_uid.is_none() {
        return None;
    }
    let m = meta.cloned().unwrap_or_default();
    Some(WorkloadIdentity {
        container_runtime: ids.runtime.or(m.runtime).map(|r| r.as_str().to_string()),
        container_id: ids.container_id.clone(),
        container: m.container,
        pod: m.pod,
        namespace: m.namespace,
        pod_uid: ids.pod_uid.clone().or(m.pod_uid),
        qos_class: ids.qos_class.map(String::from),
        ..Default::default()
    })
}

/// Turns cgroup paths and pids into identities; caches runtime metadata per container id.
pub struct Attributor {
    cfg: AttributionConfig,
    cache: HashMap<String, ContainerMeta>,
}

impl Attributor {
    pub fn new(cfg: AttributionConfig) -> Self {
        Self {
            cfg,
            cache: HashMap::new(),
        }
    }

    /// The container and pod of a cgroup path (metadata read on first sight of its id).
    pub fn container(&mut self, cgroup: &str) -> Option<WorkloadIdentity> {
        if !self.cfg.kubernetes {
            return None;
        }
        let ids = parse_cgroup_path(cgroup);
        let meta = match &ids.container_id {
            Some(id) => {
                if !self.cache.contains_key(id) {
                    if self.cache.len() >= MAX_CACHED {
                        self.cache.clear();
                    }
                    let m = lookup_container(&self.cfg, ids.runtime, id);
                    self.cache.insert(id.clone(), m);
                }
                self.cache.get(id)
            }
            None => None,
        };
        container_identity(&ids, meta)
    }

    /// The container part from what is cached only (no file reads): for per-cgroup totals.
    pub fn cached_container(&self, cgroup: &str) -> Option<WorkloadIdentity> {
        if !self.cfg.kubernetes {
            return None;
        }
        let ids = parse_cgroup_path(cgroup);
        let meta = ids.container_id.as_ref().and_then(|id| self.cache.get(id));
        container_identity(&ids, meta)
    }

    /// Full identity of process `pid` in `cgroup`: container, pod, job and rank. Called when
    /// ethand first sees the process and after it execs.
    pub fn identify(&mut self, pid: u32, cgroup: &str) -> Option<WorkloadIdentity> {
        let mut w = self.container(cgroup);
        let env = read_env(pid, &self.cfg.env_allowlist);
        if env.is_empty() {
            return w;
        }
        let (job, rank) = job_and_rank(&env, &self.cfg.job_keys, &self.cfg.rank_keys);
        let w_ref = w.get_or_insert_with(WorkloadIdentity::default);
        if let Some((k, v)) = job {
            w_ref.job_id = Some(v);
            w_ref.job_id_source = Some(k);
        }
        if let Some((k, r)) = rank {
            w_ref.rank = Some(r);
            w_ref.rank_source = Some(k);
        }
        w_ref.env = env;
        w
    }
}

/// Completes an identity with NCCL's communicator rank when the environment gave none.
pub fn with_nccl_rank(
    w: Option<WorkloadIdentity>,
    nccl_rank: Option<u32>,
) -> Option<WorkloadIdentity> {
    match (w, nccl_rank) {
        (Some(w), _) if w.rank.is_some() => Some(w),
        (w, Some(r)) => {
            let mut w = w.unwrap_or_default();
            w.rank = Some(r);
            w.rank_source = Some("nccl".into());
            Some(w)
        }
        (w, None) => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "3f9c2a1e-7b4d-4c8e-9a10-5d2e6f7a8b9c";
    const UID_: &str = "3f9c2a1e_7b4d_4c8e_9a10_5d2e6f7a8b9c";

    fn ids(rt: Option<Runtime>, qos: &'static str) -> CgroupIds {
        CgroupIds {
            runtime: rt,
            container_id: Some(ID.into()),
            pod_uid: Some(UID.into()),
            qos_class: Some(qos),
        }
    }

    #[test]
    fn systemd_driver_forms() {
        for (scope, rt) in [
            (format!("cri-containerd-{ID}.scope"), Runtime::Containerd),
            (format!("crio-{ID}.scope"), Runtime::Crio),
            (format!("docker-{ID}.scope"), Runtime::Docker),
        ] {
            let p = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/{scope}"
            );
            assert_eq!(parse_cgroup_path(&p), ids(Some(rt), "burstable"), "{p}");
            let p = format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/{scope}"
            );
            assert_eq!(parse_cgroup_path(&p), ids(Some(rt), "besteffort"), "{p}");
            // Guaranteed pods sit directly under kubepods.slice.
            let p = format!("/kubepods.slice/kubepods-pod{UID_}.slice/{scope}");
            assert_eq!(parse_cgroup_path(&p), ids(Some(rt), "guaranteed"), "{p}");
        }
    }

    #[test]
    fn cgroupfs_driver_forms() {
        let p = format!("/kubepods/burstable/pod{UID}/{ID}");
        assert_eq!(parse_cgroup_path(&p), ids(None, "burstable"));
        let p = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(parse_cgroup_path(&p), ids(None, "besteffort"));
        let p = format!("/kubepods/pod{UID}/{ID}");
        assert_eq!(parse_cgroup_path(&p), ids(None, "guaranteed"));
    }

    #[test]
    fn plain_docker_forms() {
        for p in [
            format!("/system.slice/docker-{ID}.scope"),
            format!("/docker/{ID}"),
        ] {
            let got = parse_cgroup_path(&p);
            assert_eq!(got.runtime, Some(Runtime::Docker), "{p}");
            assert_eq!(got.container_id.as_deref(), Some(ID), "{p}");
            assert_eq!((got.pod_uid, got.qos_class), (None, None), "{p}");
        }
    }

    #[test]
    fn namespaced_and_nested_forms() {
        // Seen from a process in another cgroup namespace.
        let p = format!(
            "/../../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_cgroup_path(&p),
            ids(Some(Runtime::Containerd), "burstable")
        );
        // From a pod's cgroup namespace the common ancestor is left out: no kubepods segment.
        let p = format!(
            "/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"
        );
        assert_eq!(
            parse_cgroup_path(&p),
            ids(Some(Runtime::Crio), "besteffort")
        );
        let p = format!("/../../../kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            parse_cgroup_path(&p),
            ids(Some(Runtime::Containerd), "guaranteed")
        );
        let p = format!("/../../pod{UID}/{ID}");
        let got = parse_cgroup_path(&p);
        assert_eq!(
            (got.pod_uid.as_deref(), got.container_id.as_deref()),
            (Some(UID), Some(ID))
        );
        assert_eq!(got.qos_class, None, "unknown, not guessed");
        let p = format!("/../../../system.slice/docker-{ID}.scope");
        assert_eq!(parse_cgroup_path(&p).runtime, Some(Runtime::Docker));
        // A sub-cgroup of the container (systemd in the container, a job's own groups).
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope/init.scope"
        );
        assert_eq!(parse_cgroup_path(&p), ids(Some(Runtime::Crio), "burstable"));
        // kind: the node is a Docker container, the pod inside it.
        let node = "f".repeat(64);
        let p = format!("/system.slice/docker-{node}.scope/kubepods/burstable/pod{UID}/{ID}");
        assert_eq!(parse_cgroup_path(&p), ids(None, "burstable"));
        // Nested Docker: the outermost container is the host runtime's.
        let p = format!("/docker/{ID}/docker/{node}");
        assert_eq!(parse_cgroup_path(&p).container_id.as_deref(), Some(ID));
        // Static pod: the UID is the 32-hex config hash.
        let hash = "6e2a0b3d7c1f4e5a8b9c0d1e2f3a4b5c";
        let p = format!("/kubepods/burstable/pod{hash}/{ID}");
        assert_eq!(parse_cgroup_path(&p).pod_uid.as_deref(), Some(hash));
    }

    #[test]
    fn not_containers() {
        for p in [
            "/",
            "",
            "/user.slice/user-1000.slice/session-3.scope",
            "/system.slice/containerd.service",
            "/kubepods.slice/kubepods-burstable.slice",
            // conmon is CRI-O's monitor, not the container.
            &format!("/system.slice/crio-conmon-{ID}.scope"),
            // Too short to be an id.
            "/docker/0123456789ab",
        ] {
            assert_eq!(
                parse_cgroup_path(p).container_id,
                None,
                "{p} is not a container"
            );
        }
        // The pod's own slice: a pod but no container yet.
        let p =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        let got = parse_cgroup_path(&p);
        assert_eq!(got.pod_uid.as_deref(), Some(UID));
        assert_eq!(got.container_id, None);
    }

    #[test]
    fn runtime_metadata() {
        let c = br#"{"ociVersion":"1.1.0","process":{"env":["SECRET=x"]},"annotations":{"io.kubernetes.cri.container-type":"container",
            "io.kubernetes.cri.sandbox-name":"trainer-0","io.kubernetes.cri.sandbox-namespace":"ml",
            "io.kubernetes.cri.container-name":"pytorch","io.kubernetes.cri.sandbox-uid":"u1"}}"#;
        let m = parse_containerd_config(c).unwrap();
        assert_eq!(
            (
                m.pod.as_deref(),
                m.namespace.as_deref(),
                m.container.as_deref()
            ),
            (Some("trainer-0"), Some("ml"), Some("pytorch"))
        );
        let c = br#"{"annotations":{"io.kubernetes.pod.name":"p","io.kubernetes.pod.namespace":"n",
            "io.kubernetes.container.name":"c","io.kubernetes.pod.uid":"u"}}"#;
        let m = parse_crio_config(c).unwrap();
        assert_eq!(
            (
                m.pod.as_deref(),
                m.namespace.as_deref(),
                m.container.as_deref(),
                m.pod_uid.as_deref()
            ),
            (Some("p"), Some("n"), Some("c"), Some("u"))
        );
        let d = br#"{"Name":"/k8s_c_p_n_u_0","Config":{"Labels":{"io.kubernetes.pod.name":"p",
            "io.kubernetes.pod.namespace":"n","io.kubernetes.container.name":"c"}}}"#;
        let m = parse_docker_config(d).unwrap();
        assert_eq!(
            (
                m.pod.as_deref(),
                m.namespace.as_deref(),
                m.container.as_deref()
            ),
            (Some("p"), Some("n"), Some("c"))
        );
        let d = br#"{"Name":"/web","Config":{"Env":["A=b"],"Labels":null}}"#;
        let m = parse_docker_config(d).unwrap();
        assert_eq!((m.pod, m.container.as_deref()), (None, Some("web")));
        assert_eq!(parse_containerd_config(b"{not json"), None);
    }

    fn cfg(root: &Path) -> AttributionConfig {
        AttributionConfig {
            kubernetes: true,
            containerd_dirs: vec![root.join("containerd")],
            crio_dirs: vec![root.join("crio")],
            docker_dirs: vec![root.join("docker")],
            env_allowlist: vec!["RANK".into(), "TORCHELASTIC_RUN_ID".into()],
            job_keys: vec!["TORCHELASTIC_RUN_ID".into()],
            rank_keys: vec!["RANK".into()],
        }
    }

    #[test]
    fn lookup_reads_files_and_caches_and_unknown_is_not_an_error() {
        let root = std::env::temp_dir().join(format!("ethand-attr-unit-{}", std::process::id()));
        let dir = root.join("crio").join(ID).join("userdata");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            br#"{"annotations":{"io.kubernetes.pod.name":"p","io.kubernetes.pod.namespace":"n","io.kubernetes.container.name":"c"}}"#,
        )
        .unwrap();
        let mut a = Attributor::new(cfg(&root));
        // cgroupfs driver: no runtime in the path, found by trying every runtime.
        let w = a.container(&format!("/kubepods/pod{UID}/{ID}")).unwrap();
        assert_eq!(w.container_runtime.as_deref(), Some("cri-o"));
        assert_eq!(
            (w.pod.as_deref(), w.namespace.as_deref()),
            (Some("p"), Some("n"))
        );
        assert_eq!(w.container_id.as_deref(), Some(ID));
        // Cached: the file is gone but the answer stays.
        std::fs::remove_dir_all(&root).unwrap();
        let w2 = a
            .cached_container(&format!("/kubepods/pod{UID}/{ID}"))
            .unwrap();
        assert_eq!(w2, w);
        // Missing metadata: ids from the path, names unknown.
        let other = "a".repeat(64);
        let w = a
            .container(&format!(
                "/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{other}.scope"
            ))
            .unwrap();
        assert_eq!(w.container_runtime.as_deref(), Some("containerd"));
        assert_eq!((w.pod, w.namespace, w.container), (None, None, None));
        assert_eq!(a.container("/user.slice"), None);
    }

    #[test]
    fn environ_keeps_only_allowed_keys() {
        let allow: Vec<String> = ["RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let buf = b"PATH=/bin\0AWS_SECRET_ACCESS_KEY=hunter2\0RANK=3\0RANKX=9\0XRANK=8\0WORLD_SIZE=8\0TORCHELASTIC_RUN_ID=job 42\x01\0NOEQUALS\0=x\0";
        let env = filter_environ(buf, &allow);
        assert_eq!(env.len(), 3, "{env:?}");
        assert_eq!(env["RANK"], "3");
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["TORCHELASTIC_RUN_ID"], "job_42_");
        assert!(!format!("{env:?}").contains("hunter2"));
        let long = format!("RANK={}\0", "7".repeat(1000));
        assert_eq!(filter_environ(long.as_bytes(), &allow)["RANK"].len(), 128);
    }

    #[test]
    fn job_and_rank_order() {
        let env: BTreeMap<String, String> = [
            ("TORCHELASTIC_RUN_ID", "none"),
            ("SLURM_JOB_ID", "1234"),
            ("RANK", "x"),
            ("SLURM_PROCID", "5"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (job, rank) = job_and_rank(
            &env,
            &keys(&["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]),
            &keys(&["RANK", "SLURM_PROCID"]),
        );
        assert_eq!(job, Some(("SLURM_JOB_ID".into(), "1234".into())));
        assert_eq!(rank, Some(("SLURM_PROCID".into(), 5)));
    }

    #[test]
    fn identify_reads_own_environment_through_the_allowlist() {
        // This test process has no RANK (normally); the allow-list holds PATH's absence too.
        let mut c = cfg(Path::new("/nonexistent"));
        c.env_allowlist.push("HOME".into());
        let mut a = Attributor::new(c);
        let w = a.identify(std::process::id(), "/user.slice");
        if let Some(w) = w {
            assert!(
                w.env
                    .keys()
                    .all(|k| ["RANK", "TORCHELASTIC_RUN_ID", "HOME"].contains(&k.as_str()))
            );
            assert!(!w.env.contains_key("PATH"));
        }
    }

    #[test]
    fn nccl_rank_fills_in() {
        let w = with_nccl_rank(None, Some(2)).unwrap();
        assert_eq!((w.rank, w.rank_source.as_deref()), (Some(2), Some("nccl")));
        let env_rank = WorkloadIdentity {
            rank: Some(3),
            rank_source: Some("RANK".into()),
            ..Default::default()
        };
        assert_eq!(
            with_nccl_rank(Some(env_rank.clone()), Some(2)),
            Some(env_rank)
        );
        assert_eq!(with_nccl_rank(None, None), None);
    }

    #[test]
    fn config_keys_must_be_allowlisted() {
        let mut c = cfg(Path::new("/"));
        assert!(c.validate().is_ok());
        c.rank_keys.push("SLURM_PROCID".into());
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "attribution.rank_keys");
    }
}
