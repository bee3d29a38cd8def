//! Entry points for the fuzz targets in the repository's `fuzz/` directory (feature
//! `fuzzing`, never in a user's build). Each takes the fuzzer's bytes as what another member
//! of the domain controls (a coordinator frame, a Ref, a ref slot and the pages it lists, the
//! pool's header), decodes them with the code a real member runs, and asserts what that code
//! relies on of anything it accepts. A refusal is fine; a panic is a finding.
//!
//! Inputs start with fixed-width fields (zeros once the bytes run out), then the bytes under
//! test; [`seeds`] makes a few of each with the real encoders, for the targets' corpora.
//! Nothing here is used by the library itself.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netless_shm::Segment;

use crate::coordinator::handshake::{check_offer, check_welcome, offer, refusal, welcome, Request};
use crate::layout::{
    member_state, slot_parts, slot_state, PoolHeader, PoolMap, MAX_MEMBERS, PAGE_SIZE,
};
use crate::{members, pages, Domain, DomainConfig, PoolError, PoolGeometry, Ref};

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

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// Target `coordinator_frame`: the bytes as a join request (what the coordinator reads) and
/// as the coordinator's offer and reply (what a joining process reads). A request re-encodes
/// to the same bytes but for the domain and generation a new member's request carries and
/// nobody reads; an offer is accepted only in this protocol; a welcome re-encodes to its
/// bytes and never assigns a row outside the member table; a refusal carries the
/// coordinator's text.
pub fn coordinator_frame(data: &[u8]) {
    if let Ok(request) = Request::decode(data) {
        let again = request.encode();
        let reread = Request::decode(&again).expect("an encoded request decodes");
        assert_eq!(
            (reread.rejoin, reread.who),
            (request.rejoin, request.who),
            "decode → encode → decode"
        );
        match request.rejoin {
            Some((_, member, _)) => {
                assert!(member < u32::MAX as usize);
                assert_eq!(again, data, "a rejoin re-encodes to its bytes");
            }
            None => {
                assert_eq!(again[..8], data[..8]);
                assert_eq!(again[16..20], data[16..20]);
                assert_eq!(again[24..], data[24..]);
            }
        }
    }
    let config = DomainConfig::new("fuzz");
    let refused = data.len() >= 5 && data[..4] == *b"NLDW" && data[4] != 0;
    let reason = |e: PoolError| match e {
        PoolError::Join { reason, .. } => reason,
        other => panic!("a frame refused as {other}"),
    };
    match check_offer(&config, data) {
        Ok(()) => assert_eq!(data, offer(), "an offer in another protocol"),
        Err(e) if refused => assert_eq!(reason(e), String::from_utf8_lossy(&data[5..])),
        Err(e) => drop(reason(e)),
    }
    match check_welcome(&config, data) {
        Ok((member, generation)) => {
            assert!(member < MAX_MEMBERS, "a welcome to member {member}");
            let domain = u64::from_le_bytes(data[5..13].try_into().expect("8 bytes"));
            let again = welcome(domain, member, generation);
            assert_eq!(again, data, "a welcome re-encodes to its bytes");
        }
        Err(e) if refused => assert_eq!(reason(e), String::from_utf8_lossy(&data[5..])),
        Err(e) => drop(reason(e)),
    }
}

/// The domain id of the pools `pool_ref` forges.
const DOMAIN: u64 = 0x5eed_0fd0_a1ce;
/// Pages of a forged pool: one page word's worth, so a `u64` says who holds which.
const PAGES: u32 = 64;
/// Ref slots of a forged pool.
const SLOTS: u32 = 4;

/// Target `pool_ref`: `mode: u8` (bits 0–1: which check), then per mode
///
/// - 0: a Ref's 32 bytes (`Ref::from_bytes`), which re-encode to themselves;
/// - 1, 2: a Ref mapped (`Domain::map`, or with 2 `Domain::map_from` the creator's pid)
///   from a private pool whose ref slot, holder words and page tables another member wrote:
///   `ref: [u8; 32], slot: u8, state: u64, len: u64, npages: u32, ntables: u32, tables:
///   [u32; 24], held: u64` (the pages the slot's creator holds), then the page-table bytes;
/// - 3: a pool segment a coordinator passed (`PoolMap::attach`): `sized: u8, len: u32,
///   expect: u64`, the header, then the rest of the first page.
///
/// Whatever maps is a buffer of the Ref's length whose pages are in the pool and held by
/// this process; whatever attaches has every view inside the mapping.
pub fn pool_ref(data: &[u8]) {
    let mut input = Input(data);
    match input.u8() & 3 {
        0 => {
            let bytes = input.rest();
            if let Ok(r) = Ref::from_bytes(bytes) {
                assert_eq!(r.to_bytes(), bytes, "a Ref re-encodes to its bytes");
            }
        }
        3 => attach_pool(input),
        mode => map_forged_ref(input, mode == 2),
    }
}

