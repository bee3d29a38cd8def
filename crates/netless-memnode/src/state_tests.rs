//! The node's state without a transport: holds, page sharing, leases (time moved by hand),
//! capacity, and every refusal's code.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::Code;

use super::*;

const LEASE: Duration = Duration::from_secs(1);

fn node(capacity_pages: u64) -> State {
    State::new(MemNodeConfig {
        capacity_bytes: capacity_pages * PAGE,
        lease: LEASE,
        max_sessions: 4,
        max_object_bytes: 64 * PAGE,
        max_objects: 100,
        max_holds_per_session: 10,
        ..MemNodeConfig::default()
    })
    .unwrap()
}

fn page(byte: u8) -> Bytes {
    Bytes::from(vec![byte; PAGE_SIZE])
}

/// Puts an object of `n` pages (page `i` filled with byte `i`) for `session`.
fn put(state: &mut State, session: &SessionId, n: u8, now: Instant) -> RemoteRef {
    state.reserve(u64::from(n)).unwrap();
    state.unreserve(u64::from(n));
    let pages = (0..n).map(page).collect();
    state
        .commit_put(session, u64::from(n) * PAGE, pages, now)
        .unwrap()
}

fn code<T: std::fmt::Debug>(result: Result<T, Status>) -> Code {
    result.unwrap_err().code()
}

#[test]
fn derived_objects_share_unwritten_pages_and_free_them_with_the_last_holder() {
    let now = Instant::now();
    let mut state = node(100);
    let s = state.open("a", None, now).unwrap();
    let base = put(&mut state, &s, 3, now);
    let mut written = BTreeMap::new();
    written.insert(1, page(0xee));
    let derived = state
        .commit_derive(&s, &base, 3 * PAGE, written, now)
        .unwrap();
    assert_eq!(state.stats().pages, 4, "3 base pages + 1 private copy");
    assert_eq!(state.page_refs(&base, 0), 2);
    assert_eq!(state.page_refs(&base, 1), 1);
    assert_eq!(state.page_refs(&derived, 1), 1);
    let base_pages = state.read(&base, 0, 3).unwrap();
    assert_eq!(base_pages[1][0], 1, "the base never changes");
    assert_eq!(state.read(&derived, 1, 2).unwrap()[0][0], 0xee);

    state.release(&s, &base, now).unwrap();
    assert_eq!(state.stats().pages, 3, "the base's private page 1 is freed");
    assert_eq!(state.page_refs(&derived, 0), 1);
    assert_eq!(code(state.read(&base, 0, 1)), Code::NotFound);
    state.release(&s, &derived, now).unwrap();
    let stats = state.stats();
    assert_eq!((stats.objects, stats.pages, stats.holds), (0, 0, 0));
}

#[test]
fn an_object_lives_while_any_session_holds_it() {
    let now = Instant::now();
    let mut state = node(100);
    let caller = state.open("caller", None, now).unwrap();
    let callee = state.open("callee", None, now).unwrap();
    let r = put(&mut state, &caller, 2, now);
    state.retain(&callee, &r, now).unwrap();
    state.retain(&callee, &r, now).unwrap();
    assert_eq!(state.stats().holds, 2, "retaining twice holds once");
    assert_eq!(state.close(&caller, now).unwrap(), 1);
    assert_eq!(
        state.read(&r, 0, 2).unwrap().len(),
        2,
        "the callee still holds it"
    );
    assert_eq!(
        code(state.release(&caller, &r, now)),
        Code::Unauthenticated,
        "a closed session"
    );
    state.release(&callee, &r, now).unwrap();
    assert_eq!(code(state.release(&callee, &r, now)), Code::NotFound);
    assert_eq!(state.stats().pages, 0);
}

#[test]
fn an_expired_session_loses_its_holds_and_a_kept_alive_one_does_not() {
    let start = Instant::now();
    let mut state = node(100);
    let kept = state.open("kept", None, start).unwrap();
    let lost = state.open("lost", None, start).unwrap();
    let r_kept = put(&mut state, &kept, 1, start);
    let r_lost = put(&mut state, &lost, 2, start);
    let mut now = start;
    for _ in 0..5 {
        now += LEASE / 2;
        state.keep_alive(&kept, now).unwrap();
        state.sweep(now);
    }
    assert_eq!(code(state.keep_alive(&lost, now)), Code::Unauthenticated);
    assert_eq!(code(state.read(&r_lost, 0, 1)), Code::NotFound);
    assert_eq!(state.read(&r_kept, 0, 1).unwrap().len(), 1);
    let stats = state.stats();
    assert_eq!((stats.sessions, stats.objects, stats.pages), (1, 1, 1));
    now += LEASE;
    assert_eq!(state.sweep(now), 1);
    let stats = state.stats();
    assert_eq!((stats.sessions, stats.objects, stats.pages), (0, 0, 0));
}

