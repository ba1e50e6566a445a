//! Offsets handed to the programs as read-only globals: kernel struct fields (from BTF) and
//! classic tracepoint fields (from tracefs).

/// Offsets inside kernel structs, read from BTF by userspace and handed to the programs as
/// read-only globals (aya has no CO-RE for Rust programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_group_leader: u32,
    pub task_start_time: u32,
    /// Syscall number that is not a syscall: the uretprobe return trampoline (335 on x86_64).
    pub skip_syscall_nr: u32,
    /// `task_struct.se.cfs_rq`, `cfs_rq.rq` and `rq.clock`: the scheduler programs read their
    /// run queue's clock instead of calling bpf_ktime_get_ns().
    pub task_se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    /// 1 when the three offsets above were found (CONFIG_FAIR_GROUP_SCHED); 0: the
    /// scheduler programs use the monotonic clock.
    pub sched_clock_from_rq: u32,
    /// What the BTF block programs read of a `struct request`: its size and flags, and its
    /// disk's dev_t through `request.q->disk->{major, first_minor}`.
    pub request_q: u32,
    pub request_data_len: u32,
    pub request_cmd_flags: u32,
    pub request_queue_disk: u32,
    pub gendisk_major: u32,
    pub gendisk_first_minor: u32,
    /// `REQ_PREFLUSH`: 1 << `__REQ_PREFLUSH` of `enum req_flag_bits`.
    pub req_preflush: u32,
    /// 1 when every block offset above was found; 0: block IO uses the classic tracepoints.
    pub blk_btf: u32,
    /// `sock.sk_protocol` (a u16): what the BTF socket programs read to tell TCP from UDP.
    pub sock_protocol: u32,
    /// 1 when `sock_protocol` was found (a plain u16, not the bitfield of kernels before
    /// 5.6); 0: the socket probes use the classic tracepoints.
    pub net_btf: u32,
    /// 1 when the BTF `sched_process_exit` tracepoint passes `group_dead` (its second
    /// argument, a bool; kernels since 6.15); 0: the BTF exit program takes a thread group
    /// leader's exit as the group's.
    pub exit_group_dead_arg: u32,
    /// `request.__sector` (a u64): the start sector `ethand record` reports for a request.
    pub request_sector: u32,
    /// `task_struct.se.sum_exec_runtime` (a u64): the on-CPU time the kernel has charged a
    /// thread, read at its switch-out.
    pub task_sum_exec_runtime: u32,
    /// 1 when `task_sum_exec_runtime` was found; 0: on-CPU time is measured from switch-in to
    /// switch-out.
    pub oncpu_from_task: u32,
    /// `task_struct.sched_info.run_delay` (a u64, CONFIG_SCHED_INFO): the time the kernel
    /// has seen a thread runnable and waiting for a CPU, read at its switch-out.
    pub task_run_delay: u32,
    /// 1 when `task_run_delay` was found (and `oncpu_from_task`): run-queue waits come from
    /// the kernel and `sched_wakeup` is not attached; 0: waits are timed from `sched_wakeup`.
    pub runq_from_task: u32,
    /// `task_struct.sched_info.last_arrival` (a u64, run-queue clock): when the thread's
    /// current run began, read at its switch-out.
    pub task_last_arrival: u32,
    /// 1 when `task_last_arrival` was found (with `runq_from_task` and `sched_clock_from_rq`,
    /// whose clock it shares): the switch-out does all the accounting, off-CPU time included,
    /// and the switch-in nothing; the running thread's per-CPU context is filled by its first
    /// event instead. 0: the switch-in times off-CPU spans.
    pub offcpu_from_task: u32,
    /// `task_struct.real_parent` (a pointer): the parent a fork and an exit record.
    pub task_real_parent: u32,
    /// `task_struct.thread.fsbase` (x86_64, a u64): the thread pointer, where glibc keeps the
    /// thread's `struct pthread` and its thread-specific data (the CPython walk's start).
    pub task_thread_fsbase: u32,
    /// 1 when `task_thread_fsbase` was found: GPU probes may walk Python frames.
    pub py_walk: u32,
}

/// Field offsets of the classic tracepoints used as fallbacks, read from
/// `/sys/kernel/tracing/events/<group>/<event>/format` at start-up. u32::MAX: field absent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointOffsets {
    pub sched_switch_prev_pid: u32,
    pub sched_switch_prev_state: u32,
    pub sched_switch_next_pid: u32,
    pub sched_wakeup_pid: u32,
    pub sys_enter_id: u32,
    pub sys_exit_id: u32,
    pub sys_exit_ret: u32,
    pub blk_start_dev: u32,
    pub blk_start_sector: u32,
    pub blk_start_rwbs: u32,
    pub blk_start_bytes: u32,
    pub blk_issue_dev: u32,
    pub blk_issue_sector: u32,
    pub blk_complete_dev: u32,
    pub blk_complete_sector: u32,
    pub blk_complete_nr_sector: u32,
    pub blk_complete_rwbs: u32,
    pub sock_len_sk: u32,
    pub sock_len_family: u32,
    pub sock_len_protocol: u32,
    pub sock_len_ret: u32,
    pub set_state_sk: u32,
    pub set_state_oldstate: u32,
    pub set_state_newstate: u32,
    pub set_state_protocol: u32,
    pub tcp_retransmit_skaddr: u32,
    pub tcp_send_reset_skaddr: u32,
    pub tcp_receive_reset_skaddr: u32,
    pub exec_pid: u32,
    /// sched_process_exit's group_dead (u8); ABSENT on kernels without it.
    pub exit_group_dead: u32,
}

impl TracepointOffsets {
    pub const ABSENT: u32 = u32::MAX;
}

impl Default for TracepointOffsets {
    fn default() -> Self {
        let a = Self::ABSENT;
        Self {
            sched_switch_prev_pid: a,
            sched_switch_prev_state: a,
            sched_switch_next_pid: a,
            sched_wakeup_pid: a,
            sys_enter_id: a,
            sys_exit_id: a,
            sys_exit_ret: a,
            blk_start_dev: a,
            blk_start_sector: a,
            blk_start_rwbs: a,
            blk_start_bytes: a,
            blk_issue_dev: a,
            blk_issue_sector: a,
            blk_complete_dev: a,
            blk_complete_sector: a,
            blk_complete_nr_sector: a,
            blk_complete_rwbs: a,
            sock_len_sk: a,
            sock_len_family: a,
            sock_len_protocol: a,
            sock_len_ret: a,
            set_state_sk: a,
            set_state_oldstate: a,
            set_state_newstate: a,
            set_state_protocol: a,
            tcp_retransmit_skaddr: a,
            tcp_send_reset_skaddr: a,
            tcp_receive_reset_skaddr: a,
            exec_pid: a,
            exit_group_dead: a,
        }
    }
}
