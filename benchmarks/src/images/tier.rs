//! A tier of the image application, the `tier` peer role: one process serving one of the
//! seven tonic services (`images.Ingest/Process` … `images.Store/Process`), written once and
//! served either by tonic's own HTTP/2 server on a loopback port (`--serving tcp`) or by a
//! netless [`GrpcServer`] (`--serving netless`). A tier does its part of the work ([`work`])
//! and calls the next tier through the generated tonic client, on a tonic `Channel` to the
//! next tier's port or on a netless `Channel` to the next tier's service: the only line that
//! differs between the transports.
//!
//! The picture comes in `image` (by value) or as a Ref in `image_ref` (by reference): "if
//! `image_ref` is set, map it", read the pixels in place in the pool's pages, and pass the
//! output on the same way, written into a `SharedBuf` of the domain's pool and shared as a
//! fresh Ref. Ingest forwards what it received without copying it (by reference: a new Ref to
//! the same pages); watermark writes only the rows its mark covers, so by reference only the
//! pages they touch are copied. The store keeps the last pictures and answers a receipt. A
//! tier never measures: the client times the calls and reads every process's CPU time.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use image::RgbaImage;
use netless::{ClientConfig, ServerConfig, WaitMode, WaitPolicy};
use netless_grpc::GrpcServer;
use netless_pool::{Domain, DomainConfig, Ref, SharedBuf};
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use super::work;
use crate::harness::peer;
use crate::proto::images::{self as pb, Format, Image, Receipt};

/// Largest message either side accepts: a 2048×1536 picture's raw pixels and then some.
pub const MAX_MESSAGE: usize = 32 << 20;

/// Pictures the store keeps.
const KEPT: usize = 16;

/// The seven tiers, in the order a picture goes through them.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Ingest,
    Decode,
    Resize,
    Filter,
    Watermark,
    Encode,
    Store,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Ingest,
        Stage::Decode,
        Stage::Resize,
        Stage::Filter,
        Stage::Watermark,
        Stage::Encode,
        Stage::Store,
    ];

    /// The gRPC service (and netless service name).
    pub fn service(self) -> &'static str {
        match self {
            Stage::Ingest => "images.Ingest",
            Stage::Decode => "images.Decode",
            Stage::Resize => "images.Resize",
            Stage::Filter => "images.Filter",
            Stage::Watermark => "images.Watermark",
            Stage::Encode => "images.Encode",
            Stage::Store => "images.Store",
        }
    }

    /// Lower-case name, as in the tables and the JSON.
    pub fn name(self) -> &'static str {
        &self.service()["images.".len()..]
    }

    /// The tier after this one.
    pub fn next(self) -> Option<Stage> {
        let i = Stage::ALL.iter().position(|&s| s == self)?;
        Stage::ALL.get(i + 1).copied()
    }
}

/// How a tier is served and reaches the next one.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Serving {
    /// tonic's HTTP/2 server and `Channel` over loopback TCP.
    Tcp,
    /// netless `GrpcServer` and `Channel` (shared memory).
    Netless,
}

/// The `tier` peer role.
#[derive(clap::Args, Debug)]
pub struct TierArgs {
    /// Which tier.
    #[arg(long)]
    pub stage: Stage,
    /// Its transport.
    #[arg(long)]
    pub serving: Serving,
    /// The next tier: `http://ADDR` (tcp) or its service name (netless).
    #[arg(long)]
    pub next: Option<String>,
    /// The run's socket directory (netless services and the domain).
    #[arg(long)]
    pub dir: PathBuf,
    /// The domain to join (netless tiers).
    #[arg(long)]
    pub domain: Option<String>,
    /// netless worker threads: a unary call holds its worker while it waits for the next
    /// tier, so as many as the client keeps calls in flight.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// How long a netless worker polls for the next request before it sleeps, in µs.
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    /// Worker threads of a tcp tier's tokio runtime (what `#[tokio::main]` gives on two
    /// CPUs).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// The next tier, on one transport or the other.
#[derive(Clone)]
enum Next {
    Tcp(tonic::transport::Channel),
    Netless(netless_grpc::Channel),
}

/// What a tier received: the message's bytes, or the pool pages its Ref named.
enum Held {
    Value(Vec<u8>),
    Pool(SharedBuf),
}

impl Held {
    /// The bytes, in place (a buffer whose pages are not contiguous is copied).
    fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Held::Value(v) => Cow::Borrowed(v),
            Held::Pool(buf) => buf
                .as_slice()
                .map_or_else(|| Cow::Owned(buf.to_vec()), Cow::Borrowed),
        }
    }
}

