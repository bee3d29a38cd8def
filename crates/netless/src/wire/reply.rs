//! The bytes of a reply record in a response ring: the server encodes a batch of compact
//! replies ([`ReplyBatch`]); clients validate and decode every record they read
//! ([`parse_response`], [`for_each_compact_reply`]).
//!
//! The records live in memory the server writes: nothing here trusts a length before it is
//! checked against the record, and a malformed record is an error for the caller to close the
//! connection with, never a panic.

use crate::status::{Code, ReplyCode, Status};
use crate::wire::header::{
    align8, kind, CompactReply, ResponseHeader, COMPACT_REPLY_LEN, RESPONSE_HEADER_LEN,
};
use crate::wire::metadata::Metadata;

/// What a connection's response ring takes: the largest reply body its client accepts (from
/// its `Hello`) and the longest record the ring holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordLimits {
    /// The largest reply body the client accepts.
    pub(crate) client_max: usize,
    /// The longest record the ring takes.
    pub(crate) record_limit: usize,
}

/// Validates a response record from the ring (memory the server writes): its header, shape
/// and status code. Returns the header, the code and the fragment of body it carries.
pub(crate) fn parse_response(
    body: &[u8],
    max_message: usize,
) -> Result<(ResponseHeader, ReplyCode, &[u8]), &'static str> {
    if body.len() < RESPONSE_HEADER_LEN {
        return Err("record shorter than a header");
    }
    // SAFETY: body has at least RESPONSE_HEADER_LEN bytes.
    let h = unsafe { ResponseHeader::read_from(body.as_ptr()) };
    if h.kind != kind::RESPONSE {
        return Err("not a response");
    }
    h.validate_shape(max_message, body.len() - RESPONSE_HEADER_LEN)?;
    let code = ReplyCode::from_wire(h.status).ok_or("unknown status code")?;
    let fragment = &body[RESPONSE_HEADER_LEN..RESPONSE_HEADER_LEN + h.frag_len as usize];
    Ok((h, code, fragment))
}

