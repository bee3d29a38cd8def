//! The gateway as a trust boundary, and its limits, with real clients over real sockets:
//! the Python grpcio client (`tests/interop/probe.py`) and tonic over TCP call through
//! `netless gateway` to a backend process (the setup is `common::interop`'s).
//!
//! Bounds are generous (seconds where the gateway takes milliseconds): a test fails when a
//! call is refused, or waits for something that holds it for seconds, never on speed.

mod common;

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use netless_examples::helloworld::greeter_client::GreeterClient;
use netless_examples::helloworld::{HelloReply, HelloRequest};
use netless_examples::routeguide_pb::route_guide_client::RouteGuideClient;
use netless_examples::routeguide_pb::{Point, Rectangle};
use prost::Message;

use common::interop::{probe, start_gateway, Call, Outcome, Setup};
use common::peer::PeerConnection;
use common::{TestDir, SHORT};

const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";

/// Entry point of the backend process (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the backend process the other tests spawn"]
fn backend_process_entry() {
    common::interop::backend_main();
}

fn hello(name: &str) -> Vec<u8> {
    HelloRequest { name: name.into() }.encode_to_vec()
}

fn greeting(outcome: &Outcome) -> String {
    assert_eq!(outcome.code, "OK", "{outcome:?}");
    HelloReply::decode(&outcome.reply[..]).unwrap().message
}

