//! [`RemoteBuf`]: a local view of a memory-node object that fetches pages on demand and
//! copies a page before writing it (page-granular copy-on-write), so what it writes reaches
//! nobody until it publishes a new object, and the original never changes.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;
use tonic::Status;

use crate::client::{Session, Transport};
use crate::proto::PageWrite;
use crate::{RemoteRef, PAGE_SIZE};

const PAGE: u64 = PAGE_SIZE as u64;

/// The most pages one Read of a view asks for (4 MiB): the size of the list of pages it
/// builds at once.
const PAGES_PER_FETCH: u64 = 1024;

#[derive(Debug)]
enum Page {
    /// As fetched: the object's bytes.
    Clean(Bytes),
    /// A private copy, written.
    Dirty(Vec<u8>),
}

impl Page {
    fn bytes(&self) -> &[u8] {
        match self {
            Page::Clean(b) => b,
            Page::Dirty(v) => v,
        }
    }
}

/// An object on a memory node, seen through a local page cache ([`Session::map`]).
///
/// [`read`](RemoteBuf::read) fetches only the pages it needs and has not fetched yet, a
/// run of adjacent pages at a time; [`write`](RemoteBuf::write) writes private copies of the
/// pages it touches (fetching only those it covers partly); [`publish`](RemoteBuf::publish)
/// sends only the written pages and makes a new object sharing all the others with the
/// base. The base object never changes, so the caller that passed its reference keeps
/// seeing what it put.
///
/// ```no_run
/// # async fn run(session: netless_memnode::Session<tonic::transport::Channel>, r: netless_memnode::RemoteRef) -> Result<(), tonic::Status> {
/// let mut view = session.map(&r);
/// let header = view.read(0..64).await?;         // one page fetched
/// view.write(8192, &[0xff; 16]).await?;         // page 2, copied then written
/// let edited = view.publish().await?;           // page 2 sent; the rest shared with r
/// # drop((header, edited)); Ok(()) }
/// ```
#[derive(Debug)]
pub struct RemoteBuf<T> {
    session: Session<T>,
    base: RemoteRef,
    pages: BTreeMap<u64, Page>,
    fetched: u64,
}

impl<T: Transport> RemoteBuf<T> {
    pub(crate) fn new(session: Session<T>, base: RemoteRef) -> RemoteBuf<T> {
        RemoteBuf {
            session,
            base,
            pages: BTreeMap::new(),
            fetched: 0,
        }
    }

    /// The object's length in bytes, as the reference says (the node checks it on the first
    /// fetch).
    pub fn len(&self) -> u64 {
        self.base.len()
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.base.is_empty()
    }

    /// The object this view reads: the mapped one, or the last one published.
    pub fn base(&self) -> &RemoteRef {
        &self.base
    }

    /// Pages fetched from the node so far.
    pub fn fetched_pages(&self) -> u64 {
        self.fetched
    }

    /// Pages written and not yet published.
    pub fn dirty_pages(&self) -> usize {
        self.pages
            .values()
            .filter(|p| matches!(p, Page::Dirty(_)))
            .count()
    }