/// Decodes a whole response body: metadata, then payload (or the status message).
pub(crate) fn decode_body(
    h: &ResponseHeader,
    code: ReplyCode,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<Metadata, Status> {
    let md_end = h.metadata_len as usize;
    let metadata = Metadata::decode(&body[..md_end])?;
    let rest = &body[md_end..];
    if code.code == Code::Ok {
        netless_shm::copy::extend(out, rest);
        Ok(metadata)
    } else {
        Err(code.status(rest))
    }
}

/// Replies gathered for one connection, sent as one `RESPONSE_BATCH` ring record of
/// `CompactReply` entries. Only a connection that sent compact batches (a `Pipeline`,
/// which reads such records) gets one.
#[derive(Default)]
pub(crate) struct ReplyBatch {
    bytes: Vec<u8>,
    count: u32,
}

impl ReplyBatch {
    /// The entry's length, if this reply to `call_id` may go in a batch to the connection: whole,
    /// fitting a `CompactReply`'s fields (call id under 2^32, body under 64 KiB, metadata
    /// under 256 bytes), within the client's limit, at most half a record.
    pub(crate) fn entry_len(
        limits: RecordLimits,
        call_id: u64,
        md_len: usize,
        payload_len: usize,
    ) -> Option<usize> {
        let body_len = md_len + payload_len;
        let entry = COMPACT_REPLY_LEN + body_len;
        (call_id <= u64::from(u32::MAX)
            && md_len <= usize::from(u8::MAX)
            && body_len <= usize::from(u16::MAX)
            && body_len <= limits.client_max
            && entry <= (limits.record_limit - RESPONSE_HEADER_LEN) / 2)
            .then_some(entry)
    }

    /// Whether an entry of `entry` bytes still fits this batch's record for the connection.
    pub(crate) fn fits(&self, limits: RecordLimits, entry: usize) -> bool {
        align8(self.bytes.len()) + entry <= limits.record_limit - RESPONSE_HEADER_LEN
    }

    /// Appends a reply that `entry_len` admitted (so its fields fit their widths). Inline:
    /// a batch's replies go through here one by one.
    #[inline(always)]
    pub(crate) fn push(
        &mut self,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) {
        let md_len = metadata.encoded_len();
        let len = self.bytes.len();
        let at = align8(len);
        // One reservation for the padding, header and body: nothing below grows the buffer.
        self.bytes
            .reserve(at - len + COMPACT_REPLY_LEN + md_len + payload.len());
        let header = CompactReply {
            call_id: call_id as u32,
            body_len: (md_len + payload.len()) as u16,
            metadata_len: md_len as u8,
            status: code.wire8(),
        };
        // SAFETY: capacity >= at + COMPACT_REPLY_LEN >= len + 8 (reserved above); eight zero
        // bytes at `len` (the padding) and the header at `at` fill `len..at + 8` first.
        unsafe {
            let base = self.bytes.as_mut_ptr();
            base.add(len).cast::<u64>().write_unaligned(0);
            let header = header.as_bytes();
            std::ptr::copy_nonoverlapping(header.as_ptr(), base.add(at), COMPACT_REPLY_LEN);
            self.bytes.set_len(at + COMPACT_REPLY_LEN);
        }
        if md_len != 0 {
            metadata.encode_into(&mut self.bytes);
        }
        let len = self.bytes.len();
        // SAFETY: the reservation covers the payload after the metadata; the bytes are
        // written before `set_len` exposes them, and `payload` cannot overlap our buffer.
        unsafe {
            let dst = self.bytes.as_mut_ptr().add(len);
            netless_shm::copy::copy_bytes(payload.as_ptr(), dst, payload.len());
            self.bytes.set_len(len + payload.len());
        }
        self.count += 1;
    }

    /// Whether it holds no reply.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The record's header and body, to push into the ring.
    pub(crate) fn record(&self) -> (ResponseHeader, &[u8]) {
        let header = ResponseHeader {
            kind: kind::RESPONSE_BATCH,
            body_len: self.bytes.len() as u32,
            frag_len: self.bytes.len() as u32,
            reserved: self.count,
            ..ResponseHeader::default()
        };
        (header, &self.bytes)
    }

    /// Empties it, keeping its allocation.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }
}

/// A reply's outcome from its status code, metadata encoding and the rest of its body.
#[inline]
pub(crate) fn outcome<'b>(
    code: ReplyCode,
    metadata: &[u8],
    rest: &'b [u8],
) -> Result<&'b [u8], Status> {
    // Inline up to here: most replies are OK and carry no metadata.
    if metadata.is_empty() && code.code == Code::Ok {
        return Ok(rest);
    }
    outcome_of_the_rest(code, metadata, rest)
}

/// [`outcome`] of a reply with metadata or an error status (out of line).
#[inline(never)]
fn outcome_of_the_rest<'b>(
    code: ReplyCode,
    metadata: &[u8],
    rest: &'b [u8],
) -> Result<&'b [u8], Status> {
    if !metadata.is_empty() {
        Metadata::decode(metadata)?;
    }
    if code.code == Code::Ok {
        Ok(rest)
    } else {
        Err(code.status(rest))
    }
}

/// Whether a ring record holds a batch of compact replies (`kind::RESPONSE_BATCH`).
pub(crate) fn is_reply_batch(record: &[u8]) -> bool {
    // SAFETY: at least RESPONSE_HEADER_LEN bytes (checked first).
    record.len() >= RESPONSE_HEADER_LEN
        && unsafe { ResponseHeader::read_from(record.as_ptr()) }.kind == kind::RESPONSE_BATCH
}