/// Checks that `outcome` is the gateway's answer for an unknown service `service`, worded
/// exactly as `like` (the answer for another service) but for the name.
fn assert_unknown(outcome: &Outcome, service: &str, like: &Outcome, like_service: &str) {
    assert_eq!(outcome.code, "UNIMPLEMENTED", "{service}: {outcome:?}");
    assert!(outcome.details.contains(service), "{outcome:?}");
    assert_eq!(
        outcome.details.replace(service, "SERVICE"),
        like.details.replace(like_service, "SERVICE"),
        "{service} is answered differently from an unknown service"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(address: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A unary call of `path` with an empty message, over `channel`.
async fn call_path(channel: tonic::transport::Channel, path: &str) -> Result<(), tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    client
        .unary(
            tonic::Request::new(HelloRequest::default()),
            path.parse().unwrap(),
            tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default(),
        )
        .await
        .map(drop)
}

/// A backend that hangs: a socket at `path` whose connections are accepted and never
/// answered (a thread holds them until the listener's file is gone).
fn hung_backend(path: &Path) {
    let listener = UnixListener::bind(path).unwrap();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        listener.set_nonblocking(true).unwrap();
        while path.exists() {
            if let Ok((stream, _)) = listener.accept() {
                held.push(stream);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// A socket file nobody listens on (its server died without removing it).
fn stale_socket(path: &Path) {
    drop(UnixListener::bind(path).unwrap());
}

#[test]
fn only_allowed_services_are_forwarded_and_the_rest_look_unknown() {
    let setup = Setup::start_with(
        "allow",
        &["--allow", "helloworld.Greeter", "--allow", "absent.*"],
        &[("NETLESS_INTEROP_DOMAIN", "probe")],
    );
    // The internal services are there, to be called: the domain's coordinator, and a
    // server bound as `netless.ctl`.
    assert!(setup.dir.socket("netless-domain.probe").exists());
    let _ctl = netless::Server::bind(
        "netless.ctl",
        netless::ServerConfig {
            dir: Some(setup.dir.path.clone()),
            ..Default::default()
        },
        |_req: &netless::Request<'_>, resp: &mut netless::ResponseBuilder<'_>| {
            resp.payload.extend_from_slice(b"internal");
            Ok(())
        },
    )
    .unwrap();

    let unknown = [
        "routeguide.RouteGuide", // running, not allowed
        "absent.Service",        // allowed, not running
        "nope.Service",          // neither
        "netless.ctl",           // internal
        "netless-domain.probe",  // internal, running
    ];
    let mut calls = vec![Call::new(SAY_HELLO, &hello("py"))];
    calls.extend(unknown.map(|s| Call::new(&format!("/{s}/Get"), b"")));
    let out = probe(&setup.address, &calls, &[]);
    assert_eq!(greeting(&out[0]), "Hello py!");
    for (outcome, service) in out[1..].iter().zip(unknown) {
        assert_unknown(outcome, service, &out[3], "nope.Service");
    }

    // A gateway that forwards every service still forwards no internal one.
    let (_all, everything) = start_gateway(&setup.dir.path, &["--allow", "*"]);
    let calls = [
        Call::new(SAY_HELLO, &hello("all")),
        Call::new("/routeguide.RouteGuide/GetFeature", b""),
        Call::new("/nope.Service/Get", b""),
        Call::new("/netless.ctl/Get", b""),
        Call::new("/netless-domain.probe/Join", b""),
        Call::new("/NETLESS.ctl/Get", b""),
    ];
    let out = probe(&everything, &calls, &[]);
    assert_eq!(greeting(&out[0]), "Hello all!");
    assert_eq!(out[1].code, "OK", "{:?}", out[1]);
    assert_unknown(&out[3], "netless.ctl", &out[2], "nope.Service");
    assert_unknown(&out[4], "netless-domain.probe", &out[2], "nope.Service");
    assert_unknown(&out[5], "NETLESS.ctl", &out[2], "nope.Service");

    // Patterns of internal services, and no pattern at all, are refused at startup.
    let refused = common::run(
        &setup.dir,
        &["gateway", "--listen", "127.0.0.1:0", "--allow", "netless.*"],
        SHORT,
    );
    assert_ne!(refused.status.code(), Some(0), "{}", refused.describe());
    assert!(
        refused.stderr.contains("internal"),
        "{}",
        refused.describe()
    );
    let refused = common::run(&setup.dir, &["gateway", "--listen", "127.0.0.1:0"], SHORT);
    assert_ne!(refused.status.code(), Some(0), "{}", refused.describe());
    assert!(refused.stderr.contains("--allow"), "{}", refused.describe());
}

#[test]
fn a_bearer_token_is_required_and_never_echoed() {
    let secrets = TestDir::new("token");
    let token = secrets.path.join("token");
    std::fs::write(&token, "s3cret-Token-1234\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let setup = Setup::start(
        "token",
        &[
            "--allow",
            "helloworld.*",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    let call = || Call::new(SAY_HELLO, &hello("auth"));
    let calls = [
        call(),
        call().with("authorization", "Bearer wrong-Token-9999"),
        call().with("authorization", "Basic s3cret-Token-1234"),
        call().with("authorization", "Bearer s3cret-Token-123"),
        Call::new("/nope.Service/Get", b""),
        call().with("authorization", "Bearer s3cret-Token-1234"),
        Call::new("/nope.Service/Get", b"").with("authorization", "Bearer s3cret-Token-1234"),
    ];
    let out = probe(&setup.address, &calls, &[]);
    for outcome in &out[..5] {
        // Unauthenticated callers learn nothing else, not even which services exist.
        assert_eq!(outcome.code, "UNAUTHENTICATED", "{outcome:?}");
        assert!(outcome.details.contains("Bearer"), "{outcome:?}");
    }
    assert_eq!(greeting(&out[5]), "Hello auth!");
    assert_eq!(out[6].code, "UNIMPLEMENTED", "{:?}", out[6]);
    for outcome in &out {
        assert!(
            !outcome.details.contains("s3cret") && !outcome.details.contains("wrong-Token"),
            "a token was echoed: {outcome:?}"
        );
    }

    // A token file others may read is refused, without showing the token.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).unwrap();
    let refused = common::run(
        &setup.dir,
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "helloworld.*",
            "--token-file",
            token.to_str().unwrap(),
        ],
        SHORT,
    );
    assert_ne!(refused.status.code(), Some(0), "{}", refused.describe());
    assert!(
        refused.stderr.contains("chmod 600"),
        "{}",
        refused.describe()
    );
    assert!(!refused.stderr.contains("s3cret"), "{}", refused.describe());
}

const TOKEN: &str = "s3cret-Token-5678";

/// A token file (mode 600) in `dir`, holding [`TOKEN`].
fn token_file(dir: &TestDir) -> String {
    let path = dir.path.join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_caller_without_the_token_cannot_hold_the_connections() {
    let secrets = TestDir::new("unauth-token");
    let token = token_file(&secrets);
    let setup = Setup::start(
        "unauth",
        &[
            "--allow",
            "helloworld.*",
            "--token-file",
            &token,
            "--max-connections",
            "4",
            "--max-connections-per-peer",
            "2",
            // Far beyond the test: any connection closed here was closed for what it did.
            "--idle-timeout",
            "300s",
        ],
    );
    let gateway: SocketAddr = setup.address.parse().unwrap();
    let attacker: IpAddr = "127.0.0.2".parse().unwrap();
    let honest: IpAddr = "127.0.0.1".parse().unwrap();
    runtime().block_on(async {
        // The attacker opens as many connections as the gateway serves, and calls without
        // the token on each: only its peer's share is served, the rest closed at accept.
        let mut held = Vec::new();
        let mut refused = 0;
        for i in 0..4 {
            let Ok(connection) = PeerConnection::open(attacker, gateway).await else {
                refused += 1;
                continue;
            };
            match connection.say_hello(&format!("attack {i}"), None).await {
                Err(status) if status.code() == tonic::Code::Unauthenticated => {
                    held.push(connection)
                }
                other => {
                    assert!(other.is_err(), "served without the token");
                    refused += 1;
                }
            }
        }
        assert_eq!((held.len(), refused), (2, 2), "per-peer cap not applied");
        for connection in &held {
            let status = connection.say_hello("again", None).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            assert!(!connection.is_closed(), "closed after 2 failed calls");
        }

        // Meanwhile an honest client connects, and is served.
        let mut honest_connections = Vec::new();
        for i in 0..2 {
            let connection = PeerConnection::open(honest, gateway).await.unwrap();
            let reply = connection
                .say_hello(&format!("honest {i}"), Some(TOKEN))
                .await;
            assert_eq!(reply.unwrap(), format!("Hello honest {i}!"));
            honest_connections.push(connection);
        }

        // The attacker's third call in a row without the token is refused, saying that its
        // connection closes; then the gateway closes it.
        for mut connection in held {
            let status = connection.say_hello("third", None).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
            assert!(
                status.message().contains("closes this connection"),
                "{status:?}"
            );
            assert!(
                connection.closes_within(Duration::from_secs(10)).await,
                "a connection stayed open after 3 failed calls"
            );
        }
        // Its places are free again, and its next connection fares the same.
        let mut again = PeerConnection::open(attacker, gateway).await.unwrap();
        for _ in 0..3 {
            let status = again.say_hello("more", None).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        }
        assert!(again.closes_within(Duration::from_secs(10)).await);
        let after = again.say_hello("after", Some(TOKEN)).await.unwrap_err();
        assert_ne!(after.code(), tonic::Code::Ok);

        // The honest connections were never touched.
        for (i, connection) in honest_connections.iter().enumerate() {
            assert!(!connection.is_closed());
            let reply = connection
                .say_hello(&format!("still {i}"), Some(TOKEN))
                .await;
            assert_eq!(reply.unwrap(), format!("Hello still {i}!"));
        }
    });
}

#[test]
fn calls_without_the_token_keep_no_connection_open() {
    let secrets = TestDir::new("idle-token");
    let token = token_file(&secrets);
    let setup = Setup::start(
        "idle-unauth",
        &[
            "--allow",
            "helloworld.*",
            "--token-file",
            &token,
            "--idle-timeout",
            "3s",
        ],
    );
    let gateway: SocketAddr = setup.address.parse().unwrap();
    let from: IpAddr = "127.0.0.1".parse().unwrap();
    runtime().block_on(async {
        let started = Instant::now();
        let attacker = PeerConnection::open(from, gateway).await.unwrap();
        let honest = PeerConnection::open(from, gateway).await.unwrap();
        // 2.5 s in, each calls once (the attacker twice, not yet closed for failing).
        tokio::time::sleep_until((started + Duration::from_millis(2500)).into()).await;
        for _ in 0..2 {
            let status = attacker.say_hello("idle", None).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        }
        let reply = honest.say_hello("busy", Some(TOKEN)).await.unwrap();
        assert_eq!(reply, "Hello busy!");
        // The honest call keeps its connection until 3 s after it (5.5 s in at the
        // earliest); the attacker's calls do not, so its connection is idle 3 s in.
        tokio::time::sleep_until((started + Duration::from_millis(4800)).into()).await;
        assert!(
            attacker.is_closed(),
            "calls without the token kept a connection open"
        );
        assert!(
            !honest.is_closed(),
            "an authenticated call was not activity"
        );
    });
}

#[test]
fn mutual_tls_serves_only_clients_with_a_certificate_from_the_ca() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
        KeyPair,
    };
    let certs = TestDir::new("mtls");
    let write = |name: &str, pem: String| {
        let path = certs.path.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let server_cert = write("server.pem", server.cert.pem());
    let server_key = write("server.key", server.signing_key.serialize_pem());
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    };
    let (clients_ca, other_ca) = (ca("clients"), ca("others"));
    let client = |issuer: &CertifiedIssuer<'_, KeyPair>, name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["client".to_string()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, issuer).unwrap();
        (
            write(&format!("{name}.pem"), cert.pem()),
            write(&format!("{name}.key"), key.serialize_pem()),
        )
    };
    let (good_cert, good_key) = client(&clients_ca, "good");
    let (bad_cert, bad_key) = client(&other_ca, "bad");
    let ca_file = write("clients-ca.pem", clients_ca.pem());

    let setup = Setup::start(
        "mtls",
        &[
            "--allow",
            "helloworld.*",
            "--tls-cert",
            server_cert.to_str().unwrap(),
            "--tls-key",
            server_key.to_str().unwrap(),
            "--tls-client-ca",
            ca_file.to_str().unwrap(),
        ],
    );
    let port = setup.address.rsplit(':').next().unwrap();
    let target = format!("localhost:{port}");
    let calls = [Call::new(SAY_HELLO, &hello("mtls"))];
    let served = probe(&target, &calls, &[&server_cert, &good_cert, &good_key]);
    assert_eq!(greeting(&served[0]), "Hello mtls!");
    for tls in [
        &[server_cert.as_path()][..],
        &[&server_cert, &bad_cert, &bad_key],
    ] {
        let out = probe(&target, &calls, tls);
        assert_eq!(out[0].code, "UNAVAILABLE", "{tls:?}: {:?}", out[0]);
    }
}

#[test]
fn remote_errors_name_no_local_path() {
    let mut setup = Setup::start(
        "paths",
        &[
            "--allow",
            "helloworld.*",
            "--allow",
            "absent.*",
            "--allow",
            "hung.*",
            "--allow",
            "stale.*",
            "--allow",
            "leaky.*",
            "--backend-connect-timeout",
            "1s",
        ],
    );
    hung_backend(&setup.dir.socket("hung.Service"));
    stale_socket(&setup.dir.socket("stale.Service"));
    // A backend whose errors name local things, as netless's own errors do: the socket
    // directory, a path through /proc, uids, gids and an ACL's lists of them.
    let uid = rustix::process::geteuid().as_raw();
    let leak = format!(
        "uid {uid} gid 4343 is not allowed to use service `leaky.Service` at \
         /proc/self/fd/9/leaky.Service.sock (its ACL admits uids [4242, {uid}], gids [4343]); \
         its log is {}/leaky.log, its config /home/leaky/.config/netless, pid: 4444",
        setup.dir.path.display()
    );
    let _leaky = netless::Server::bind(
        "leaky.Service",
        netless::ServerConfig {
            dir: Some(setup.dir.path.clone()),
            ..Default::default()
        },
        move |_req: &netless::Request<'_>, _resp: &mut netless::ResponseBuilder<'_>| {
            Err(netless::Status::new(netless::Code::PermissionDenied, &leak))
        },
    )
    .unwrap();
    let calls = [
        Call::new("/absent.Service/Get", b""),
        Call::new("/hung.Service/Get", b""),
        Call::new("/stale.Service/Get", b""),
        Call::new("/routeguide.RouteGuide/GetFeature", b""),
        Call::new("/netless.ctl/Get", b""),
        Call::new("/not-a-method-path", b""),
        Call::new("/leaky.Service/Get", b""),
    ];
    let mut out = probe(&setup.address, &calls, &[]);
    let codes: Vec<&str> = out.iter().map(|o| o.code.as_str()).collect();
    assert_eq!(
        codes,
        [
            "UNIMPLEMENTED",
            "UNAVAILABLE",
            "UNAVAILABLE",
            "UNIMPLEMENTED",
            "UNIMPLEMENTED",
            "UNIMPLEMENTED",
            "PERMISSION_DENIED",
        ],
        "{out:?}"
    );
    // The backend's error keeps its sense, less what names the machine.
    assert_eq!(
        out[6].details,
        "uid <id> gid <id> is not allowed to use service `leaky.Service` at <path> (its ACL \
         admits uids <ids>, gids <ids>); its log is <socket directory>, its config <path>, \
         pid: <id>"
    );
    // A backend that dies: its calls fail, and say so without saying where it lived.
    drop(setup.backend.take());
    std::thread::sleep(Duration::from_millis(200));
    out.extend(probe(
        &setup.address,
        &[
            Call::new(SAY_HELLO, &hello("gone")),
            Call::new(SAY_HELLO, &hello("gone")),
        ],
        &[],
    ));
    assert!(
        ["UNAVAILABLE", "UNIMPLEMENTED"].contains(&out[7].code.as_str()),
        "{:?}",
        out[7]
    );
    let dir = setup.dir.path.display().to_string();
    let tmp = std::env::temp_dir().display().to_string();
    for outcome in &out {
        assert!(!outcome.details.is_empty(), "{outcome:?}");
        let private = [
            dir.as_str(),
            tmp.as_str(),
            ".sock",
            "netless-0",
            "/proc",
            "/home",
            ".config",
            "leaky.log",
            "4242",
            "4343",
            "4444",
        ];
        for private in private {
            assert!(
                !outcome.details.contains(private),
                "`{private}` seen remotely: {outcome:?}"
            );
        }
    }
}

#[test]
fn a_hung_backend_delays_no_other_service() {
    let setup = Setup::start(
        "hung",
        &[
            "--allow",
            "helloworld.*",
            "--allow",
            "hung.*",
            "--backend-connect-timeout",
            "2s",
        ],
    );
    hung_backend(&setup.dir.socket("hung.Service"));
    runtime().block_on(async {
        let channel = connect(&setup.address).await;
        let hung: Vec<_> = (0..8)
            .map(|_| {
                let channel = channel.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let result = call_path(channel, "/hung.Service/Get").await;
                    (result, started.elapsed())
                })
            })
            .collect();
        // While the gateway's connects to the hung backend wait for their handshake, the
        // greeter answers every call at once.
        let mut greeter = GreeterClient::new(channel.clone());
        let started = Instant::now();
        let mut calls = 0;
        while started.elapsed() < Duration::from_secs(4) {
            let call = Instant::now();
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                greeter.say_hello(HelloRequest {
                    name: "meanwhile".into(),
                }),
            )
            .await
            .expect("a call to a healthy service waited 10 s")
            .unwrap();
            assert_eq!(reply.into_inner().message, "Hello meanwhile!");
            assert!(
                call.elapsed() < Duration::from_millis(1500),
                "a call to a healthy service took {:?}",
                call.elapsed()
            );
            calls += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(calls >= 5, "{calls} calls in 4 s");
        for call in hung {
            let (result, took) = call.await.unwrap();
            let status = result.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(took < Duration::from_secs(10), "failed after {took:?}");
            assert!(!status.message().contains(".sock"), "{status:?}");
        }
    });
}

#[test]
fn thousands_of_idle_streams_starve_no_other_client() {
    let setup = Setup::start(
        "idle",
        &["--allow", "helloworld.*", "--allow", "routeguide.*"],
    );
    runtime().block_on(async {
        // 2000 client streams that never send a message nor end, on 20 connections.
        let mut hogs = Vec::new();
        for _ in 0..20 {
            let channel = connect(&setup.address).await;
            for _ in 0..100 {
                let mut client = RouteGuideClient::new(channel.clone());
                hogs.push(tokio::spawn(async move {
                    let idle = tonic::codegen::tokio_stream::pending::<Point>();
                    client.record_route(tonic::Request::new(idle)).await
                }));
            }
        }
        // Until the gateway has taken all it takes (its other calls fail at once).
        let mut settled = (0, Instant::now());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let finished = hogs.iter().filter(|h| h.is_finished()).count();
            if finished != settled.0 {
                settled = (finished, Instant::now());
            } else if settled.1.elapsed() > Duration::from_secs(2) {
                break;
            }
            assert!(Instant::now() < deadline, "the hogs never settled");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let holding = hogs.iter().filter(|h| !h.is_finished()).count();
        assert!(holding >= 200, "only {holding} idle streams are held");

        // Another client's calls to the same services are served, one after the other.
        let channel = connect(&setup.address).await;
        let mut guide = RouteGuideClient::new(channel.clone());
        let mut greeter = GreeterClient::new(channel);
        for i in 0..20 {
            let mut request = tonic::Request::new(netless_examples::routeguide::grid_point(i));
            request.set_timeout(Duration::from_secs(10));
            let feature = guide.get_feature(request).await.unwrap().into_inner();
            assert_eq!(feature.name, format!("feature {i}"));
            let mut request = tonic::Request::new(HelloRequest {
                name: format!("honest {i}"),
            });
            request.set_timeout(Duration::from_secs(10));
            greeter.say_hello(request).await.unwrap();
        }
        let rect = Rectangle {
            lo: Some(netless_examples::routeguide::grid_point(0)),
            hi: Some(netless_examples::routeguide::grid_point(9)),
        };
        let mut stream = guide.list_features(rect).await.unwrap().into_inner();
        let mut features = 0;
        while stream.message().await.unwrap().is_some() {
            features += 1;
        }
        assert_eq!(features, 10);
        for hog in hogs {
            hog.abort();
        }
    });
}

/// Reads from `stream` until it is closed; how long that took, if within `limit`.
fn closed_within(mut stream: TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(started.elapsed())
            }
            Err(_) => return None,
        }
    }
}

