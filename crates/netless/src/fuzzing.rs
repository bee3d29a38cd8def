//! Entry points for the fuzz targets in the repository's `fuzz/` directory (feature
//! `fuzzing`, never in a user's build). Each takes the fuzzer's bytes as a peer's memory or
//! frame, decodes them with the code that reads them in a real process, and asserts what that
//! code relies on of anything it accepts: a validated length within its container, a slice
//! inside its run, a decode → encode → decode round trip. An input that is refused is fine;
//! a panic (a failed assertion, an index out of bounds, an overflow) is a finding.
//!
//! Inputs start with fixed-width fields (zeros once the bytes run out), then the bytes under
//! test; [`seeds`] makes a few of each with the real encoders, for the targets' corpora.
//! Nothing here is used by the library itself.

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use netless_ring::ConsumerHead;
use netless_shm::{Published, Segment};

use crate::config::DEFAULT_MAX_CLIENT_RING;
use crate::segment::layout::{provisioning, ConnHeader, ReplicaHeader, ServerControl};
use crate::segment::{BlockRun, ConnSegment, ControlSegment, ReplicaSegment, ReplicaSpec};
use crate::server::serve::next_compact;
use crate::status::{Code, ReplyCode};
use crate::sync::Ordering;
use crate::wire::handshake::{Frame, HELLO_LEN, PROTOCOL_VERSION};
use crate::wire::header::{
    align64, align8, compact_flags, kind, wire_flags, CompactHeader, CompactReply, ResponseHeader,
    ShortHeader, WireHeader, COMPACT_HEADER_LEN, HEADER_LEN, RESPONSE_HEADER_LEN, SHORT_HEADER_LEN,
};
use crate::wire::metadata::Metadata;
use crate::wire::reply::{
    decode_body, for_each_compact_reply, is_reply_batch, outcome, parse_response, ReplyBatch,
};
use crate::Status;

/// A fuzz input read front to back: fixed-width fields, zero once the bytes run out, then
/// the rest.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// What every caller of a successful `validate_shape` slices with: the body within the
/// maximum, the fragment within its container and inside the body, the method and metadata
/// (`prefix`) inside the body, and no empty fragment of a non-empty body.
fn assert_shape(h: (u32, u32, u32), prefix: u64, max_message: usize, capacity: usize) {
    let (body_len, frag_offset, frag_len) = h;
    let (body, frag) = (body_len as usize, frag_len as usize);
    assert!(
        body <= max_message,
        "a body of {body} over the maximum {max_message}"
    );
    assert!(
        frag <= capacity,
        "a fragment of {frag} in a container of {capacity}"
    );
    assert!(
        u64::from(frag_offset) + u64::from(frag_len) <= u64::from(body_len),
        "fragment {frag_offset}+{frag_len} outside a body of {body}"
    );
    assert!(
        prefix <= u64::from(body_len),
        "a prefix of {prefix} in a body of {body}"
    );
    assert!(
        frag > 0 || body == 0,
        "an empty fragment of a body of {body}"
    );
}

