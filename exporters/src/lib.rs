//! ethand's outputs. Exporters read the latest [`snapshot::NodeSnapshot`] and nothing else:
//! they never touch BPF maps or device libraries.
pub mod devices;
pub mod diagnosis;
pub mod gpu;
pub mod html;
pub mod otlp;
pub mod prometheus;
mod prometheus_devices;
mod prometheus_gpu;
pub mod report;
pub mod selection;
pub mod snapshot;
pub mod text;
