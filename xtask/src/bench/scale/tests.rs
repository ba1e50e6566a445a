use super::*;

#[test]
fn vm_lines() {
    let s = "Name:\tethand\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
    assert_eq!(parse_vm_kb(s, "VmRSS"), Some(10240));
    assert_eq!(parse_vm_kb(s, "VmHWM"), Some(20480));
    assert_eq!(parse_vm_kb(s, "VmSwap"), None);
    assert_eq!(shorten("abcdef", 6), "abcdef");
    assert_eq!(shorten("abcdefg", 6), "abc...");
}

#[test]
fn load_threads() {
    assert_eq!(LoadSpec::FULL.threads(), 1300);
}
