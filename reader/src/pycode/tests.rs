//! Code objects decoded from memory made here: what CPython lays out, and what a hostile or
//! changing process could hold instead (sizes that would allocate without bound, reads that
//! fault halfway, objects freed or of another type).
use std::{cell::Cell, collections::BTreeMap};

use ethand_common::PY_LAYOUTS;

use super::*;

/// Regions of made-up memory; a read outside one region faults, as `process_vm_readv`
/// does across an unmapped page. Remembers the largest read asked (the largest buffer).
#[derive(Default)]
struct Fake {
    regions: BTreeMap<u64, Vec<u8>>,
    largest: Cell<usize>,
}

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.largest.set(self.largest.get().max(buf.len()));
        let fault = || std::io::Error::from_raw_os_error(libc::EFAULT);
        let (start, bytes) = self.regions.range(..=addr).next_back().ok_or_else(fault)?;
        let off = usize::try_from(addr - start).map_err(|_| fault())?;
        let src = off
            .checked_add(buf.len())
            .and_then(|end| bytes.get(off..end))
            .ok_or_else(fault)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

const CODE_T: u64 = 0x1000;
const STR_T: u64 = 0x2000;
const BYTES_T: u64 = 0x3000;
const TYPES: PyTypes = PyTypes {
    code: Some(CODE_T),
    str: Some(STR_T),
    bytes: Some(BYTES_T),
};

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// An object's header: reference count 1 and its type.
fn object(ty: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    put(&mut b, 0, &1u64.to_le_bytes());
    put(&mut b, OB_TYPE, &ty.to_le_bytes());
    b
}

/// A compact str as CPython 3.`layout.minor` lays it out: ASCII, else UCS1/2/4 by its
/// largest character.
fn str_obj(l: &PyLayout, s: &str) -> Vec<u8> {
    let chars: Vec<u32> = s.chars().map(u32::from).collect();
    let max = chars.iter().copied().max().unwrap_or(0);
    let (ascii, kind) = match max {
        0..0x80 => (true, 1u32),
        0x80..0x100 => (false, 1),
        0x100..0x10000 => (false, 2),
        _ => (false, 4),
    };
    let data = if ascii {
        l.str_ascii_data
    } else {
        l.str_compact_data
    } as usize;
    let mut b = object(STR_T, data + chars.len() * kind as usize + 4);
    put(&mut b, OB_SIZE, &(chars.len() as i64).to_le_bytes());
    let state = kind << 2 | 1 << 5 | u32::from(ascii) << 6;
    put(&mut b, STR_STATE, &state.to_le_bytes());
    for (i, c) in chars.iter().enumerate() {
        let w = kind as usize;
        put(&mut b, data + i * w, &c.to_le_bytes()[..w]);
    }
    b
}

fn bytes_obj(v: &[u8]) -> Vec<u8> {
    let mut b = object(BYTES_T, BYTES_DATA + v.len() + 1);
    put(&mut b, OB_SIZE, &(v.len() as i64).to_le_bytes());
    put(&mut b, BYTES_DATA, v);
    b
}

fn code_obj(l: &PyLayout, file: u64, name: u64, table: u64, first_line: i32) -> Vec<u8> {
    let mut b = object(CODE_T, CODE_HEAD_MAX);
    put(&mut b, l.code_filename as usize, &file.to_le_bytes());
    put(&mut b, l.code_name as usize, &name.to_le_bytes());
    put(&mut b, l.code_linetable as usize, &table.to_le_bytes());
    put(
        &mut b,
        l.code_firstlineno as usize,
        &first_line.to_le_bytes(),
    );
    b
}

const CODE: u64 = 0x10_0000;
const FILE: u64 = 0x20_0000;
const NAME: u64 = 0x30_0000;
const TABLE: u64 = 0x40_0000;

/// One code object of `l` with these names and table, at [`CODE`].
fn memory(l: &PyLayout, file: &str, name: &str, table: &[u8]) -> Fake {
    let mut m = Fake::default();
    m.regions.insert(CODE, code_obj(l, FILE, NAME, TABLE, 10));
    m.regions.insert(FILE, str_obj(l, file));
    m.regions.insert(NAME, str_obj(l, name));
    m.regions.insert(TABLE, bytes_obj(table));
    m
}

/// A table whose position 0 is on line `first + 2`, in each version's format.
fn table_of(minor: u32) -> Vec<u8> {
    match minor {
        // (bytes advanced 0, lines +2).
        9 => vec![0, 2],
        // (2 bytes covered, lines +2).
        10 => vec![2, 2],
        // One entry of 1 code unit, form 13 (no columns), svarint +2 = 4.
        _ => vec![0x80 | 13 << 3, 4],
    }
}

