//! ethand's own health: build, probes, BPF programs and maps, drops, the daemon's resources,
//! the OTLP export and the servers.
use ethand_snapshot::ProbeState;

use super::{Label, Metric, Num, Otel, OtelKind, Per, Sample, counter, gauge, label, otel};

const PROGRAM: Label = label("program", "ethand.bpf.program");
const MAP: Label = label("map", "ethand.bpf.map");
const SERVER: Label = label("server", "ethand.server").values("metrics, api");
const NODE: super::Subject<'static> = super::Subject::Node;

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        gauge("ethand_build_info", "ethand's version, value always 1."),
        Per::Node,
        Otel::NotExported("the version is the resource attribute service.version"),
        |s, o| o.sample(NODE, &[&s.snap.ethand.version], Sample::Int(1)),
    )
    .labels(&[label("version", "service.version")]),
    Metric::new(
        gauge(
            "ethand_probe_state",
            "1 for each probe's current state (attached, unsupported, disabled, failed), 0 for the \
             others; `ethand status` says why a probe is not attached.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.probe.state", "1", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for p in &s.snap.ethand.probes {
                for state in [
                    ProbeState::Attached,
                    ProbeState::Unsupported,
                    ProbeState::Disabled,
                    ProbeState::Failed,
                    ProbeState::Waiting,
                ] {
                    let on = u64::from(p.state == state);
                    o.sample(NODE, &[&p.name, state.as_str()], Sample::Int(on));
                }
            }
        },
    )
    .labels(&[
        label("probe", "ethand.probe"),
        label("state", "ethand.probe.state")
            .values("attached, unsupported, disabled, failed, waiting"),
    ]),
    Metric::new(
        counter(
            "ethand_bpf_program_runs_total",
            "Runs of each of ethand's BPF programs while the kernel's BPF statistics were on \
             (ethand_bpf_stats_enabled_seconds_total; kernel BPF run statistics).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.program.runs", "{run}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for p in &s.snap.ethand.programs {
                o.sample(NODE, &[&p.name], Sample::Int(p.run_count));
            }
        },
    )
    .labels(&[PROGRAM]),
    Metric::new(
        counter(
            "ethand_bpf_program_run_seconds_total",
            "Time spent running each of ethand's BPF programs while the kernel's BPF statistics \
             were on (kernel BPF run statistics).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.program.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for p in &s.snap.ethand.programs {
                o.sample(NODE, &[&p.name], Sample::Nanos(p.run_time_ns));
            }
        },
    )
    .labels(&[PROGRAM]),
    Metric::new(
        counter(
            "ethand_bpf_stats_enabled_seconds_total",
            "Time the kernel's BPF run-time statistics were on (daemon.bpf_stats): the window that \
             ethand_bpf_program_runs_total and ethand_bpf_program_run_seconds_total cover.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.stats.enabled.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            let ms = s.snap.ethand.bpf_stats_enabled_ms;
            o.sample(NODE, &[], Sample::Nanos(ms.saturating_mul(1_000_000)));
        },
    ),
    Metric::new(
        gauge("ethand_bpf_map_entries", "Entries in each of ethand's BPF maps."),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.map.entries", "{entry}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for m in &s.snap.ethand.maps {
                o.sample(NODE, &[&m.name], Sample::Int(m.entries));
            }
        },
    )
    .labels(&[MAP]),
    Metric::new(
        gauge(
            "ethand_bpf_map_capacity_entries",
            "Maximum entries of each of ethand's BPF maps.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.map.capacity", "{entry}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for m in &s.snap.ethand.maps {
                o.sample(NODE, &[&m.name], Sample::Int(m.capacity));
            }
        },
    )
    .labels(&[MAP]),
    Metric::new(
        counter(
            "ethand_bpf_dropped_events_total",
            "Events ethand could not account, by reason (map full, ring buffer full, wakeup slot \
             taken); loss=\"false\" marks informational cases: mismatches that lose no data and \
             events the kernel did not report (switch_in_unseen).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.bpf.dropped_events", "{event}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for d in &s.snap.ethand.dropped {
                let loss = if d.loss { "true" } else { "false" };
                o.sample(NODE, &[&d.reason, loss], Sample::Int(d.count));
            }
        },
    )
    .labels(&[
        label("reason", "ethand.drop.reason"),
        label("loss", "ethand.drop.loss").values("true, false"),
    ]),
    Metric::new(
        counter(
            "ethand_self_cpu_seconds_total",
            "CPU time used by the ethand daemon, user and system.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.self.cpu.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| o.sample(NODE, &[], Sample::Float(s.snap.ethand.cpu_seconds)),
    ),
    Metric::new(
        gauge(
            "ethand_last_round_timestamp_seconds",
            "When the collection round these figures come from ended (Unix time). Every series \
             of a scrape is from that round: time() minus this is how stale they are (a \
             collection that stopped leaves /metrics answering with old figures).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.last_round.time", "s", OtelKind::Gauge, Num::Float)),
        |s, o| o.sample(NODE, &[], Sample::Float(s.snap.taken_at_unix_ms as f64 / 1000.0)),
    ),
    Metric::new(
        gauge(
            "ethand_self_resident_memory_bytes",
            "Resident memory of the ethand daemon.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.self.memory.usage", "By", OtelKind::Gauge, Num::Int)),
        |s, o| o.sample(NODE, &[], Sample::Int(s.snap.ethand.rss_bytes)),
    ),
    Metric::new(
        gauge(
            "ethand_tracked_processes",
            "Processes in ethand's model, exited ones within the grace period included.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.tracked_processes", "{process}", OtelKind::Gauge, Num::Int)),
        |s, o| o.sample(NODE, &[], Sample::Int(s.snap.ethand.tracked_processes)),
    ),
    Metric::new(
        counter(
            "ethand_processes_overflow_total",
            "Processes ethand did not track because its model held max_processes already.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.processes.overflow", "{process}", OtelKind::Counter, Num::Int)),
        |s, o| o.sample(NODE, &[], Sample::Int(s.snap.ethand.processes_overflow)),
    ),
    // The OTLP counters are always present (0 while [otlp] is off), so alerts need no
    // absent() special case.
    Metric::new(
        counter(
            "ethand_otlp_exports_total",
            "OTLP export requests by result (ok, failed); each retry of a failed batch counts \
             (0 while [otlp] is off; docs/otlp.md).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.otlp.exports", "{request}", OtelKind::Counter, Num::Int)),
        |s, o| {
            o.sample(NODE, &["ok"], Sample::Int(s.otlp.exports_ok));
            o.sample(NODE, &["failed"], Sample::Int(s.otlp.exports_failed));
        },
    )
    .labels(&[label("result", "ethand.otlp.result").values("ok, failed")]),
    Metric::new(
        counter(
            "ethand_otlp_dropped_batches_total",
            "OTLP batches dropped after their retries ran out of the export interval; counters are \
             cumulative, so the next batch carries the totals again (docs/otlp.md).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.otlp.dropped_batches", "{batch}", OtelKind::Counter, Num::Int)),
        |s, o| o.sample(NODE, &[], Sample::Int(s.otlp.dropped_batches)),
    ),
    Metric::new(
        counter(
            "ethand_otlp_overflow_points_total",
            "OTLP points summed into a metric's otel.metric.overflow point because the metric had \
             more than otlp.max_points_per_metric attribute sets in a batch (docs/otlp.md).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.otlp.overflow_points", "{point}", OtelKind::Counter, Num::Int)),
        |s, o| o.sample(NODE, &[], Sample::Int(s.otlp.overflow_points)),
    ),
    Metric::new(
        gauge(
            "ethand_otlp_last_export_duration_seconds",
            "How long the last successful OTLP export request took: encoding the batch, sending it and \
             the endpoint's answer (0 before the first, and while [otlp] is off; docs/otlp.md).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.otlp.export.duration", "s", OtelKind::Gauge, Num::Float)),
        |s, o| {
            let seconds = s.otlp.last_export_duration_us as f64 / 1e6;
            o.sample(NODE, &[], Sample::Float(seconds));
        },
    ),
    Metric::new(
        gauge(
            "ethand_server_connections",
            "Connections open to ethand's servers: server=\"metrics\" (/metrics) or \"api\" (the \
             local API socket).",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.server.connections", "{connection}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for c in &s.snap.ethand.servers {
                o.sample(NODE, &[&c.server], Sample::Int(c.open));
            }
        },
    )
    .labels(&[SERVER]),
    Metric::new(
        counter(
            "ethand_server_connections_refused_total",
            "Connections closed at once: reason=\"limit\" (the server had prometheus.max_connections \
             or daemon.api_max_connections open) or \"peer_limit\" (that peer, an address and for a \
             local client its user, had prometheus.max_connections_per_peer open).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.server.connections.refused",
            "{connection}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for c in &s.snap.ethand.servers {
                o.sample(NODE, &[&c.server, "limit"], Sample::Int(c.refused_limit));
                o.sample(NODE, &[&c.server, "peer_limit"], Sample::Int(c.refused_peer_limit));
            }
        },
    )
    .labels(&[SERVER, label("reason", "ethand.reason").values("limit, peer_limit")]),
    Metric::new(
        counter(
            "ethand_server_connections_timed_out_total",
            "Connections closed for sending a request too slowly, idling, or not reading a reply \
             (prometheus.timeout_ms; 10 s on the local API).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.server.connections.timed_out",
            "{connection}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for c in &s.snap.ethand.servers {
                o.sample(NODE, &[&c.server], Sample::Int(c.timed_out));
            }
        },
    )
    .labels(&[SERVER]),
    Metric::new(
        counter(
            "ethand_server_accept_errors_total",
            "accept(2) failures of ethand's servers (out of descriptors, say), each followed by a \
             pause of 5 ms to 1 s.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.server.accept_errors", "{error}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for c in &s.snap.ethand.servers {
                o.sample(NODE, &[&c.server], Sample::Int(c.accept_errors));
            }
        },
    )
    .labels(&[SERVER]),
];
