//! The netless experiments: one binary per question (`src/bin/`), each a thin `main` over a
//! module here, all on one shared [`harness`].
//!
//! Each binary spawns its peer processes (servers, tiers, load generators) by running itself
//! again as `<binary> peer <role> …`; the user's `echo-server` and `gateway` are among those
//! roles, run from the `netless` command's own code ([`netless_cli::cmd`]). The
//! micro-benchmarks of the data structures are `cargo bench` targets (`benches/`).

pub mod harness;
pub mod proto;
