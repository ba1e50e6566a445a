//! tracefs `events/GROUP/EVENT/format` files: field name -> (offset, size), read at start-up to
//! place the classic tracepoint programs' loads.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(fields) = ethand::kernel::parse_format(&text) {
        assert!(!fields.is_empty());
    }
});