/// Target `wire_header`: `max_message: u32, capacity: u32`, then 64 bytes read as each
/// header form (`WireHeader`, `ShortHeader`, `CompactHeader`, `ResponseHeader`,
/// `CompactReply`) and shape-checked as the server and the clients check them, then the
/// rest read as a metadata encoding (`Metadata::decode`), which re-encodes to as many bytes
/// that decode the same.
pub fn wire_header(data: &[u8]) {
    let mut input = Input(data);
    let max_message = input.u32() as usize;
    let capacity = input.u32() as usize;
    let bytes: [u8; HEADER_LEN] = input.array();
    let encoding = input.rest();
    if let Ok(metadata) = Metadata::decode(encoding) {
        let mut encoded = Vec::new();
        metadata.encode_into(&mut encoded);
        assert_eq!(
            encoded.len(),
            encoding.len(),
            "metadata re-encodes to as many bytes"
        );
        assert_eq!(metadata.encoded_len(), encoded.len());
        assert_eq!(
            Metadata::decode(&encoded).as_ref(),
            Ok(&metadata),
            "decode → encode → decode"
        );
    }

    // SAFETY: `bytes` holds HEADER_LEN bytes.
    let h = unsafe { WireHeader::read_from(bytes.as_ptr()) };
    assert_eq!(h.as_bytes(), &bytes, "a header reads back as its bytes");
    if h.validate_shape(max_message, capacity).is_ok() {
        let prefix = u64::from(h.method_len) + u64::from(h.metadata_len);
        let shape = (h.body_len, h.frag_offset, h.frag_len);
        assert_shape(shape, prefix, max_message, capacity);
    }

    // SAFETY: `bytes` holds HEADER_LEN >= SHORT_HEADER_LEN bytes.
    let short = unsafe { ShortHeader::read_from(bytes.as_ptr()) };
    let expanded = short.expand();
    let short_again = ShortHeader {
        kind: kind::REQUEST_SHORT,
        ..short
    };
    assert_eq!(
        ShortHeader::of(&expanded),
        Some(short_again),
        "short → full → short"
    );
    if expanded.validate_shape(max_message, capacity).is_ok() {
        let shape = (expanded.body_len, 0, expanded.body_len);
        assert_shape(shape, u64::from(short.method_len), max_message, capacity);
    }

    // SAFETY: `bytes` holds HEADER_LEN >= COMPACT_HEADER_LEN bytes.
    let compact = unsafe { CompactHeader::read_from(bytes.as_ptr()) };
    assert_eq!(
        compact.validate_shape(max_message, capacity),
        compact.expand(&h).validate_shape(max_message, capacity),
        "a compact header checks as its expansion"
    );

    // SAFETY: `bytes` holds HEADER_LEN >= RESPONSE_HEADER_LEN bytes.
    let r = unsafe { ResponseHeader::read_from(bytes.as_ptr()) };
    assert_eq!(&r.as_bytes()[..], &bytes[..RESPONSE_HEADER_LEN]);
    if r.validate_shape(max_message, capacity).is_ok() {
        let shape = (r.body_len, r.frag_offset, r.frag_len);
        assert_shape(shape, u64::from(r.metadata_len), max_message, capacity);
    }
    if let Some(code) = ReplyCode::from_wire(r.status) {
        assert_eq!(
            code.wire(),
            r.status,
            "a reply code re-encodes to its wire form"
        );
        assert!(!code.not_run || code.code == Code::ResourceExhausted);
    }

    // SAFETY: `bytes` holds HEADER_LEN >= COMPACT_REPLY_LEN bytes.
    let c = unsafe { CompactReply::read_from(bytes.as_ptr()) };
    if let Some(code) = ReplyCode::from_wire8(c.status) {
        assert_eq!(code.wire8(), c.status, "a one-byte reply code re-encodes");
        assert_eq!(ReplyCode::from_wire(code.wire()), Some(code));
    }
}