#[test]
fn a_session_found_expired_before_the_sweeper_is_closed_there() {
    let start = Instant::now();
    let mut state = node(100);
    let s = state.open("late", None, start).unwrap();
    put(&mut state, &s, 1, start);
    assert_eq!(
        code(state.session(&s, start + LEASE)),
        Code::Unauthenticated
    );
    assert_eq!(state.stats().pages, 0);
}

#[test]
fn capacity_counts_reservations_and_recovers_after_release() {
    let now = Instant::now();
    let mut state = node(4);
    let s = state.open("a", None, now).unwrap();
    let r = put(&mut state, &s, 3, now);
    state.reserve(1).unwrap();
    assert_eq!(code(state.reserve(1)), Code::ResourceExhausted);
    assert_eq!(state.stats().reserved_bytes, PAGE);
    state.unreserve(1);
    assert_eq!(code(state.reserve(2)), Code::ResourceExhausted);
    state.release(&s, &r, now).unwrap();
    state.reserve(4).unwrap();
    assert_eq!(state.stats().reserved_bytes, 4 * PAGE);
}

#[test]
fn every_bound_refuses_with_resource_exhausted() {
    let now = Instant::now();
    let mut state = node(1000);
    let sessions: Vec<_> = (0..4)
        .map(|_| state.open("x", None, now).unwrap())
        .collect();
    assert_eq!(code(state.open("x", None, now)), Code::ResourceExhausted);
    assert_eq!(
        code(state.check_len(64 * PAGE + 1)),
        Code::ResourceExhausted
    );
    assert_eq!(
        code(state.open(&"x".repeat(200), None, now)),
        Code::InvalidArgument
    );
    let s = sessions[0];
    for _ in 0..10 {
        state.commit_put(&s, 0, Vec::new(), now).unwrap();
    }
    assert_eq!(
        code(state.commit_put(&s, 0, Vec::new(), now)),
        Code::ResourceExhausted,
        "holds per session"
    );
    assert_eq!(state.stats().pages, 0, "empty objects take no page");
}

#[test]
fn one_client_takes_at_most_its_share_of_sessions() {
    let start = Instant::now();
    let mut state = State::new(MemNodeConfig {
        lease: LEASE,
        max_sessions: 8,
        max_sessions_per_peer: 2,
        ..MemNodeConfig::default()
    })
    .unwrap();
    let hog: Peer = Some("10.0.0.9".parse().unwrap());
    let first = state.open("hog", hog, start).unwrap();
    state.open("hog", hog, start).unwrap();
    let refused = state.open("hog", hog, start).unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("2 sessions are open from 10.0.0.9"),
        "{refused:?}"
    );
    // Others are served meanwhile, those of unknown address under one key of their own.
    state
        .open("other", Some("10.0.0.10".parse().unwrap()), start)
        .unwrap();
    state.open("local", None, start).unwrap();
    state.open("local", None, start).unwrap();
    let refused = state.open("local", None, start).unwrap_err();
    assert!(refused.message().contains("unknown address"), "{refused:?}");
    // A closed session, or one whose lease ran out, gives its place back.
    state.close(&first, start).unwrap();
    let kept = state.open("hog", hog, start).unwrap();
    assert_eq!(code(state.open("hog", hog, start)), Code::ResourceExhausted);
    let later = start + LEASE / 2;
    state.keep_alive(&kept, later).unwrap();
    let now = start + LEASE;
    state.open("hog", hog, now).unwrap();
    assert_eq!(code(state.open("hog", hog, now)), Code::ResourceExhausted);
    assert_eq!(state.stats().sessions, 2, "the expired ones are gone");
}

