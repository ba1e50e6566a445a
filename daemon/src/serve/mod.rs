//! `ethand run`: the daemon's collection loop and the servers that read its state (the
//! local API over a Unix socket, Prometheus' /metrics over HTTP), with the limits that keep
//! any client from holding more than its share.
pub mod api;
pub mod connlimit;
pub mod daemon;
pub mod gpu_trace;
pub mod http;
pub mod peer;
pub mod shared;
pub mod tree;
pub mod web_config;
