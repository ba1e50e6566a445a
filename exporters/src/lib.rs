//! ethand's outputs. Exporters read the latest [`ethand_snapshot::NodeSnapshot`] and nothing else:
//! they never touch BPF maps or device libraries. Every metric is declared once, in
//! `catalog`, and encoded by [`prometheus`] and [`otlp`] alike.
mod catalog;
pub mod format;
pub mod html;
pub mod otlp;
pub mod prometheus;
pub mod report;
pub mod stacks;
pub mod terminal;
pub mod text;
