//! The message headers in front of every request and response, as they lie in shared memory:
//! the 64-byte `WireHeader`, its 32-byte short form for a whole plain request, the 8-byte
//! compact header of each later request of a batch, the 32-byte `ResponseHeader` of a reply
//! record and the 8-byte `CompactReply` of each reply in a batch record.
//!
//! Every header here is plain integers (`#[repr(C)]`, any bit pattern is a valid value),
//! read from shared memory as one copy and validated (`validate_shape`) before any length in
//! it is used; nothing here trusts a peer, and nothing here touches a segment.

/// Message kinds in [`WireHeader::kind`].
pub(crate) mod kind {
    /// A request (or a fragment of one), client → server.
    pub(crate) const REQUEST: u16 = 1;
    /// A response (or a fragment of one), server → client.
    pub(crate) const RESPONSE: u16 = 2;
    /// A ring record holding several whole responses, each behind a [`CompactReply`]
    /// (super::CompactReply): the replies to a compact request batch.
    pub(crate) const RESPONSE_BATCH: u16 = 3;
    /// A whole request behind a 32-byte [`ShortHeader`](super::ShortHeader) instead of a
    /// `WireHeader` (protocol 9 and later). Only at the start of a block run.
    pub(crate) const REQUEST_SHORT: u16 = 4;
}

/// Bits of [`WireHeader::reserved`]`[0]` (request flags).
pub(crate) mod wire_flags {
    /// The payload is a 32-byte `netless_pool::Ref` to the real payload in the domain's page
    /// pool (pass by reference); only on connections whose two sides share a domain.
    pub(crate) const PAYLOAD_REF: u32 = 1;
    /// Another whole request of the same connection follows in the same run (a batch: one
    /// queue entry for several requests), behind a [`CompactHeader`](super::CompactHeader):
    /// only with [`BATCH_COMPACT`]. (Batches of full headers, each at the 64-byte boundary
    /// after the previous body, are refused since protocol 9; no client sent them since
    /// compact batches came in protocol 4.)
    pub(crate) const BATCH_MORE: u32 = 2;
    /// Set on the first request of a batch whose other requests each carry an 8-byte
    /// [`CompactHeader`](super::CompactHeader) instead of a `WireHeader`, at the first 8-byte
    /// boundary after the previous request's body (see there).
    pub(crate) const BATCH_COMPACT: u32 = 4;
    /// Set on the first request of a run the client keeps: the server leaves the run's
    /// blocks OWNED by the client when it has read it, and the client writes its next batch
    /// there once every request in it is answered (a `Pipeline`'s runs, so a steady stream
    /// of batches claims and frees no blocks: no CAS per block, and the block table's lines
    /// stay put). The server reads the run only before it sends the last of its replies.
    pub(crate) const KEEP_BLOCKS: u32 = 8;
}

/// The header of each request after the first in a compact batch
/// ([`wire_flags::BATCH_COMPACT`]): what differs from call to call, 8 bytes where a
/// `WireHeader` takes 64, so a batch of small requests moves about half as many cache lines
/// and claims half as many blocks. Everything else is the batch's first request's:
/// connection, token and kind. A compact request carries no metadata, no deadline and no
/// Ref, and is never a fragment; its body (`method ++ payload`, `body_len` bytes) follows the
/// header, and the next header starts at the first 8-byte boundary after it. Requests that do
/// not fit its fields (a call id of 2^32 or more, a body of 64 KiB or more, a method name of
/// 256 bytes or more) take a batch's first place, with a full header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CompactHeader {
    /// Chosen by the client; the response echoes it (as a `u64`, these bits zero-extended).
    pub(crate) call_id: u32,
    /// Length of the whole body.
    pub(crate) body_len: u16,
    /// Length of the method name at the start of the body.
    pub(crate) method_len: u8,
    /// [`compact_flags`].
    pub(crate) flags: u8,
}
/// Size of [`CompactHeader`].
pub(crate) const COMPACT_HEADER_LEN: usize = 8;
const _: () = assert!(std::mem::size_of::<CompactHeader>() == COMPACT_HEADER_LEN);

