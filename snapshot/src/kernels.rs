//! What the GPU ran for one snapshot: kernels, copies, memsets and syncs of the tree's
//! processes that were started with `libethand_cupti.so` (CUDA_INJECTION64_PATH), recorded by
//! CUPTI for the snapshot's window only (docs/gpu-activity.md).
use serde::{Deserialize, Serialize};

/// The GPU activity of a tree's processes over one window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuActivity {
    /// How it was measured and what that costs the recorded processes.
    pub method: String,
    pub started_unix_ms: u64,
    /// How long the daemon kept the window open.
    pub duration_ms: u64,
    /// Per process of the tree that maps a CUDA library.
    pub processes: Vec<GpuActivityProcess>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What became of a process's window.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ActivityState {
    /// Recorded: the figures below are the window's.
    Recorded,
    /// Another tool holds CUPTI (torch.profiler, Nsight, a debugger): ethand stepped aside.
    Refused,
    /// The library could not record (no libcupti found, a CUPTI error): see `detail`.
    Failed,
    /// The process was not started with the library: nothing recorded.
    #[default]
    NotInjected,
    /// The library is loaded but never answered within the window (an ABI mismatch, a
    /// process stopped, or the daemon's probes lost its events).
    NoAnswer,
    /// A child forked from an injected process (a DataLoader worker): it maps the library
    /// but its thread did not survive fork(), so nothing is asked of it (CUDA cannot be used
    /// in a forked child anyway).
    Forked,
}

impl ActivityState {
    /// What the outputs say of a process in this state.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Refused => "not recorded: CUPTI in use by another tool",
            Self::Failed => "not recorded: failed",
            Self::NotInjected => "not recorded: not started with libethand_cupti.so",
            Self::NoAnswer => "not recorded: no answer from its library",
            Self::Forked => "not recorded: forked from an injected process (no CUDA here)",
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuActivityProcess {
    pub pid: u32,
    pub state: ActivityState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The libcupti the process loaded (CUPTI_API_VERSION: 28 for CUDA 12.9, 130500 for 13.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_version: Option<u32>,
    /// The window as the process's library timed it (CLOCK_MONOTONIC, open to close).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// Records handed over by the library, and lost on the way: by CUPTI (no buffer free),
    /// by the daemon (its ring buffer full, or a record it could not read).
    pub records: u64,
    pub records_dropped_by_cupti: u64,
    pub records_lost_by_ethand: u64,
    /// Why the figures may cover only part of the window (records stopped short of the
    /// launches the uprobes counted over about the same time: another tool took CUPTI's
    /// activity buffers). Absent: no sign of it, or the two could not be compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Per device: time with at least one kernel running (the union of kernel intervals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceActivity>,
    /// Kernels by name, most GPU time first (at most [`TOP_KERNELS`]; `kernels_other` holds
    /// the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels_other: Option<KernelStat>,
    /// All kernels of the window by class, most GPU time first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_classes: Vec<KernelClassStat>,
    /// Copies by direction and memory kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memsets: Option<TimedCount>,
    /// Synchronizations by kind, time the host waited in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syncs: Vec<SyncStat>,
    /// Where the window's kernels were launched from; absent where the launches were not
    /// traced (not recorded, `diagnosis.launch_sites` off, or see
    /// `launch_sites_unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_sites: Option<LaunchSites>,
    /// Why the launches of a recorded process could not be traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_sites_unavailable: Option<String>,
}

/// Launch call sites listed; the others are summed.
pub const TOP_LAUNCH_SITES: usize = 10;
/// Kernels listed per launch call site.
pub const KERNELS_PER_SITE: usize = 3;

/// The window's kernels by the call that launched them: every launch call of the process
/// inside the window (uprobes on the runtime's launch symbols) with its user stack and
/// Python frames, and each kernel joined to the one launch call whose [entry, return] holds
/// the time the host queued it (docs/gpu-activity.md, "Launch call sites"). A kernel is
/// never guessed onto a site: where no call or more than one holds it, it is counted apart.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LaunchSites {
    /// Launch calls seen inside the window.
    pub launches: u64,
    /// Kernels (with a duration) of the window, and those joined to a launch call.
    pub kernels: u64,
    pub kernels_joined: u64,
    /// Kernels CUPTI gave no queued time (a CUDA graph's, or latency timestamps off).
    pub kernels_without_queued_time: u64,
    /// Kernels queued inside no traced launch call (launched before the window or by a
    /// symbol not probed, or the launch's event lost).
    pub kernels_without_launch: u64,
    /// Kernels queued inside two launch calls of different threads at once.
    pub kernels_ambiguous: u64,
    /// Launch events the daemon did not keep (over the window's budget).
    #[serde(default)]
    pub launches_over_budget: u64,
    /// Most GPU time first, at most [`TOP_LAUNCH_SITES`]; launches whose stack could not be
    /// taken and that have no Python frames are one site without frames.
    pub sites: Vec<LaunchSite>,
    /// The sites beyond the first [`TOP_LAUNCH_SITES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<TimedCount>,
}

impl LaunchSite {
    /// The frame that names the site (as [`crate::stacks::CallSite::key_frame`]).
    pub fn key_frame(&self) -> Option<&crate::stacks::Frame> {
        crate::stacks::key_frame(&self.frames)
    }
}

/// One call site that launched kernels in the window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LaunchSite {
    /// The launching thread's stack above the runtime library, innermost first, its Python
    /// frames in place of the interpreter's own (as the GPU call sites have them).
    pub frames: Vec<crate::stacks::Frame>,
    /// The source text of the innermost frame with a file and line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Kernels joined to launches from here, and their GPU time.
    pub kernels: u64,
    pub gpu_ns: u64,
    /// Those kernels by name, most GPU time first (at most [`KERNELS_PER_SITE`]).
    pub top: Vec<KernelStat>,
}

