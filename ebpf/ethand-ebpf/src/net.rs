//! Network per process: TCP/UDP bytes from the sock length tracepoints (fired in the sending
//! or receiving process's context), TCP connection lifecycle and retransmits/resets. Events
//! that fire in softirq context find their process through SOCK_OWNER.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use ethand_common::{NetStats, ProcKey, counter};

use crate::maps::{NET_STATS, SOCK_OWNER, atomic_add, current_ctx, get_or_insert, proc_key};
use crate::tpoff;

const IPPROTO_TCP: u16 = 6;
const IPPROTO_UDP: u16 = 17;
const TCP_ESTABLISHED: i32 = 1;
const TCP_SYN_SENT: i32 = 2;
const TCP_CLOSE: i32 = 7;
const TCP_LISTEN: i32 = 10;

#[inline(always)]
fn stats(key: &ProcKey) -> Option<*mut NetStats> {
    get_or_insert(
        &NET_STATS,
        key,
        &NetStats::default(),
        counter::NET_STATS_FULL,
    )
}

#[inline(always)]
fn on_length(ctx: &TracePointContext, tx: bool) {
    let ret: i32 = unsafe { ctx.read_at(tpoff!(sock_len_ret)) }.unwrap_or(0);
    if ret <= 0 {
        return;
    }
    let proto: u16 = unsafe { ctx.read_at(tpoff!(sock_len_protocol)) }.unwrap_or(0);
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return;
    }
    let Some(c) = current_ctx() else { return };
    let key = proc_key(c);
    if proto == IPPROTO_TCP {
        let sk: u64 = unsafe { ctx.read_at(tpoff!(sock_len_sk)) }.unwrap_or(0);
        // Learn the owner of accepted sockets (and of sockets opened before attach).
        if sk != 0 && unsafe { SOCK_OWNER.get(&sk) }.is_none() {
            let _ = SOCK_OWNER.insert(&sk, &key, 0);
        }
    }
    let Some(s) = stats(&key) else { return };
    let field = unsafe {
        match (proto == IPPROTO_TCP, tx) {
            (true, true) => &raw mut (*s).tcp_tx_bytes,
            (true, false) => &raw mut (*s).tcp_rx_bytes,
            (false, true) => &raw mut (*s).udp_tx_bytes,
            (false, false) => &raw mut (*s).udp_rx_bytes,
        }
    };
    atomic_add(field, ret as u64);
}

#[tracepoint(category = "sock", name = "sock_send_length")]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    on_length(&ctx, true);
    0
}

#[tracepoint(category = "sock", name = "sock_recv_length")]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    on_length(&ctx, false);
    0
}

#[tracepoint(category = "sock", name = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let proto: u16 = unsafe { ctx.read_at(tpoff!(set_state_protocol)) }.unwrap_or(0);
    if proto != IPPROTO_TCP {
        return 0;
    }
    let sk: u64 = unsafe { ctx.read_at(tpoff!(set_state_sk)) }.unwrap_or(0);
    let old: i32 = unsafe { ctx.read_at(tpoff!(set_state_oldstate)) }.unwrap_or(0);
    let new: i32 = unsafe { ctx.read_at(tpoff!(set_state_newstate)) }.unwrap_or(0);
    if new == TCP_SYN_SENT {
        // connect(): process context, the owner is current.
        if let Some(c) = current_ctx() {
            let _ = SOCK_OWNER.insert(&sk, &proc_key(c), 0);
        }
        return 0;
    }
    let Some(owner) = (unsafe { SOCK_OWNER.get(&sk) }).copied() else {
        return 0;
    };
    if new == TCP_ESTABLISHED && old == TCP_SYN_SENT {
        if let Some(s) = stats(&owner) {
            atomic_add(unsafe { &raw mut (*s).tcp_active_opens }, 1);
        }
    } else if new == TCP_CLOSE {
        if old != TCP_LISTEN && old != TCP_SYN_SENT {
            if let Some(s) = stats(&owner) {
                atomic_add(unsafe { &raw mut (*s).tcp_closes }, 1);
            }
        }
        let _ = SOCK_OWNER.remove(&sk);
    }
    0
}

#[inline(always)]
fn count_owned(ctx: &TracePointContext, sk_off: usize, field: fn(*mut NetStats) -> *mut u64) {
    let sk: u64 = unsafe { ctx.read_at(sk_off) }.unwrap_or(0);
    if sk == 0 {
        return;
    }
    let Some(owner) = (unsafe { SOCK_OWNER.get(&sk) }).copied() else {
        return;
    };
    if let Some(s) = stats(&owner) {
        atomic_add(field(s), 1);
    }
}

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    count_owned(&ctx, tpoff!(tcp_retransmit_skaddr), |s| unsafe {
        &raw mut (*s).tcp_retransmits
    });
    0
}

#[tracepoint(category = "tcp", name = "tcp_send_reset")]
pub fn tcp_send_reset(ctx: TracePointContext) -> u32 {
    count_owned(&ctx, tpoff!(tcp_send_reset_skaddr), |s| unsafe {
        &raw mut (*s).tcp_resets_sent
    });
    0
}

#[tracepoint(category = "tcp", name = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    count_owned(&ctx, tpoff!(tcp_receive_reset_skaddr), |s| unsafe {
        &raw mut (*s).tcp_resets_received
    });
    0
}
