//! The HTML report (`ethand snapshot --html`): escaping, charts, findings, self-containment.
use ethand_exporters::html::{escape, render_html};
use ethand_snapshot::{
    GpuLevel, ProcessSnapshot, SchedStats, ThreadSnapshot, TreeSnapshot, TreeTotals,
    devices::{CollectorState, CollectorStatus, DevicesSnapshot, GpuDevice},
    diagnosis::{Evidence, Finding, NotEvaluated, TimelinePoint},
    gpu::{
        CollectiveStats, CommRank, GpuCopyStats, GpuDerived, GpuMemoryStats, GpuProcessStats,
        GpuTimedCalls, LaunchSample, LaunchSampleProcess,
    },
};

const EVIL: &str = "<script>alert(1)</script>";

fn proc(pid: u32, ppid: u32, comm: &str) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        ppid,
        comm: comm.into(),
        cmdline: vec![comm.into(), "--flag".into()],
        alive: true,
        sched: SchedStats {
            oncpu_ns: 1_500_000_000,
            ..Default::default()
        },
        threads: vec![ThreadSnapshot {
            tid: pid,
            comm: comm.into(),
            alive: true,
            sched: SchedStats {
                oncpu_ns: 1_500_000_000,
                ..Default::default()
            },
            now: None,
        }],
        ..Default::default()
    }
}