    /// Bytes `range` of the object, as this view sees them (its own writes included).
    ///
    /// The pages missing from the cache are fetched a run at a time, at most 1024 pages
    /// (4 MiB) a call, and the reply is sized only once they are: the node checks the
    /// reference on the first call, so a forged length costs one refused call and nothing
    /// in proportion to it.
    ///
    /// # Errors
    /// `OUT_OF_RANGE` if `range` reaches past the object; the node's refusal of the
    /// reference; transport failures.
    pub async fn read(&mut self, range: Range<u64>) -> Result<Vec<u8>, Status> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let pages = range.start / PAGE..range.end.div_ceil(PAGE);
        self.fetch(pages.clone()).await?;
        // Every page of the range is in the cache now, fetched (the node accepted the
        // reference) or written: the range is no longer than memory already held.
        let mut out = Vec::with_capacity(usize::try_from(range.end - range.start).unwrap_or(0));
        for (&i, page) in self.pages.range(pages) {
            let from = range.start.saturating_sub(i * PAGE) as usize;
            let to = ((range.end - i * PAGE).min(PAGE) as usize).min(page.bytes().len());
            out.extend_from_slice(&page.bytes()[from..to]);
        }
        Ok(out)
    }

    /// The whole object, as this view sees it.
    ///
    /// # Errors
    /// As [`RemoteBuf::read`].
    pub async fn to_vec(&mut self) -> Result<Vec<u8>, Status> {
        self.read(0..self.len()).await
    }

    /// Writes `data` at byte `offset`, into private copies of the pages it touches; the
    /// object on the node is untouched.
    ///
    /// # Errors
    /// `OUT_OF_RANGE` if the write reaches past the object; as [`RemoteBuf::read`] for the
    /// pages it covers only partly, which it fetches first.
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Status> {
        let end = offset.saturating_add(data.len() as u64);
        self.check(&(offset..end))?;
        if data.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / PAGE, (end - 1) / PAGE);
        // Only a page written in part needs its old bytes.
        for i in [first, last] {
            if (offset > i * PAGE || end < (i * PAGE + self.page_len(i)))
                && !self.pages.contains_key(&i)
            {
                self.fetch(i..i + 1).await?;
            }
        }
        for i in first..=last {
            let valid = self.page_len(i) as usize;
            let page = self
                .pages
                .entry(i)
                .or_insert_with(|| Page::Dirty(vec![0; valid]));
            if let Page::Clean(bytes) = page {
                *page = Page::Dirty(bytes.to_vec());
            }
            let Page::Dirty(bytes) = page else {
                continue;
            };
            let from = offset.max(i * PAGE);
            let to = end.min(i * PAGE + valid as u64);
            let (at, src) = ((from - i * PAGE) as usize, (from - offset) as usize);
            bytes[at..at + (to - from) as usize]
                .copy_from_slice(&data[src..src + (to - from) as usize]);
        }
        Ok(())
    }

    /// Makes a new object from this view, held by the view's session: only the written
    /// pages travel, every other page is shared with the base on the node. The view then
    /// reads the new object, and later writes build on it.
    ///
    /// # Errors
    /// `NOT_FOUND` if the base is no longer held; `RESOURCE_EXHAUSTED` if the node is
    /// full; `UNAUTHENTICATED` if the session has ended; transport failures.
    pub async fn publish(&mut self) -> Result<RemoteRef, Status> {
        let writes = self
            .pages
            .iter()
            .filter_map(|(&page, p)| match p {
                Page::Dirty(bytes) => Some(PageWrite {
                    page,
                    offset: 0,
                    data: Bytes::copy_from_slice(bytes),
                }),
                Page::Clean(_) => None,
            })
            .collect();
        let published = self.session.derive_pages(&self.base, None, writes).await?;
        for page in self.pages.values_mut() {
            if let Page::Dirty(bytes) = page {
                *page = Page::Clean(Bytes::from(std::mem::take(bytes)));
            }
        }
        self.base = published;
        Ok(published)
    }

    fn check(&self, range: &Range<u64>) -> Result<(), Status> {
        if range.start > range.end || range.end > self.len() {
            return Err(Status::out_of_range(format!(
                "bytes {}..{} are outside this object of {} bytes",
                range.start,
                range.end,
                self.len()
            )));
        }
        Ok(())
    }

    /// Bytes of page `i` within the object.
    fn page_len(&self, i: u64) -> u64 {
        self.len().saturating_sub(i * PAGE).min(PAGE)
    }

    /// Fetches the pages of `pages` not in the cache, a run of adjacent ones per call and
    /// at most [`PAGES_PER_FETCH`] a call. Each run is found when it is fetched, by walking
    /// the cache, so nothing here grows with the range: until the node has accepted the
    /// reference (the first call does), its length has cost nothing.
    async fn fetch(&mut self, pages: Range<u64>) -> Result<(), Status> {
        let mut next = pages.start;
        while let Some(start) = self.first_missing(next..pages.end) {
            let limit = pages.end.min(start.saturating_add(PAGES_PER_FETCH));
            let end = self
                .pages
                .range(start..limit)
                .next()
                .map_or(limit, |(&cached, _)| cached);
            let fetched = self
                .session
                .node()
                .page_list(&self.base, start..end)
                .await?;
            for (i, page) in (start..end).zip(fetched) {
                if page.len() as u64 != self.page_len(i) {
                    return Err(Status::internal(format!(
                        "the memory node sent {} bytes for page {i}, which holds {}",
                        page.len(),
                        self.page_len(i)
                    )));
                }
                self.pages.insert(i, Page::Clean(page));
                self.fetched += 1;
            }
            next = end;
        }
        Ok(())
    }

    /// The first page of `pages` not in the cache: a walk over the cached ones before it.
    fn first_missing(&self, pages: Range<u64>) -> Option<u64> {
        let mut at = pages.start;
        for &cached in self.pages.range(pages.clone()).map(|(i, _)| i) {
            if cached != at {
                break;
            }
            at += 1;
        }
        (at < pages.end).then_some(at)
    }
}