/// Validates a `RESPONSE_BATCH` record (memory the server writes) and calls `each(call id,
/// code, (metadata, rest of body))` for every reply in it, in order; returns how many. Stops
/// at the first thing wrong (or `each`'s error): the connection is then closed.
pub(crate) fn for_each_compact_reply(
    record: &[u8],
    max_message: usize,
    mut each: impl FnMut(u64, ReplyCode, (&[u8], &[u8])) -> Result<(), &'static str>,
) -> Result<usize, &'static str> {
    if record.len() < RESPONSE_HEADER_LEN {
        return Err("record shorter than a header");
    }
    // SAFETY: record holds at least RESPONSE_HEADER_LEN bytes (checked just above).
    let h = unsafe { ResponseHeader::read_from(record.as_ptr()) };
    let len = h.body_len as usize;
    if h.frag_offset != 0 || h.frag_len != h.body_len || len > record.len() - RESPONSE_HEADER_LEN {
        return Err("a reply batch longer than its record");
    }
    let entries = &record[RESPONSE_HEADER_LEN..RESPONSE_HEADER_LEN + len];
    let (mut offset, mut count) = (0usize, 0usize);
    while offset < len {
        if len - offset < COMPACT_REPLY_LEN {
            return Err("a compact reply header cut short");
        }
        // SAFETY: offset + COMPACT_REPLY_LEN <= len: a whole header inside `entries`.
        let r = unsafe { CompactReply::read_from(entries.as_ptr().add(offset)) };
        let (body_len, md_len) = (r.body_len as usize, usize::from(r.metadata_len));
        let body_at = offset + COMPACT_REPLY_LEN;
        if body_len > len - body_at || md_len > body_len || body_len > max_message {
            return Err("a compact reply longer than its batch");
        }
        let code = ReplyCode::from_wire8(r.status).ok_or("unknown status code")?;
        let body = &entries[body_at..body_at + body_len];
        each(u64::from(r.call_id), code, body.split_at(md_len))?;
        count += 1;
        offset = align8(body_at + body_len);
    }
    if count != h.reserved as usize {
        return Err("a reply batch holding another number of replies than it says");
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `RESPONSE_BATCH` record as a server writes it: `(call id, status, metadata, payload)`.
    fn batch(replies: &[(u32, u8, &[u8], &[u8])]) -> Vec<u8> {
        let mut entries = Vec::new();
        for (id, status, md, payload) in replies {
            entries.resize(align8(entries.len()), 0);
            let r = CompactReply {
                call_id: *id,
                body_len: (md.len() + payload.len()) as u16,
                metadata_len: md.len() as u8,
                status: *status,
            };
            entries.extend_from_slice(r.as_bytes());
            entries.extend_from_slice(md);
            entries.extend_from_slice(payload);
        }
        let h = ResponseHeader {
            kind: kind::RESPONSE_BATCH,
            body_len: entries.len() as u32,
            frag_len: entries.len() as u32,
            reserved: replies.len() as u32,
            ..ResponseHeader::default()
        };
        let mut record = h.as_bytes().to_vec();
        record.extend_from_slice(&entries);
        record
    }

    /// Each reply's call id and outcome.
    type Delivered = Vec<(u64, Result<Vec<u8>, Status>)>;

    fn collect(record: &[u8]) -> Result<Delivered, &'static str> {
        let mut got = Vec::new();
        for_each_compact_reply(record, 1 << 20, |id, code, (md, rest)| {
            got.push((id, outcome(code, md, rest).map(<[u8]>::to_vec)));
            Ok(())
        })?;
        Ok(got)
    }

    #[test]
    fn compact_replies_come_out_in_order_with_their_outcomes() {
        let mut md = Vec::new();
        let mut m = Metadata::new();
        m.insert("k", "v");
        m.encode_into(&mut md);
        let record = batch(&[
            (1, 0, b"", b"one"),
            (2, 5, b"", b"no such thing"),
            (3, 0, &md, b"three, with metadata"),
            (4, 0, b"", b""),
        ]);
        assert!(is_reply_batch(&record));
        let got = collect(&record).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (1, Ok(b"one".to_vec())));
        assert_eq!(got[1].1.as_ref().unwrap_err().code(), Code::NotFound);
        assert_eq!(got[2], (3, Ok(b"three, with metadata".to_vec())));
        assert_eq!(got[3], (4, Ok(Vec::new())));
    }

    #[test]
    fn a_reply_batch_reads_back_as_the_server_wrote_it() {
        let limits = RecordLimits {
            client_max: 1 << 20,
            record_limit: 4096,
        };
        let mut md = Metadata::new();
        md.insert("k", "v");
        let mut batch = ReplyBatch::default();
        for (id, payload) in [(1u64, &b"one"[..]), (2, b""), (3, b"three")] {
            let entry = ReplyBatch::entry_len(limits, id, md.encoded_len(), payload.len());
            let entry = entry.expect("a short reply fits a batch");
            assert!(batch.fits(limits, entry));
            batch.push(id, Code::Ok.into(), &md, payload);
        }
        let (header, body) = batch.record();
        let mut record = header.as_bytes().to_vec();
        record.extend_from_slice(body);
        let got = collect(&record).unwrap();
        let ids: Vec<u64> = got.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(got[2].1.as_ref().unwrap(), b"three");
        // Call ids of 2^32 and more, and bodies of 64 KiB and more, take records of their own.
        assert!(ReplyBatch::entry_len(limits, 1 << 32, 0, 1).is_none());
        assert!(ReplyBatch::entry_len(limits, 1, 0, 1 << 16).is_none());
        batch.clear();
        assert!(batch.is_empty());
    }

    #[test]
    fn malformed_reply_batches_are_refused() {
        let good = batch(&[(1, 0, b"", b"one"), (2, 0, b"", b"two")]);
        // The record says it holds more bytes than it does.
        let mut long = good.clone();
        long[12..16].copy_from_slice(&10_000u32.to_le_bytes());
        long[20..24].copy_from_slice(&10_000u32.to_le_bytes());
        assert!(collect(&long).is_err());
        // A reply whose body runs past the batch.
        let mut past = good.clone();
        past[32 + 4..32 + 6].copy_from_slice(&5_000u16.to_le_bytes());
        assert!(collect(&past).is_err());
        // Metadata longer than the body.
        let mut md = good.clone();
        md[32 + 6] = 9;
        assert!(collect(&md).is_err());
        // An unknown status code.
        let mut status = good.clone();
        status[32 + 7] = 99;
        assert!(collect(&status).is_err());
        // A NOT_RUN bit on a code other than RESOURCE_EXHAUSTED.
        let mut status = good.clone();
        status[32 + 7] = 0x80 | Code::Internal as u8;
        assert!(collect(&status).is_err());
        // Another count than the replies it holds.
        let mut count = good.clone();
        count[28..32].copy_from_slice(&3u32.to_le_bytes());
        assert!(collect(&count).is_err());
        // A header cut short at the end.
        let mut cut = good.clone();
        cut.resize(32 + align8(cut.len() - 32), 0);
        cut.extend_from_slice(&[0; 4]);
        let len = (cut.len() - 32) as u32;
        cut[12..16].copy_from_slice(&len.to_le_bytes());
        cut[20..24].copy_from_slice(&len.to_le_bytes());
        assert!(collect(&cut).is_err());
        // A record shorter than its header.
        assert!(collect(&good[..RESPONSE_HEADER_LEN - 1]).is_err());
        assert!(collect(&[]).is_err());
        // Garbage metadata fails that call only.
        let bad_md = batch(&[(1, 0, &[0xff, 1, 2], b"x")]);
        let got = collect(&bad_md).unwrap();
        assert!(got[0].1.is_err());
        assert!(collect(&good).is_ok());
    }
}