/// Bits of [`CompactHeader::flags`].
pub(crate) mod compact_flags {
    /// Another compact request follows this one in the batch.
    pub(crate) const MORE: u8 = 1;
    /// This request calls the same method as the one before it in the batch, and its body
    /// holds no method name (`method_len` is 0): most batches repeat one method, so the name
    /// need not move again (as HTTP/2 indexes a repeated `:path`). Protocol 7 and later.
    pub(crate) const SAME_METHOD: u8 = 2;
}

impl CompactHeader {
    /// The header as bytes, to copy into shared memory.
    pub(crate) fn as_bytes(&self) -> &[u8; COMPACT_HEADER_LEN] {
        // SAFETY: CompactHeader is repr(C), 8 bytes of plain integers with no padding
        // (checked by the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const CompactHeader as *const [u8; COMPACT_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `CompactHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`COMPACT_HEADER_LEN`] bytes.
    pub(crate) unsafe fn read_from(src: *const u8) -> CompactHeader {
        // SAFETY: the caller guarantees 8 readable bytes; read_unaligned copies them without
        // assuming alignment, and every bit pattern is a valid CompactHeader.
        unsafe { std::ptr::read_unaligned(src as *const CompactHeader) }
    }

    /// Checks the body's length against `max_message` and `room` (the bytes left in the run
    /// after this header), and the method's against the body: what `validate_shape` checks
    /// of the header `expand` makes (whole, no metadata), in the same order and words,
    /// without making it.
    #[inline]
    pub(crate) fn validate_shape(
        &self,
        max_message: usize,
        room: usize,
    ) -> Result<(), &'static str> {
        let body = usize::from(self.body_len);
        if body > max_message {
            return Err("body longer than the maximum message size");
        }
        if body > room {
            return Err("fragment longer than its container");
        }
        if usize::from(self.method_len) > body {
            return Err("method and metadata longer than the body");
        }
        Ok(())
    }

    /// The full header this compact one stands for, in the batch that `first` opens: the
    /// connection's fields from `first`, the call's from here; no metadata, no deadline,
    /// no flags, one whole fragment. Its shape still needs `validate_shape`.
    pub(crate) fn expand(&self, first: &WireHeader) -> WireHeader {
        WireHeader {
            token: first.token,
            call_id: u64::from(self.call_id),
            deadline_ns: 0,
            conn_index: first.conn_index,
            kind: first.kind,
            status: 0,
            body_len: u32::from(self.body_len),
            frag_offset: 0,
            frag_len: u32::from(self.body_len),
            method_len: u32::from(self.method_len),
            metadata_len: 0,
            nblocks: 0,
            reserved: [0, 0],
        }
    }
}

/// The 32-byte header of a request that needs none of a `WireHeader`'s other fields: whole,
/// no metadata, no deadline, no enqueue stamp (so no SLO), a method name under 64 KiB and a
/// run under 65 536 blocks. It replaces the `WireHeader` at the start of a run
/// ([`kind::REQUEST_SHORT`]), so a 64-byte echo with its 4-byte method name takes two
/// 64-byte blocks (cache lines) instead of three: every lone request and the first of every
/// batch. The body follows at byte 32.
///
/// `token`, `call_id`, `conn_index` and `kind` lie where a `WireHeader` has them, so the
/// server reads 64 bytes at a run's start as before and tells the forms apart by `kind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShortHeader {
    /// The connection's secret token.
    pub(crate) token: u64,
    /// Chosen by the client; the response echoes it.
    pub(crate) call_id: u64,
    /// Length of the whole body (`method ++ payload`).
    pub(crate) body_len: u32,
    /// Length of the method name at the start of the body.
    pub(crate) method_len: u16,
    /// [`wire_flags`], as in `WireHeader::reserved[0]`.
    pub(crate) flags: u16,
    /// The connection's index in the server's table.
    pub(crate) conn_index: u32,
    /// [`kind::REQUEST_SHORT`].
    pub(crate) kind: u16,
    /// Number of blocks in the run holding the request.
    pub(crate) nblocks: u16,
}
/// Size of [`ShortHeader`].
pub(crate) const SHORT_HEADER_LEN: usize = 32;
const _: () = assert!(std::mem::size_of::<ShortHeader>() == SHORT_HEADER_LEN);
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(ShortHeader, token) == offset_of!(WireHeader, token));
    assert!(offset_of!(ShortHeader, call_id) == offset_of!(WireHeader, call_id));
    assert!(offset_of!(ShortHeader, conn_index) == offset_of!(WireHeader, conn_index));
    assert!(offset_of!(ShortHeader, kind) == offset_of!(WireHeader, kind));
};