/// Target `request_run`: `max_message: u32`, then a run of blocks (rounded up to whole
/// 64-byte blocks) read as a worker reads a queue entry's run: its first header in either
/// form, the fragment it describes, and a compact batch's every request
/// (`server::serve::next_compact`), each sliced into method, metadata and payload as
/// `dispatch` does.
pub fn request_run(data: &[u8]) {
    let mut input = Input(data);
    let max_message = input.u32() as usize;
    let mut buf = input.rest().to_vec();
    buf.resize(align64(buf.len()).max(HEADER_LEN), 0);
    let run = BlockRun::over(&mut buf);
    let (h, header_len) = run.request_header();
    assert!(header_len == HEADER_LEN || header_len == SHORT_HEADER_LEN);
    // What `serve_conn` checks before it slices.
    if h.kind != kind::REQUEST
        || h.validate_shape(max_message, run.len() - header_len)
            .is_err()
    {
        return;
    }
    let fragment = run
        .bytes(header_len, h.frag_len as usize)
        .expect("validate_shape keeps a fragment inside its run");
    if h.frag_len != h.body_len {
        return;
    }
    assert_dispatchable(&h, fragment);
    let flags = h.reserved[0];
    if flags & wire_flags::BATCH_MORE == 0 || flags & wire_flags::BATCH_COMPACT == 0 {
        return;
    }
    // `serve_requests`: each compact request after the body before it, until one without
    // MORE or the first one refused.
    let (mut end, mut count) = (header_len + fragment.len(), 0);
    while let Ok((c, body, next_end)) = next_compact(run, end, max_message) {
        count += 1;
        assert!(
            count <= run.len() / COMPACT_HEADER_LEN,
            "more requests than headers fit"
        );
        assert_eq!(body.len(), usize::from(c.body_len));
        assert!(
            next_end <= run.len(),
            "a request ending at {next_end} past its run"
        );
        assert!(
            next_end >= align8(end) + COMPACT_HEADER_LEN,
            "a batch that goes back"
        );
        assert!(c.flags & compact_flags::SAME_METHOD == 0 || c.method_len == 0);
        assert_dispatchable(&c.expand(&h), body);
        if c.flags & compact_flags::MORE == 0 {
            break;
        }
        end = next_end;
    }
}

/// What `dispatch` slices out of a whole request's body: the method, then the metadata.
fn assert_dispatchable(h: &WireHeader, body: &[u8]) {
    let method_end = h.method_len as usize;
    let md_end = method_end + h.metadata_len as usize;
    assert!(md_end <= body.len(), "method and metadata past the body");
    let _ = std::str::from_utf8(&body[..method_end]);
    let _ = Metadata::decode(&body[method_end..md_end]);
}

/// One reply as a client hands it over: call id, code, metadata, rest of the body.
type Delivered = (u64, ReplyCode, Result<Metadata, Status>, Vec<u8>);

/// Target `reply_record`: `max_message: u32`, then a response ring record read as a client
/// reads it: a reply (`parse_response`, and `decode_body` when it is whole) or a batch of
/// compact replies (`for_each_compact_reply`, `outcome`); a batch that decodes re-encodes
/// (`ReplyBatch`) to one that decodes the same.
pub fn reply_record(data: &[u8]) {
    let mut input = Input(data);
    let max_message = input.u32() as usize;
    let record = input.rest();
    if is_reply_batch(record) {
        let Ok(replies) = compact_replies(record, max_message) else {
            return;
        };
        // SAFETY: `is_reply_batch` saw a whole header.
        let h = unsafe { ResponseHeader::read_from(record.as_ptr()) };
        assert_eq!(
            replies.len(),
            h.reserved as usize,
            "a batch's count is its replies'"
        );
        let mut batch = ReplyBatch::default();
        for (id, code, metadata, rest) in &replies {
            let Ok(metadata) = metadata else { return };
            batch.push(*id, *code, metadata, rest);
        }
        let (header, body) = batch.record();
        let mut again = header.as_bytes().to_vec();
        again.extend_from_slice(body);
        let decoded = compact_replies(&again, max_message).expect("a re-encoded batch decodes");
        assert_eq!(decoded, replies, "a batch re-encodes to the same replies");
        return;
    }
    let Ok((h, code, fragment)) = parse_response(record, max_message) else {
        return;
    };
    assert_eq!(h.kind, kind::RESPONSE);
    assert_eq!(code.wire(), h.status);
    assert_eq!(fragment.len(), h.frag_len as usize);
    assert!(RESPONSE_HEADER_LEN + fragment.len() <= record.len());
    if h.frag_len == h.body_len {
        let mut payload = Vec::new();
        match decode_body(&h, code, fragment, &mut payload) {
            Ok(metadata) => {
                assert_eq!(code.code, Code::Ok);
                assert_eq!(metadata.encoded_len(), h.metadata_len as usize);
                assert_eq!(payload, &fragment[h.metadata_len as usize..]);
            }
            Err(status) => assert!(code.code != Code::Ok || status.code() == Code::Internal),
        }
    }
}

