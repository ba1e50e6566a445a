#![no_std]
//! Library target so that the daemon can name this crate as a build-dependency (cargo then
//! rebuilds the daemon when the programs change); the programs are in the `ethand` binary.