impl ShortHeader {
    /// The short form of request header `h`, if it has one (see the type's docs).
    pub(crate) fn of(h: &WireHeader) -> Option<ShortHeader> {
        let plain = h.kind == kind::REQUEST
            && h.deadline_ns == 0
            && h.status == 0
            && h.metadata_len == 0
            && h.frag_offset == 0
            && h.frag_len == h.body_len
            && h.reserved[1] == 0;
        if !plain {
            return None;
        }
        Some(ShortHeader {
            token: h.token,
            call_id: h.call_id,
            body_len: h.body_len,
            method_len: u16::try_from(h.method_len).ok()?,
            flags: u16::try_from(h.reserved[0]).ok()?,
            conn_index: h.conn_index,
            kind: kind::REQUEST_SHORT,
            nblocks: u16::try_from(h.nblocks).ok()?,
        })
    }

    /// The header as bytes, to copy into shared memory.
    pub(crate) fn as_bytes(&self) -> &[u8; SHORT_HEADER_LEN] {
        // SAFETY: ShortHeader is repr(C), 32 bytes of plain integers with no padding (checked
        // by the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const ShortHeader as *const [u8; SHORT_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `ShortHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`SHORT_HEADER_LEN`] bytes.
    #[inline(always)]
    pub(crate) unsafe fn read_from(src: *const u8) -> ShortHeader {
        // read_unaligned copies the bytes without assuming alignment, and every bit pattern is
        // a valid ShortHeader.
        // SAFETY: the caller guarantees 32 readable bytes, as just said.
        unsafe { std::ptr::read_unaligned(src as *const ShortHeader) }
    }

    /// The full header this short one stands for: a whole request, no metadata, no deadline,
    /// no stamp. Its shape still needs `validate_shape`.
    pub(crate) fn expand(&self) -> WireHeader {
        WireHeader {
            token: self.token,
            call_id: self.call_id,
            deadline_ns: 0,
            conn_index: self.conn_index,
            kind: kind::REQUEST,
            status: 0,
            body_len: self.body_len,
            frag_offset: 0,
            frag_len: self.body_len,
            method_len: u32::from(self.method_len),
            metadata_len: 0,
            nblocks: u32::from(self.nblocks),
            reserved: [u32::from(self.flags), 0],
        }
    }
}

/// The 64-byte header in front of every message.
///
/// A message body is `method bytes ++ metadata encoding ++ payload`, `body_len` bytes in all.
/// Bodies too large for one block run (requests) or one ring record (responses) travel as
/// fragments: each carries `frag_len` bytes of the body starting at `frag_offset`. For an error
/// response the payload is the UTF-8 status message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WireHeader {
    /// Request: the connection's secret token. Response: zero.
    pub(crate) token: u64,
    /// Chosen by the client; the response echoes it.
    pub(crate) call_id: u64,
    /// CLOCK_MONOTONIC nanoseconds after which the client no longer waits; 0 for none.
    pub(crate) deadline_ns: u64,
    /// Request: the connection's index in the server's table.
    pub(crate) conn_index: u32,
    /// One of [`kind`].
    pub(crate) kind: u16,
    /// Response: the gRPC status code.
    pub(crate) status: u16,
    /// Length of the whole body.
    pub(crate) body_len: u32,
    /// Where this fragment's bytes start in the body.
    pub(crate) frag_offset: u32,
    /// Bytes of body in this fragment (they follow the header).
    pub(crate) frag_len: u32,
    /// Length of the method name at the start of the body.
    pub(crate) method_len: u32,
    /// Length of the metadata encoding after the method.
    pub(crate) metadata_len: u32,
    /// Request: number of blocks in the run holding this message.
    pub(crate) nblocks: u32,
    /// `[flags (wire_flags), enqueue stamp]`. The stamp, under an SLO only: the low 32 bits
    /// of CLOCK_MONOTONIC in µs when the client enqueued the request (0: none), from which
    /// workers tell a request that waited too long to finish within the SLO
    /// (`crate::slo::admission`).
    pub(crate) reserved: [u32; 2],
}
/// Size of [`WireHeader`].
pub(crate) const HEADER_LEN: usize = 64;
const _: () = assert!(std::mem::size_of::<WireHeader>() == HEADER_LEN);

