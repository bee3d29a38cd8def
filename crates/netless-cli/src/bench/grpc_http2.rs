//! The baseline transport: a real tonic gRPC server and client over TCP loopback
//! (HTTP/2, prost messages), in two processes.
//!
//! The server is this same executable run as `<exe> bench-peer grpc-server --listen ADDR
//! [--pin-cpu N]`, which calls [`serve`]. [`GrpcHttp2::start`] spawns it, reads its
//! `LISTENING <ip:port>` line and connects a client on a current-thread tokio runtime, so
//! each call is made from the caller's (possibly pinned) thread.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::clock::Stopwatch;
use super::peer::reap;

use anyhow::{anyhow, bail, Context as _};
use hdrhistogram::Histogram;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use super::proto::{Echo, EchoClient, EchoReply, EchoRequest, EchoServer};

/// How long [`GrpcHttp2::start`] waits for the server's `LISTENING` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

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

fn pin(cpu: usize) -> anyhow::Result<()> {
    netless_shm::pin_current_thread(cpu).with_context(|| format!("pinning a thread to cpu {cpu}"))
}

/// Runs the gRPC echo server: `bench-peer grpc-server --listen ADDR [--pin-cpu N]`.
///
/// Builds a tokio multi-thread runtime with 2 workers (every thread of the process pinned to
/// `pin_cpu` if given), binds `listen` (e.g. `127.0.0.1:0`), prints exactly one line
/// `LISTENING <ip:port>` to stdout once bound, and serves the Echo service until stdin
/// reaches EOF (the parent closed it or died), SIGTERM or SIGINT; then returns `Ok(())`.
/// The echo service, for other transports to serve too.
pub fn echo_service() -> EchoServer<impl Echo> {
    EchoServer::new(EchoService)
}

pub fn serve(listen: &str, pin_cpu: Option<usize>) -> anyhow::Result<()> {
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

        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "LISTENING {bound}").context("writing LISTENING to stdout")?;
            out.flush().context("flushing stdout")?;
        }

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

/// A running gRPC server process and a connected client.
///
/// Dropping it closes the server's stdin, waits up to 2 s for it to exit, then kills it.
pub struct GrpcHttp2 {
    child: Child,
    rt: tokio::runtime::Runtime,
    client: EchoClient<Channel>,
    /// Payload template, resized to the requested size by [`measure`](Self::measure).
    buf: Vec<u8>,
    addr: SocketAddr,
}

impl std::fmt::Debug for GrpcHttp2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcHttp2")
            .field("server_pid", &self.child.id())
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

    /// Spawns `<exe> bench-peer grpc-server --listen 127.0.0.1:0 [--pin-cpu N]`, waits (up to
    /// [`STARTUP_TIMEOUT`]) for its `LISTENING` line and connects a tonic client to it
    /// (`http://ip:port`, `TCP_NODELAY`).
    ///
    /// The server inherits the calling thread's CPU affinity: with `pin_server_cpu = None`,
    /// call this *before* pinning the measuring thread, or the server shares its CPU.
    pub fn start(exe: &Path, pin_server_cpu: Option<usize>) -> anyhow::Result<GrpcHttp2> {
        let mut cmd = Command::new(exe);
        cmd.args(["bench-peer", "grpc-server", "--listen", "127.0.0.1:0"]);
        if let Some(cpu) = pin_server_cpu {
            cmd.arg("--pin-cpu").arg(cpu.to_string());
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {} bench-peer grpc-server", exe.display()))?;

        match Self::connect(&mut child) {
            Ok((rt, client, addr)) => Ok(GrpcHttp2 {
                child,
                rt,
                client,
                buf: Vec::new(),
                addr,
            }),
            Err(e) => {
                reap(&mut child, Duration::ZERO);
                Err(e)
            }
        }
    }

    fn connect(
        child: &mut Child,
    ) -> anyhow::Result<(tokio::runtime::Runtime, EchoClient<Channel>, SocketAddr)> {
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel::<std::io::Result<String>>();
        // Reads the first line, then drains stdout so the server can never block on it.
        std::thread::Builder::new()
            .name("grpc-server-stdout".into())
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                let mut line = String::new();
                let first = reader.read_line(&mut line).map(|_| line);
                let _ = tx.send(first);
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
            })
            .context("spawning the stdout reader")?;

        let line = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(e).context("reading the grpc server's stdout"),
            Err(_) => bail!(
                "the grpc server printed no LISTENING line within {} s",
                STARTUP_TIMEOUT.as_secs()
            ),
        };
        if line.is_empty() {
            // EOF: give it a moment to be reaped so we can report its status.
            std::thread::sleep(Duration::from_millis(50));
            let status = child
                .try_wait()
                .ok()
                .flatten()
                .map_or_else(|| "still running".to_string(), |s| s.to_string());
            bail!("the grpc server exited before printing LISTENING ({status})");
        }
        let addr: SocketAddr = line
            .trim_end()
            .strip_prefix("LISTENING ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                anyhow!(
                    "the grpc server printed {:?} instead of `LISTENING <ip:port>`",
                    line.trim_end()
                )
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
        Ok((rt, client, addr))
    }

    /// Makes [`WARMUP_CALLS`] unrecorded calls, then `calls` sequential unary Echo calls with
    /// a payload of `payload_bytes`, recording each call's wall time in nanoseconds in
    /// `hist` (building the request, which copies the payload, is inside the timed region
    /// as it is for a real caller; the ~20–25 ns cost of `Instant::now()` on this VM is too).
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

impl Drop for GrpcHttp2 {
    fn drop(&mut self) {
        reap(&mut self.child, Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_reports_a_server_that_exits() {
        let err = GrpcHttp2::start(Path::new("/bin/true"), None).unwrap_err();
        assert!(
            format!("{err:#}").contains("exited before printing LISTENING"),
            "{err:#}"
        );
    }

    #[test]
    fn start_reports_a_server_that_prints_something_else() {
        // /bin/echo prints its arguments: "bench-peer grpc-server --listen 127.0.0.1:0".
        let err = GrpcHttp2::start(Path::new("/bin/echo"), None).unwrap_err();
        assert!(format!("{err:#}").contains("instead of"), "{err:#}");
    }
}