/// The replies of a batch record, each with its outcome decoded, or why it was refused.
fn compact_replies(record: &[u8], max_message: usize) -> Result<Vec<Delivered>, &'static str> {
    let mut replies = Vec::new();
    for_each_compact_reply(record, max_message, |id, code, (metadata, rest)| {
        assert!(id <= u64::from(u32::MAX), "a compact call id of 32 bits");
        assert!(metadata.len() + rest.len() <= max_message.min(usize::from(u16::MAX)));
        assert!(metadata.len() <= usize::from(u8::MAX));
        let decoded = Metadata::decode(metadata);
        match outcome(code, metadata, rest) {
            Ok(payload) => {
                assert!(decoded.is_ok() && code.code == Code::Ok);
                assert_eq!(payload, rest);
            }
            Err(_) => assert!(decoded.is_err() || code.code != Code::Ok),
        }
        replies.push((id, code, decoded, rest.to_vec()));
        Ok(())
    })?;
    Ok(replies)
}

/// Target `handshake_frame`: the bytes as one handshake frame, as either side reads it
/// (`Frame::decode`). A frame that decodes re-encodes to the same bytes (to bytes that
/// decode the same, for a status message that is not UTF-8).
pub fn handshake_frame(data: &[u8]) {
    let Some(frame) = Frame::decode(data) else {
        return;
    };
    let encoded = frame.encode();
    assert_eq!(
        Frame::decode(&encoded).as_ref(),
        Some(&frame),
        "decode → encode → decode"
    );
    match &frame {
        Frame::Reject(_) | Frame::Goodbye(_) if std::str::from_utf8(&data[3..]).is_err() => {}
        Frame::Hello { version, .. } => {
            assert_eq!(data.len(), HELLO_LEN, "a hello of another length decoded");
            assert_eq!(encoded, data);
            assert_eq!(Frame::hello_version(data), Some(*version));
        }
        _ => assert_eq!(encoded, data, "a frame re-encodes to its bytes"),
    }
}

/// Largest segment `segment_layout` makes (attach maps whatever the header says fits).
const MAX_FUZZ_SEGMENT: usize = 4 << 20;

/// The segments `segment_layout` makes, by its `form` byte.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SegmentKind {
    /// A client's connection segment, attached by the server.
    Conn,
    /// A trust group's replica segment, attached by a client.
    Replica,
    /// The server's control segment (sealed: clients map it read-only), attached by a client.
    Control,
}

/// Target `segment_layout`: `form: u8` (bit 0: a connection segment; else bit 2: a control
/// segment; else a replica segment; bit 1: sized by its header's `total_len`), `len: u32`,
/// `index: u32, count: u32`, the header (32, 64 or 128 bytes), then patches `(offset: u32,
/// n: u8, n bytes)`. The segment is made of those and attached as the peer's side attaches it
/// (`ConnSegment::attach`, `ControlSegment::attach`, `ReplicaSegment::attach`); whatever
/// attaches is then used: a run of blocks, the queues, the response ring, the registers and
/// worker stats, all inside the mapping.
pub fn segment_layout(data: &[u8]) {
    let mut input = Input(data);
    let form = input.u8();
    let len = input.u32() as usize;
    let (index, count) = (input.u32(), input.u32());
    let kind = match form {
        f if f & 1 != 0 => SegmentKind::Conn,
        f if f & 4 != 0 => SegmentKind::Control,
        _ => SegmentKind::Replica,
    };
    let (header, total_at): (Vec<u8>, usize) = match kind {
        SegmentKind::Conn => (input.array::<32>().into(), 24),
        SegmentKind::Control => (input.array::<64>().into(), 32),
        SegmentKind::Replica => (input.array::<128>().into(), 56),
    };
    let total_len = u64::from_le_bytes(header[total_at..total_at + 8].try_into().unwrap());
    let len = match usize::try_from(total_len) {
        Ok(n) if form & 2 != 0 && (1..=MAX_FUZZ_SEGMENT).contains(&n) => n,
        _ => len % MAX_FUZZ_SEGMENT + 1,
    };
    let patches = input.rest();
    if kind == SegmentKind::Control {
        // Sealed against writable mappings, as the server makes it, or a client refuses it.
        let Ok(published) = Published::create("netless-fuzz", len) else {
            return;
        };
        // SAFETY: the mapping is `len` bytes, and nobody else maps it yet.
        unsafe { fill(published.as_ptr(), len, &header, patches) };
        use_control_segment(published.fd().try_clone_to_owned().expect("dup of a memfd"));
    } else {
        let Ok(segment) = Segment::create("netless-fuzz", len) else {
            return;
        };
        // SAFETY: the mapping is `len` bytes, and nobody else maps it yet (just created).
        unsafe { fill(segment.as_ptr(), len, &header, patches) };
        let fd = segment.fd().try_clone_to_owned().expect("dup of a memfd");
        match kind {
            SegmentKind::Conn => use_conn_segment(fd),
            _ => use_replica_segment(fd, index, count),
        }
    }
}

