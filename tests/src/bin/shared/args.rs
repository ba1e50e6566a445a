//! The argument prologue shared by the test binaries (`#[path = "shared/args.rs"] mod args;`).

/// The arguments after argv[0]. `args_os`: argv[0] may be any bytes (the escaping test execs
/// these binaries under a name that is not UTF-8); the arguments themselves are ASCII.
pub fn args() -> Vec<String> {
    std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Argument `i` as a number; exits with 101, naming `bin`, when it is missing or not one.
pub fn number(bin: &str, args: &[String], i: usize) -> u64 {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        eprintln!("{bin}: argument {i} missing or not a number: {args:?}");
        std::process::exit(101)
    })
}
