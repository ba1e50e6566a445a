//! One request line of the local API (the Unix socket any member of `daemon.socket_group`
//! can write to).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(msg) = ethand::api::parse_request(data) {
        assert!(msg.starts_with("bad request: "), "{msg}");
    }
});
