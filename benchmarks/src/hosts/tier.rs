//! A tier of the cross-host chain, the `tier` peer role: one process serving `chain.TierK`
//! over netless in its host's socket directory. A call with hops > 1 goes on to
//! `chain.TierK+1` through a netless `Channel`: to a tier on the same host directly, to one on
//! the other host through this host's gateway (its egress). The tier never opens a socket
//! for a hop. The last tier sums the array: the bytes it received (by value), or the pages it
//! reads from the memory node (by reference). It never measures.

use std::sync::Arc;

use anyhow::Context as _;
use netless_grpc::{Channel, GrpcServer};
use tokio::sync::OnceCell;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Request, Response, Status};

use super::remote::Memory;
use crate::harness::peer;
use crate::proto::chain::{self, HopReply, HopRequest};

/// The `tier` peer role.
#[derive(clap::Args, Debug)]
pub struct TierArgs {
    /// Which tier (1 to 7): serves `chain.TierK`.
    #[arg(long)]
    pub index: u32,
    /// The memory node (`http://ADDR`), read by the last tier of a by-reference call.
    #[arg(long)]
    pub memnode: String,
    /// Netless worker threads (calls this tier serves at once).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
}

/// One tier's state: where it forwards and the memory node.
struct Tier {
    index: u32,
    /// `chain.TierK+1`, connected on first use (the next tier may start after this one).
    next: OnceCell<Channel>,
    next_path: PathAndQuery,
    memory: Arc<Memory>,
}

impl Tier {
    async fn hop(&self, request: HopRequest) -> Result<HopReply, Status> {
        if request.hops > 1 {
            let next = HopRequest {
                hops: request.hops - 1,
                ..request
            };
            return self.forward(next).await;
        }
        let sum = if request.remote_ref.is_empty() {
            byte_sum(&request.data)
        } else {
            self.memory.sum(&request.remote_ref).await?
        };
        Ok(HopReply {
            sum,
            last: self.index,
        })
    }

    async fn forward(&self, request: HopRequest) -> Result<HopReply, Status> {
        let name = format!("chain.Tier{}", self.index + 1);
        let channel = self
            .next
            .get_or_try_init(|| async {
                Channel::connect(&name).map_err(|e| {
                    Status::unavailable(format!("tier {} cannot reach {name}: {e}", self.index))
                })
            })
            .await?
            .clone();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("{name} is not ready: {e}")))?;
        let codec = tonic_prost::ProstCodec::<HopRequest, HopReply>::default();
        let reply = grpc
            .unary(Request::new(request), self.next_path.clone(), codec)
            .await?;
        Ok(reply.into_inner())
    }
}

/// The sum of `data`'s bytes, which the client checks.
pub fn byte_sum(data: &[u8]) -> u64 {
    data.iter().map(|&b| u64::from(b)).sum()
}

/// Implements the generated server trait of each `chain.TierK` for [`Shared`].
macro_rules! tiers {
    ($($module:ident :: $trait:ident),*) => {$(
        #[tonic::async_trait]
        impl chain::$module::$trait for Shared {
            async fn hop(
                &self,
                request: Request<HopRequest>,
            ) -> Result<Response<HopReply>, Status> {
                self.0.hop(request.into_inner()).await.map(Response::new)
            }
        }
    )*};
}

/// The tier as the generated servers hold it.
#[derive(Clone)]
struct Shared(Arc<Tier>);

tiers!(
    tier1_server::Tier1,
    tier2_server::Tier2,
    tier3_server::Tier3,
    tier4_server::Tier4,
    tier5_server::Tier5,
    tier6_server::Tier6,
    tier7_server::Tier7
);

/// Runs the `tier` role until stdin closes.
pub fn serve(args: TierArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=super::MAX_HOPS).contains(&args.index),
        "--index must be 1 to {}",
        super::MAX_HOPS
    );
    // The memory node's connection lives on a runtime of its own, which the handlers (on the
    // server's runtime) reach through the connection's channel.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let memory = runtime.block_on(Memory::open(&args.memnode, &format!("tier{}", args.index)))?;
    let next_path = format!("/chain.Tier{}/Hop", args.index + 1);
    let shared = Shared(Arc::new(Tier {
        index: args.index,
        next: OnceCell::new(),
        next_path: PathAndQuery::try_from(next_path).context("path")?,
        memory: Arc::new(memory),
    }));
    let config = netless::ServerConfig {
        workers: args.workers,
        // Every call in flight may hold a 1 MiB array at once.
        buffer_bytes: Some(16 << 20),
        ..netless::ServerConfig::default()
    };
    let server = GrpcServer::new().config(config).runtime_threads(2);
    let server = match args.index {
        1 => server.add_service(chain::tier1_server::Tier1Server::new(shared)),
        2 => server.add_service(chain::tier2_server::Tier2Server::new(shared)),
        3 => server.add_service(chain::tier3_server::Tier3Server::new(shared)),
        4 => server.add_service(chain::tier4_server::Tier4Server::new(shared)),
        5 => server.add_service(chain::tier5_server::Tier5Server::new(shared)),
        6 => server.add_service(chain::tier6_server::Tier6Server::new(shared)),
        _ => server.add_service(chain::tier7_server::Tier7Server::new(shared)),
    };
    let _serving = server.serve()?;
    peer::listening(format!("chain.Tier{}", args.index))?;
    peer::until_stdin_closes();
    Ok(())
}
