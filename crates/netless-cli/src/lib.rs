//! The `netless` command's tools as a library: each subcommand's arguments and its `run`.
//!
//! The binary (`src/main.rs`) parses the command line and calls them; the benchmarks
//! (`netless-benchmarks`) run the same echo server and gateway as peer processes of their
//! own, so that what they measure is what the user runs.

pub mod cmd;
