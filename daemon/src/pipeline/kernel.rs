//! What the running kernel looks like: struct offsets from BTF, tracepoint field offsets
//! from tracefs format files. Both are parsed here and handed to the BPF programs as globals.
use std::{collections::HashMap, fs, path::Path};

use btf_rs::{Btf, Type};
use ethand_common::KernelOffsets;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel BTF not readable at {path}: {source}")]
    Btf { path: String, source: btf_rs::Error },
    #[error("BTF has no struct {0}")]
    NoStruct(String),
    #[error("BTF struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("no kernel BTF: {VMLINUX_BTF}: {file}; from the kernel: {kernel}")]
    NoBtf { file: String, kernel: String },
    #[error("tracepoint {0} not found (no {1})")]
    NoTracepoint(String, String),
    #[error("tracepoint format {path}: {source}")]
    Format { path: String, source: FormatError },
}

/// Why a tracefs `format` file could not be read as fields; `line` is the trimmed line.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("bad offset in {line:?}: {source}")]
    BadOffset {
        line: String,
        source: std::num::ParseIntError,
    },
    #[error("bad size in {line:?}: {source}")]
    BadSize {
        line: String,
        source: std::num::ParseIntError,
    },
    #[error("no declaration in {line:?}")]
    NoDeclaration { line: String },
    #[error("no field name in {line:?}")]
    NoFieldName { line: String },
    #[error("missing offset/size in {line:?}")]
    NoOffsetOrSize { line: String },
    #[error("no fields")]
    NoFields,
}

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of `member` in struct `strukt`, looking through anonymous structs/unions.
fn member_offset(btf: &Btf, strukt: &str, member: &str) -> Result<u32, KernelError> {
    let types = btf
        .resolve_types_by_name(strukt)
        .map_err(|_| KernelError::NoStruct(strukt.into()))?;
    let st = types
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
        .ok_or_else(|| KernelError::NoStruct(strukt.into()))?;
    find_member(btf, &st.members, member, 0).ok_or_else(|| KernelError::NoMember {
        strukt: strukt.into(),
        member: member.into(),
    })
}

fn find_member(btf: &Btf, members: &[btf_rs::Member], name: &str, base_bits: u32) -> Option<u32> {
    for m in members {
        let mname = btf.resolve_name(m).unwrap_or_default();
        if mname == name {
            return Some((base_bits + m.bit_offset()) / 8);
        }
        if mname.is_empty() {
            // Anonymous struct/union: search inside.
            let inner = match btf.resolve_chained_type(m).ok()? {
                Type::Struct(s) | Type::Union(s) => s,
                _ => continue,
            };
            if let Some(off) = find_member(btf, &inner.members, name, base_bits + m.bit_offset()) {
                return Some(off);
            }
        }
    }
    None
}

/// Reads the offsets the programs need from the kernel's BTF. From a memory map of
/// `/sys/kernel/btf/vmlinux` where the kernel allows one: a full parse of vmlinux's BTF into
/// btf-rs's cache took ~40 MB for a moment, which was the daemon's peak RSS (51.7 MB against
/// 12 MB before and after). Else from the bytes read, with the full parse.
pub fn kernel_offsets(kbtf: &KernelBtf) -> Result<KernelOffsets, KernelError> {
    if kbtf.file_error.is_none() {
        match Btf::from_file_with_backend(VMLINUX_BTF, btf_rs::Backend::Mmap) {
            Ok(btf) => return offsets_from(&btf),
            Err(e) => {
                tracing::debug!(error = %e, "kernel BTF not memory-mapped: parsing it whole");
            }
        }
    }
    kernel_offsets_from(&kbtf.bytes, VMLINUX_BTF)
}

/// Reads the offsets the programs need from the kernel's BTF (raw bytes of `source`).
pub fn kernel_offsets_from(bytes: &[u8], source: &str) -> Result<KernelOffsets, KernelError> {
    let btf = Btf::from_bytes(bytes).map_err(|e| KernelError::Btf {
        path: source.to_string(),
        source: e,
    })?;
    offsets_from(&btf)
}

/// Offset of `task_struct.<member>.<field>`, `member` being a struct of type `ty`; None
/// where the kernel's BTF lacks either.
fn task_field(btf: &Btf, member: &str, ty: &str, field: &str) -> Option<u32> {
    Some(member_offset(btf, "task_struct", member).ok()? + member_offset(btf, ty, field).ok()?)
}

