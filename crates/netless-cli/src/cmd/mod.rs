//! The user-facing subcommands other than `bench`.

pub mod ctl;
pub mod echo_server;
pub mod gateway;
pub mod ping;
pub mod sim;
pub mod size;
pub mod stat;
