//! CPython line tables read from another user's process memory: any bytes, any first line and
//! position, in each format; an answer or None, never a panic.
#![no_main]
use ethand_reader::pyline::LineTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let format = match data[0] % 3 {
        0 => LineTable::Lnotab,
        1 => LineTable::Linetable310,
        _ => LineTable::Locations,
    };
    let first = u32::from_le_bytes(data[1..5].try_into().unwrap());
    let pos = u32::from_le_bytes(data[5..9].try_into().unwrap());
    let table = &data[9..];
    let line = format.line(table, first, pos);
    // A table of n bytes covers at most 8 code units a byte: nothing past that has a line.
    if format == LineTable::Locations && u64::from(pos) >= 8 * table.len() as u64 {
        assert_eq!(line, None);
    }
});
