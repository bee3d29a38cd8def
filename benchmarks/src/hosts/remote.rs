//! The memory node as the chain's processes use it: one session per process, a put per
//! by-reference call (the caller's array, fresh each call) and a read by the last tier. It
//! owns the session and the conversion of statuses; the node itself is `netless memnode`.

use netless_memnode::{RemoteRef, Session};
use tonic::Status;

/// A process's session with the memory node.
#[derive(Debug)]
pub struct Memory {
    session: Session<tonic::transport::Channel>,
}

impl Memory {
    /// Opens a session with the node at `uri` (`http://ADDR`), as holder `holder`.
    pub async fn open(uri: &str, holder: &str) -> anyhow::Result<Memory> {
        let channel = tonic::transport::Endpoint::from_shared(uri.to_string())?.connect_lazy();
        let session = Session::open(channel, holder).await?;
        Ok(Memory { session })
    }

    /// Puts `data` on the node: its reference, held by this session until released.
    pub async fn put(&self, data: &[u8]) -> Result<Vec<u8>, Status> {
        Ok(self.session.put(data).await?.to_bytes().to_vec())
    }

    /// Lets go of a reference [`Memory::put`] returned.
    pub async fn release(&self, reference: &[u8]) -> Result<(), Status> {
        let reference = RemoteRef::from_bytes(reference)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.session.release(&reference).await
    }

    /// Reads the pages `reference` names and sums their bytes.
    pub async fn sum(&self, reference: &[u8]) -> Result<u64, Status> {
        let reference = RemoteRef::from_bytes(reference)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let data = self.session.read(&reference).await?;
        Ok(super::tier::byte_sum(&data))
    }
}