struct Tier {
    stage: Stage,
    next: Option<Next>,
    domain: Option<Domain>,
    mark: RgbaImage,
    ids: AtomicU64,
    stored: AtomicU64,
    /// The store's last pictures (by reference: the pool pages themselves).
    kept: Mutex<VecDeque<Held>>,
}

fn invalid(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

impl Tier {
    async fn process(&self, mut image: Image) -> Result<Receipt, Status> {
        let by_ref = !image.image_ref.is_empty();
        let input = if by_ref {
            let domain = self.domain.as_ref().ok_or_else(|| {
                Status::failed_precondition("a Ref came to a tier outside the domain")
            })?;
            let r = Ref::from_bytes(&image.image_ref).map_err(invalid)?;
            Held::Pool(domain.map(&r).map_err(invalid)?)
        } else {
            Held::Value(std::mem::take(&mut image.image))
        };
        let (width, height) = (image.width, image.height);
        // The output, in the form the next tier gets it; computed before any await.
        let (output, format, width, height) = match self.stage {
            Stage::Ingest => {
                let (format, w, h) = work::probe(&input.bytes()).map_err(invalid)?;
                if image.id == 0 {
                    image.id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
                }
                (input, format, w, h)
            }
            Stage::Decode => {
                let decoded = work::decode(&input.bytes()).map_err(invalid)?;
                let (w, h) = decoded.dimensions();
                (self.output(by_ref, decoded.into_raw())?, Format::Rgb8, w, h)
            }
            Stage::Resize | Stage::Filter | Stage::Encode => {
                let bytes = input.bytes();
                let view = work::view(width, height, &bytes).map_err(invalid)?;
                let (raw, format, (w, h)) = match self.stage {
                    Stage::Resize => {
                        let out = work::resize(&view);
                        (out.as_raw().clone(), Format::Rgb8, out.dimensions())
                    }
                    Stage::Filter => (
                        work::filter(&view).into_raw(),
                        Format::Rgb8,
                        (width, height),
                    ),
                    _ => (
                        work::encode(&view).map_err(invalid)?,
                        Format::Jpeg,
                        (width, height),
                    ),
                };
                (self.output(by_ref, raw)?, format, w, h)
            }
            Stage::Watermark => {
                let rows = work::watermark(
                    &work::view(width, height, &input.bytes()).map_err(invalid)?,
                    &self.mark,
                );
                let output = match input {
                    Held::Value(mut pixels) => {
                        work::apply(&mut pixels, &rows);
                        Held::Value(pixels)
                    }
                    // Copy-on-write: only the pages the mark's rows touch are copied.
                    Held::Pool(mut buf) => {
                        for (offset, row) in &rows {
                            buf.write(*offset, row).map_err(invalid)?;
                        }
                        Held::Pool(buf)
                    }
                };
                (output, Format::Rgb8, width, height)
            }
            Stage::Store => return Ok(self.store(&image, input)),
        };
        let mut next = Image {
            id: image.id,
            width,
            height,
            format: format as i32,
            ..Image::default()
        };
        // By reference the buffer stays held until the next tier answers.
        let held = match output {
            Held::Value(bytes) => {
                next.image = bytes;
                None
            }
            Held::Pool(buf) => {
                next.image_ref = buf.share().map_err(invalid)?.to_bytes().to_vec();
                Some(buf)
            }
        };
        let receipt = self.forward(next).await;
        drop(held);
        receipt
    }

    /// `raw` as the next tier gets it: as is, or written into a new pool buffer.
    fn output(&self, by_ref: bool, raw: Vec<u8>) -> Result<Held, Status> {
        if !by_ref {
            return Ok(Held::Value(raw));
        }
        let domain = self.domain.as_ref().expect("checked on arrival");
        Ok(Held::Pool(domain.alloc_from(&raw).map_err(|e| {
            Status::resource_exhausted(format!("the pool: {e}"))
        })?))
    }

    fn store(&self, image: &Image, input: Held) -> Receipt {
        let (length, checksum) = {
            let bytes = input.bytes();
            (bytes.len() as u64, work::checksum(&bytes))
        };
        let stored = self.stored.fetch_add(1, Ordering::Relaxed) + 1;
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(input);
        Receipt {
            id: image.id,
            width: image.width,
            height: image.height,
            format: image.format,
            length,
            checksum,
            stored,
        }
    }

    async fn forward(&self, image: Image) -> Result<Receipt, Status> {
        let stage = self.stage.next().expect("the store does not forward");
        match self.next.clone() {
            Some(Next::Tcp(channel)) => call(stage, channel, image).await,
            Some(Next::Netless(channel)) => call(stage, channel, image).await,
            None => Err(Status::failed_precondition("no next tier")),
        }
    }
}

/// Calls `stage`'s service on `channel` through its generated client.
pub async fn call<T>(stage: Stage, channel: T, image: Image) -> Result<Receipt, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    macro_rules! via {
        ($module:ident :: $client:ident) => {
            pb::$module::$client::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE)
                .process(image)
                .await
        };
    }
    let reply = match stage {
        Stage::Ingest => via!(ingest_client::IngestClient),
        Stage::Decode => via!(decode_client::DecodeClient),
        Stage::Resize => via!(resize_client::ResizeClient),
        Stage::Filter => via!(filter_client::FilterClient),
        Stage::Watermark => via!(watermark_client::WatermarkClient),
        Stage::Encode => via!(encode_client::EncodeClient),
        Stage::Store => via!(store_client::StoreClient),
    };
    Ok(reply?.into_inner())
}