fn map_forged_ref(mut input: Input<'_>, from_pid: bool) {
    let Ok(r) = Ref::from_bytes(&input.array::<32>()) else {
        return;
    };
    let geometry = PoolGeometry {
        pages: PAGES,
        ref_slots: SLOTS,
    };
    let map = Arc::new(PoolMap::create(geometry, DOMAIN).expect("a private pool"));
    members::claim_private_row(&map, 0);
    let slot = &map.slots()[usize::from(input.u8()) % SLOTS as usize];
    let state = input.u64();
    slot.state.store(state, Ordering::Relaxed);
    slot.len.store(input.u64(), Ordering::Relaxed);
    slot.npages.store(input.u32(), Ordering::Relaxed);
    slot.ntables.store(input.u32(), Ordering::Relaxed);
    for table in &slot.tables {
        table.store(input.u32(), Ordering::Relaxed);
    }
    // The slot's creator: alive (another process, here ours), holding the pages it says.
    let (_, creator, _) = slot_parts(state);
    let held = input.u64();
    if creator < MAX_MEMBERS {
        let row = &map.members()[creator];
        row.pid.store(std::process::id(), Ordering::Relaxed);
        row.pid_ns
            .store(members::pid_namespace(), Ordering::Relaxed);
        row.state
            .store(1 << 32 | member_state::ALIVE, Ordering::Release);
        for (page, word) in map.words().iter().enumerate() {
            if held & 1 << page != 0 {
                word.fetch_or(pages::bit(creator), Ordering::Relaxed);
            }
        }
    }
    // The page tables' bytes, into the pages the slot names as tables (each once).
    let mut bytes = input.rest();
    let mut written = Vec::new();
    for table in &slot.tables {
        let page = table.load(Ordering::Relaxed);
        if bytes.is_empty() || page >= PAGES || written.contains(&page) {
            continue;
        }
        let n = bytes.len().min(PAGE_SIZE);
        // SAFETY: page < npages: n <= PAGE_SIZE bytes inside the pool's pages, ours alone.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.page_ptr(page), n) };
        bytes = &bytes[n..];
        written.push(page);
    }
    let domain = Domain::from_parts(
        map.clone(),
        0,
        &DomainConfig::new("fuzz"),
        None,
        members::Tokens::private(),
        members::pid_namespace(),
    );
    let mapped = if from_pid {
        domain.map_from(&r, std::process::id())
    } else {
        domain.map(&r)
    };
    let Ok(buf) = mapped else {
        return;
    };
    assert_eq!(
        buf.len(),
        r.len(),
        "a buffer of another length than its Ref"
    );
    assert_eq!(buf.pages().len(), r.len().div_ceil(PAGE_SIZE));
    for &page in buf.pages() {
        assert!(page < PAGES, "page {page} outside the pool");
        assert!(
            pages::holds(&map, 0, page),
            "page {page} mapped but not held"
        );
    }
    let (_, _, now) = slot_parts(slot.state.load(Ordering::Acquire));
    assert_eq!(now, slot_state::TAKEN, "a mapped Ref's slot is taken");
    assert_eq!(buf.to_vec().len(), r.len());
}

/// Largest pool segment `attach_pool` makes.
const MAX_FUZZ_POOL: usize = 8 << 20;

