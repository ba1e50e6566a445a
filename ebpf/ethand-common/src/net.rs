//! Network counters per process.

/// Per process network counters. Key: [`ProcKey`](crate::ProcKey).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub tcp_tx_bytes: u64,
    pub tcp_rx_bytes: u64,
    pub udp_tx_bytes: u64,
    pub udp_rx_bytes: u64,
    pub tcp_retransmits: u64,
    /// connect() that reached ESTABLISHED.
    pub tcp_active_opens: u64,
    /// Owned TCP sockets that reached CLOSE from an open state.
    pub tcp_closes: u64,
    pub tcp_resets_sent: u64,
    pub tcp_resets_received: u64,
}
