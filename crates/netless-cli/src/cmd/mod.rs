//! The user's tools, one module per subcommand.

pub mod bench;
pub mod ctl;
pub mod echo_server;
pub mod fabric;
pub mod gateway;
pub mod memnode;
pub mod ping;
pub mod sim;
pub mod size;
pub mod stat;