/// The tier as the generated servers hold it.
#[derive(Clone)]
struct Shared(Arc<Tier>);

/// Implements each generated server trait for [`Shared`].
macro_rules! services {
    ($($module:ident :: $trait:ident),*) => {$(
        #[tonic::async_trait]
        impl pb::$module::$trait for Shared {
            async fn process(&self, request: Request<Image>) -> Result<Response<Receipt>, Status> {
                self.0.process(request.into_inner()).await.map(Response::new)
            }
        }
    )*};
}

services!(
    ingest_server::Ingest,
    decode_server::Decode,
    resize_server::Resize,
    filter_server::Filter,
    watermark_server::Watermark,
    encode_server::Encode,
    store_server::Store
);

/// Evaluates `$body` with `$svc` bound to `$stage`'s generated server around `$shared`.
macro_rules! with_service {
    ($stage:expr, $shared:expr, $svc:ident => $body:expr) => {
        match $stage {
            Stage::Ingest => {
                let $svc = limits!(pb::ingest_server::IngestServer::new($shared));
                $body
            }
            Stage::Decode => {
                let $svc = limits!(pb::decode_server::DecodeServer::new($shared));
                $body
            }
            Stage::Resize => {
                let $svc = limits!(pb::resize_server::ResizeServer::new($shared));
                $body
            }
            Stage::Filter => {
                let $svc = limits!(pb::filter_server::FilterServer::new($shared));
                $body
            }
            Stage::Watermark => {
                let $svc = limits!(pb::watermark_server::WatermarkServer::new($shared));
                $body
            }
            Stage::Encode => {
                let $svc = limits!(pb::encode_server::EncodeServer::new($shared));
                $body
            }
            Stage::Store => {
                let $svc = limits!(pb::store_server::StoreServer::new($shared));
                $body
            }
        }
    };
}

