//! The CLI's commands beyond the daemon: `ethand snapshot` (the daemon's, or a standalone
//! measurement), `ethand record` (a timeline of one tree), `ethand survey` (which functions of
//! a library a workload calls), `ethand compare` (two snapshots side by side), `ethand
//! diagnose` (the rules over a saved snapshot), and the one way every command writes an
//! output file.
pub mod compare;
pub mod diagnose;
pub mod outfile;
pub mod python_samples;
pub mod record;
pub mod snapshot;
pub mod survey;
