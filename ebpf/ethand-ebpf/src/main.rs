//! ethand's kernel-side programs. Everything aggregates in maps; nothing goes to userspace per
//! event except the rare process lifecycle events. One module per subsystem.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod block;
mod context;
mod cupti;
mod gpu;
mod lifecycle;
mod maps;
mod net;
mod profile;
mod python;
mod record;
mod sched;
mod syscall_account;
mod syscalls;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: the verifier rejects programs that could get here.
    loop {}
}
