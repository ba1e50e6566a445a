//! The configuration file: TOML merged over the embedded defaults, validated, and every error
//! reported with the line of the offending key.
#![no_main]
use ethand::config::{Config, ConfigError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_overlay(text, "fuzz.toml") {
        Ok(cfg) => {
            // What `ethand config show` prints must load again.
            let shown = cfg.to_toml();
            if let Err(e) = Config::from_overlay(&shown, "shown.toml") {
                panic!("`config show` output does not load: {e}\n{shown}");
            }
        }
        Err(ConfigError::Invalid { line, message, .. }) => {
            // Line 0 means "unknown"; otherwise it lies in the file (or just past its end).
            assert!(line <= text.lines().count() + 1, "line {line} past the end");
            assert!(!message.is_empty());
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
});