impl WireHeader {
    /// The header as bytes, to copy into shared memory.
    pub(crate) fn as_bytes(&self) -> &[u8; HEADER_LEN] {
        // SAFETY: WireHeader is repr(C), 64 bytes of plain integers with no padding (checked by
        // the const assert), so viewing it as bytes is sound.
        unsafe { &*(self as *const WireHeader as *const [u8; HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing: one copy, then only the copy
    /// is used. Any bit pattern is a valid `WireHeader`; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`HEADER_LEN`] bytes.
    pub(crate) unsafe fn read_from(src: *const u8) -> WireHeader {
        // SAFETY: the caller guarantees 64 readable bytes; read_unaligned copies them without
        // assuming alignment, and every bit pattern is a valid WireHeader.
        unsafe { std::ptr::read_unaligned(src as *const WireHeader) }
    }

    /// Checks the body-shape fields against `max_message` and `frag_capacity` (bytes of body
    /// that fit in the container this fragment came in).
    pub(crate) fn validate_shape(
        &self,
        max_message: usize,
        frag_capacity: usize,
    ) -> Result<(), &'static str> {
        let prefix = (self.method_len as usize).checked_add(self.metadata_len as usize);
        check_body_shape(
            self.body_len,
            self.frag_offset,
            self.frag_len,
            prefix,
            max_message,
            frag_capacity,
        )
    }
}

/// The 32-byte header in front of every response record (responses need no token, deadline
/// or block run, and a small header keeps a 64-byte reply within two cache lines).
///
/// The body is `metadata encoding ++ payload` (or the UTF-8 status message when `status` is
/// not OK), `body_len` bytes in all, sent in fragments as [`WireHeader`] describes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ResponseHeader {
    /// The call this answers (0 in a [`kind::RESPONSE_BATCH`] record).
    pub(crate) call_id: u64,
    /// [`kind::RESPONSE`], or [`kind::RESPONSE_BATCH`] for a record of compact replies.
    pub(crate) kind: u16,
    /// The gRPC status code.
    pub(crate) status: u16,
    /// Length of the whole body.
    pub(crate) body_len: u32,
    /// Where this fragment's bytes start in the body.
    pub(crate) frag_offset: u32,
    /// Bytes of body in this fragment.
    pub(crate) frag_len: u32,
    /// Length of the metadata encoding at the start of the body.
    pub(crate) metadata_len: u32,
    /// In a [`kind::RESPONSE_BATCH`] record: the number of replies it holds.
    pub(crate) reserved: u32,
}
/// Size of [`ResponseHeader`].
pub(crate) const RESPONSE_HEADER_LEN: usize = 32;
const _: () = assert!(std::mem::size_of::<ResponseHeader>() == RESPONSE_HEADER_LEN);

impl ResponseHeader {
    /// The header as bytes, to copy into shared memory.
    pub(crate) fn as_bytes(&self) -> &[u8; RESPONSE_HEADER_LEN] {
        // SAFETY: repr(C), 32 bytes of plain integers without padding (const-asserted).
        unsafe { &*(self as *const ResponseHeader as *const [u8; RESPONSE_HEADER_LEN]) }
    }

    /// Reads a header from bytes another process may be writing; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`RESPONSE_HEADER_LEN`] bytes.
    pub(crate) unsafe fn read_from(src: *const u8) -> ResponseHeader {
        // SAFETY: the caller guarantees the bytes; any bit pattern is a valid value.
        unsafe { std::ptr::read_unaligned(src as *const ResponseHeader) }
    }

    /// Checks the lengths against `max_message` and the fragment's container.
    pub(crate) fn validate_shape(
        &self,
        max_message: usize,
        frag_capacity: usize,
    ) -> Result<(), &'static str> {
        check_body_shape(
            self.body_len,
            self.frag_offset,
            self.frag_len,
            Some(self.metadata_len as usize),
            max_message,
            frag_capacity,
        )
    }
}

/// The header of one reply in a [`kind::RESPONSE_BATCH`] record (whose `ResponseHeader`
/// gives the record's `body_len` and, in `reserved`, the number of replies): 8 bytes, then
/// the reply's body (`metadata encoding ++ payload`, or the status message), the next reply
/// at the first 8-byte boundary after it. A server sends one such record for the replies
/// to a compact request batch, instead of a record per reply, so the client reads fewer
/// lines and record words; only whole replies that fit the fields go this way (call id
/// under 2^32, body under 64 KiB, metadata under 256 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CompactReply {
    /// The call this answers (as a `u64`, these bits zero-extended).
    pub(crate) call_id: u32,
    /// Length of the reply's body.
    pub(crate) body_len: u16,
    /// Length of the metadata encoding at the start of the body.
    pub(crate) metadata_len: u8,
    /// The gRPC status code, and in bit 7 whether the call was refused without running
    /// (the [`ResponseHeader::status`] encoding in one byte).
    pub(crate) status: u8,
}
/// Size of [`CompactReply`].
pub(crate) const COMPACT_REPLY_LEN: usize = 8;
const _: () = assert!(std::mem::size_of::<CompactReply>() == COMPACT_REPLY_LEN);

