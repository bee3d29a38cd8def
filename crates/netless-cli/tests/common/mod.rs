//! The `netless` binary under test, run through the workspace's test support
//! (`netless-testing`: private directories, process groups, bounded waits); every helper
//! here runs [`BIN`].

// Each test binary uses only some of these.
#![allow(dead_code, unused_imports)]

use std::time::Duration;

pub(crate) mod interop;
pub(crate) mod peer;

pub(crate) use netless_testing::{Output, Proc, TestDir, SHORT, SHUTDOWN, STARTUP};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_netless");

/// Starts `netless <args>` (see [`Proc::spawn`]).
pub(crate) fn spawn(dir: &TestDir, args: &[&str]) -> Proc {
    Proc::spawn(BIN, dir, args)
}

/// Runs `netless <args>` to completion (at most `timeout`).
pub(crate) fn run(dir: &TestDir, args: &[&str], timeout: Duration) -> Output {
    netless_testing::run(BIN, dir, args, timeout)
}

/// Runs `netless <args>` until it succeeds, while `server` comes up (see
/// [`netless_testing::run_until_ok`]).
pub(crate) fn run_until_ok(dir: &TestDir, server: &mut Proc, args: &[&str]) -> Output {
    netless_testing::run_until_ok(BIN, dir, server, args)
}
