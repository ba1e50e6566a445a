//! Network per process: TCP/UDP bytes from the sock length tracepoints (fired in the sending
//! or receiving process's context), TCP connection lifecycle and retransmits/resets. Events
//! that fire in softirq context find their process through SOCK_OWNER.
//!
//! `tp_btf` programs are preferred: the kernel builds no trace record for them and they read
//! the socket's protocol from `struct sock` directly. The classic tracepoints are the
//! fallback. Both key SOCK_OWNER by the socket's address, so the kinds may mix.
use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{NetStats, ProcKey, counter};

use crate::context::{current_ctx, proc_key};
use crate::maps::{NET_STATS, SOCK_OWNER, atomic_add, btf_u16, get_or_insert};
use crate::{koff, tpoff};

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

/// Bytes sent or received by the current process on socket `sk` (`ret` of the call);
/// `proto()` reads the socket's protocol, only for a call that moved bytes.
#[inline(always)]
fn on_length(sk: u64, ret: i32, proto: impl Fn() -> u16, tx: bool) {
    if ret <= 0 {
        return;
    }
    let proto = proto();
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return;
    }
    let Some(c) = current_ctx() else { return };
    let key = proc_key(c);
    // Learn the owner of accepted sockets (and of sockets opened before attach).
    if proto == IPPROTO_TCP && sk != 0 && unsafe { SOCK_OWNER.get(&sk) }.is_none() {
        let _ = SOCK_OWNER.insert(&sk, &key, 0);
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

/// A TCP socket changed state: connect() records its owner, an active open or a close is
/// counted for the owner.
#[inline(always)]
fn on_set_state(sk: u64, old: i32, new: i32) {
    if new == TCP_SYN_SENT {
        // connect(): process context, the owner is current.
        if let Some(c) = current_ctx() {
            let _ = SOCK_OWNER.insert(&sk, &proc_key(c), 0);
        }
        return;
    }
    let Some(owner) = (unsafe { SOCK_OWNER.get(&sk) }).copied() else {
        return;
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
}

/// An event of socket `sk` (softirq context too) counted for its owner.
#[inline(always)]
fn count_owned(sk: u64, field: fn(*mut NetStats) -> *mut u64) {
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

fn retransmits(s: *mut NetStats) -> *mut u64 {
    unsafe { &raw mut (*s).tcp_retransmits }
}
fn resets_sent(s: *mut NetStats) -> *mut u64 {
    unsafe { &raw mut (*s).tcp_resets_sent }
}
fn resets_received(s: *mut NetStats) -> *mut u64 {
    unsafe { &raw mut (*s).tcp_resets_received }
}

// ---- tp_btf: the socket is the first argument; its protocol is read from it directly ----

#[inline(always)]
fn sk_protocol(sk: *const u8) -> u16 {
    btf_u16(sk, koff!(sock_protocol))
}

#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: u64 = ctx.arg(1);
    on_length(sk as u64, ret as i32, || sk_protocol(sk), true);
    0
}

#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: u64 = ctx.arg(1);
    on_length(sk as u64, ret as i32, || sk_protocol(sk), false);
    0
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    if sk_protocol(sk) != IPPROTO_TCP {
        return 0;
    }
    let old: u64 = ctx.arg(1);
    let new: u64 = ctx.arg(2);
    on_set_state(sk as u64, old as i32, new as i32);
    0
}

#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    count_owned(sk, retransmits);
    0
}

#[btf_tracepoint(function = "tcp_send_reset")]
pub fn tcp_send_reset_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    count_owned(sk, resets_sent);
    0
}

#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn tcp_receive_reset_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    count_owned(sk, resets_received);
    0
}

// ---- classic tracepoints: fields at offsets from tracefs ----

#[inline(always)]
fn classic_length(ctx: &TracePointContext, tx: bool) {
    let ret: i32 = unsafe { ctx.read_at(tpoff!(sock_len_ret)) }.unwrap_or(0);
    let sk: u64 = unsafe { ctx.read_at(tpoff!(sock_len_sk)) }.unwrap_or(0);
    let proto = || unsafe { ctx.read_at::<u16>(tpoff!(sock_len_protocol)) }.unwrap_or(0);
    on_length(sk, ret, proto, tx);
}

#[tracepoint(category = "sock", name = "sock_send_length")]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    classic_length(&ctx, true);
    0
}

#[tracepoint(category = "sock", name = "sock_recv_length")]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    classic_length(&ctx, false);
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
    on_set_state(sk, old, new);
    0
}

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let sk: u64 = unsafe { ctx.read_at(tpoff!(tcp_retransmit_skaddr)) }.unwrap_or(0);
    count_owned(sk, retransmits);
    0
}

#[tracepoint(category = "tcp", name = "tcp_send_reset")]
pub fn tcp_send_reset(ctx: TracePointContext) -> u32 {
    let sk: u64 = unsafe { ctx.read_at(tpoff!(tcp_send_reset_skaddr)) }.unwrap_or(0);
    count_owned(sk, resets_sent);
    0
}

#[tracepoint(category = "tcp", name = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    let sk: u64 = unsafe { ctx.read_at(tpoff!(tcp_receive_reset_skaddr)) }.unwrap_or(0);
    count_owned(sk, resets_received);
    0
}