fn offsets_from(btf: &Btf) -> Result<KernelOffsets, KernelError> {
    // The run queue clock chain exists with CONFIG_FAIR_GROUP_SCHED (cfs_rq.rq).
    let rq_chain = (|| -> Result<(u32, u32, u32), KernelError> {
        Ok((
            member_offset(btf, "task_struct", "se")?
                + member_offset(btf, "sched_entity", "cfs_rq")?,
            member_offset(btf, "cfs_rq", "rq")?,
            member_offset(btf, "rq", "clock")?,
        ))
    })();
    let rq_chain = rq_chain.ok();
    let (task_se_cfs_rq, cfs_rq_rq, rq_clock) = rq_chain.unwrap_or((0, 0, 0));
    let sum_exec = task_field(btf, "se", "sched_entity", "sum_exec_runtime");
    // CONFIG_SCHED_INFO (schedstats or delay accounting): the kernel's own run-queue wait.
    let run_delay =
        task_field(btf, "sched_info", "sched_info", "run_delay").filter(|_| sum_exec.is_some());
    // When the current run began, on the run-queue clock the scheduler programs read.
    let last_arrival = task_field(btf, "sched_info", "sched_info", "last_arrival")
        .filter(|_| run_delay.is_some() && rq_chain.is_some());
    let fsbase = task_field(btf, "thread", "thread_struct", "fsbase");
    Ok(KernelOffsets {
        task_last_arrival: last_arrival.unwrap_or(0),
        offcpu_from_task: u32::from(last_arrival.is_some()),
        task_sum_exec_runtime: sum_exec.unwrap_or(0),
        oncpu_from_task: u32::from(sum_exec.is_some()),
        task_run_delay: run_delay.unwrap_or(0),
        runq_from_task: u32::from(run_delay.is_some()),
        task_se_cfs_rq,
        cfs_rq_rq,
        rq_clock,
        sched_clock_from_rq: u32::from(rq_chain.is_some()),
        task_pid: member_offset(btf, "task_struct", "pid")?,
        task_tgid: member_offset(btf, "task_struct", "tgid")?,
        task_group_leader: member_offset(btf, "task_struct", "group_leader")?,
        task_start_time: member_offset(btf, "task_struct", "start_time")?,
        task_real_parent: member_offset(btf, "task_struct", "real_parent").unwrap_or(0),
        task_thread_fsbase: fsbase.unwrap_or(0),
        py_walk: u32::from(fsbase.is_some()),
        // x86_64's uretprobe trampoline syscall; see toolchain notes (kernel >= 6.11).
        skip_syscall_nr: 335,
        sock_protocol: sock_protocol_offset(btf).unwrap_or(0),
        net_btf: u32::from(sock_protocol_offset(btf).is_some()),
        // btf_trace_sched_process_exit(void *ctx, struct task_struct *p, bool group_dead).
        exit_group_dead_arg: u32::from(
            tracepoint_params(btf, "sched_process_exit").is_some_and(|n| n >= 3),
        ),
        ..block_offsets(btf).unwrap_or_default()
    })
}

/// Whether the kernel keeps `sched_info` (run_delay, pcount) up to date: with
/// CONFIG_SCHED_INFO it does on current kernels, but older ones collected it only with
/// schedstats or delay accounting on. This thread has run, so its run count is above 0
/// exactly when the kernel counts.
pub fn sched_info_live() -> bool {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse::<u64>().ok())
        .is_some_and(|runs| runs > 0)
}

/// How many parameters the BTF tracepoint `name` passes (its `btf_trace_<name>` typedef, a
/// pointer to a function prototype whose first parameter is the program's context).
fn tracepoint_params(btf: &Btf, name: &str) -> Option<usize> {
    let types = btf
        .resolve_types_by_name(&format!("btf_trace_{name}"))
        .ok()?;
    let Type::Typedef(t) = types.into_iter().next()? else {
        return None;
    };
    let Type::Ptr(p) = btf.resolve_chained_type(&t).ok()? else {
        return None;
    };
    match btf.resolve_chained_type(&p).ok()? {
        Type::FuncProto(f) => Some(f.parameters.len()),
        _ => None,
    }
}

