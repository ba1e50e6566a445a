//! One request line of the local API (the Unix socket any member of `daemon.socket_group`
//! can write to).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = ethand::api::parse_request(data) {
        let msg = e.to_string();
        assert!(msg.starts_with("bad request: "), "{msg}");
    }
});
