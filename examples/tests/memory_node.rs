//! The `memory_node` example, run to its end: a callee in another process reads only the
//! pages it touches of the 1 MiB object it was passed by reference, its edit shares all but
//! one page with the caller's object, a forged reference is refused, and the node frees
//! everything once both sessions have closed.

mod common;

use std::process::Command;
use std::time::Duration;

#[test]
fn the_memory_node_example_shares_pages_and_refuses_a_forgery() {
    let out = common::run_to_end(
        &mut Command::new(env!("CARGO_BIN_EXE_memory_node")),
        Duration::from_secs(120),
    )
    .out;
    for expected in [
        "caller: put 1 MiB, got a 48-byte RemoteRef",
        "callee: mapped a RemoteBuf of 1048576 bytes; read pages 1 and 200: fetched_pages() = 2",
        "callee: wrote 6 bytes at 0 (copy-on-write): fetched_pages() = 3, dirty_pages() = 1",
        "callee: published a new object: RemoteRef",
        "caller: read its array back unchanged",
        "node: objects 2, pages 257, sessions 2, holds 2 (255 pages shared)",
        "caller: a forged reference: PERMISSION_DENIED",
        "node, the caller gone: objects 1, pages 256, sessions 1, holds 1",
        "node, the callee gone: objects 0, pages 0, sessions 0, holds 0",
    ] {
        assert!(out.contains(expected), "no `{expected}` in:\n{out}");
    }
}