/// Writes `header` at the start of the `len` bytes at `base`, then each patch `(offset: u32,
/// n: u8, n bytes)` of `patches`, all cut at `len`.
///
/// # Safety
/// `base..base + len` must be a mapping nobody else reads or writes meanwhile.
unsafe fn fill(base: *mut u8, len: usize, header: &[u8], mut patches: &[u8]) {
    let write = |at: usize, part: &[u8]| {
        let n = part.len().min(len.saturating_sub(at));
        // SAFETY: at + n <= len, inside the mapping (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), base.add(at), n) };
    };
    write(0, header);
    while patches.len() >= 5 {
        let at = u32::from_le_bytes(patches[..4].try_into().unwrap()) as usize;
        let n = usize::from(patches[4]).min(patches.len() - 5);
        write(at, &patches[5..5 + n]);
        patches = &patches[5 + n..];
    }
}

/// Whether `ptr..ptr + len` lies inside `segment`'s mapping.
fn inside(segment: &Segment, ptr: *const u8, len: usize) -> bool {
    inside_mapping((segment.as_ptr(), segment.len()), ptr, len)
}

/// Whether `ptr..ptr + len` lies inside the mapping `(base, its length)`.
fn inside_mapping((base, mapped): (*const u8, usize), ptr: *const u8, len: usize) -> bool {
    let (base, at) = (base as usize, ptr as usize);
    at >= base && at - base <= mapped && mapped - (at - base) >= len
}

/// The server's control segment, which a client attaches beside its group's replica segment.
fn server_control() -> Arc<ControlSegment> {
    static CONTROL: OnceLock<Arc<ControlSegment>> = OnceLock::new();
    CONTROL
        .get_or_init(|| {
            Arc::new(ControlSegment::create("netless-fuzz", 2).expect("a control segment"))
        })
        .clone()
}

fn use_control_segment(fd: OwnedFd) {
    let Ok(control) = ControlSegment::attach(fd) else {
        return;
    };
    let mapping = control.mapping();
    let registers: *const ServerControl = control.server_control();
    assert!(
        inside_mapping(
            mapping,
            registers.cast(),
            std::mem::size_of::<ServerControl>()
        ),
        "the registers"
    );
    let stats = control.stats();
    assert!(!stats.is_empty(), "a control segment without workers");
    assert!(
        inside_mapping(mapping, stats.as_ptr().cast(), std::mem::size_of_val(stats)),
        "the workers' stats"
    );
    // What `netless stat` and a client read of them: any values are fine.
    let _ = control.server_control().depth_limit.load(Ordering::Relaxed);
    let last = stats.last().expect("not empty");
    let _ = last.calls.load(Ordering::Relaxed);
}

