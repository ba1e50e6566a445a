use super::*;

#[test]
fn durations_parse_within_an_hour() {
    assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("1h").unwrap(), MAX_DURATION);
    for bad in [
        "0",
        "-1",
        "x",
        "nan",
        "inf",
        "1e300",
        "18446744073709551615",
        "61m",
        "2h",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_duration(" 61m ").unwrap_err().to_string(),
        "\"61m\" is longer than ethand record allows (1 h)"
    );
    assert_eq!(
        parse_duration("x").unwrap_err().to_string(),
        "\"x\" is not a duration like 10s, 500ms or 2m"
    );
}

fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut l = Vec::new();
    f(&mut l);
    String::from_utf8(l).unwrap()
}

#[test]
fn numbers_are_formatted_exactly() {
    assert_eq!(s(|l| push_u64(l, 0)), "0");
    assert_eq!(s(|l| push_u64(l, u64::MAX)), u64::MAX.to_string());
    assert_eq!(s(|l| push_i64(l, -38)), "-38");
    assert_eq!(s(|l| push_i64(l, i64::MIN)), i64::MIN.to_string());
    assert_eq!(s(|l| push_us(l, 0)), "0.000");
    assert_eq!(s(|l| push_us(l, 1_234_005)), "1234.005");
    assert_eq!(s(|l| push_ts(l, 1_500, 2_000)), "-0.500");
    assert_eq!(s(|l| push_ts(l, 2_000_070, 1_000)), "1999.070");
}