/// Kernels listed by name; the others are summed.
pub const TOP_KERNELS: usize = 30;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceActivity {
    pub device: u32,
    pub kernels: u64,
    /// Sum of kernel durations (overlapping kernels counted each).
    pub kernel_ns: u64,
    /// Time with at least one kernel running.
    pub busy_ns: u64,
    /// `busy_ns` over the window, as NVML's utilization defines it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_fraction: Option<f64>,
    /// The rest of the window, by what the GPU waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleSplit>,
    /// Collectives against computation; absent: no communication kernel ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub communication: Option<CommOverlap>,
}

/// The time of a window with no kernel running on a device, by why; the parts add up to the
/// window (on CUPTI's clock) less `busy_ns` (docs/gpu-activity.md, "The idle split").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdleSplit {
    /// Nothing was queued: the GPU waited for the host (Python, the input pipeline, a sync,
    /// a copy from pageable memory staged by the CPU).
    pub host_wait_ns: u64,
    /// The next kernel was queued and not running yet: launch latency, or work ahead of it in
    /// its stream.
    pub kernel_wait_ns: u64,
    /// A copy or memset ran and no kernel.
    pub copy_ns: u64,
    /// Before the first and after the last kernel of the window (work queued outside it may
    /// have run there), and gaps before kernels CUPTI gave no queued time.
    pub unattributed_ns: u64,
    /// Gaps between kernels.
    pub gaps: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelStat {
    /// As CUPTI names it (mangled C++ names as they are); None: the name was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A mangled C++ name demangled by the sandboxed reader, without its parameters; absent
    /// for a name that is not mangled (Triton's, XLA's, cuBLAS's own) or could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demangled: Option<String>,
    #[serde(default)]
    pub class: KernelClass,
    pub count: u64,
    pub gpu_ns: u64,
    pub max_ns: u64,
}

impl KernelStat {
    /// The name the outputs show: demangled where it was, else CUPTI's.
    pub fn shown_name(&self) -> &str {
        self.demangled
            .as_deref()
            .or(self.name.as_deref())
            .unwrap_or("(name lost)")
    }
}

/// What a kernel does, told from its name (HTA's and Nsight's kernel breakdown).
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum KernelClass {
    /// Collectives: NCCL's and HCCL's kernels.
    Communication,
    /// Fused attention (FlashAttention, cuDNN's and PyTorch's SDPA, FMHA).
    Attention,
    /// Convolutions, their data and weight gradients included.
    Convolution,
    /// Matrix multiplies: cuBLAS, cuBLASLt, CUTLASS, Triton and XLA GEMMs.
    Gemm,
    /// Reductions and normalizations: sums, softmax, layer/batch/RMS norm, top-k, scans.
    Reduction,
    /// Element by element: activations, arithmetic, Inductor's pointwise and XLA's loop
    /// fusions.
    Elementwise,
    /// Moving data inside the GPU: copies, fills, concatenations, transposes.
    Memory,
    /// None of the above.
    #[default]
    Other,
}