fn use_replica_segment(fd: OwnedFd, index: u32, count: u32) {
    let Ok(replica) = ReplicaSegment::attach(fd, server_control()) else {
        return;
    };
    let g: ReplicaHeader = *replica.geometry();
    let segment = replica.segment();
    assert_eq!(g.total_len, segment.len() as u64);
    let table = replica.table();
    assert_eq!(table.len(), g.nblocks as usize);
    assert!(
        inside(segment, table.as_ptr().cast(), table.len() * 4),
        "the block table"
    );
    assert_eq!(replica.queues().len(), g.nqueues as usize);
    for view in replica.queues() {
        let queue = view.queue();
        assert!(queue.capacity().is_power_of_two());
        assert!(view.depth() <= u64::from(queue.capacity()));
        // The cells are the peer's bytes: take and put back a few, as workers and clients do.
        let head = ConsumerHead::new();
        for _ in 0..4 {
            let _ = queue.try_dequeue(&head);
        }
        let _ = queue.try_enqueue(index);
        let _ = queue.try_dequeue(&head);
    }
    let part = replica.partition_for(index);
    assert!(
        part.start <= part.end && part.end <= g.nblocks,
        "a partition past the blocks"
    );
    let _ = replica.sharers();
    if let Some(run) = replica.run(index, count) {
        assert_eq!(run.len(), count as usize * replica.block_size());
        assert!(
            inside(segment, run.as_ptr(), run.len()),
            "a run outside the mapping"
        );
        let _ = run.request_header();
    }
}

fn use_conn_segment(fd: OwnedFd) {
    let Ok((conn, mut producer)) = ConnSegment::attach(fd, DEFAULT_MAX_CLIENT_RING) else {
        return;
    };
    let segment = conn.segment();
    assert!(
        inside(segment, producer.next_record_ptr(), 8),
        "the ring's next record"
    );
    assert!(producer.nslots().is_power_of_two());
    let doorbell: *const netless_ring::DoorbellWords = conn.doorbell();
    assert!(inside(segment, doorbell.cast(), 64), "the doorbell");
    // The consumer's head is the peer's word: pushes must fail cleanly, not write outside.
    for len in [0, 100, producer.max_record_len().min(1 << 16)] {
        let _ = producer.try_push(&[&vec![0x5a; len]]);
        assert!(
            inside(segment, producer.next_record_ptr(), 8),
            "the ring's next record"
        );
    }
}

/// The socket `ClientConfig::socket_path` gives `service` once it has resolved the socket
/// directory to `dir`, or `None` for a name it refuses. Resolving the directory creates and
/// checks it, which a fuzz target must not do for every input; the gateway's fuzz target maps
/// the services callers name with this.
pub fn socket_path_in(dir: &std::path::Path, service: &str) -> Option<std::path::PathBuf> {
    Some(dir.join(crate::config::socket_name(dir, service, None).ok()?))
}