#[test]
fn names_of_every_width_and_the_line_table_are_read_with_each_layout() {
    let names = ["K.method", "größe", "δέλτα.x", "f\u{20000}g"];
    for l in &PY_LAYOUTS {
        for name in names {
            let table = table_of(l.minor);
            let m = memory(l, "/srv/jöb/train.py", name, &table);
            let code =
                read_code(&m, l, &TYPES, CODE).unwrap_or_else(|e| panic!("3.{}: {e}", l.minor));
            assert_eq!(
                code,
                PyCode {
                    file: "/srv/jöb/train.py".into(),
                    function: name.into(),
                    first_line: 10,
                    line_table: table,
                },
                "3.{}",
                l.minor
            );
            assert_eq!(code.line(l.minor, 0), Some(12), "3.{}", l.minor);
            // Without the interpreter's type symbols the objects are read all the same.
            assert!(read_code(&m, l, &PyTypes::default(), CODE).is_ok());
        }
    }
}

#[test]
fn long_names_are_read_to_the_bound_and_cut_on_a_character() {
    let l = &PY_LAYOUTS[3];
    let long = "ä".repeat(3 * MAX_NAME);
    let m = memory(l, &long, "f", &[]);
    let code = read_code(&m, l, &TYPES, CODE).unwrap();
    assert_eq!(code.file, cut(long, MAX_NAME));
    assert!(
        m.largest.get() <= CODE_HEAD_MAX.max(MAX_NAME),
        "{}",
        m.largest.get()
    );
}

fn err(m: &Fake, l: &PyLayout) -> String {
    match read_code(m, l, &TYPES, CODE) {
        Ok(c) => panic!("decoded {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_sizes_are_refused_before_anything_that_large_is_read() {
    let l = &PY_LAYOUTS[2];
    for size in [i64::MAX, (MAX_LINE_TABLE + 1) as i64, -1, i64::MIN] {
        let mut m = memory(l, "a.py", "f", &[1, 2]);
        put(
            m.regions.get_mut(&TABLE).unwrap(),
            OB_SIZE,
            &size.to_le_bytes(),
        );
        assert!(err(&m, l).contains("line table"), "{size}");
        assert!(
            m.largest.get() <= CODE_HEAD_MAX,
            "{size}: {}",
            m.largest.get()
        );
    }
    // A str that says it is longer than it is: at most MAX_NAME characters are read, and
    // those past the object fault.
    for (name, width) in [("f", 1), ("é", 1), ("δ", 2), ("\u{20000}", 4)] {
        let mut m = memory(l, "a.py", name, &[]);
        put(
            m.regions.get_mut(&NAME).unwrap(),
            OB_SIZE,
            &i64::MAX.to_le_bytes(),
        );
        assert!(err(&m, l).contains("cannot read"), "{name}");
        assert!(m.largest.get() <= CODE_HEAD_MAX.max(width * MAX_NAME));
    }
    let mut m = memory(l, "a.py", "f", &[]);
    put(
        m.regions.get_mut(&NAME).unwrap(),
        OB_SIZE,
        &(-5i64).to_le_bytes(),
    );
    assert!(err(&m, l).contains("length -5"), "{}", err(&m, l));
}

#[test]
fn strs_of_other_forms_are_refused() {
    let l = &PY_LAYOUTS[4];
    // Not compact (a legacy or subclass str: its characters are elsewhere), a kind that is
    // no kind, and an "ASCII" str of 2-byte characters.
    for state in [
        1u32 << 2 | 1 << 6,
        3 << 2 | 1 << 5,
        2 << 2 | 1 << 5 | 1 << 6,
    ] {
        let mut m = memory(l, "a.py", "f", &[]);
        put(
            m.regions.get_mut(&FILE).unwrap(),
            STR_STATE,
            &state.to_le_bytes(),
        );
        assert!(err(&m, l).contains("not a compact str"), "{state:#x}");
    }
}

#[test]
fn truncated_objects_fault_without_a_panic() {
    let l = &PY_LAYOUTS[0];
    let base = memory(l, "abcdef.py", "f", &[1, 2, 3, 4]);
    for (at, keep) in [(CODE, 40), (FILE, 20), (FILE, 50), (TABLE, 20), (TABLE, 33)] {
        let mut m = memory(l, "abcdef.py", "f", &[1, 2, 3, 4]);
        m.regions.get_mut(&at).unwrap().truncate(keep);
        assert!(err(&m, l).contains("cannot read"), "{at:#x} {keep}");
    }
    assert!(read_code(&base, l, &TYPES, CODE).is_ok());
    // An address in no region, and pointers that overflow when an offset is added.
    assert!(read_code(&base, l, &TYPES, 8).is_err());
    let mut m = memory(l, "a.py", "f", &[]);
    m.regions
        .insert(CODE, code_obj(l, u64::MAX - 4, NAME, TABLE, 1));
    assert!(err(&m, l).contains("cannot read"));
}

#[test]
fn freed_and_foreign_objects_are_not_decoded() {
    let l = &PY_LAYOUTS[3];
    let set = |at: u64, off: usize, v: u64| {
        let mut m = memory(l, "a.py", "f", &[]);
        put(m.regions.get_mut(&at).unwrap(), off, &v.to_le_bytes());
        err(&m, l)
    };
    // pymalloc's free-list link where the reference count was: 0 or an address.
    assert!(set(CODE, 0, 0).contains("not live"));
    assert!(set(CODE, 0, 0x7f12_3456_7000).contains("not live"));
    // Reused by another object, or a name that is no str, a table that is no bytes.
    assert!(set(CODE, OB_TYPE, STR_T).contains("code object at"));
    assert!(set(NAME, OB_TYPE, BYTES_T).contains("not one"));
    assert!(set(TABLE, OB_TYPE, STR_T).contains("line table at"));
    assert!(set(CODE, l.code_filename as usize, 0).contains("null"));
    // An immortal object (3.12+) is live.
    let mut m = memory(l, "a.py", "f", &[]);
    put(
        m.regions.get_mut(&CODE).unwrap(),
        0,
        &u64::from(u32::MAX).to_le_bytes(),
    );
    assert!(read_code(&m, l, &TYPES, CODE).is_ok());
    let mut m = memory(l, "a.py", "f", &[]);
    m.regions.insert(CODE, code_obj(l, FILE, NAME, TABLE, -3));
    assert_eq!(err(&m, l), "co_firstlineno is -3");
}

#[test]
fn a_reply_stops_reading_when_it_is_full() {
    let l = &PY_LAYOUTS[2];
    let table = vec![7u8; MAX_LINE_TABLE];
    let m = memory(l, "a.py", "f", &table);
    let got = read_codes(&m, l, &TYPES, &[CODE, 8, CODE, CODE, CODE]);
    let ok: Vec<bool> = got.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, false, true, false, false]);
    assert!(got[3].as_ref().unwrap_err().contains("ask again"));
    assert!(got[1].as_ref().unwrap_err().contains("cannot read"));
}