#[test]
fn connections_past_the_limits_are_closed() {
    let setup = Setup::start(
        "limits",
        &[
            "--allow",
            "helloworld.*",
            "--max-connections",
            "2",
            "--idle-timeout",
            "1s",
            "--max-calls-per-connection",
            "1",
            "--default-timeout",
            "700ms",
        ],
    );
    // Two silent connections take the two places; a third is closed at once.
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(&setup.address).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let third = TcpStream::connect(&setup.address).unwrap();
    let took = closed_within(third, Duration::from_secs(5)).expect("a third connection was served");
    assert!(took < Duration::from_millis(900), "closed after {took:?}");
    // The silent ones are closed once idle for a second, and their places serve again.
    for stream in silent {
        closed_within(stream, Duration::from_secs(10)).expect("an idle connection stayed open");
    }
    runtime().block_on(async {
        let channel = connect(&setup.address).await;
        let mut greeter = GreeterClient::new(channel.clone());
        // No grpc-timeout: the default deadline (700 ms) cuts a call that takes 1.5 s.
        let started = Instant::now();
        let status = greeter
            .say_hello(HelloRequest {
                name: "slow".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1400),
            "{status:?}"
        );
        // One call at a time on a connection: a second waits its turn, here past its deadline.
        let slow = {
            let mut greeter = greeter.clone();
            tokio::spawn(async move {
                let mut request = tonic::Request::new(HelloRequest {
                    name: "slow".into(),
                });
                request.set_timeout(Duration::from_secs(10));
                greeter.say_hello(request).await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // (No timeout of its own: tonic would enforce it before the gateway answers.)
        let status = greeter
            .say_hello(HelloRequest {
                name: "queued".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("its turn"), "{status:?}");
        // The slow call outlives the idle timeout: a call under way keeps its connection.
        let reply = slow.await.unwrap().unwrap();
        assert_eq!(reply.into_inner().message, "Hello slow!");
        greeter
            .say_hello(HelloRequest {
                name: "after".into(),
            })
            .await
            .unwrap();
    });
}

#[test]
fn deadlines_past_the_max_timeout_are_cut() {
    let setup = Setup::start(
        "max-timeout",
        &["--allow", "helloworld.*", "--max-timeout", "700ms"],
    );
    runtime().block_on(async {
        let channel = connect(&setup.address).await;
        let mut greeter = GreeterClient::new(channel);
        let call = |name: &str, timeout: Option<Duration>| {
            let mut request = tonic::Request::new(HelloRequest { name: name.into() });
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            request
        };
        // A call that asks for an hour, and one that asks for no deadline (the default
        // timeout, 60 s), get 700 ms: the slow greeting (1.5 s) is cut.
        for timeout in [Some(Duration::from_secs(3600)), None] {
            let started = Instant::now();
            let status = greeter.say_hello(call("slow", timeout)).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "{timeout:?}: cut after {took:?}"
            );
        }
        // Calls within the bound are served as they ask.
        let reply = greeter
            .say_hello(call("quick", Some(Duration::from_secs(10))))
            .await
            .unwrap();
        assert_eq!(reply.into_inner().message, "Hello quick!");
    });
    // Without a bound (`0`), the slow greeting has the hour it asks for.
    let (_unbounded, address) = start_gateway(
        &setup.dir.path,
        &["--allow", "helloworld.*", "--max-timeout", "0"],
    );
    runtime().block_on(async {
        let mut greeter = GreeterClient::new(connect(&address).await);
        let mut request = tonic::Request::new(HelloRequest {
            name: "slow".into(),
        });
        request.set_timeout(Duration::from_secs(3600));
        let reply = greeter.say_hello(request).await.unwrap();
        assert_eq!(reply.into_inner().message, "Hello slow!");
    });
}

#[test]
fn a_tls_handshake_that_never_comes_is_cut() {
    let certs = TestDir::new("tls-slow");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_path, key_path) = (certs.path.join("cert.pem"), certs.path.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let setup = Setup::start(
        "tls-slow",
        &[
            "--allow",
            "helloworld.*",
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
            "--tls-handshake-timeout",
            "1s",
        ],
    );
    let silent = TcpStream::connect(&setup.address).unwrap();
    let took = closed_within(silent, Duration::from_secs(10)).expect("a silent TLS peer stayed");
    assert!(took >= Duration::from_millis(500), "closed after {took:?}");
}
