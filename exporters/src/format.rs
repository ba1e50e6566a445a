//! How a figure reads in every human output (terminal, HTML, comparison): one place, so the
//! same number reads the same in each. Machine outputs (CSV, JSON, /metrics, OTLP) keep raw
//! values and never come here.

/// An integer with thousands separators: "12,345".
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut o = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            o.push(',');
        }
        o.push(ch);
    }
    o
}

/// "1 error", "2 errors", "3 context switches".
pub fn plural(n: u64, what: &str) -> String {
    match (n, what.ends_with("ch") || what.ends_with('s')) {
        (1, _) => format!("1 {what}"),
        (_, true) => format!("{} {what}es", count(n)),
        _ => format!("{} {what}s", count(n)),
    }
}

/// What "written" counts, beside the live processes' own figure: the block-layer bytes
/// include the journal and metadata writes the filesystem adds for the tree (an fsync'd
/// small file costs several times its size), `write_bytes` only the processes' own data.
pub fn written_note(proc_write_bytes: u64) -> String {
    format!(
        "written = block-layer bytes the tree submitted (its data plus the journal and metadata \
         writes they caused); its live processes' own write_bytes (/proc/PID/io: data they sent \
         to storage): {}",
        bytes_u(proc_write_bytes)
    )
}

/// Bytes in binary units, about three significant digits: "512 B", "1.5 KiB", "123 MiB".
/// Negative values (differences) keep their sign.
pub fn bytes(b: f64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut i = 0;
    while v.abs() >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else if v.abs() >= 100.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// [`bytes`] of an integer count.
pub fn bytes_u(b: u64) -> String {
    bytes(b as f64)
}

/// Bytes per second: "3.0 MiB/s".
pub fn bytes_per_second(b: f64) -> String {
    format!("{}/s", bytes(b))
}

/// A duration in the unit that reads best: "850 ns", "12.5 µs", "3.2 ms", "1.25 s",
/// "12 min 5 s", "3.1 h".
pub fn duration_s(s: f64) -> String {
    let a = s.abs();
    if a == 0.0 {
        "0 s".into()
    } else if a < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if a < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if a < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if a < 600.0 {
        format!("{s:.2} s")
    } else if a < 7200.0 {
        format!("{:.0} min {:.0} s", (s / 60.0).floor(), s % 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// [`duration_s`] of nanoseconds.
pub fn duration_ns(ns: f64) -> String {
    duration_s(ns / 1e9)
}

/// [`duration_s`] of an integer count of nanoseconds.
pub fn duration_ns_u(ns: u64) -> String {
    duration_ns(ns as f64)
}

/// Seconds with a fixed three decimals ("12.345s"): lifetime totals in aligned columns.
pub fn seconds_fixed(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// A ratio (0-1) as percent: "37.0 %", "0.05 %" for the smallest non-zero ones.
pub fn percent(r: f64) -> String {
    if r != 0.0 && (r * 100.0).abs() < 0.1 {
        format!("{:.2} %", r * 100.0)
    } else {
        format!("{:.1} %", r * 100.0)
    }
}

/// A plain number, about three significant digits: "1.23 M", "12,345", "512", "3.25", "0.125".
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if a >= 1e4 {
        count(v.round() as u64)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A count exactly as counted ("12345"), two decimals when it is not whole (a mean, a rate):
/// comparisons show what changed to the unit.
pub fn exact(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Three significant digits for small values ("0.000212"), three decimals otherwise.
pub fn significant(v: f64) -> String {
    if v == 0.0 || v.abs() >= 0.1 || !v.is_finite() {
        format!("{v:.3}")
    } else {
        let digits = (2 - v.abs().log10().floor() as i64).clamp(3, 12) as usize;
        format!("{v:.digits$}")
    }
}

/// A value in the unit it was measured in, as diagnosis evidence and comparisons name them
/// ("ratio", "bytes", "ns", "per_second", ...). An unknown unit is written after the number,
/// as given: callers that embed it in markup escape the result.
pub fn in_unit(v: f64, unit: &str) -> String {
    match unit {
        "ratio" | "share" | "fraction" => percent(v),
        "percent" => format!("{v:.1} %"),
        "bytes" => bytes(v),
        "bytes_per_second" => bytes_per_second(v),
        "seconds" | "s" => duration_s(v),
        "ns" | "nanoseconds" => duration_ns(v),
        "ms" | "milliseconds" => duration_s(v / 1e3),
        "count" | "impact" => number(v),
        "per_second" => format!("{}/s", number(v)),
        "cores" => format!("{v:.2} cores"),
        "watts" => format!("{} W", number(v)),
        "celsius" => format!("{} °C", number(v)),
        "hertz" => format!("{} MHz", number(v / 1e6)),
        "joules" => format!("{} J", number(v)),
        "" => number(v),
        u => format!("{} {u}", number(v)),
    }
}

/// "YYYY-MM-DD HH:MM:SS UTC" from milliseconds since the epoch (proleptic Gregorian).
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_the_same_everywhere() {
        assert_eq!(count(0), "0");
        assert_eq!(count(12_345_678), "12,345,678");
        assert_eq!(plural(1, "switch"), "1 switch");
        assert_eq!(plural(3, "context switch"), "3 context switches");
        assert_eq!(plural(1000, "error"), "1,000 errors");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(-3.0 * 1024.0 * 1024.0), "-3.0 MiB");
        assert_eq!(bytes(200.0 * 1024.0 * 1024.0), "200 MiB");
        assert_eq!(bytes_per_second(3.0 * 1024.0 * 1024.0), "3.0 MiB/s");
        assert_eq!(duration_s(0.0), "0 s");
        assert_eq!(duration_ns(850.0), "850 ns");
        assert_eq!(duration_ns(12_500.0), "12.5 µs");
        assert_eq!(duration_s(1.25), "1.25 s");
        assert_eq!(duration_s(725.0), "12 min 5 s");
        assert_eq!(seconds_fixed(12_345_678_901), "12.346s");
        assert_eq!(percent(0.37), "37.0 %");
        assert_eq!(percent(0.0005), "0.05 %");
        assert_eq!(number(1_234_567.0), "1.23 M");
        assert_eq!(number(3.25), "3.25");
        assert_eq!(in_unit(0.62, "ratio"), "62.0 %");
        assert_eq!(in_unit(2.0e6, "ns"), "2.0 ms");
        assert_eq!(in_unit(350.0, "watts"), "350 W");
        assert_eq!(utc(1_758_464_000_000), "2025-09-21 14:13:20 UTC");
        assert_eq!(exact(12345.0), "12345");
        assert_eq!(exact(2.5), "2.50");
        assert_eq!(significant(0.000_212_3), "0.000212");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    }
}