impl KernelClass {
    /// Told from a kernel's name, mangled or not: the identifiers a mangled name holds are
    /// in it as they are. First match wins, the most specific first (a convolution's
    /// implicit GEMM is a convolution; an NCCL kernel's reduction is communication).
    pub fn of(name: &str) -> Self {
        const RULES: &[(KernelClass, &[&str])] = &[
            (KernelClass::Communication, &["nccl", "hccl"]),
            (
                KernelClass::Attention,
                &["flash", "fmha", "attention", "attn", "sdpa", "mha_"],
            ),
            (
                KernelClass::Convolution,
                &[
                    "convol", "conv1d", "conv2d", "conv3d", "fprop", "dgrad", "wgrad", "winograd",
                ],
            ),
            (
                KernelClass::Gemm,
                &[
                    "gemm",
                    "matmul",
                    "cutlass",
                    "xmma",
                    "nvjet",
                    "cublas",
                    "triton_mm",
                    "_mm_",
                    "bmm",
                    "dot_fusion",
                    "_dot",
                    "wgmma",
                ],
            ),
            (
                KernelClass::Reduction,
                &[
                    "reduce",
                    "reduction",
                    "softmax",
                    "layer_norm",
                    "layernorm",
                    "batch_norm",
                    "batchnorm",
                    "group_norm",
                    "rms_norm",
                    "rmsnorm",
                    "bn_fw",
                    "bn_bw",
                    "topk",
                    "argmax",
                    "argmin",
                    "cumsum",
                    "scan",
                    "triton_red_",
                    "triton_per_",
                ],
            ),
            (
                KernelClass::Memory,
                &[
                    "memcpy",
                    "memset",
                    "copy",
                    "fill",
                    "catarray",
                    "transpose",
                    "concat",
                ],
            ),
            (
                KernelClass::Elementwise,
                &[
                    "elementwise",
                    "pointwise",
                    "triton_poi_",
                    "loop_",
                    "relu",
                    "gelu",
                    "silu",
                    "sigmoid",
                    "tanh",
                    "dropout",
                    "activation",
                    "unary",
                    "binary",
                ],
            ),
        ];
        let lower = name.to_ascii_lowercase();
        RULES
            .iter()
            .find(|(_, words)| words.iter().any(|w| lower.contains(w)))
            .map_or(Self::Other, |(class, _)| *class)
    }

    /// Whether a GEMM kernel, by its name, multiplies fp32 on the CUDA cores (FFMA) rather
    /// than the tensor cores: cuBLAS's and CUTLASS's SIMT sgemm (`ampere_sgemm_128x64_nn`,
    /// `cutlass_80_simt_sgemm_256x128_8x4_nn_align1`, `gemmSN_NN_kernel<float...`) and xmma
    /// kernels of fp32 math (`sm80_xmma_gemm_f32f32_f32f32_f32_...`; the tensor cores' TF32
    /// ones say `tf32`). Kernels named otherwise (Triton's, XLA's fusions, nvjet) are not
    /// told: false.
    pub fn fp32_simt_gemm(name: &str) -> bool {
        let lower = name.to_ascii_lowercase();
        if lower.contains("tf32") || lower.contains("tensorop") || lower.contains("wgmma") {
            return false;
        }
        lower.contains("sgemm")
            || lower.contains("simt_gemm")
            || lower.contains("gemm_f32f32_f32f32_f32")
            || (lower.contains("gemmsn") && lower.contains("float"))
    }

    /// Every class, in the order outputs list them.
    pub const ALL: [Self; 8] = [
        Self::Gemm,
        Self::Attention,
        Self::Convolution,
        Self::Communication,
        Self::Reduction,
        Self::Elementwise,
        Self::Memory,
        Self::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Communication => "communication",
            Self::Attention => "attention",
            Self::Convolution => "convolution",
            Self::Gemm => "gemm",
            Self::Reduction => "reduction",
            Self::Elementwise => "elementwise",
            Self::Memory => "memory",
            Self::Other => "other",
        }
    }
}

/// Kernels of one class: all of the window's, not only the top ones.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelClassStat {
    pub class: KernelClass,
    pub count: u64,
    pub gpu_ns: u64,
}

/// Collectives against computation on one device: how much of the communication kernels'
/// time ran while a computing kernel ran too (NCCL on its own stream overlapping the
/// backward pass). Low overlap: the collectives are on the step's critical path.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommOverlap {
    /// Time with at least one communication kernel running (the union).
    pub communication_ns: u64,
    /// The part of it with a kernel of another class running too.
    pub overlapped_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TimedCount {
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
}

