//! The supervisor on its own, for this crate's tests (the daemon runs the same code as
//! `ethand reader`).
fn main() -> std::process::ExitCode {
    match ethand_reader::supervisor::Args::parse(std::env::args().skip(1)) {
        Ok(a) => std::process::ExitCode::from(ethand_reader::supervisor::main(a)),
        Err(e) => {
            eprintln!("ethand-reader: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
