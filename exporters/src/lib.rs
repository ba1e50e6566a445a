//! ethand's outputs. Exporters read the latest [`snapshot::NodeSnapshot`] and nothing else:
//! they never touch BPF maps or device libraries.
pub mod prometheus;
pub mod snapshot;
