//! The two hosts reach each other over their link: a server on host B's address answers a
//! client on host A. Needs root and `ip`: without them the test says `SKIPPED:` and passes.

use std::time::Duration;

use netless_testing::TwoHosts;

#[test]
fn the_hosts_reach_each_other_over_their_link() {
    let hosts = match TwoHosts::new("link") {
        Ok(hosts) => hosts,
        Err(why) => {
            println!("SKIPPED: {why}");
            return;
        }
    };
    let listen = format!(
        "import socket; s = socket.socket(); s.bind(('{}', 7777)); s.listen(); \
         print('READY', flush=True); c, _ = s.accept(); c.sendall(b'hello from b')",
        hosts.b.addr
    );
    let mut server = hosts.b.spawn("python3", &["-c", &listen]);
    server.wait_for_line("READY", Duration::from_secs(20));
    let connect = format!(
        "import socket; s = socket.create_connection(('{}', 7777), timeout=10); \
         print(s.recv(100).decode())",
        hosts.b.addr
    );
    let out = hosts
        .a
        .spawn("python3", &["-c", &connect])
        .finish(Duration::from_secs(30))
        .ok();
    assert_eq!(out.stdout.trim(), "hello from b");
}