/// `_Py_DebugOffsets` as a 3.13 interpreter with ethand's layout holds them.
fn debug_offsets(l: &PyLayout) -> Vec<u8> {
    let mut d = vec![0u8; DEBUG_LEN + 16];
    put(&mut d, 0, DEBUG_COOKIE);
    put(&mut d, DEBUG_VERSION, &0x030d_00f0u64.to_le_bytes());
    for (_, at, ours) in DEBUG_FIELDS {
        put(&mut d, at, &ours(l).to_le_bytes());
    }
    d
}

#[test]
fn a_313_layout_that_is_not_ethands_is_refused_by_name() {
    let l = &PY_LAYOUTS[4];
    assert_eq!(l.minor, 13);
    let check = |d: Vec<u8>| {
        let mut m = Fake::default();
        m.regions.insert(0x5000, d);
        check_debug_offsets(7, &m, 0x5000, l)
    };
    check(debug_offsets(l)).unwrap();
    let mut d = debug_offsets(l);
    put(&mut d, 296, &120u64.to_le_bytes());
    let e = check(d).unwrap_err().to_string();
    assert!(
        e.contains("layout differs from ethand's table: code_object.qualname is 120"),
        "{e}"
    );
    let mut d = debug_offsets(l);
    put(&mut d, 0, b"xdebugpz");
    assert!(check(d).unwrap_err().to_string().contains("cookie"));
    let mut d = debug_offsets(l);
    put(&mut d, DEBUG_VERSION, &0x030e_00f0u64.to_le_bytes());
    assert!(check(d).unwrap_err().to_string().contains("0x30e00f0"));
    let mut d = debug_offsets(l);
    put(&mut d, DEBUG_FREE_THREADED, &1u64.to_le_bytes());
    assert!(check(d).unwrap_err().to_string().contains("free-threaded"));
    let mut d = debug_offsets(l);
    d.truncate(100);
    assert!(check(d).is_err());
}