fn attach_pool(mut input: Input<'_>) {
    let sized = input.u8() & 1 != 0;
    let len = input.u32() as usize;
    let expect = input.u64();
    let header: [u8; std::mem::size_of::<PoolHeader>()] = input.array();
    // SAFETY: `header` holds a PoolHeader's bytes; it is plain integers.
    let h: PoolHeader = unsafe { std::ptr::read_unaligned(header.as_ptr().cast()) };
    let len = match usize::try_from(h.total_len) {
        Ok(n) if sized && (1..=MAX_FUZZ_POOL).contains(&n) => n,
        _ => len % MAX_FUZZ_POOL + 1,
    };
    let Ok(segment) = Segment::create("netless-pool-fuzz", len) else {
        return;
    };
    let first_page = [&header[..], input.rest()].concat();
    let n = first_page.len().min(len).min(PAGE_SIZE);
    // SAFETY: n <= len bytes at the start of the segment, which nobody else maps yet.
    unsafe { std::ptr::copy_nonoverlapping(first_page.as_ptr(), segment.as_ptr(), n) };
    let fd = segment.fd().try_clone_to_owned().expect("dup of a memfd");
    let expect = (expect & 1 != 0).then_some(expect >> 1);
    let Ok(map) = PoolMap::attach(fd, expect) else {
        return;
    };
    let (base, end) = (map.segment().as_ptr() as usize, map.segment().len());
    let inside = |ptr: *const u8, bytes: usize| {
        let at = ptr as usize;
        assert!(
            at >= base && at - base <= end && end - (at - base) >= bytes,
            "a view outside"
        );
    };
    inside(
        map.members().as_ptr().cast(),
        std::mem::size_of_val(map.members()),
    );
    inside(
        map.slots().as_ptr().cast(),
        std::mem::size_of_val(map.slots()),
    );
    inside(
        map.words().as_ptr().cast(),
        std::mem::size_of_val(map.words()),
    );
    inside(
        map.hints().as_ptr().cast(),
        std::mem::size_of_val(map.hints()),
    );
    assert_eq!(map.words().len(), map.npages() as usize);
    assert_eq!(map.slots().len(), map.nslots() as usize);
    inside(map.page_ptr(map.npages() - 1), PAGE_SIZE);
}

/// Seed inputs for each target, made by the real encoders: `(target, input)` pairs.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // A process as it names itself (fixed, so the seeds are too): pid, namespace, token.
    let me = members::Identity {
        pid: 4242,
        pid_ns: 4_026_531_836,
        token: 7,
    };
    let join = |rejoin| Request { rejoin, who: me }.encode();
    let mut seeds = vec![
        ("coordinator_frame", join(None)),
        ("coordinator_frame", join(Some((DOMAIN, 3, 7)))),
        ("coordinator_frame", welcome(DOMAIN, 3, 7)),
        ("coordinator_frame", refusal("the domain is full")),
        ("coordinator_frame", offer()),
    ];
    // A Ref and its slot as a creator writes them, in a private pool.
    let domain = Domain::private(PoolGeometry {
        pages: PAGES,
        ref_slots: SLOTS,
    })
    .expect("a private pool");
    let map = domain.membership.map.clone();
    for len in [5000, PAGE_SIZE * 3] {
        let buf = domain.alloc_from(&vec![0x42; len]).expect("pages");
        let r = buf.share().expect("a Ref");
        seeds.push(("pool_ref", [&[0u8][..], &r.to_bytes()].concat()));
        let slot = &map.slots()[r.slot as usize];
        let mut forged = vec![1u8];
        forged.extend_from_slice(&r.to_bytes());
        forged.push(r.slot as u8);
        forged.extend_from_slice(&slot.state.load(Ordering::Relaxed).to_le_bytes());
        forged.extend_from_slice(&slot.len.load(Ordering::Relaxed).to_le_bytes());
        forged.extend_from_slice(&slot.npages.load(Ordering::Relaxed).to_le_bytes());
        forged.extend_from_slice(&slot.ntables.load(Ordering::Relaxed).to_le_bytes());
        for table in &slot.tables {
            forged.extend_from_slice(&table.load(Ordering::Relaxed).to_le_bytes());
        }
        let mut held = 0u64;
        for (page, word) in map.words().iter().enumerate() {
            if word.load(Ordering::Relaxed) != 0 {
                held |= 1 << page;
            }
        }
        forged.extend_from_slice(&held.to_le_bytes());
        let table = slot.tables[0].load(Ordering::Relaxed);
        let entries = slot.npages.load(Ordering::Relaxed) as usize;
        // SAFETY: the table page is inside the pool; its first `entries` u32s are the list.
        let list = unsafe { std::slice::from_raw_parts(map.page_ptr(table), entries * 4) };
        forged.extend_from_slice(list);
        seeds.push(("pool_ref", forged));
    }
    let header = PoolGeometry {
        pages: PAGES,
        ref_slots: SLOTS,
    }
    .header(DOMAIN);
    // SAFETY: a PoolHeader is plain integers, viewed as its bytes.
    let bytes: [u8; std::mem::size_of::<PoolHeader>()] = unsafe { std::mem::transmute(header) };
    let mut attach = vec![3u8, 1, 0, 0, 0, 0];
    attach.extend_from_slice(&(DOMAIN << 1 | 1).to_le_bytes());
    attach.extend_from_slice(&bytes);
    seeds.push(("pool_ref", attach));
    seeds
}
