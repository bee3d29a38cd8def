//! The client: [`MemNode`], what anyone with a reference may do (read, stats), and
//! [`Session`], a holder of objects kept alive by a task that sends KeepAlive every third
//! of the lease. Both are generic over the tonic transport. The client never trusts a
//! length the node has not vouched for: a reference's length sizes nothing until the node
//! has accepted the reference (its MAC covers the length).

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::GrpcService;
use tonic::codegen::{Body, StdError};
use tonic::{Code, Status, Streaming};

use crate::proto::mem_node_client::MemNodeClient;
use crate::proto::{
    DeriveChunk, HoldRequest, OpenRequest, PageWrite, PutChunk, ReadChunk, ReadRequest, Reference,
    SessionRequest, StatsRequest,
};
use crate::PAGE_SIZE;
use crate::{RemoteBuf, RemoteRef, Stats, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, PAGES_PER_CHUNK};

/// A tonic transport the client runs on: `tonic::transport::Channel`,
/// `netless_grpc::Channel`, or any other cloneable `GrpcService` whose futures are `Send`.
pub trait Transport:
    GrpcService<
        tonic::body::Body,
        Error: Into<StdError>,
        ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<T> Transport for T where
    T: GrpcService<
            tonic::body::Body,
            Error: Into<StdError>,
            ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// What a client without a session may do with a memory node: read objects it has
/// references to, and ask what the node holds.
///
/// Cheap to clone (a clone of the transport).
#[derive(Debug, Clone)]
pub struct MemNode<T> {
    client: MemNodeClient<T>,
}