impl CompactReply {
    /// The header as bytes, to copy into shared memory.
    pub(crate) fn as_bytes(&self) -> &[u8; COMPACT_REPLY_LEN] {
        // SAFETY: repr(C), 8 bytes of plain integers without padding (const-asserted).
        unsafe { &*(self as *const CompactReply as *const [u8; COMPACT_REPLY_LEN]) }
    }

    /// Reads a header from bytes another process may be writing; validation is the caller's.
    ///
    /// # Safety
    /// `src` must be valid for reads of [`COMPACT_REPLY_LEN`] bytes.
    pub(crate) unsafe fn read_from(src: *const u8) -> CompactReply {
        // SAFETY: the caller guarantees the bytes; any bit pattern is a valid value.
        unsafe { std::ptr::read_unaligned(src as *const CompactReply) }
    }
}

/// The checks both headers need before their lengths are used to slice: the body fits the
/// maximum, the fragment fits its container and lies inside the body, and the `prefix`
/// (method and metadata before the payload; `None` if its length overflowed) fits the body.
fn check_body_shape(
    body_len: u32,
    frag_offset: u32,
    frag_len: u32,
    prefix: Option<usize>,
    max_message: usize,
    frag_capacity: usize,
) -> Result<(), &'static str> {
    let (body, frag) = (body_len as usize, frag_len as usize);
    if body > max_message {
        return Err("body longer than the maximum message size");
    }
    if frag > frag_capacity {
        return Err("fragment longer than its container");
    }
    if (frag_offset as usize)
        .checked_add(frag)
        .is_none_or(|end| end > body)
    {
        return Err("fragment outside the body");
    }
    if frag == 0 && body != 0 {
        return Err("empty fragment of a non-empty body");
    }
    if prefix.is_none_or(|n| n > body) {
        return Err("method and metadata longer than the body");
    }
    Ok(())
}

/// Rounds `n` up to a multiple of 64.
pub(crate) const fn align64(n: usize) -> usize {
    (n + 63) & !63
}

