//! The few protobuf encodings a trace needs: varints, tags, length-delimited fields. A
//! message is built into a `Vec<u8>` and added to its parent as bytes: the messages of a
//! trace are small (tens of bytes). The tests decode the result with Perfetto's own .proto
//! definitions (`perfetto_protos`).

/// Wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

pub(crate) fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

/// int32/int64 (not zigzag): a negative value takes ten bytes, as protobuf says.
pub(crate) fn int(out: &mut Vec<u8>, field: u32, v: i64) {
    uint(out, field, v as u64);
}

pub(crate) fn boolean(out: &mut Vec<u8>, field: u32, v: bool) {
    uint(out, field, u64::from(v));
}

pub(crate) fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn double(out: &mut Vec<u8>, field: u32, v: f64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&v.to_bits().to_le_bytes());
}

pub(crate) fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

/// A nested message written by `build`, then added to `out`.
pub(crate) fn message(out: &mut Vec<u8>, field: u32, build: impl FnOnce(&mut Vec<u8>)) {
    let mut m = Vec::with_capacity(64);
    build(&mut m);
    bytes(out, field, &m);
}