/// Seed inputs for each target, made by the real encoders: `(target, input)` pairs.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    let limits = |max: u32, capacity: u32| {
        let mut out = max.to_le_bytes().to_vec();
        out.extend_from_slice(&capacity.to_le_bytes());
        out
    };
    let request = WireHeader {
        token: 0x1234,
        call_id: 7,
        kind: kind::REQUEST,
        body_len: 40,
        frag_len: 40,
        method_len: 4,
        metadata_len: 11,
        nblocks: 1,
        ..WireHeader::default()
    };
    let short = ShortHeader::of(&WireHeader {
        metadata_len: 0,
        ..request
    })
    .expect("a plain request has a short form");
    let fragment = WireHeader {
        body_len: 100_000,
        frag_offset: 4096,
        frag_len: 4000,
        ..request
    };
    let reply = ResponseHeader {
        call_id: 9,
        kind: kind::RESPONSE,
        body_len: 20,
        frag_len: 20,
        metadata_len: 6,
        ..ResponseHeader::default()
    };
    let mut md = Metadata::new();
    md.insert("k", "value");
    md.insert("x-request-id-bin", [0u8, 255, 3]);
    let mut md_bytes = Vec::new();
    md.encode_into(&mut md_bytes);
    let header = request.as_bytes().to_vec();
    seeds.push((
        "wire_header",
        [limits(1 << 20, 4096), header, md_bytes.clone()].concat(),
    ));
    seeds.push((
        "wire_header",
        [limits(1 << 20, 4096), fragment.as_bytes().to_vec()].concat(),
    ));
    let mut short64 = short.as_bytes().to_vec();
    short64.resize(HEADER_LEN, 0);
    seeds.push(("wire_header", [limits(1 << 20, 4096), short64].concat()));
    let mut reply64 = reply.as_bytes().to_vec();
    reply64.resize(HEADER_LEN, 0);
    seeds.push(("wire_header", [limits(1 << 20, 4096), reply64].concat()));

    for run in request_runs(&request, &md_bytes) {
        seeds.push((
            "request_run",
            [(1u32 << 20).to_le_bytes().to_vec(), run].concat(),
        ));
    }
    for record in reply_records(&reply, &md) {
        seeds.push((
            "reply_record",
            [(1u32 << 20).to_le_bytes().to_vec(), record].concat(),
        ));
    }
    for frame in [
        Frame::Greeting {
            version: PROTOCOL_VERSION,
        },
        Frame::Hello {
            version: PROTOCOL_VERSION,
            max_message: 4 << 20,
            domain: 0x0102_0304_0506_0708,
            member: 5,
            generation: 9,
            cpu: 1,
        },
        Frame::Welcome {
            version: PROTOCOL_VERSION,
            conn_index: 3,
            tag: 0x0001_0004,
            token: 0xfeed_f00d_dead_beef,
            domain: 0x0102_0304_0506_0708,
            by_ref: true,
        },
        Frame::Reject(Status::new(
            Code::PermissionDenied,
            "uid 1000 is not allowed",
        )),
        Frame::Goodbye(Status::new(
            Code::Unavailable,
            "the server is shutting down",
        )),
    ] {
        seeds.push(("handshake_frame", frame.encode()));
    }
    seeds.extend(segment_seeds().into_iter().map(|s| ("segment_layout", s)));
    seeds
}

/// Runs as a client writes them: a request with metadata, a short one, a compact batch.
fn request_runs(request: &WireHeader, metadata: &[u8]) -> Vec<Vec<u8>> {
    let body = [&b"Echo"[..], metadata, b"payload, 18 bytes!"].concat();
    let whole = WireHeader {
        body_len: body.len() as u32,
        frag_len: body.len() as u32,
        metadata_len: metadata.len() as u32,
        ..*request
    };
    let mut lone = [&whole.as_bytes()[..], &body].concat();
    lone.resize(align64(lone.len()), 0);

    let plain = WireHeader {
        metadata_len: 0,
        body_len: 11,
        frag_len: 11,
        ..*request
    };
    let short = ShortHeader::of(&plain).expect("a plain request has a short form");
    let mut short_run = [&short.as_bytes()[..], b"Echohello!!"].concat();
    short_run.resize(HEADER_LEN, 0);

    let first = WireHeader {
        reserved: [wire_flags::BATCH_MORE | wire_flags::BATCH_COMPACT, 0],
        ..plain
    };
    let mut batch = [&first.as_bytes()[..], b"Echohello!!"].concat();
    let compacts = [
        (
            CompactHeader {
                call_id: 8,
                body_len: 7,
                method_len: 4,
                flags: compact_flags::MORE,
            },
            &b"Pingabc"[..],
        ),
        (
            CompactHeader {
                call_id: 9,
                body_len: 3,
                method_len: 0,
                flags: compact_flags::MORE | compact_flags::SAME_METHOD,
            },
            b"def",
        ),
        (
            CompactHeader {
                call_id: 10,
                body_len: 0,
                method_len: 0,
                flags: compact_flags::SAME_METHOD,
            },
            b"",
        ),
    ];
    for (c, body) in compacts {
        batch.resize(align8(batch.len()), 0);
        batch.extend_from_slice(c.as_bytes());
        batch.extend_from_slice(body);
    }
    batch.resize(align64(batch.len()), 0);
    vec![lone, short_run, batch]
}

