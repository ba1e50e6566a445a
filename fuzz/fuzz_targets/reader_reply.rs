//! What a reader worker sends the daemon. A worker parses other users' files and memory and
//! may be compromised by them: the daemon must survive any bytes it sends. The framing
//! (length first, bounded before allocation) and the messages, as `proto::recv` decodes them.
#![no_main]
use std::io::Write;

use ethand_reader::proto::{self, Reply, WireError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<Reply>(data);
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    // Bounded: a socket buffer holds at least this much, so the write never blocks.
    let n = data.len().min(64 << 10);
    a.write_all(&data[..n]).expect("write");
    drop(a);
    match proto::recv::<Reply>(&mut b, None) {
        Ok(_) | Err(WireError::Closed | WireError::TooLarge(_) | WireError::Malformed(_)) => {}
        Err(e) => panic!("unexpected: {e}"),
    }
});