#[test]
fn a_lease_too_long_for_the_clock_is_refused_not_a_panic() {
    let now = Instant::now();
    let mut state = State::new(MemNodeConfig {
        lease: Duration::MAX,
        ..MemNodeConfig::default()
    })
    .unwrap();
    assert_eq!(code(state.open("x", None, now)), Code::Internal);
    assert_eq!(state.stats().sessions, 0);
}

#[test]
fn holds_and_empty_objects_are_bounded_node_wide() {
    let now = Instant::now();
    let mut state = State::new(MemNodeConfig {
        capacity_bytes: 0,
        lease: LEASE,
        max_objects: 3,
        max_holds: 5,
        ..MemNodeConfig::default()
    })
    .unwrap();
    let owner = state.open("owner", None, now).unwrap();
    let empty: Vec<_> = (0..3)
        .map(|_| state.commit_put(&owner, 0, Vec::new(), now).unwrap())
        .collect();
    let refused = state.commit_put(&owner, 0, Vec::new(), now).unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("3 objects"), "{refused:?}");

    let other = state.open("other", None, now).unwrap();
    state.retain(&other, &empty[0], now).unwrap();
    state.retain(&other, &empty[1], now).unwrap();
    let refused = state.retain(&other, &empty[2], now).unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("5 holds"), "{refused:?}");
    // Other sessions share the bound: a new one may hold nothing more either.
    let third = state.open("third", None, now).unwrap();
    assert_eq!(
        code(state.retain(&third, &empty[2], now)),
        Code::ResourceExhausted
    );
    state.release(&owner, &empty[0], now).unwrap();
    state.retain(&third, &empty[2], now).unwrap();
    let stats = state.stats();
    assert_eq!((stats.objects, stats.holds, stats.pages), (3, 5, 0));
}

#[test]
fn references_are_checked_before_anything_is_looked_up() {
    let now = Instant::now();
    let mut state = node(100);
    let s = state.open("a", None, now).unwrap();
    let r = put(&mut state, &s, 2, now);
    let mut bytes = r.to_bytes();
    bytes[40] ^= 1;
    let forged = RemoteRef::from_bytes(&bytes).unwrap();
    assert_eq!(code(state.read(&forged, 0, 1)), Code::PermissionDenied);
    let mut bytes = r.to_bytes();
    bytes[24] = 0xff; // a longer length
    let longer = RemoteRef::from_bytes(&bytes).unwrap();
    assert_eq!(
        code(state.page_range(&longer, 0, 0)),
        Code::PermissionDenied
    );
    let other_run = node(100);
    assert_eq!(code(other_run.page_range(&r, 0, 0)), Code::NotFound);
    assert_eq!(code(state.page_range(&r, 1, 2)), Code::OutOfRange);
    assert_eq!(code(state.page_range(&r, 3, 0)), Code::OutOfRange);
    assert_eq!(
        state.page_range(&r, 2, 0).unwrap(),
        2,
        "an empty range at the end"
    );
    assert_eq!(state.page_range(&r, 0, 0).unwrap(), 2);
    assert_eq!(code(state.retain(&[0; 16], &r, now)), Code::Unauthenticated);
    assert_eq!(code(state.retain(b"short", &r, now)), Code::Unauthenticated);
}

#[test]
fn reads_cut_the_last_page_to_the_length_and_count_pages() {
    let now = Instant::now();
    let mut state = node(100);
    let s = state.open("a", None, now).unwrap();
    let r = state
        .commit_put(&s, PAGE + 10, vec![page(1), page(2)], now)
        .unwrap();
    let pages = state.read(&r, 0, 2).unwrap();
    assert_eq!((pages[0].len(), pages[1].len()), (PAGE_SIZE, 10));
    state.read(&r, 1, 2).unwrap();
    assert_eq!(state.stats().pages_read, 3);
}

/// Records each event's fields as `name=value` with `value` as the event formats it.
struct Capture(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, "{}={value:?} ", field.name());
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_holder_label_reaches_the_log_escaped() {
    let start = Instant::now();
    let mut state = node(100);
    state
        .open("evil\nINFO memory node: forged line\u{1b}[2J", None, start)
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(Capture(lines.clone()), || state.sweep(start + LEASE));
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        !lines[0].contains(['\n', '\u{1b}']),
        "a raw control character: {lines:?}"
    );
    assert!(
        lines[0].contains(r#"holder="evil\nINFO memory node: forged line\u{1b}[2J""#),
        "{lines:?}"
    );
}