impl<T: Transport> MemNode<T> {
    /// A client of the node at the other end of `transport`.
    pub fn new(transport: T) -> MemNode<T> {
        MemNode {
            client: MemNodeClient::new(transport)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    fn client(&self) -> MemNodeClient<T> {
        self.client.clone()
    }

    /// Opens a session for `holder` (a label for the node's logs).
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` if the node has its most sessions; transport failures.
    pub async fn open(&self, holder: &str) -> Result<Session<T>, Status> {
        let reply = self
            .client()
            .open(OpenRequest {
                holder: holder.to_owned(),
            })
            .await?
            .into_inner();
        Ok(Session::started(
            self.clone(),
            reply.id,
            Duration::from_millis(reply.lease_ms),
        ))
    }

    /// The whole object.
    ///
    /// # Errors
    /// The node's refusal of the reference (see the crate docs), or a transport failure.
    pub async fn read(&self, reference: &RemoteRef) -> Result<Vec<u8>, Status> {
        self.read_pages(reference, 0..reference.pages()).await
    }

    /// Pages `pages` of the object, concatenated (the object's last page may be short).
    /// Only those pages travel.
    ///
    /// The buffer is sized only once the node has accepted the reference (its MAC covers
    /// the length), so a forged length costs one refused call, not an allocation.
    ///
    /// # Errors
    /// `OUT_OF_RANGE` if `pages` reaches past the object; otherwise as [`MemNode::read`].
    pub async fn read_pages(
        &self,
        reference: &RemoteRef,
        pages: Range<u64>,
    ) -> Result<Vec<u8>, Status> {
        let Some(mut reading) = self.start_read(reference, &pages).await? else {
            return Ok(Vec::new());
        };
        let wanted = reading.count.saturating_mul(PAGE_SIZE as u64);
        let mut out = Vec::with_capacity(usize::try_from(wanted.min(reference.len())).unwrap_or(0));
        while let Some(chunk) = reading.next().await? {
            for page in chunk {
                out.extend_from_slice(&page);
            }
        }
        Ok(out)
    }

    /// Pages `pages` of the object, one `Bytes` each.
    pub(crate) async fn page_list(
        &self,
        reference: &RemoteRef,
        pages: Range<u64>,
    ) -> Result<Vec<Bytes>, Status> {
        let Some(mut reading) = self.start_read(reference, &pages).await? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        while let Some(chunk) = reading.next().await? {
            out.extend(chunk);
        }
        Ok(out)
    }

    /// Asks for pages `pages`; `None` if there are none. Returns once the node has checked
    /// the reference and the range: what the reply's first message proves.
    async fn start_read(
        &self,
        reference: &RemoteRef,
        pages: &Range<u64>,
    ) -> Result<Option<Reading>, Status> {
        if pages.start >= pages.end {
            return Ok(None);
        }
        let count = pages.end - pages.start;
        let stream = self
            .client()
            .read(ReadRequest {
                reference: Bytes::copy_from_slice(&reference.to_bytes()),
                first_page: pages.start,
                pages: count,
            })
            .await?
            .into_inner();
        Ok(Some(Reading {
            stream,
            first: pages.start,
            count,
            received: 0,
        }))
    }

    /// What the node holds now.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn stats(&self) -> Result<Stats, Status> {
        Ok(self.client().stats(StatsRequest {}).await?.into_inner())
    }
}

/// A Read the node accepted: its chunks, checked to arrive in order and to add up to the
/// pages asked for.
#[derive(Debug)]
struct Reading {
    stream: Streaming<ReadChunk>,
    first: u64,
    count: u64,
    received: u64,
}

impl Reading {
    /// The next chunk's pages; `None` once all have arrived.
    async fn next(&mut self) -> Result<Option<Vec<Bytes>>, Status> {
        let Some(chunk) = self.stream.message().await? else {
            if self.received != self.count {
                return Err(Status::unavailable(format!(
                    "the memory node's reply ended after {} of {} pages: retry",
                    self.received, self.count
                )));
            }
            return Ok(None);
        };
        let expected = self.first + self.received;
        if chunk.first_page != expected
            || self.received + chunk.pages.len() as u64 > self.count
            || chunk.pages.iter().any(|p| p.len() > PAGE_SIZE)
        {
            return Err(Status::internal(format!(
                "the memory node sent pages out of order (page {} where {expected} was due)",
                chunk.first_page
            )));
        }
        self.received += chunk.pages.len() as u64;
        Ok(Some(chunk.pages))
    }
}

/// A holder of objects on a memory node: what it puts and derives, and what it retains.
///
/// Opening one starts a task on the current tokio runtime that sends KeepAlive every third
/// of the node's lease. [`Session::close`], or dropping the last clone, ends the task and
/// closes the session, releasing its holds; a process that dies without either loses them
/// when the lease runs out.
///
/// Cheap to clone; clones are the same session.
#[derive(Debug, Clone)]
pub struct Session<T> {
    node: MemNode<T>,
    inner: Arc<Lifetime>,
}

/// The session's id and keepalive task; dropping the last handle stops the task, which
/// then closes the session.
#[derive(Debug)]
struct Lifetime {
    id: Bytes,
    lease: Duration,
    /// `true`: close the session; `false`: it is closed already.
    stop: Mutex<Option<oneshot::Sender<bool>>>,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        if let Some(stop) = self
            .stop
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = stop.send(true);
        }
    }
}

impl<T: Transport> Session<T> {
    /// Opens a session on the node at the other end of `transport` (see [`MemNode::open`]).
    ///
    /// # Errors
    /// As [`MemNode::open`].
    pub async fn open(transport: T, holder: &str) -> Result<Session<T>, Status> {
        MemNode::new(transport).open(holder).await
    }

    fn started(node: MemNode<T>, id: Bytes, lease: Duration) -> Session<T> {
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(keep_alive(node.client(), id.clone(), lease, stopped));
        Session {
            node,
            inner: Arc::new(Lifetime {
                id,
                lease,
                stop: Mutex::new(Some(stop)),
            }),
        }
    }

    /// The node's lease: how long the session lives without a KeepAlive.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The node, for what needs no session.
    pub fn node(&self) -> &MemNode<T> {
        &self.node
    }

    /// Stores `data` as a new object held by this session.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` if the node is full or the object over its limit;
    /// `UNAUTHENTICATED` if the session has ended; transport failures.
    pub async fn put(&self, data: &[u8]) -> Result<RemoteRef, Status> {
        self.put_slices(&[data]).await
    }

    /// Stores the concatenation of `slices` (the pages of a local buffer, say) as one
    /// object, without first joining them: each chunk is copied from the slices as it is
    /// sent, so memory stays at a few chunks whatever the length.
    ///
    /// # Errors
    /// As [`Session::put`].
    pub async fn put_slices(&self, slices: &[&[u8]]) -> Result<RemoteRef, Status> {
        let total: u64 = slices.iter().map(|s| s.len() as u64).sum();
        let (chunks, rx) = mpsc::channel(2);
        let mut client = self.node.client();
        let call = client.put(ReceiverStream::new(rx));
        let id = self.inner.id.clone();
        // Owns the sender: when it is done (or the call refused), the stream ends.
        let send = async move {
            let mut first = Some((id, total));
            let mut chunk = BytesMut::new();
            let pieces = slices
                .iter()
                .flat_map(|s| s.chunks(MAX_CHUNK_BYTES))
                .map(Some)
                .chain([None]);
            for piece in pieces {
                if let Some(piece) = piece {
                    let room = MAX_CHUNK_BYTES - chunk.len();
                    if piece.len() <= room {
                        chunk.extend_from_slice(piece);
                        continue;
                    }
                    chunk.extend_from_slice(&piece[..room]);
                    let full = std::mem::replace(&mut chunk, BytesMut::from(&piece[room..]));
                    if !send_put(&chunks, &mut first, full.freeze()).await {
                        return;
                    }
                } else if !chunk.is_empty() || first.is_some() {
                    send_put(&chunks, &mut first, std::mem::take(&mut chunk).freeze()).await;
                }
            }
        };
        tokio::pin!(call);
        let reply = tokio::select! {
            // A refusal ends the call before the data is sent: stop sending.
            reply = &mut call => reply,
            () = send => call.await,
        };
        decode_reply(reply?.into_inner())
    }

    /// The whole object (see [`MemNode::read`]).
    ///
    /// # Errors
    /// As [`MemNode::read`].
    pub async fn read(&self, reference: &RemoteRef) -> Result<Vec<u8>, Status> {
        self.node.read(reference).await
    }

    /// Pages `pages` of the object (see [`MemNode::read_pages`]).
    ///
    /// # Errors
    /// As [`MemNode::read_pages`].
    pub async fn read_pages(
        &self,
        reference: &RemoteRef,
        pages: Range<u64>,
    ) -> Result<Vec<u8>, Status> {
        self.node.read_pages(reference, pages).await
    }

    /// A local view of the object that fetches pages as they are read and keeps writes
    /// private until [`RemoteBuf::publish`]. Fetches nothing yet.
    pub fn map(&self, reference: &RemoteRef) -> RemoteBuf<T> {
        RemoteBuf::new(self.clone(), *reference)
    }

    /// A new object of `len` bytes, held by this session: `base` with `writes` (byte
    /// offset, bytes) applied in order. It shares every page no write touches with `base`,
    /// which never changes; bytes past `base`'s length read as zero until written.
    ///
    /// # Errors
    /// `OUT_OF_RANGE` if a write reaches past `len`; the node's refusal of `base`; as
    /// [`Session::put`].
    pub async fn derive(
        &self,
        base: &RemoteRef,
        len: u64,
        writes: &[(u64, &[u8])],
    ) -> Result<RemoteRef, Status> {
        let mut pages = Vec::new();
        for &(offset, data) in writes {
            let end = offset.checked_add(data.len() as u64).filter(|&e| e <= len);
            if end.is_none() {
                return Err(Status::out_of_range(format!(
                    "a write of {} bytes at {offset} reaches past the new length {len}",
                    data.len()
                )));
            }
            let mut at = offset;
            for piece in split_at_pages(offset, data) {
                pages.push(PageWrite {
                    page: at / PAGE_SIZE as u64,
                    offset: (at % PAGE_SIZE as u64) as u32,
                    data: Bytes::copy_from_slice(piece),
                });
                at += piece.len() as u64;
            }
        }
        self.derive_pages(base, Some(len), pages).await
    }

    /// [`Session::derive`] with the writes already cut at page boundaries.
    pub(crate) async fn derive_pages(
        &self,
        base: &RemoteRef,
        len: Option<u64>,
        writes: Vec<PageWrite>,
    ) -> Result<RemoteRef, Status> {
        let mut chunks = vec![DeriveChunk {
            session: self.inner.id.clone(),
            base: Bytes::copy_from_slice(&base.to_bytes()),
            len,
            writes: Vec::new(),
        }];
        for (i, write) in writes.into_iter().enumerate() {
            if i > 0 && i % PAGES_PER_CHUNK == 0 {
                chunks.push(DeriveChunk::default());
            }
            if let Some(last) = chunks.last_mut() {
                last.writes.push(write);
            }
        }
        let reply = self
            .node
            .client()
            .derive(tokio_stream::iter(chunks))
            .await?;
        decode_reply(reply.into_inner())
    }

    /// This session holds the object too, so it outlives its other holders.
    ///
    /// # Errors
    /// `NOT_FOUND` if nobody holds the object any more; the node's refusal of the
    /// reference; `UNAUTHENTICATED` if the session has ended.
    pub async fn retain(&self, reference: &RemoteRef) -> Result<(), Status> {
        self.node.client().retain(self.hold(reference)).await?;
        Ok(())
    }

    /// This session stops holding the object; with no holder left, the node frees it.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` if this session does not hold it; as [`Session::retain`].
    pub async fn release(&self, reference: &RemoteRef) -> Result<(), Status> {
        self.node.client().release(self.hold(reference)).await?;
        Ok(())
    }

    fn hold(&self, reference: &RemoteRef) -> HoldRequest {
        HoldRequest {
            session: self.inner.id.clone(),
            reference: Bytes::copy_from_slice(&reference.to_bytes()),
        }
    }

    /// Closes the session now (for every clone): its holds are released and objects no
    /// other session holds are freed. Returns how many holds it had.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` if the session had ended already; transport failures.
    pub async fn close(self) -> Result<u64, Status> {
        let stop = self
            .inner
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stop) = stop {
            let _ = stop.send(false);
        }
        let reply = self
            .node
            .client()
            .close(SessionRequest {
                session: self.inner.id.clone(),
            })
            .await?;
        Ok(reply.into_inner().released)
    }
}

/// Sends one Put chunk, the first with the session and total length; `false` once the
/// call has ended.
async fn send_put(
    chunks: &mpsc::Sender<PutChunk>,
    first: &mut Option<(Bytes, u64)>,
    data: Bytes,
) -> bool {
    let (session, total_len) = first.take().unwrap_or_default();
    chunks
        .send(PutChunk {
            session,
            total_len,
            data,
        })
        .await
        .is_ok()
}

/// `data`, written at byte `offset`, cut where pages end.
fn split_at_pages(offset: u64, mut data: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    let mut at = offset;
    while !data.is_empty() {
        let room = PAGE_SIZE - (at % PAGE_SIZE as u64) as usize;
        let (piece, rest) = data.split_at(room.min(data.len()));
        pieces.push(piece);
        at += piece.len() as u64;
        data = rest;
    }
    pieces
}

fn decode_reply(reply: Reference) -> Result<RemoteRef, Status> {
    RemoteRef::from_bytes(&reply.reference)
        .map_err(|e| Status::internal(format!("the memory node answered with no reference: {e}")))
}

/// Sends KeepAlive every third of the lease until stopped, then closes the session unless
/// told it is closed already. Ends early if the node no longer knows the session.
async fn keep_alive<T: Transport>(
    mut client: MemNodeClient<T>,
    id: Bytes,
    lease: Duration,
    mut stopped: oneshot::Receiver<bool>,
) {
    let period = (lease / 3).max(Duration::from_millis(1));
    loop {
        tokio::select! {
            stop = &mut stopped => {
                // A dropped sender (the runtime ends) closes too: the lease would anyway.
                if stop.unwrap_or(true) {
                    let _ = client.close(SessionRequest { session: id }).await;
                }
                return;
            }
            () = tokio::time::sleep(period) => {
                let request = SessionRequest { session: id.clone() };
                if let Err(status) = client.keep_alive(request).await {
                    if status.code() == Code::Unauthenticated {
                        return;
                    }
                    // Anything else may pass (a node restarting, a network blip): the next
                    // period tries again, within the lease.
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_at_pages;

    #[test]
    fn writes_are_cut_where_pages_end() {
        let data = vec![1u8; 10_000];
        let pieces = split_at_pages(4000, &data);
        let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [96, 4096, 4096, 1712]);
        assert!(split_at_pages(5, &[]).is_empty());
        assert_eq!(split_at_pages(4096, &[1; 4096]).len(), 1);
    }
}
