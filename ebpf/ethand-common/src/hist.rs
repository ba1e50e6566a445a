//! Latency histograms: the log2 bucket layout both sides agree on.

/// Number of log2 buckets in every latency histogram. Bucket `i` counts values `v` (ns) with
/// `floor(log2(v)) == i` (bucket 0 also holds 0 and 1 ns); the last bucket holds everything
/// above 2^31 ns (~2.1 s).
pub const HIST_BUCKETS: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hist {
    pub buckets: [u64; HIST_BUCKETS],
}

impl Default for Hist {
    fn default() -> Self {
        Self {
            buckets: [0; HIST_BUCKETS],
        }
    }
}

/// log2 bucket of a nanosecond value (see [`HIST_BUCKETS`]). Branch-free enough for BPF.
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    if v < 2 {
        return 0;
    }
    let b = 63 - v.leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(2), 1);
        assert_eq!(log2_bucket(3), 1);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(u64::MAX), HIST_BUCKETS - 1);
    }
}
