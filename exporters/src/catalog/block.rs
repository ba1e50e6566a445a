//! Node block I/O latency histograms, by device and op, all processes.
use super::labels::{BLOCK_DEVICE, BLOCK_OP};
use super::{Metric, Num, Otel, OtelKind, Per, Sample, Subject, device_label, histogram, otel};

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        histogram(
            "ethand_block_io_queue_seconds",
            "Time block I/O requests waited between submission and dispatch to the device, by device \
             and op, all processes, exited ones included (block_io_start to block_rq_issue).",
        ),
        Per::Node,
        Otel::Histogram {
            sum: Some(otel("ethand.block.io.queue.time", "s", OtelKind::Counter, Num::Float)),
            // The same requests as the service histogram's: counted once, there.
            count: None,
        },
        |s, o| {
            for b in &s.snap.block_devices {
                let counts = &b.queue_hist;
                let value = Sample::Hist { counts, sum_ns: b.queue_ns };
                o.sample(Subject::Node, &[device_label(b), &b.op], value);
            }
        },
    )
    .labels(&[BLOCK_DEVICE, BLOCK_OP]),
    Metric::new(
        histogram(
            "ethand_block_io_service_seconds",
            "Time the device took to complete block I/O requests, by device and op, all processes \
             (block_rq_issue to block_rq_complete).",
        ),
        Per::Node,
        Otel::Histogram {
            sum: Some(otel("ethand.block.io.service.time", "s", OtelKind::Counter, Num::Float)),
            count: Some(otel("ethand.block.io.requests", "{request}", OtelKind::Counter, Num::Int)),
        },
        |s, o| {
            for b in &s.snap.block_devices {
                let counts = &b.service_hist;
                let value = Sample::Hist { counts, sum_ns: b.service_ns };
                o.sample(Subject::Node, &[device_label(b), &b.op], value);
            }
        },
    )
    .labels(&[BLOCK_DEVICE, BLOCK_OP]),
];
