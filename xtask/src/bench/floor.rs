//! The kernel's floor: what a BPF program costs on a hook before it does any work.
//!
//! `xtask floor-probes` loads the smallest programs the kernel accepts (raw tracepoint
//! programs, hand-assembled: `r0 = 0; exit`, or with one `bpf_ktime_get_ns()` call first) and
//! attaches them to the hooks ethand's per-syscall and per-switch paths use, then waits for a
//! signal. The `floor*` bench modes run the workloads under it: what they add is the
//! mechanism's own cost (the syscall slow path that any `sys_enter`/`sys_exit` program turns
//! on, the program dispatch, the clock read), which no program on those hooks can go below.
//! Raw tracepoint programs take the same dispatch (`bpf_trace_run*`) as ethand's `tp_btf`
//! ones; they need no BTF, so nothing here depends on the kernel's type information.
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct FloorArgs {
    /// The syscall programs each read the clock once (`bpf_ktime_get_ns()`), as timing a
    /// syscall needs (ethand's scheduler programs read the run queue's clock, no helper).
    #[arg(long)]
    clock: bool,
    /// Only the scheduler hooks (`sched_switch`, and `sched_wakeup` where ethand needs it).
    #[arg(long)]
    sched_only: bool,
    /// Whether `sched_wakeup` gets a program too. `auto`: where ethand attaches one, i.e.
    /// where the kernel does not keep each task's run-queue wait (`sched_info`) itself.
    #[arg(long, value_enum, default_value_t = WakeupHook::Auto)]
    wakeup: WakeupHook,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum WakeupHook {
    Auto,
    Yes,
    No,
}

impl WakeupHook {
    fn wanted(self) -> bool {
        match self {
            WakeupHook::Yes => true,
            WakeupHook::No => false,
            WakeupHook::Auto => !sched_info_live(),
        }
    }
}

/// The check ethand's loader makes (`daemon/src/pipeline/kernel.rs`) before it leaves `sched_wakeup`
/// unattached: the kernel counts this thread's runs in `/proc/thread-self/schedstat`, so it
/// keeps `sched_info.run_delay` up to date for every task.
fn sched_info_live() -> bool {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
        .is_some_and(|runs| runs > 0)
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_FUNC_KTIME_GET_NS: i32 = 5;

/// One instruction: opcode, registers (dst low nibble, src high), offset, immediate.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const MOV64_IMM: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// The program: `[call bpf_ktime_get_ns;] r0 = 0; exit`.
fn program(clock: bool) -> Vec<Insn> {
    let insn = |code, imm| Insn {
        code,
        regs: 0,
        off: 0,
        imm,
    };
    let mut p = Vec::new();
    if clock {
        p.push(insn(CALL, BPF_FUNC_KTIME_GET_NS));
    }
    p.push(insn(MOV64_IMM, 0));
    p.push(insn(EXIT, 0));
    p
}

/// The `prog_load` member of `union bpf_attr`, up to `prog_name`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// The `raw_tracepoint` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct RawTpAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid bpf_attr prefix of size_of::<T>() bytes for `cmd`, live for
    // the call; a non-negative result is a new file descriptor that we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Loads the program and attaches it to raw tracepoint `hook`; detached when the returned
/// descriptors close.
fn attach(hook: &str, clock: bool) -> Result<(OwnedFd, OwnedFd)> {
    let insns = program(clock);
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    let short = format!("floor_{}", hook.trim_start_matches("sched_"));
    name[..short.len().min(15)].copy_from_slice(&short.as_bytes()[..short.len().min(15)]);
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    let prog = sys_bpf(BPF_PROG_LOAD, &mut attr).with_context(|| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        format!(
            "loading the floor program for {hook}; verifier log: {}",
            String::from_utf8_lossy(&log[..end]).trim()
        )
    })?;
    let hook_c = CString::new(hook).expect("no NUL");
    let mut attr = RawTpAttr {
        name: hook_c.as_ptr() as u64,
        prog_fd: std::os::fd::AsRawFd::as_raw_fd(&prog) as u32,
        ..Default::default()
    };
    let link = sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
        .with_context(|| format!("attaching the floor program to raw tracepoint {hook}"))?;
    Ok((prog, link))
}

/// The hooks of one floor mode, with whether each reads the clock.
fn hooks(args: &FloorArgs) -> Vec<(&'static str, bool)> {
    let mut h = Vec::new();
    if !args.sched_only {
        h.push(("sys_enter", args.clock));
        h.push(("sys_exit", args.clock));
    }
    h.push(("sched_switch", false));
    if args.wakeup.wanted() {
        h.push(("sched_wakeup", false));
    }
    h
}

/// `xtask floor-probes`: attach, say so on stdout, and hold the programs until a signal ends
/// the process (its descriptors close and the kernel detaches them).
pub fn run(args: FloorArgs) -> Result<()> {
    let hooks = hooks(&args);
    let mut held = Vec::new();
    for &(hook, clock) in &hooks {
        held.push(attach(hook, clock)?);
    }
    let names: Vec<String> = hooks
        .iter()
        .map(|(h, c)| format!("{h}{}", if *c { " (clock)" } else { "" }))
        .collect();
    // SIGINT or SIGTERM is the bench's "stop": exit 0 (the kernel detaches on close).
    extern "C" fn stop(_: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(0) }
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only calls _exit.
        unsafe {
            libc::signal(
                sig,
                stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
    println!(
        "Attached {} floor programs: {}",
        held.len(),
        names.join(", ")
    );
    loop {
        // SAFETY: pause() only sleeps until a signal arrives.
        unsafe { libc::pause() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_the_kernel_abi() {
        // Offsets of union bpf_attr's prog_load and raw_tracepoint members (linux/bpf.h).
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(size_of::<RawTpAttr>(), 24);
        assert_eq!(size_of::<Insn>(), 8);
    }

    #[test]
    fn programs_end_in_exit_with_r0_set() {
        for clock in [false, true] {
            let p = program(clock);
            assert_eq!(p.len(), 2 + usize::from(clock));
            assert_eq!(p[p.len() - 1].code, EXIT);
            assert_eq!(p[p.len() - 2].code, MOV64_IMM);
        }
    }

    #[test]
    fn sched_only_has_no_syscall_hooks_and_clock_only_on_syscalls() {
        let h = hooks(&FloorArgs {
            clock: true,
            sched_only: false,
            wakeup: WakeupHook::Yes,
        });
        assert_eq!(
            h,
            [
                ("sys_enter", true),
                ("sys_exit", true),
                ("sched_switch", false),
                ("sched_wakeup", false)
            ]
        );
        let h = hooks(&FloorArgs {
            clock: false,
            sched_only: true,
            wakeup: WakeupHook::No,
        });
        assert_eq!(h, [("sched_switch", false)]);
    }

    /// Loads and attaches for real where the process may (root with BPF, as in CI): a wrong
    /// attribute layout or instruction is refused by the kernel here.
    #[test]
    fn floor_program_attaches_where_bpf_is_allowed() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root");
            return;
        }
        let (prog, _link) = attach("sys_enter", true).expect("attach as root");
        drop(prog);
    }
}