fn tree() -> TreeSnapshot {
    let mut root = proc(4242, 1, "trainer");
    root.cgroup = "/kubepods/pod-a&b\"c'".into();
    TreeSnapshot {
        schema_version: 1,
        source: ethand_snapshot::SnapshotSource::Daemon,
        root_pid: 4242,
        taken_at_unix_ms: 1_790_000_000_000,
        measured_ms: 0,
        processes: vec![
            root,
            proc(4300, 4242, "worker0"),
            proc(4400, 4300, "grandchild"),
        ],
        total: TreeTotals {
            processes: 3,
            threads: 3,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn timeline(n: u64) -> Vec<TimelinePoint> {
    (0..n)
        .map(|i| TimelinePoint {
            t_unix_ms: 1_790_000_000_000 - (n - 1 - i) * 1000,
            interval_ms: 1000,
            oncpu_ns: 500_000_000 + i * 100_000_000,
            runq_wait_ns: 10_000_000 * i,
            syscalls: 1000 * i,
            block_read_bytes: 1 << 20,
            net_tx_bytes: 4096 * i,
            gpu_launches: Some(100 * i),
            gpu_sync_ns: 200_000_000,
            ..Default::default()
        })
        .collect()
}

/// No external resources: nothing loaded from anywhere, no script.
fn assert_self_contained(h: &str) {
    // Attribute forms only: escaped user text may say src=x but never src=" (quotes escaped).
    for bad in [
        "src=\"", "href=\"", "src='", "href='", "<script", "<link", "<iframe", "<img", "url(",
        "@import",
    ] {
        assert!(!h.contains(bad), "report contains {bad:?}");
    }
    assert!(
        !h.contains("http://") && !h.contains("https://"),
        "report references a URL"
    );
}

#[test]
fn escape_covers_markup_quotes_and_invalid_characters() {
    assert_eq!(escape(EVIL), "&lt;script&gt;alert(1)&lt;/script&gt;");
    assert_eq!(escape("a&b \"c\" 'd'"), "a&amp;b &quot;c&quot; &#39;d&#39;");
    // Control characters and direction overrides become visible escapes; noncharacters U+FFFD.
    assert_eq!(escape("x\u{0}y\u{1b}[31m"), "x\\u{0}y\\u{1b}[31m");
    assert_eq!(escape("ab\u{202e}cd"), "ab\\u{202e}cd");
    assert_eq!(escape("\u{fffe}\u{ffff}"), "\u{fffd}\u{fffd}");
    assert_eq!(escape("plain café ✓"), "plain café ✓");
}

#[test]
fn user_controlled_strings_are_escaped_everywhere() {
    let mut t = tree();
    t.processes[0].comm = EVIL.into();
    t.processes[0].cmdline = vec![
        EVIL.into(),
        "\"quoted\" & 'single' \u{1b}]0;title\u{7}".into(),
    ];
    t.processes[0].exe = EVIL.into();
    t.processes[1].comm = "\"><img src=x onerror=alert(2)>".into();
    t.processes[1].threads[0].comm = EVIL.into();
    t.processes[0].cgroup = "/a<b>/c&d".into();
    t.findings = vec![Finding {
        id: EVIL.into(),
        title: EVIL.into(),
        // A typed severity: no text of a process reaches it.
        severity: ethand_snapshot::diagnosis::Severity::Critical,
        evidence: vec![Evidence {
            signal: EVIL.into(),
            value: 1.0,
            unit: EVIL.into(),
        }],
        explanation: EVIL.into(),
        advice: vec![EVIL.into()],
        estimated_speedup: Some(1.5),
        impact: 0.5,
        detail: vec![EVIL.into()],
    }];
    t.devices.hostname = EVIL.into();
    let h = render_html(&t);
    assert!(!h.contains("<script"), "unescaped <script in the report");
    assert!(!h.contains("<img"), "unescaped <img in the report");
    assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(h.contains("&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"));
    assert!(h.contains("&quot;quoted&quot; &amp; &#39;single&#39; \\u{1b}]0;title\\u{7}"));
    assert!(h.contains("/a&lt;b&gt;/c&amp;d"));
    assert!(
        !h.contains('\u{1b}') && !h.contains('\u{7}'),
        "raw control characters"
    );
    assert_self_contained(&h);
}

#[test]
fn header_and_process_tree() {
    let t = tree();
    let h = render_html(&t);
    assert!(h.starts_with("<!DOCTYPE html>"));
    assert!(h.trim_end().ends_with("</html>"));
    assert!(h.contains("<title>ethand report: pid 4242 (trainer)</title>"));
    assert!(
        h.contains("2026-09-21 14:13:20 UTC"),
        "taken-at time in UTC"
    );
    assert!(h.contains("/kubepods/pod-a&amp;b&quot;c&#39;"));
    // Depth-first with indentation: root, worker, its child.
    let (a, b, c) = (
        h.find(">trainer<").unwrap(),
        h.find(">worker0<").unwrap(),
        h.find(">grandchild<").unwrap(),
    );
    assert!(a < b && b < c);
    assert!(
        h.contains("padding-left:18px"),
        "workers indented one level"
    );
    assert!(
        h.contains("padding-left:36px"),
        "grandchildren indented two levels"
    );
    assert!(h.contains("Top threads by CPU"));
    assert_self_contained(&h);
}

#[test]
fn charts_are_drawn_when_the_timeline_has_points() {
    let mut t = tree();
    t.timeline = timeline(10);
    let h = render_html(&t);
    assert!(!h.contains("No time series"));
    // CPU, run-queue, blocked, syscalls, disk, network, and the three GPU charts.
    assert_eq!(
        h.matches("<svg").count(),
        9,
        "charts: {}",
        h.matches("<svg").count()
    );
    for title in [
        "<b>CPU</b>",
        "<b>Scheduler wait</b>",
        "<b>Disk</b>",
        "<b>Network</b>",
        "<b>GPU/NPU launches</b>",
        "<b>GPU/NPU host time</b>",
    ] {
        assert!(h.contains(title), "chart {title}");
    }
    assert!(h.contains(">cores</text>"), "CPU axis unit");
    assert!(h.contains("seconds before the snapshot"), "x axis label");
    // Peak CPU 1.4 cores, disk 1 MiB/s, sync-blocked 20 %.
    assert!(h.contains("peak <b>1.40 cores</b>"), "CPU peak");
    assert!(h.contains("avg <b>1.00 MiB/s</b>"), "disk read average");
    assert!(
        h.contains("avg <b>20 %</b>") || h.contains("avg <b>20.00 %</b>"),
        "sync share"
    );
    assert_self_contained(&h);
}

#[test]
fn gpu_charts_are_left_out_without_gpu_activity() {
    let mut t = tree();
    t.timeline = timeline(5)
        .into_iter()
        .map(|p| TimelinePoint {
            gpu_launches: Some(0),
            gpu_sync_ns: 0,
            ..p
        })
        .collect();
    let h = render_html(&t);
    assert_eq!(h.matches("<svg").count(), 6);
    assert!(h.contains("GPU charts left out"));
}

#[test]
fn one_point_and_zero_intervals_do_not_break_charts() {
    let mut t = tree();
    t.timeline = vec![TimelinePoint {
        t_unix_ms: 1000,
        interval_ms: 0,
        ..Default::default()
    }];
    let h = render_html(&t);
    assert!(h.contains("<svg"));
    assert!(
        !h.contains("NaN") && !h.contains("inf"),
        "non-finite numbers in the SVG"
    );
}

#[test]
fn empty_timeline_shows_a_note_instead_of_charts() {
    let mut t = tree();
    t.source = ethand_snapshot::SnapshotSource::Standalone;
    t.measured_ms = 5000;
    let h = render_html(&t);
    assert!(h.contains("No time series"));
    assert!(h.contains("standalone"));
    assert!(!h.contains("<svg"), "no charts without a timeline");
    assert_self_contained(&h);
}

#[test]
fn findings_come_first_with_severity_evidence_advice_and_speedup() {
    let mut t = tree();
    t.findings = vec![
        Finding {
            id: "input_pipeline_stall".into(),
            title: "GPU waits for the input pipeline".into(),
            severity: ethand_snapshot::diagnosis::Severity::Critical,
            evidence: vec![
                Evidence {
                    signal: "gpu.sync_blocked_ratio".into(),
                    value: 0.62,
                    unit: "ratio".into(),
                },
                Evidence {
                    signal: "disk.read_bytes_per_second".into(),
                    value: 3.0 * 1024.0 * 1024.0,
                    unit: "bytes_per_second".into(),
                },
            ],
            explanation: "The data loader cannot keep up.".into(),
            advice: vec!["Raise num_workers".into(), "Use pinned memory".into()],
            estimated_speedup: Some(2.6),
            impact: 0.62,
            detail: Vec::new(),
        },
        Finding {
            id: "runq".into(),
            title: "CPU oversubscribed".into(),
            severity: ethand_snapshot::diagnosis::Severity::Warning,
            estimated_speedup: None,
            impact: 0.1,
            ..Default::default()
        },
    ];
    t.timeline = timeline(3);
    let h = render_html(&t);
    let f = h
        .find("GPU waits for the input pipeline")
        .expect("finding title");
    assert!(f < h.find("<svg").unwrap(), "findings before the charts");
    assert!(
        f < h.find("<h2>Process tree</h2>").unwrap(),
        "findings before the process table"
    );
    assert!(h.contains("class=\"finding critical\""));
    assert!(h.contains("class=\"finding warning\""));
    assert!(h.contains("62.0 %"), "ratio evidence as percent");
    assert!(h.contains("3.0 MiB/s"), "byte-rate evidence");
    assert!(h.contains("gpu.sync_blocked_ratio"));
    assert!(h.contains("The data loader cannot keep up."));
    assert!(h.contains("<li>Raise num_workers</li>") && h.contains("<li>Use pinned memory</li>"));
    assert!(h.contains("2.60× faster"));
    assert!(
        h.find("GPU waits").unwrap() < h.find("CPU oversubscribed").unwrap(),
        "order kept"
    );
}

#[test]
fn no_findings_says_so() {
    let h = render_html(&tree());
    assert!(h.contains("No findings"));
}

#[test]
fn gpu_and_device_sections() {
    let mut t = tree();
    let g = GpuProcessStats {
        launches: Some(12345),
        copies: vec![
            GpuCopyStats {
                direction: "host_to_device".into(),
                calls: 10,
                bytes: 10 << 30,
            },
            GpuCopyStats {
                direction: "device_to_host".into(),
                calls: 5,
                bytes: 1 << 20,
            },
        ],
        memory: vec![GpuMemoryStats {
            kind: "device".into(),
            allocs: 3,
            live_bytes: 2 << 30,
            peak_bytes: 3 << 30,
            ..Default::default()
        }],
        collectives: vec![CollectiveStats {
            library: "nccl".into(),
            operation: "all_reduce".into(),
            calls: 100,
            bytes: 1 << 30,
            time_ns: 2_000_000_000,
            timed_calls: 100,
        }],
        comm: Some(CommRank {
            library: "nccl".into(),
            rank: Some(3),
            nranks: 8,
        }),
        ..Default::default()
    };
    t.processes[1].gpu = Some(g.clone());
    t.total.gpu = Some(g);
    t.devices = DevicesSnapshot {
        hostname: "node7".into(),
        collectors: vec![CollectorStatus {
            name: "nvml".into(),
            state: CollectorState::Available,
            detail: String::new(),
        }],
        gpus: vec![GpuDevice {
            index: 0,
            name: "NVIDIA H200".into(),
            utilization_ratio: Some(0.37),
            memory_used_bytes: Some(40 << 30),
            memory_total_bytes: Some(141 << 30),
            power_watts: Some(350.0),
            ..Default::default()
        }],
        ..Default::default()
    };
    let h = render_html(&t);
    assert!(h.contains("host to device") && h.contains("10.0 GiB"));
    assert!(h.contains("3.0 GiB"), "peak memory");
    assert!(h.contains("all reduce"));
    assert!(h.contains("<td>3</td><td>8</td>"), "rank 3 of 8");
    assert!(h.contains("12,345"));
    assert!(h.contains("NVIDIA H200") && h.contains("37.0 %") && h.contains("350 W"));
    assert!(h.contains("node7"));
    assert!(
        h.contains("GPU launches"),
        "GPU columns in the process table"
    );
    assert_self_contained(&h);
}

fn not_evaluated() -> Vec<NotEvaluated> {
    vec![
        NotEvaluated {
            rule: "launch_bound".into(),
            title: "Kernel launch overhead".into(),
            missing: vec!["gpu.launches_per_second".into()],
            how: "count launches: `ethand level process` (a cost per call)".into(),
        },
        NotEvaluated {
            rule: EVIL.into(),
            title: EVIL.into(),
            missing: vec![EVIL.into(), "gpu.sm_activity_ratio".into()],
            how: EVIL.into(),
        },
    ]
}

/// Rules that could not run: never the green "No findings" card, but a card that says the
/// tree was not fully examined and lists each rule, what it lacks and how to get it.
#[test]
fn rules_that_could_not_run_replace_the_green_card() {
    let mut t = tree();
    t.not_evaluated = not_evaluated();
    let h = render_html(&t);
    assert!(!h.contains("No findings"), "green card shown");
    assert!(!h.contains("class=\"finding ok\""), "green card shown");
    assert!(h.contains("class=\"finding partial\""));
    assert!(h.contains("Not fully examined: 2 rules could not run"));
    assert!(h.contains("No finding among the rules that could run."));
    assert!(h.contains("Kernel launch overhead") && h.contains("<code>launch_bound</code>"));
    assert!(h.contains("missing <code>gpu.launches_per_second</code>"));
    assert!(h.contains("count launches: `ethand level process` (a cost per call)"));
    assert!(h.contains("<code>gpu.sm_activity_ratio</code>"));
    assert!(!h.contains("<script"), "unescaped rule text");
    assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    // Before the charts and the process table, like findings.
    let card = h.find("Not fully examined").unwrap();
    assert!(card < h.find("<h2>Process tree</h2>").unwrap());

    // One rule: singular; with findings as well, both are shown and still no green card.
    t.not_evaluated.truncate(1);
    t.findings = vec![Finding {
        id: "runq".into(),
        title: "CPU oversubscribed".into(),
        severity: ethand_snapshot::diagnosis::Severity::Warning,
        impact: 0.1,
        ..Default::default()
    }];
    let h = render_html(&t);
    assert!(h.contains("Not fully examined: 1 rule could not run"));
    assert!(!h.contains("No finding among the rules that could run."));
    assert!(h.find("CPU oversubscribed").unwrap() < h.find("Not fully examined").unwrap());
    assert!(!h.contains("No findings"));
    assert_self_contained(&h);
}

/// A tree at GPU level `calls`: launches are "not measured at level calls" wherever they
/// would appear (never a 0), there is no launches chart, and the launch sample taken for the
/// snapshot is shown with its method; the GPM ratios are shown where measured.
#[test]
fn launches_not_measured_at_level_calls() {
    let mut t = tree();
    t.gpu_level = Some(GpuLevel::Calls);
    let g = GpuProcessStats {
        launches: None,
        sync: GpuTimedCalls {
            calls: 40,
            time_ns: 1_000_000_000,
            timed_calls: 40,
        },
        ..Default::default()
    };
    t.processes[1].gpu = Some(g.clone());
    t.total.gpu = Some(g);
    t.total.gpu_derived = Some(GpuDerived {
        window_ms: 5000,
        launches_per_second: None,
        sync_blocked_ratio: 0.2,
        syncs_per_second: 8.0,
        sm_activity_ratio: Some(0.75),
        tensor_activity_ratio: Some(0.5),
        ..Default::default()
    });
    t.timeline = timeline(5)
        .into_iter()
        .map(|p| TimelinePoint {
            gpu_launches: None,
            ..p
        })
        .collect();
    t.launch_sample = Some(LaunchSample {
        method: "uprobes on cuLaunchKernel* <scoped>".into(),
        started_unix_ms: 1_790_000_000_000,
        duration_ms: 2000,
        launches: Some(2468),
        launches_per_second: Some(1234.0),
        processes: vec![LaunchSampleProcess {
            pid: 4300,
            launches: 2468,
        }],
        notes: vec!["pid 4400: no runtime library mapped".into()],
    });
    let h = render_html(&t);
    assert!(
        h.contains("<td><span class=\"na\">not measured at level calls</span>"),
        "process table"
    );
    assert!(h.contains("<div class=\"tl\">Launches</div><div class=\"tv\"><span class=\"na\">not measured at level calls</span>"));
    assert!(h.contains("<div class=\"tl\">GPU/NPU launches</div><div class=\"tv\"><span class=\"na\">not measured at level calls</span>"));
    assert!(
        !h.contains("<b>GPU/NPU launches</b>"),
        "launches chart drawn"
    );
    assert!(
        h.contains("<b>GPU/NPU host time</b>"),
        "other GPU charts kept"
    );
    assert_eq!(h.matches("<svg").count(), 8);
    assert!(h.contains("Kernel launches not measured at level calls over the window"));
    assert!(
        h.contains("1234 launches/s, counted on demand over 2.00 s for this snapshot"),
        "launch sample"
    );
    assert!(h.contains("uprobes on cuLaunchKernel* &lt;scoped&gt;"));
    assert!(h.contains("pid 4400: no runtime library mapped"));
    assert!(
        h.contains("2,468 in the 2.00 s sample"),
        "per-process sample"
    );
    assert!(h.contains("sampled: 1234 /s"));
    assert!(h.contains("<div class=\"tl\">SM activity</div><div class=\"tv\">75.0 %</div>"));
    assert!(h.contains("<div class=\"tl\">Tensor activity</div><div class=\"tv\">50.0 %</div>"));
    assert!(
        !h.contains("SM occupancy") && !h.contains("DRAM bandwidth"),
        "unmeasured GPM"
    );
    assert!(h.contains("<div class=\"tl\">Sync rate</div><div class=\"tv\">8 /s</div>"));
    assert_self_contained(&h);

    // Counted at level process: a 0 is a 0.
    t.gpu_level = Some(GpuLevel::Process);
    t.launch_sample = None;
    for g in [&mut t.processes[1].gpu, &mut t.total.gpu] {
        g.as_mut().unwrap().launches = Some(0);
    }
    t.total.gpu_derived.as_mut().unwrap().launches_per_second = Some(0.0);
    for p in &mut t.timeline {
        p.gpu_launches = Some(0);
    }
    let h = render_html(&t);
    assert!(!h.contains("not measured at level"));
    assert!(h.contains("<div class=\"tl\">Launches</div><div class=\"tv\">0</div>"));
    assert!(h.contains("<b>GPU/NPU launches</b>"), "launches chart");
}

#[test]
fn empty_tree_does_not_panic() {
    let h = render_html(&TreeSnapshot::default());
    assert!(h.contains("</html>"));
}

/// "Where in the code": the sampled call sites, each main thread's busiest lines and its
/// flame graph, names from the process escaped; absent without a sample or kernel stacks.
#[test]
fn where_in_the_code_with_a_flame_graph() {
    use ethand_snapshot::stacks::{
        CallSite, CallSites, FoldedStack, Frame, FrameKind, SiteBasis, StackSample, ThreadProfile,
    };
    let mut t = tree();
    assert!(!render_html(&t).contains("Where in the code"));
    let py = |f: &str, l: u32| Frame {
        kind: FrameKind::Python,
        function: Some(f.into()),
        file: Some(format!("/w/{EVIL}.py")),
        line: Some(l),
        ..Frame::default()
    };
    t.stack_sample = Some(StackSample {
        method: "py-spy".into(),
        duration_ms: 2000,
        rate_hz: 97,
        call_sites: vec![CallSites {
            pid: 1,
            call: "cuStreamSynchronize".into(),
            category: "sync".into(),
            basis: SiteBasis::Samples,
            total: 10,
            sites: vec![CallSite {
                frames: vec![py("step", 41)],
                count: 10,
                time_ns: None,
                source: Some(format!("loss.item()  # {EVIL}")),
            }],
            ..CallSites::default()
        }],
        threads: vec![ThreadProfile {
            pid: 1,
            tid: 1,
            name: "MainThread".into(),
            main_thread: true,
            samples: 10,
            active_samples: 0,
            in_runtime_call_samples: 10,
            top_lines: vec![CallSite {
                frames: vec![py("step", 41)],
                count: 10,
                ..CallSite::default()
            }],
            frames: vec![py("<module>", 90), py("step", 41)],
            folded: vec![FoldedStack {
                frames: vec![0, 1],
                samples: 10,
            }],
            folded_other: 0,
        }],
        ..StackSample::default()
    });
    let h = render_html(&t);
    assert_self_contained(&h);
    assert!(h.contains("Where in the code"));
    assert!(h.contains("cuStreamSynchronize: 100.0 % of 10 samples inside it from"));
    assert!(h.contains("<svg class=\"flame\""));
    assert_eq!(
        h.matches("<rect").count() - render_html(&tree()).matches("<rect").count(),
        2
    );
    assert!(!h.contains(EVIL), "unescaped process text in the report");
}

/// The GPU activity section: kernel names are the job's to choose (escaped, raw name kept
/// in the title), the type breakdown, the idle split, collectives and copy bandwidth.
#[test]
fn gpu_activity_section_escapes_kernel_names() {
    use ethand_snapshot::kernels::{
        ActivityState, CommOverlap, CopyKind, CopyStat, DeviceActivity, GpuActivity,
        GpuActivityProcess, IdleSplit, KernelClass, KernelClassStat, KernelStat, MemoryKind,
    };
    let mut t = tree();
    t.gpu_activity = Some(GpuActivity {
        duration_ms: 2000,
        processes: vec![
            GpuActivityProcess {
                pid: 4242,
                state: ActivityState::Recorded,
                window_ns: Some(2_000_000_000),
                records: 3,
                devices: vec![DeviceActivity {
                    device: 0,
                    kernels: 3,
                    kernel_ns: 1_500_000_000,
                    busy_ns: 1_000_000_000,
                    busy_fraction: Some(0.5),
                    idle: Some(IdleSplit {
                        host_wait_ns: 600_000_000,
                        kernel_wait_ns: 300_000_000,
                        copy_ns: 100_000_000,
                        unattributed_ns: 0,
                        gaps: 2,
                    }),
                    communication: Some(CommOverlap {
                        communication_ns: 400_000_000,
                        overlapped_ns: 100_000_000,
                    }),
                }],
                kernels: vec![KernelStat {
                    name: Some(format!("_Z{EVIL}")),
                    demangled: Some(format!("ns::k<{EVIL}>")),
                    class: KernelClass::Gemm,
                    count: 2,
                    gpu_ns: 1_100_000_000,
                    max_ns: 600_000_000,
                }],
                kernels_other: Some(KernelStat {
                    count: 1,
                    gpu_ns: 400_000_000,
                    ..Default::default()
                }),
                kernel_classes: vec![
                    KernelClassStat {
                        class: KernelClass::Gemm,
                        count: 2,
                        gpu_ns: 1_100_000_000,
                    },
                    KernelClassStat {
                        class: KernelClass::Communication,
                        count: 1,
                        gpu_ns: 400_000_000,
                    },
                ],
                copies: vec![CopyStat {
                    kind: CopyKind::HostToDevice,
                    src: MemoryKind::Pageable,
                    dst: MemoryKind::Device,
                    count: 4,
                    bytes: 4 << 30,
                    gpu_ns: 1_000_000_000,
                    bytes_per_s: Some((4u64 << 30) as f64),
                }],
                launch_sites: Some(ethand_snapshot::kernels::LaunchSites {
                    launches: 4,
                    kernels: 3,
                    kernels_joined: 2,
                    kernels_ambiguous: 1,
                    sites: vec![ethand_snapshot::kernels::LaunchSite {
                        frames: vec![ethand_snapshot::stacks::Frame {
                            kind: ethand_snapshot::stacks::FrameKind::Python,
                            function: Some(EVIL.into()),
                            file: Some("train.py".into()),
                            line: Some(41),
                            ..Default::default()
                        }],
                        source: Some(format!("y = {EVIL}")),
                        kernels: 2,
                        gpu_ns: 1_100_000_000,
                        top: vec![KernelStat {
                            name: Some(format!("_Z{EVIL}")),
                            demangled: Some(format!("ns::k<{EVIL}>")),
                            count: 2,
                            gpu_ns: 1_100_000_000,
                            ..Default::default()
                        }],
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            GpuActivityProcess {
                pid: 4300,
                state: ActivityState::Refused,
                detail: Some(format!("held by {EVIL}")),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    let h = render_html(&t);
    assert_self_contained(&h);
    assert!(h.contains("<h2>GPU activity</h2>"), "{h}");
    assert!(
        h.contains("ns::k&lt;&lt;script&gt;alert(1)&lt;/script&gt;&gt;")
            && h.contains("title=\"_Z&lt;script&gt;"),
        "kernel names escaped"
    );
    assert!(
        h.contains("<td class=\"l\">gemm</td>") && h.contains("<td class=\"l\">communication</td>")
    );
    assert!(h.contains("HostToDevice") && h.contains("Pageable") && h.contains("4.0 GiB/s"));
    assert!(
        h.contains("400.0 ms (100.0 ms)"),
        "collectives and their overlap"
    );
    assert!(h.contains("pid 4300: not recorded: CUPTI in use by another tool"));
    assert!(h.contains("<i>the other kernels</i>"));
    // The launch sites: where, with the source line and its kernels, escaped.
    assert!(
        h.contains("Launched from: 2 of 3 kernels joined to their launch call (1 queued while two threads were launching)."),
        "{h}"
    );
    assert!(
        h.contains("train.py:41") && h.contains("`y = &lt;script&gt;alert(1)&lt;/script&gt;`"),
        "{h}"
    );
    assert!(
        h.contains("ns::k&lt;&lt;script&gt;alert(1)&lt;/script&gt;&gt; ×2"),
        "{h}"
    );
}