macro_rules! limits {
    ($server:expr) => {
        $server
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    };
}

/// How a netless waiter waits: polls for `spin_us`, then sleeps (0: sleeps at once).
pub fn wait_policy(spin_us: u64) -> WaitPolicy {
    if spin_us == 0 {
        WaitPolicy {
            mode: WaitMode::Futex,
            spin: Duration::ZERO,
        }
    } else {
        WaitPolicy {
            mode: WaitMode::Adaptive,
            spin: Duration::from_micros(spin_us),
        }
    }
}

/// A netless client of the run: its calls take milliseconds, so it sleeps at once.
pub fn client_config(dir: &std::path::Path) -> ClientConfig {
    ClientConfig {
        wait: wait_policy(0),
        dir: Some(dir.to_path_buf()),
        max_message: MAX_MESSAGE,
        default_timeout: Some(Duration::from_secs(60)),
        ..ClientConfig::default()
    }
}

/// Joins the run's domain `name` in `dir`.
pub fn join(name: &str, dir: &std::path::Path) -> anyhow::Result<Domain> {
    let mut config = DomainConfig::new(name);
    config.dir = Some(dir.to_path_buf());
    Domain::join(&config).with_context(|| format!("joining domain {name}"))
}

/// Runs the `tier` role until stdin closes.
pub fn serve(args: TierArgs) -> anyhow::Result<()> {
    let domain = args
        .domain
        .as_deref()
        .map(|name| join(name, &args.dir))
        .transpose()?;
    let tier = |next| {
        Shared(Arc::new(Tier {
            stage: args.stage,
            next,
            domain: domain.clone(),
            mark: work::mark(),
            ids: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            kept: Mutex::new(VecDeque::with_capacity(KEPT)),
        }))
    };
    match args.serving {
        Serving::Netless => {
            let next = match &args.next {
                Some(name) => Some(Next::Netless(netless_grpc::Channel::connect_with(
                    name,
                    client_config(&args.dir),
                )?)),
                None => None,
            };
            let config = ServerConfig {
                workers: args.workers,
                wait: wait_policy(args.spin_us),
                // Whole raw pictures in flight on every worker, in runs of big blocks.
                block_size: 16 << 10,
                buffer_bytes: Some(64 << 20),
                max_message: MAX_MESSAGE,
                dir: Some(args.dir.clone()),
                ..ServerConfig::default()
            };
            let shared = tier(next);
            let server = GrpcServer::new().config(config).runtime_threads(1);
            let server = with_service!(args.stage, shared, svc => server.add_service(svc));
            let _serving = server.serve()?;
            peer::listening(args.stage.service())?;
            peer::until_stdin_closes();
            Ok(())
        }
        Serving::Tcp => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(args.threads.max(1))
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let next = match &args.next {
                    Some(uri) => Some(Next::Tcp(
                        tonic::transport::Endpoint::from_shared(uri.clone())?
                            .tcp_nodelay(true)
                            .connect_lazy(),
                    )),
                    None => None,
                };
                let shared = tier(next);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                peer::listening(listener.local_addr()?)?;
                let stdin_closed = tokio::task::spawn_blocking(peer::until_stdin_closes);
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                let router = with_service!(args.stage, shared, svc => {
                    tonic::transport::Server::builder().add_service(svc)
                });
                router
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stdin_closed.await;
                    })
                    .await?;
                anyhow::Ok(())
            })?;
            runtime.shutdown_timeout(Duration::from_millis(500));
            Ok(())
        }
    }
}