/// Records as a server writes them: a whole reply, an error, a fragment, a batch.
fn reply_records(reply: &ResponseHeader, metadata: &Metadata) -> Vec<Vec<u8>> {
    let mut md = Vec::new();
    metadata.encode_into(&mut md);
    let body = [&md[..], b"the payload"].concat();
    let ok = ResponseHeader {
        body_len: body.len() as u32,
        frag_len: body.len() as u32,
        metadata_len: md.len() as u32,
        ..*reply
    };
    let message = b"no such method";
    let error = ResponseHeader {
        status: ReplyCode::of(&Status::nack("busy")).wire(),
        body_len: message.len() as u32,
        frag_len: message.len() as u32,
        metadata_len: 0,
        ..*reply
    };
    let part = ResponseHeader {
        body_len: 10_000,
        frag_offset: 4000,
        frag_len: 16,
        metadata_len: 0,
        ..*reply
    };
    let mut batch = ReplyBatch::default();
    batch.push(1, Code::Ok.into(), &Metadata::new(), b"one");
    batch.push(2, Code::NotFound.into(), &Metadata::new(), b"no such thing");
    batch.push(3, Code::Ok.into(), metadata, b"three");
    let (header, entries) = batch.record();
    vec![
        [&ok.as_bytes()[..], &body].concat(),
        [&error.as_bytes()[..], message].concat(),
        [&part.as_bytes()[..], &[7u8; 16]].concat(),
        [&header.as_bytes()[..], entries].concat(),
    ]
}

/// Replica and connection segments as servers and clients make them, as `segment_layout`
/// inputs: the header, then every stretch of non-zero bytes as a patch.
fn segment_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let specs = [
        ReplicaSpec {
            block_size: 64,
            provisioning: provisioning::SHARED,
            nparts: 1,
            part_blocks: 16,
            nqueues: 1,
            quota_blocks: 16,
            max_message: 4096,
            max_connections: 4,
        },
        ReplicaSpec {
            block_size: 128,
            provisioning: provisioning::PER_CONNECTION,
            nparts: 4,
            part_blocks: 8,
            nqueues: 2,
            quota_blocks: 4,
            max_message: 1 << 20,
            max_connections: 4,
        },
    ];
    for spec in specs {
        let replica =
            ReplicaSegment::create("fuzz-seed", spec, server_control()).expect("a replica segment");
        let header = [2u8, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0];
        out.push([&header[..], &patches(segment_bytes(replica.segment()), 128)].concat());
    }
    let control = ControlSegment::create("fuzz-seed", 3).expect("a control segment");
    let header = [6u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let (base, len) = control.mapping();
    // SAFETY: the server's mapping, `len` bytes long, read as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(base, len) };
    out.push([&header[..], &patches(bytes, 64)].concat());
    let (conn, _consumer) = ConnSegment::create(4096).expect("a connection segment");
    let header = [3u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    out.push(
        [
            &header[..],
            &patches(
                segment_bytes(conn.segment()),
                std::mem::size_of::<ConnHeader>(),
            ),
        ]
        .concat(),
    );
    out
}

/// The bytes of a segment of ours.
fn segment_bytes(segment: &Segment) -> &[u8] {
    // SAFETY: the segment is ours alone, `len` bytes long; it is read as bytes.
    unsafe { std::slice::from_raw_parts(segment.as_ptr(), segment.len()) }
}

/// The first `header` bytes of `bytes`, then its non-zero bytes after them as patches.
fn patches(bytes: &[u8], header: usize) -> Vec<u8> {
    let mut out = bytes[..header].to_vec();
    let mut at = header;
    while at < bytes.len() {
        if bytes[at] == 0 {
            at += 1;
            continue;
        }
        let n = bytes[at..]
            .iter()
            .take(255)
            .rposition(|&b| b != 0)
            .map_or(1, |i| i + 1);
        out.extend_from_slice(&(at as u32).to_le_bytes());
        out.push(n as u8);
        out.extend_from_slice(&bytes[at..at + n]);
        at += n;
    }
    out
}
