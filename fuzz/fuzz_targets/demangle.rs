//! CUDA kernel names a job gave (CUPTI's), demangled in the reader's worker: any bytes after
//! `_Z`; an answer within the output bound or None, never a panic or a stack overflow.
#![no_main]
use ethand_reader::demangle::{MAX_OUT_BYTES, short};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let name = format!("_Z{}", String::from_utf8_lossy(data));
    if let Some(s) = short(&name) {
        assert!(s.len() <= MAX_OUT_BYTES + 3, "{} bytes", s.len());
    }
});