/// `sock.sk_protocol`, when it is a whole u16 (kernels since 5.6; before, a bitfield that a
/// 16-bit load would misread).
fn sock_protocol_offset(btf: &Btf) -> Option<u32> {
    let types = btf.resolve_types_by_name("sock").ok()?;
    let st = types.into_iter().find_map(|t| match t {
        Type::Struct(s) if !s.members.is_empty() => Some(s),
        _ => None,
    })?;
    let m = st
        .members
        .iter()
        .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == "sk_protocol"))?;
    if m.bitfield_size().is_some_and(|b| b != 0) || m.bit_offset() % 16 != 0 {
        return None;
    }
    Some(m.bit_offset() / 8)
}

/// What the BTF block programs read; None (block IO on the classic tracepoints) when the
/// kernel's `struct request` or `enum req_flag_bits` lacks any of it.
fn block_offsets(btf: &Btf) -> Option<KernelOffsets> {
    let preflush_bit = enum_value(btf, "req_flag_bits", "__REQ_PREFLUSH")?;
    Some(KernelOffsets {
        request_q: member_offset(btf, "request", "q").ok()?,
        request_data_len: member_offset(btf, "request", "__data_len").ok()?,
        request_cmd_flags: member_offset(btf, "request", "cmd_flags").ok()?,
        request_queue_disk: member_offset(btf, "request_queue", "disk").ok()?,
        gendisk_major: member_offset(btf, "gendisk", "major").ok()?,
        gendisk_first_minor: member_offset(btf, "gendisk", "first_minor").ok()?,
        req_preflush: 1u32.checked_shl(preflush_bit)?,
        request_sector: member_offset(btf, "request", "__sector").ok()?,
        blk_btf: 1,
        ..Default::default()
    })
}

/// The value of enumerator `name` of `enum enum_name`.
fn enum_value(btf: &Btf, enum_name: &str, name: &str) -> Option<u32> {
    btf.resolve_types_by_name(enum_name)
        .ok()?
        .into_iter()
        .find_map(|t| match t {
            Type::Enum(e) => e
                .members
                .iter()
                .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == name))
                .map(|m| m.val()),
            _ => None,
        })
}

/// The kernel's BTF and where it came from.
pub struct KernelBtf {
    pub bytes: Vec<u8>,
    /// Why the file was not used, when the BTF came from the kernel instead (None: the file).
    pub file_error: Option<String>,
}

/// BTF starts with this magic (little-endian u16 0xeB9F).
const BTF_MAGIC: [u8; 2] = [0x9f, 0xeb];

/// The kernel's own BTF: `/sys/kernel/btf/vmlinux`, else, when that file is missing or not
/// BTF (a container without /sys/kernel/btf, a masked path), the same data straight from the
/// kernel: the `vmlinux` object of `bpf(BPF_BTF_GET_NEXT_ID)`, read with
/// `BPF_OBJ_GET_INFO_BY_FD` (needs CAP_SYS_ADMIN).
pub fn vmlinux_btf() -> Result<KernelBtf, KernelError> {
    let file_error = match fs::read(VMLINUX_BTF) {
        Ok(b) if b.starts_with(&BTF_MAGIC) => {
            return Ok(KernelBtf {
                bytes: b,
                file_error: None,
            });
        }
        Ok(b) if b.is_empty() => "empty file".to_string(),
        Ok(b) => format!("not BTF ({} bytes without the BTF magic)", b.len()),
        Err(e) => e.to_string(),
    };
    match btf_from_kernel() {
        Ok(bytes) => Ok(KernelBtf {
            bytes,
            file_error: Some(file_error),
        }),
        Err(e) => Err(KernelError::NoBtf {
            file: file_error,
            kernel: e.to_string(),
        }),
    }
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
const BPF_BTF_GET_NEXT_ID: libc::c_long = 23;

/// struct bpf_btf_info.
#[repr(C)]
#[derive(Default)]
struct BpfBtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
    name: u64,
    name_len: u32,
    kernel_btf: u32,
}

