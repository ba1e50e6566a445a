//! C++ names a process gave, demangled: CUDA kernel names as CUPTI reports them inside a job
//! are the job owner's to choose, and a demangler's recursion and its output (which a crafted
//! name can make grow exponentially through substitutions) are what the worker's deadline and
//! limits are for. Here both are bounded as well: the input's length, the parser's and
//! printer's recursion, and the output, which stops being written at [`MAX_OUT_BYTES`].
use std::fmt;

use cpp_demangle::{DemangleOptions, ParseOptions, Symbol};

/// Names demangled per request (the CUPTI library interns at most 4,096 per window).
pub const MAX_NAMES: usize = 4096;
/// Longer names are not demangled (the library cuts names at 4,095 bytes anyway).
pub const MAX_NAME_BYTES: usize = 4096;
/// Output past this is cut, with "..." at the end.
pub const MAX_OUT_BYTES: usize = 1024;
/// Well below the crate's defaults (96 and 128): kernel names nest templates a dozen deep.
const RECURSION: u32 = 64;

/// `name` demangled without its parameters or return type; None when it is not a mangled
/// C++ name (Triton's, XLA's and cuBLAS's own kernels are not) or not a valid one.
pub fn short(name: &str) -> Option<String> {
    if !name.starts_with("_Z") || name.len() > MAX_NAME_BYTES {
        return None;
    }
    let sym = Symbol::new_with_options(
        name.as_bytes(),
        &ParseOptions::default().recursion_limit(RECURSION),
    )
    .ok()?;
    let opts = DemangleOptions::new()
        .no_params()
        .no_return_type()
        .hide_expression_literal_types()
        .recursion_limit(RECURSION);
    let mut out = Bounded::default();
    match sym.structured_demangle(&mut out, &opts) {
        Ok(()) if !out.text.is_empty() => Some(out.text),
        Err(_) if out.cut => Some(out.text + "..."),
        _ => None,
    }
}

/// A writer that stops the demangler at [`MAX_OUT_BYTES`].
#[derive(Default)]
struct Bounded {
    text: String,
    cut: bool,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = MAX_OUT_BYTES - self.text.len();
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        self.cut = true;
        Err(fmt::Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// Names as the H200 recording has them (tests/fixtures/gpu-activity).
    fn kernel_names_as_pytorch_and_cutlass_give_them() {
        assert_eq!(
            short("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_")
                .as_deref(),
            Some("at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3> >")
        );
        assert_eq!(
            short(
                "_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE"
            )
            .as_deref(),
            Some("cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>")
        );
        assert_eq!(
            short("_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE5_clEvEUlfE_St5arrayIPcLm2EELi4E23TrivialOffsetCalculatorILi1EjESB_NS0_6memory12LoadWithCastILi1EEENSC_13StoreWithCastILi1EEEEEviT_T0_")
                .is_some_and(|s| s.starts_with("at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(")),
            true
        );
        // Not mangled: left as it is by the caller.
        assert_eq!(short("ampere_sgemm_128x64_nn"), None);
        assert_eq!(short("triton_poi_fused_add_0"), None);
        assert_eq!(short("_Z"), None);
        assert_eq!(short("_Zgarbage"), None);
    }

    /// Names a hostile job could give: deep nesting, substitutions that make the output grow
    /// exponentially, huge lengths. Each ends bounded, fast, with no panic.
    #[test]
    fn hostile_names_are_bounded() {
        let deep = format!("_Z1f{}i{}", "PA_".repeat(5000), "E".repeat(0));
        assert!(short(&deep).is_none_or(|s| s.len() <= MAX_OUT_BYTES + 3));
        let nested = format!("_Z1fI{}iEvv", "N1aI".repeat(200));
        assert!(short(&nested).is_none_or(|s| s.len() <= MAX_OUT_BYTES + 3));
        // Each template argument refers back to the previous ones: the text doubles each time.
        let mut blowup = String::from("_Z1fIiS_");
        for _ in 0..40 {
            blowup.push_str("S0_");
        }
        blowup.push_str("EvT_");
        let t = std::time::Instant::now();
        if let Some(s) = short(&blowup) {
            assert!(s.len() <= MAX_OUT_BYTES + 3, "{}", s.len());
        }
        let mut subs = String::from("_Z1fI");
        for i in 0..30 {
            subs.push_str(&format!(
                "N1aI{}EE",
                if i == 0 {
                    "i".into()
                } else {
                    format!("S{}_", i - 1)
                }
            ));
        }
        subs.push_str("Evv");
        if let Some(s) = short(&subs) {
            assert!(s.len() <= MAX_OUT_BYTES + 3, "{}", s.len());
        }
        assert!(short(&format!("_Z{}", "a".repeat(MAX_NAME_BYTES))).is_none());
        assert!(short("_Z\u{1F600}\u{0}\u{7f}").is_none());
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        // Random bytes after _Z: never a panic.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let len = (rng % 60) as usize;
            let tail: String = (0..len)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    b"NEIS_0123456789vifcdPKRLZTa"[(rng % 27) as usize] as char
                })
                .collect();
            rng = rng.wrapping_add(1);
            let _ = short(&format!("_Z{tail}"));
        }
    }
}
