//! Network per process: TCP and UDP bytes, connection opens and closes.
use std::{
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, NetStats, ProbeState, TreeSnapshot, find_proc, measure, probe, serial};

use crate::workload;

fn delta(a: &NetStats, b: &NetStats) -> NetStats {
    NetStats {
        tcp_tx_bytes: a.tcp_tx_bytes - b.tcp_tx_bytes,
        tcp_rx_bytes: a.tcp_rx_bytes - b.tcp_rx_bytes,
        udp_tx_bytes: a.udp_tx_bytes - b.udp_tx_bytes,
        udp_rx_bytes: a.udp_rx_bytes - b.udp_rx_bytes,
        tcp_retransmits: a.tcp_retransmits - b.tcp_retransmits,
        tcp_active_opens: a.tcp_active_opens - b.tcp_active_opens,
        tcp_closes: a.tcp_closes - b.tcp_closes,
        tcp_resets_sent: a.tcp_resets_sent - b.tcp_resets_sent,
        tcp_resets_received: a.tcp_resets_received - b.tcp_resets_received,
    }
}

/// The workload connects to its child server over loopback, sends 3 MiB + 123 bytes of TCP
/// and closes, then sends 50 UDP datagrams of 1000 bytes. Sender and receiver are different
/// processes, so each side's figures are checked on its own. The socket probes are the BTF
/// tracepoints (the classic ones: `probes::classic_tracepoints_when_btf_is_not_preferred`).
#[test]
fn tcp_and_udp_bytes_and_connections_are_exact() {
    let _serial = serial();
    let d = Daemon::start("net", "");
    let status = d.status();
    for name in NET_PROBES {
        let p = probe(&status.probes, name);
        assert_eq!(
            (p.state, p.attach_point.as_str()),
            (ProbeState::Attached, format!("tp_btf/{name}").as_str()),
            "{name}: {p:?}"
        );
    }
    assert_net_exact(&d);
}

/// The network probes.
pub const NET_PROBES: [&str; 6] = [
    "sock_send_length",
    "sock_recv_length",
    "inet_sock_set_state",
    "tcp_retransmit_skb",
    "tcp_send_reset",
    "tcp_receive_reset",
];

/// Runs the `net` workload under `d` and checks both sides' figures exactly.
pub fn assert_net_exact(d: &Daemon) {
    let tcp_bytes = (3u64 << 20) + 123;
    let (udp_n, udp_size) = (50u64, 1000u64);
    let mut w = workload(&[
        "net",
        &tcp_bytes.to_string(),
        &udp_n.to_string(),
        &udp_size.to_string(),
    ]);
    let server = w.ready.u64("server") as u32;
    let m = measure(d, &mut w);
    let udp_bytes = udp_n * udp_size;
    assert_eq!(
        (
            m.done.u64("server_tcp_received"),
            m.done.u64("server_udp_received")
        ),
        (tcp_bytes, udp_bytes),
        "what the server received"
    );

    let expect_client = NetStats {
        tcp_tx_bytes: tcp_bytes,
        udp_tx_bytes: udp_bytes,
        tcp_active_opens: 1,
        tcp_closes: 1,
        ..Default::default()
    };
    let expect_server = NetStats {
        tcp_rx_bytes: tcp_bytes,
        udp_rx_bytes: udp_bytes,
        tcp_closes: 1,
        ..Default::default()
    };
    let before_net = |pid: u32| {
        m.before
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.net.clone())
            .unwrap_or_default()
    };
    let changes = |t: &TreeSnapshot| {
        (
            delta(&find_proc(t, w.pid).net, &before_net(w.pid)),
            delta(&find_proc(t, server).net, &before_net(server)),
        )
    };
    // The close completes in softirq context after the peer's FIN: allow it up to 2 s more.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut after = m.after.clone();
    let (client, srv) = loop {
        let (client, srv) = changes(&after);
        if (client == expect_client && srv == expect_server) || Instant::now() > deadline {
            break (client, srv);
        }
        thread::sleep(Duration::from_millis(200));
        after = d.snapshot(w.pid);
    };
    eprintln!(
        "observed: client {} {client:?}\nobserved: server {server} {srv:?}",
        w.pid
    );
    assert_eq!(
        client, expect_client,
        "client process {} (connect, send, close)",
        w.pid
    );
    assert_eq!(
        srv, expect_server,
        "server process {server} (accept, receive, close)"
    );
    let total = &after.total.net;
    assert_eq!(
        (
            total.tcp_tx_bytes - m.before.total.net.tcp_tx_bytes,
            total.tcp_rx_bytes - m.before.total.net.tcp_rx_bytes
        ),
        (tcp_bytes, tcp_bytes),
        "tree totals of TCP (tx, rx)"
    );
    w.finish();
}