/// `n` rounded up to a multiple of 8 (where a compact batch's next header starts).
pub(crate) const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The server checks a batch's compact headers without expanding them first: the
        /// check must agree with the full header's, error for error.
        #[test]
        fn a_compact_header_validates_as_its_expansion(
            call_id: u32,
            // Small ranges, so the boundaries (equal lengths) come up often.
            body_len in 0u16..300,
            method_len: u8,
            max_message in 0usize..300,
            room in 0usize..300,
        ) {
            let c = CompactHeader { call_id, body_len, method_len, flags: 0 };
            let first = WireHeader { kind: kind::REQUEST, ..WireHeader::default() };
            proptest::prop_assert_eq!(
                c.validate_shape(max_message, room),
                c.expand(&first).validate_shape(max_message, room)
            );
        }
    }

    #[test]
    fn header_bytes_round_trip() {
        let h = WireHeader {
            token: 7,
            call_id: 9,
            body_len: 100,
            frag_len: 100,
            method_len: 4,
            ..Default::default()
        };
        // SAFETY: the buffer is 64 bytes.
        let back = unsafe { WireHeader::read_from(h.as_bytes().as_ptr()) };
        assert_eq!(h, back);
        assert!(back.validate_shape(1000, 1000).is_ok());
    }

    #[test]
    fn a_compact_header_expands_to_its_batch_first_header() {
        let first = WireHeader {
            token: 7,
            call_id: 1,
            conn_index: 3,
            kind: kind::REQUEST,
            body_len: 100,
            frag_len: 100,
            method_len: 4,
            metadata_len: 9,
            reserved: [wire_flags::BATCH_COMPACT | wire_flags::BATCH_MORE, 5],
            ..Default::default()
        };
        let c = CompactHeader {
            call_id: 0xffff_fffe,
            body_len: 65_535,
            method_len: 255,
            flags: compact_flags::MORE,
        };
        // SAFETY: the buffer is COMPACT_HEADER_LEN bytes.
        let back = unsafe { CompactHeader::read_from(c.as_bytes().as_ptr()) };
        assert_eq!(back, c);
        let h = back.expand(&first);
        assert_eq!((h.token, h.conn_index, h.kind), (7, 3, kind::REQUEST));
        assert_eq!(h.call_id, 0xffff_fffe);
        assert_eq!((h.body_len, h.frag_len, h.frag_offset), (65_535, 65_535, 0));
        assert_eq!((h.method_len, h.metadata_len, h.deadline_ns), (255, 0, 0));
        assert_eq!(h.reserved, [0, 0]);
        assert!(h.validate_shape(1 << 20, 65_535).is_ok());
        assert!(h.validate_shape(1 << 20, 65_534).is_err());
    }

    #[test]
    fn a_short_header_reads_back_as_the_request_it_stands_for() {
        let h = WireHeader {
            token: 7,
            call_id: u64::MAX - 1,
            conn_index: 3,
            kind: kind::REQUEST,
            body_len: 100,
            frag_len: 100,
            method_len: 65_535,
            nblocks: 65_534,
            reserved: [wire_flags::BATCH_COMPACT | wire_flags::KEEP_BLOCKS, 0],
            ..Default::default()
        };
        let short = ShortHeader::of(&h).expect("fits the short form");
        // SAFETY: a ShortHeader's bytes are SHORT_HEADER_LEN long.
        let back = unsafe { ShortHeader::read_from(short.as_bytes().as_ptr()) };
        assert_eq!(back.expand(), h);
        // Whatever the short form cannot say, it refuses.
        let lacking: [fn(&mut WireHeader); 10] = [
            |h| h.deadline_ns = 1,
            |h| h.metadata_len = 1,
            |h| h.frag_offset = 1,
            |h| h.frag_len = 99,
            |h| h.reserved[1] = 1,
            |h| h.method_len = 65_536,
            |h| h.nblocks = 65_536,
            |h| h.reserved[0] = 1 << 16,
            |h| h.kind = kind::RESPONSE,
            |h| h.status = 1,
        ];
        for (i, change) in lacking.iter().enumerate() {
            let mut g = h;
            change(&mut g);
            assert_eq!(ShortHeader::of(&g), None, "change {i}");
        }
    }

    #[test]
    fn shape_validation_refuses_overflow() {
        let h = WireHeader {
            body_len: 10,
            frag_offset: u32::MAX,
            frag_len: 5,
            ..Default::default()
        };
        assert!(h.validate_shape(100, 100).is_err());
        let h = WireHeader {
            body_len: 10,
            frag_len: 10,
            method_len: u32::MAX,
            metadata_len: 2,
            ..Default::default()
        };
        assert!(h.validate_shape(100, 100).is_err());
    }
}
