//! The harness every benchmark binary shares, written once: how a binary parses its command
//! line and runs its peer roles ([`command`], [`args`]), how it spawns and stops those peers
//! ([`peer`]) in a socket directory of its own ([`run_dir`]), where it pins them ([`cpu`]) and
//! what else took their cores ([`noise`]), how it times ([`clock`]) and summarises
//! ([`histogram`], [`stats`]) what it measured, and how it shows it: tables ([`table`],
//! [`latency_table`]), JSON ([`json`]) and SVG plots ([`plot`]). [`micro`] is the loop of the
//! `cargo bench` targets.
//!
//! Nothing here knows an experiment: which processes run, what they measure and what the
//! figures mean are the experiment modules' business.

pub mod args;
pub mod clock;
pub mod command;
pub mod cpu;
pub mod histogram;
pub mod json;
pub mod latency_table;
pub mod micro;
pub mod noise;
pub mod peer;
pub mod plot;
pub mod run_dir;
pub mod stats;
pub mod table;

pub use args::CommonArgs;
pub use command::main;
pub use peer::{Peer, Stop};
pub use run_dir::RunDir;