fn bpf(cmd: libc::c_long, attr: &mut [u32]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a valid, writable bpf_attr prefix of the given size for `cmd`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The raw BTF of the kernel object named "vmlinux".
fn btf_from_kernel() -> std::io::Result<Vec<u8>> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut id = 0u32;
    loop {
        // { start_id, next_id, open_flags }
        let mut attr = [id, 0, 0];
        bpf(BPF_BTF_GET_NEXT_ID, &mut attr).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOENT) {
                std::io::Error::new(e.kind(), "the kernel has no vmlinux BTF object")
            } else {
                e
            }
        })?;
        id = attr[1];
        let fd = bpf(BPF_BTF_GET_FD_BY_ID, &mut [id, 0, 0])?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let info_of = |info: &mut BpfBtfInfo| -> std::io::Result<()> {
            use std::os::fd::AsRawFd;
            let ptr = info as *mut BpfBtfInfo as u64;
            // { bpf_fd, info_len, info (u64) }
            let mut attr = [
                fd.as_raw_fd() as u32,
                std::mem::size_of::<BpfBtfInfo>() as u32,
                ptr as u32,
                (ptr >> 32) as u32,
            ];
            bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
        };
        let mut name = [0u8; 64];
        let mut info = BpfBtfInfo {
            name: name.as_mut_ptr() as u64,
            name_len: name.len() as u32,
            ..Default::default()
        };
        info_of(&mut info)?;
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        if info.kernel_btf == 0 || &name[..len] != b"vmlinux" {
            continue;
        }
        let mut bytes = vec![0u8; info.btf_size as usize];
        let mut info = BpfBtfInfo {
            btf: bytes.as_mut_ptr() as u64,
            btf_size: bytes.len() as u32,
            ..Default::default()
        };
        info_of(&mut info)?;
        bytes.truncate(info.btf_size as usize);
        return Ok(bytes);
    }
}

/// One field of a tracepoint's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

/// Parses a tracefs `format` file into field name -> (offset, size).
///
/// Lines look like `\tfield:unsigned int prev_state;\toffset:24;\tsize:4;\tsigned:0;`;
/// array fields (`char rwbs[8]`) are keyed by their name without the brackets.
pub fn parse_format(text: &str) -> Result<HashMap<String, Field>, FormatError> {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("offset:") {
                offset = Some(v.parse::<u32>().map_err(|source| FormatError::BadOffset {
                    line: line.into(),
                    source,
                })?);
            } else if let Some(v) = part.strip_prefix("size:") {
                size = Some(v.parse::<u32>().map_err(|source| FormatError::BadSize {
                    line: line.into(),
                    source,
                })?);
            } else if decl.is_none() && !part.is_empty() && !part.contains(':') {
                decl = Some(part);
            }
        }
        let decl = decl.ok_or_else(|| FormatError::NoDeclaration { line: line.into() })?;
        let name = decl
            .split_whitespace()
            .last()
            .map(|n| n.split('[').next().unwrap_or(n).trim_start_matches('*'))
            .filter(|n| !n.is_empty())
            .ok_or_else(|| FormatError::NoFieldName { line: line.into() })?;
        let (Some(offset), Some(size)) = (offset, size) else {
            return Err(FormatError::NoOffsetOrSize { line: line.into() });
        };
        fields.insert(name.to_string(), Field { offset, size });
    }
    if fields.is_empty() {
        return Err(FormatError::NoFields);
    }
    Ok(fields)
}

/// The tracefs mount point (mounted by ethand when missing).
pub fn tracefs_root() -> &'static str {
    if Path::new("/sys/kernel/tracing/events").exists() {
        "/sys/kernel/tracing"
    } else {
        "/sys/kernel/debug/tracing"
    }
}

