//! The source line of a CPython bytecode position, from the code object's line table (read
//! from the process's memory: hostile bytes, any length). Three formats:
//!
//! - 3.9 `co_lnotab` (Objects/lnotab_notes.txt): pairs (bytes advanced u8, lines advanced
//!   i8); the position is `f_lasti`, in bytes.
//! - 3.10 `co_linetable`: pairs (bytes covered u8, line delta i8, -128 meaning "no line");
//!   the position is `f_lasti`, in code units (2 bytes).
//! - 3.11 and later, the location table (Objects/locations.md): entries of a first byte
//!   `1 CCCC LLL` (LLL + 1 code units, CCCC the form) and the form's varints; the position is
//!   the instruction's index in code units (`(prev_instr - co_code_adaptive) / 2`).
//!
//! The line starts at `co_firstlineno`. A table that ends early, a varint that runs on, or a
//! line that leaves the u32 range answers None: never a guess, never a panic.

/// The layout of a code object's line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTable {
    /// CPython 3.9 and older 3.x: `co_lnotab`.
    Lnotab,
    /// CPython 3.10: `co_linetable` of (length, delta) pairs.
    Linetable310,
    /// CPython 3.11 to 3.13: the location table.
    Locations,
}

impl LineTable {
    /// The format of CPython 3.`minor`; None before 3.6 (not read).
    pub fn of_version(minor: u32) -> Option<Self> {
        match minor {
            6..=9 => Some(Self::Lnotab),
            10 => Some(Self::Linetable310),
            11..=13 => Some(Self::Locations),
            _ => None,
        }
    }

    /// The line of position `pos` (see the module's note for its unit per format).
    pub fn line(self, table: &[u8], first_line: u32, pos: u32) -> Option<u32> {
        match self {
            Self::Lnotab => lnotab(table, first_line, pos),
            Self::Linetable310 => linetable_310(table, first_line, pos),
            Self::Locations => locations(table, first_line, pos),
        }
    }
}

fn to_line(l: i64) -> Option<u32> {
    u32::try_from(l).ok()
}

fn lnotab(table: &[u8], first_line: u32, lasti: u32) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    for &[bytes, lines] in table.as_chunks::<2>().0 {
        addr += u64::from(bytes);
        if addr > u64::from(lasti) {
            break;
        }
        line += i64::from(lines as i8);
    }
    to_line(line)
}

fn linetable_310(table: &[u8], first_line: u32, lasti: u32) -> Option<u32> {
    let target = 2 * u64::from(lasti);
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    for &[bytes, delta] in table.as_chunks::<2>().0 {
        let start = addr;
        addr += u64::from(bytes);
        let delta = delta as i8;
        if delta != -128 {
            line += i64::from(delta);
        }
        if start <= target && target < addr {
            return if delta == -128 { None } else { to_line(line) };
        }
    }
    None
}

/// A location table's varints: 6 bits a byte, least significant first, bit 6 set while more
/// follow (bit 7 marks an entry's first byte and never appears inside one).
struct Bytes<'a> {
    b: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.at)?;
        self.at += 1;
        Some(v)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(6) {
            let b = self.byte()?;
            v |= u64::from(b & 63) << shift;
            if b & 64 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn svarint(&mut self) -> Option<i64> {
        let u = self.varint()?;
        let m = i64::try_from(u >> 1).ok()?;
        Some(if u & 1 == 1 { -m } else { m })
    }
}

fn locations(table: &[u8], first_line: u32, index: u32) -> Option<u32> {
    let target = u64::from(index);
    let mut r = Bytes { b: table, at: 0 };
    let mut line = i64::from(first_line);
    let mut start = 0u64;
    while let Some(first) = r.byte() {
        if first & 0x80 == 0 {
            // Not an entry's first byte: the table is not one.
            return None;
        }
        let code = (first >> 3) & 15;
        let units = u64::from(first & 7) + 1;
        let (delta, has_line) = match code {
            // Short forms: the same line, one byte of columns.
            0..=9 => {
                r.byte()?;
                (0, true)
            }
            // One-line forms: the line moves by 0 to 2; two bytes of columns.
            10..=12 => {
                r.byte()?;
                r.byte()?;
                (i64::from(code - 10), true)
            }
            // No columns.
            13 => (r.svarint()?, true),
            // Long form: line delta, end line delta, column, end column.
            14 => {
                let d = r.svarint()?;
                r.varint()?;
                r.varint()?;
                r.varint()?;
                (d, true)
            }
            // No location.
            _ => (0, false),
        };
        // Deltas of up to 2^62 each (varints): a hostile table could overflow the sum.
        line = line.checked_add(delta)?;
        if start <= target && target < start + units {
            return if has_line { to_line(line) } else { None };
        }
        start += units;
    }
    None
}

#[cfg(test)]
mod tests;