/// CUPTI's memory kinds, as named here.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    #[default]
    Unknown,
    Pageable,
    Pinned,
    Device,
    Array,
    Managed,
    DeviceStatic,
    ManagedStatic,
}

impl MemoryKind {
    /// From CUPTI's `CUpti_ActivityMemoryKind`.
    pub fn from_cupti(v: u8) -> Self {
        match v {
            1 => Self::Pageable,
            2 => Self::Pinned,
            3 => Self::Device,
            4 => Self::Array,
            5 => Self::Managed,
            6 => Self::DeviceStatic,
            7 => Self::ManagedStatic,
            _ => Self::Unknown,
        }
    }

    /// As serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Pageable => "pageable",
            Self::Pinned => "pinned",
            Self::Device => "device",
            Self::Array => "array",
            Self::Managed => "managed",
            Self::DeviceStatic => "device_static",
            Self::ManagedStatic => "managed_static",
        }
    }
}

/// CUPTI's copy directions, as named here.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    #[default]
    Unknown,
    HostToDevice,
    DeviceToHost,
    HostToArray,
    ArrayToHost,
    ArrayToArray,
    ArrayToDevice,
    DeviceToArray,
    DeviceToDevice,
    HostToHost,
    PeerToPeer,
}

impl CopyKind {
    /// From CUPTI's `CUpti_ActivityMemcpyKind`.
    pub fn from_cupti(v: u8) -> Self {
        match v {
            1 => Self::HostToDevice,
            2 => Self::DeviceToHost,
            3 => Self::HostToArray,
            4 => Self::ArrayToHost,
            5 => Self::ArrayToArray,
            6 => Self::ArrayToDevice,
            7 => Self::DeviceToArray,
            8 => Self::DeviceToDevice,
            9 => Self::HostToHost,
            10 => Self::PeerToPeer,
            _ => Self::Unknown,
        }
    }

    /// As serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::HostToDevice => "host_to_device",
            Self::DeviceToHost => "device_to_host",
            Self::HostToArray => "host_to_array",
            Self::ArrayToHost => "array_to_host",
            Self::ArrayToArray => "array_to_array",
            Self::ArrayToDevice => "array_to_device",
            Self::DeviceToArray => "device_to_array",
            Self::DeviceToDevice => "device_to_device",
            Self::HostToHost => "host_to_host",
            Self::PeerToPeer => "peer_to_peer",
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CopyStat {
    pub kind: CopyKind,
    pub src: MemoryKind,
    pub dst: MemoryKind,
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
    /// `bytes` over `gpu_ns`; absent when the copies took no measured time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<f64>,
}

/// CUPTI's synchronization kinds.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum SyncKind {
    #[default]
    Unknown,
    Event,
    StreamWaitEvent,
    Stream,
    Context,
}