/// Mounts tracefs at /sys/kernel/tracing (in ethand's mount namespace) if it is mounted at
/// neither usual place. Ok(true): ethand mounted it.
pub fn ensure_tracefs() -> std::io::Result<bool> {
    if Path::new("/sys/kernel/tracing/events").exists()
        || Path::new("/sys/kernel/debug/tracing/events").exists()
    {
        return Ok(false);
    }
    let target = std::ffi::CString::new("/sys/kernel/tracing").unwrap();
    let fstype = std::ffi::CString::new("tracefs").unwrap();
    // SAFETY: valid NUL-terminated strings, no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(true)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Fields of tracepoint "group/event".
pub fn tracepoint_fields(group_event: &str) -> Result<HashMap<String, Field>, KernelError> {
    let path = format!("{}/events/{group_event}/format", tracefs_root());
    let text = fs::read_to_string(&path)
        .map_err(|_| KernelError::NoTracepoint(group_event.into(), path.clone()))?;
    parse_format(&text).map_err(|source| KernelError::Format { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = "name: sched_switch
ID: 316
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;

print fmt: \"prev_comm=%s prev_pid=%d\", REC->prev_comm, REC->prev_pid
";

    #[test]
    fn parses_sched_switch() {
        let f = parse_format(SCHED_SWITCH).unwrap();
        assert_eq!(
            f["prev_pid"],
            Field {
                offset: 24,
                size: 4
            }
        );
        assert_eq!(
            f["prev_state"],
            Field {
                offset: 32,
                size: 8
            }
        );
        assert_eq!(
            f["next_pid"],
            Field {
                offset: 56,
                size: 4
            }
        );
        assert_eq!(
            f["prev_comm"],
            Field {
                offset: 8,
                size: 16
            }
        );
        assert_eq!(f["common_pid"], Field { offset: 4, size: 4 });
    }

    #[test]
    fn parses_pointer_and_dynamic_fields() {
        let text = "format:\n\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:__data_loc char[] cmd;\toffset:16;\tsize:4;\tsigned:0;\n";
        let f = parse_format(text).unwrap();
        assert_eq!(f["skaddr"], Field { offset: 8, size: 8 });
        assert_eq!(
            f["cmd"],
            Field {
                offset: 16,
                size: 4
            }
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(parse_format(""), Err(FormatError::NoFields)));
        let e = parse_format("field:int x;\toffset:abc;\tsize:4;").unwrap_err();
        assert!(matches!(e, FormatError::BadOffset { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "bad offset in \"field:int x;\\toffset:abc;\\tsize:4;\": invalid digit found in string"
        );
        assert!(matches!(
            parse_format("field:int x;\tsize:4;"),
            Err(FormatError::NoOffsetOrSize { .. })
        ));
    }

    #[test]
    fn reads_this_kernels_btf() {
        // Every kernel ethand supports has BTF; CI runs on one.
        if !Path::new(VMLINUX_BTF).exists() {
            panic!("{VMLINUX_BTF} missing: ethand needs a kernel with BTF");
        }
        let o = kernel_offsets_from(&fs::read(VMLINUX_BTF).unwrap(), VMLINUX_BTF).unwrap();
        // The memory-mapped reading (the daemon's) finds the same offsets.
        let mapped = kernel_offsets(&vmlinux_btf().unwrap()).unwrap();
        assert_eq!(mapped, o);
        assert_ne!(o.task_pid, 0);
        assert_eq!(
            o.task_tgid,
            o.task_pid + 4,
            "pid and tgid are adjacent in task_struct"
        );
        assert_eq!(
            o.blk_btf, 1,
            "6.x kernels have every struct request member read"
        );
        assert_eq!(o.request_q, 0, "struct request starts with its queue");
        assert_eq!(
            o.gendisk_first_minor,
            o.gendisk_major + 4,
            "int major, first_minor"
        );
        // REQ_PREFLUSH follows the 8 op bits and the failfast (3), sync, meta, prio,
        // nomerge, idle, integrity and FUA flags.
        assert_eq!(o.req_preflush, 1 << 18, "REQ_PREFLUSH");
        assert_eq!(
            o.sched_clock_from_rq, 1,
            "CI kernels have CONFIG_FAIR_GROUP_SCHED"
        );
        assert_ne!(o.rq_clock, 0);
        // CONFIG_SCHED_INFO: struct sched_info's counters (run_delay) come before its
        // timestamps (last_arrival).
        assert_eq!(
            (o.oncpu_from_task, o.runq_from_task, o.offcpu_from_task),
            (1, 1, 1),
            "CI kernels keep se.sum_exec_runtime and sched_info"
        );
        assert!(
            o.task_last_arrival > o.task_run_delay,
            "last_arrival: {o:?}"
        );
        assert_eq!(o.net_btf, 1, "6.x kernels have a u16 sock.sk_protocol");
        assert_ne!(o.sock_protocol, 0);
        // The classic tracepoint has the field exactly when the BTF one has the argument.
        match tracepoint_fields("sched/sched_process_exit") {
            Ok(fields) => assert_eq!(
                o.exit_group_dead_arg,
                u32::from(fields.contains_key("group_dead")),
                "group_dead argument"
            ),
            // SAFETY: geteuid has no preconditions.
            Err(e) if unsafe { libc::geteuid() } != 0 => {
                eprintln!("skipped the tracefs cross-check: tracefs is root's ({e:?})")
            }
            Err(e) => panic!("sched_process_exit format: {e:?}"),
        }
    }
}
