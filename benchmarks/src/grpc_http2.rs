//! The gRPC baseline the echo and gRPC experiments compare with: a real tonic server and
//! client over TCP loopback (HTTP/2, prost messages), in two processes. It owns the tonic
//! echo service, its server process (the `grpc-server` peer role, [`serve`]) and the
//! measuring client ([`GrpcHttp2`]); it never decides what is compared with it.
//!
//! [`GrpcHttp2::start`] spawns the server, reads its `LISTENING <ip:port>` line and connects
//! a client on a current-thread tokio runtime, so each call is made from the caller's
//! (possibly pinned) thread.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::harness::clock::Stopwatch;
use crate::harness::{Peer, Stop};
use crate::proto::{Echo, EchoClient, EchoReply, EchoRequest, EchoServer};

/// Unrecorded calls [`GrpcHttp2::measure`] makes before timing, per payload size.
pub const WARMUP_CALLS: u64 = 100;

/// The echo service: returns the request's payload unchanged.
#[derive(Debug, Default, Clone, Copy)]
struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Ok(Response::new(EchoReply {
            payload: request.into_inner().payload,
        }))
    }
}

/// The echo service, for other transports to serve too.
pub fn echo_service() -> EchoServer<impl Echo> {
    EchoServer::new(EchoService)
}

/// The `grpc-server` peer role: a tonic echo server on TCP loopback.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Pin every thread of the process to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
}

fn pin(cpu: usize) -> anyhow::Result<()> {
    netless_shm::pin_current_thread(cpu).with_context(|| format!("pinning a thread to cpu {cpu}"))
}

/// Runs the gRPC echo server.
///
/// Builds a tokio multi-thread runtime with 2 workers (every thread of the process pinned to
/// `pin_cpu` if given), binds `listen` (e.g. `127.0.0.1:0`), prints exactly one line
/// `LISTENING <ip:port>` to stdout once bound, and serves the Echo service until stdin
/// reaches EOF (the parent closed it or died), SIGTERM or SIGINT; then returns `Ok(())`.
pub fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let ServerArgs { listen, pin_cpu } = args;
    let listen: SocketAddr = listen
        .parse()
        .with_context(|| format!("--listen {listen:?} is not an ip:port address"))?;
    if let Some(cpu) = pin_cpu {
        pin(cpu)?;
    }

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_all();
    if let Some(cpu) = pin_cpu {
        builder.on_thread_start(move || {
            if let Err(e) = netless_shm::pin_current_thread(cpu) {
                eprintln!("grpc-server: cannot pin a runtime thread to cpu {cpu}: {e}");
            }
        });
    }
    let rt = builder
        .build()
        .context("building the server's tokio runtime")?;

    // stdin EOF = the parent is done with us (or gone). A plain thread, not spawn_blocking,
    // so the runtime never waits for this read at shutdown.
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("stdin-watch".into())
        .spawn(move || {
            if let Some(cpu) = pin_cpu {
                let _ = netless_shm::pin_current_thread(cpu);
            }
            let mut sink = Vec::new();
            let mut stdin = std::io::stdin().lock();
            loop {
                sink.clear();
                match stdin.read_until(b'\n', &mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = eof_tx.send(());
        })
        .context("spawning the stdin watcher")?;

    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let bound = listener
            .local_addr()
            .context("local_addr of the listener")?;
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        crate::harness::peer::listening(bound)?;

        let shutdown = async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            let sigterm = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = eof_rx => {}
                _ = sigterm => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };

        Server::builder()
            .add_service(EchoServer::new(EchoService))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .context("serving gRPC")
    })?;
    // Do not wait for in-flight connections' tasks beyond a moment.
    rt.shutdown_timeout(Duration::from_millis(500));
    Ok(())
}

/// A running gRPC server process and a connected client; dropping it stops the server.
pub struct GrpcHttp2 {
    rt: tokio::runtime::Runtime,
    client: EchoClient<Channel>,
    /// Payload template, resized to the requested size by [`measure`](Self::measure).
    buf: Vec<u8>,
    addr: SocketAddr,
    server: Peer,
}

impl std::fmt::Debug for GrpcHttp2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcHttp2")
            .field("server_pid", &self.server.id())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl GrpcHttp2 {
    /// The server's address, for clients of other runtimes (a tonic channel belongs to the
    /// runtime it was created on: its connection task runs there).
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// Spawns the `grpc-server` peer on `127.0.0.1:0` (pinned to `pin_server_cpu`), waits
    /// for its `LISTENING` line and connects a tonic client to it (`http://ip:port`,
    /// `TCP_NODELAY`).
    ///
    /// The server inherits the calling thread's CPU affinity: with `pin_server_cpu = None`,
    /// call this *before* pinning the measuring thread, or the server shares its CPU.
    pub fn start(pin_server_cpu: Option<usize>) -> anyhow::Result<GrpcHttp2> {
        let cpu = pin_server_cpu.map(|c| c.to_string());
        let mut args = vec!["grpc-server", "--listen", "127.0.0.1:0"];
        if let Some(cpu) = &cpu {
            args.extend(["--pin-cpu", cpu]);
        }
        let (server, listening) = Peer::spawn(&args, "LISTENING", Stop::CloseStdin)?;
        let addr: SocketAddr = listening.parse().with_context(|| {
            format!("the grpc server printed `LISTENING {listening}`, not an ip:port")
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the client's tokio runtime")?;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .context("building the endpoint URI")?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let channel = rt
            .block_on(endpoint.connect())
            .with_context(|| format!("connecting to the grpc server at {addr}"))?;
        let client = EchoClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok(GrpcHttp2 {
            rt,
            client,
            buf: Vec::new(),
            addr,
            server,
        })
    }

    /// Makes [`WARMUP_CALLS`] unrecorded calls, then `calls` sequential unary Echo calls with
    /// a payload of `payload_bytes`, recording each call's wall time in nanoseconds in
    /// `hist` (building the request, which copies the payload, is inside the timed region
    /// as it is for a real caller; so is the stopwatch's own small cost).
    ///
    /// Fails if a call fails or a reply's payload length differs from the request's.
    pub fn measure(
        &mut self,
        payload_bytes: usize,
        calls: u64,
        hist: &mut Histogram<u64>,
        watch: &Stopwatch,
    ) -> anyhow::Result<()> {
        self.buf.resize(payload_bytes, 0xA5);
        let Self {
            rt, client, buf, ..
        } = self;
        let buf: &[u8] = buf;
        rt.block_on(async {
            for i in 0..WARMUP_CALLS + calls {
                let start = watch.mark();
                let reply = client
                    .echo(EchoRequest {
                        payload: buf.to_vec(),
                    })
                    .await
                    .with_context(|| format!("grpc echo call of {payload_bytes} B"))?;
                let elapsed_ns = watch.elapsed_ns(start);
                let got = reply.get_ref().payload.len();
                if got != payload_bytes {
                    bail!("grpc echo of {payload_bytes} B returned {got} B");
                }
                if i >= WARMUP_CALLS {
                    hist.saturating_record(elapsed_ns.max(1));
                }
            }
            Ok(())
        })
    }
}