impl SyncKind {
    /// From CUPTI's `CUpti_ActivitySynchronizationType`.
    pub fn from_cupti(v: u32) -> Self {
        match v {
            1 => Self::Event,
            2 => Self::StreamWaitEvent,
            3 => Self::Stream,
            4 => Self::Context,
            _ => Self::Unknown,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SyncStat {
    pub kind: SyncKind,
    pub count: u64,
    pub wait_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names a recording writes are the ones the snapshot's JSON holds.
    #[test]
    fn copy_and_memory_kinds_read_as_serialized() {
        for v in 0..=12u8 {
            let k = CopyKind::from_cupti(v);
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str(), "{k:?}");
            let m = MemoryKind::from_cupti(v);
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str(), "{m:?}");
        }
    }

    /// A fraction the daemon computed is the same number after the CLI reads it
    /// back (CI once saw 0.0013334712876053923 read as ...925 without
    /// serde_json's `float_roundtrip`).
    /// Names as PyTorch 2.x, cuBLAS, cuDNN, FlashAttention, Triton, XLA and NCCL give them
    /// (mangled where they are).
    /// fp32 on the CUDA cores or on the tensor cores, as cuBLAS and CUTLASS name them on
    /// Ampere and Hopper (the first two from an H100 and an H200 under PyTorch 2.11).
    #[test]
    fn fp32_gemms_on_the_cuda_cores_are_told_by_name() {
        for (name, simt) in [
            (
                "_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE",
                true,
            ),
            ("ampere_sgemm_128x64_nn", true),
            (
                "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__51a_cublas",
                true,
            ),
            (
                "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
                false,
            ),
            ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", false),
            (
                "_ZN7cutlass7Kernel2I56cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8EEvNT_6ParamsE",
                false,
            ),
            (
                "cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4",
                false,
            ),
            ("gemm_fusion_dot_12", false),
        ] {
            assert_eq!(KernelClass::fp32_simt_gemm(name), simt, "{name}");
        }
    }

    #[test]
    fn kernel_classes_of_real_names() {
        use KernelClass::*;
        for (name, class) in [
            (
                "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
                Gemm,
            ),
            ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", Gemm),
            ("ampere_sgemm_128x64_nn", Gemm),
            (
                "_ZN7cutlass7Kernel2I56cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8EEvNT_6ParamsE",
                Gemm,
            ),
            ("gemm_fusion_dot_12", Gemm),
            ("triton_tem_fused_mm_0", Gemm),
            (
                "_ZN5flash15flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass6half_tELb0EEEvNS_16Flash_fwd_paramsE",
                Attention,
            ),
            ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", Attention),
            (
                "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
                Attention,
            ),
            (
                "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
                Convolution,
            ),
            (
                "_ZN5cudnn6detail25implicit_convolve_sgemmIffLi128ELi5ELi5ELi3ELi3ELi3ELi1ELb0ELb0ELb1EEEviiiPKT_iPS2_S4_18kernel_conv_paramsyifiiS4_S4_i",
                Convolution,
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                Communication,
            ),
            (
                "_Z29ncclKernel_AllReduce_RING_LL_Sum_float14ncclWorkElem",
                Communication,
            ),
            (
                "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfNS0_15sum_functorIfffEEEEjfLi4EEEEEvT1_",
                Reduction,
            ),
            (
                "_ZN2at6native43_GLOBAL__N__ab6b1a5e_10_SoftMax_cu_9f978f6320cunn_SoftMaxForwardILi4EfffNS1_22SoftMaxForwardEpilogueEEEvPT2_PKT0_i",
                Reduction,
            ),
            (
                "_ZN2at6native53_GLOBAL__N__d8ceb000_21_layer_norm_kernel_cu_c3a4d3cf28vectorized_layer_norm_kernelIN3c108BFloat16EfEEviT0_PKT_SA_SA_PS7_S9_PS8_",
                Reduction,
            ),
            (
                "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
                Reduction,
            ),
            ("triton_per_fused_native_layer_norm_1", Reduction),
            ("input_reduce_fusion", Reduction),
            (
                "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
                Elementwise,
            ),
            (
                "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
                Memory,
            ),
            (
                "_ZN2at6native27unrolled_elementwise_kernelINS0_21direct_copy_kernel_cudaERNS_18TensorIteratorBaseEE",
                Memory,
            ),
            (
                "_ZN2at6native50_GLOBAL__N__e50ec5ae_19_Shape_cu_49f7391c19CatArrayBatchedCopyIfjLi1ELi64ELi64EEEvPT_NS1_25CatArrInputTensorMetadataIS3_jXT1_EXT2_EEENS1_16TensorSizeStrideIT0_Lj4EEEiS8_",
                Memory,
            ),
            ("triton_poi_fused_add_gelu_2", Elementwise),
            ("loop_multiply_fusion", Elementwise),
            ("convert_fp32_to_bf16", Other),
            (
                "_ZN2at6native12_GLOBAL__N_121distribution_elementwise_grid_stride_kernelIfLi4EZNS0_9templates4cuda20normal_and_transformIffPNS_17CUDAGeneratorImplEZZZNS4_13normal_kernelIS7_EEvRKNS_10TensorBaseEddT_ENKUlvE_clEvENKUlvE0_clEvEUlfE_EEvRNS_18TensorIteratorBaseET1_T2_EUlP24curandStatePhilox4_32_10E0_EEvlNS_15PhiloxCudaStateET1_SH_",
                Elementwise,
            ),
            ("", Other),
        ] {
            assert_eq!(KernelClass::of(name), class, "{name}");
        }
    }

    #[test]
    fn fractions_read_back_bit_for_bit() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let busy = rng % 10_000_000_000;
            let window = 1 + (rng >> 20) % 10_000_000_000;
            let d = DeviceActivity {
                busy_fraction: Some(busy as f64 / window as f64),
                ..Default::default()
            };
            let back: DeviceActivity =
                serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
            assert_eq!(back.busy_fraction, d.busy_fraction, "{busy} / {window}");
        }
        let d = DeviceActivity {
            busy_fraction: Some(4_000_000f64 / 2_999_689_635f64),
            ..Default::default()
        };
        let back: DeviceActivity =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back.busy_fraction, d.busy_fraction);
    }
}
