//! One egress service's remote endpoints: each one's HTTP/2 connection (a tonic channel,
//! made on first use inside the serving runtime, which then runs it, and reconnected by
//! tonic when it drops), the calls under way on it (its load), and its health.
//!
//! A call takes the least loaded endpoint that is up, the ties going round in turn. An
//! endpoint whose connection could not be made is down for a while (1 s, doubling with each
//! failure in a row, at most 30 s) and gets no call while another is up; when none is, the
//! one down the longest is tried anyway, so a remote that comes back is found by the next
//! call. This module never looks at a call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

/// How long an endpoint is down after its first failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// How long at most.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The endpoints of one egress service.
#[derive(Debug)]
pub(super) struct Endpoints {
    all: Vec<Remote>,
    /// Where the next pick starts, so that ties go round.
    next: AtomicUsize,
}

#[derive(Debug)]
struct Remote {
    /// As configured, for the gateway's log.
    shown: String,
    endpoint: tonic::transport::Endpoint,
    channel: OnceLock<Channel>,
    load: Arc<AtomicUsize>,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    /// Failed connections in a row.
    failures: u32,
    /// Until when no call goes to it while another endpoint is up.
    down_until: Option<Instant>,
}

/// A try under way on an endpoint: counted in its load until dropped.
#[derive(Debug)]
pub(super) struct Load(pub(super) Arc<AtomicUsize>);

impl Drop for Load {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Endpoints {
    pub(super) fn new(endpoints: &[(String, tonic::transport::Endpoint)]) -> Endpoints {
        Endpoints {
            all: endpoints
                .iter()
                .map(|(shown, endpoint)| Remote {
                    shown: shown.clone(),
                    endpoint: endpoint.clone(),
                    channel: OnceLock::new(),
                    load: Arc::default(),
                    health: Mutex::default(),
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    /// The endpoint for a call's next try, among those it has not `tried`: the least
    /// loaded that is up, else the one down the longest; `None` when all were tried.
    pub(super) fn pick(&self, tried: &[usize]) -> Option<usize> {
        let now = Instant::now();
        let n = self.all.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut up: Option<(usize, usize)> = None;
        let mut down: Option<(usize, Instant)> = None;
        for i in (start..n).chain(0..start) {
            if tried.contains(&i) {
                continue;
            }
            let remote = &self.all[i];
            match lock(&remote.health).down_until.filter(|&until| until > now) {
                None => {
                    let load = remote.load.load(Ordering::Relaxed);
                    if up.is_none_or(|(_, least)| load < least) {
                        up = Some((i, load));
                    }
                }
                Some(until) => {
                    if down.is_none_or(|(_, earliest)| until < earliest) {
                        down = Some((i, until));
                    }
                }
            }
        }
        up.map(|(i, _)| i).or(down.map(|(i, _)| i))
    }

    /// Endpoint `i`'s channel, and its load for a try. Must be called in the serving
    /// runtime's context the first time: tonic spawns the channel's tasks there.
    pub(super) fn begin(&self, i: usize) -> (Channel, Load) {
        let remote = &self.all[i];
        let channel = remote
            .channel
            .get_or_init(|| remote.endpoint.connect_lazy())
            .clone();
        remote.load.fetch_add(1, Ordering::Relaxed);
        (channel, Load(remote.load.clone()))
    }

    /// Endpoint `i` as configured (`http://host:port`).
    pub(super) fn shown(&self, i: usize) -> &str {
        &self.all[i].shown
    }

    /// The URI of a request to `path` on endpoint `i`: its scheme and authority, `path`.
    pub(super) fn uri(&self, i: usize, path: &http::uri::PathAndQuery) -> http::Uri {
        let origin = self.all[i].endpoint.uri();
        let mut parts = http::uri::Parts::default();
        parts.scheme = origin.scheme().cloned();
        parts.authority = origin.authority().cloned();
        parts.path_and_query = Some(path.clone());
        http::Uri::from_parts(parts)
            .expect("an endpoint has a scheme and an authority (`Plan::new` checks)")
    }

    /// Endpoint `i` answered: it is up.
    pub(super) fn answered(&self, i: usize) {
        let mut health = lock(&self.all[i].health);
        if health.failures > 0 {
            tracing::info!("egress: {} answers again", self.all[i].shown);
        }
        *health = Health::default();
    }

    /// No connection to endpoint `i` could be made (`why`): it is down for a while.
    pub(super) fn failed(&self, i: usize, why: &str) {
        let mut health = lock(&self.all[i].health);
        health.failures = health.failures.saturating_add(1);
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << (health.failures - 1).min(10))
            .min(MAX_BACKOFF);
        health.down_until = Some(Instant::now() + backoff);
        tracing::warn!(
            "egress: {} is unreachable ({why}); {} failures in a row, down for {backoff:?}",
            self.all[i].shown,
            health.failures
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize) -> Endpoints {
        let list: Vec<_> = (0..n)
            .map(|i| {
                let text = format!("http://127.0.0.1:{}", 1000 + i);
                let endpoint = tonic::transport::Endpoint::from_shared(text.clone()).unwrap();
                (text, endpoint)
            })
            .collect();
        Endpoints::new(&list)
    }

    fn load(endpoints: &Endpoints, i: usize) -> Load {
        let remote = &endpoints.all[i];
        remote.load.fetch_add(1, Ordering::Relaxed);
        Load(remote.load.clone())
    }

    #[test]
    fn ties_go_round_and_the_least_loaded_wins() {
        let e = endpoints(3);
        let picks: Vec<_> = (0..6).map(|_| e.pick(&[]).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let _busy = (load(&e, 0), load(&e, 1), load(&e, 1));
        for _ in 0..3 {
            assert_eq!(e.pick(&[]), Some(2));
        }
        let held = load(&e, 2);
        let _more = load(&e, 2);
        assert_eq!(e.pick(&[]), Some(0));
        drop(held);
        assert_eq!(e.all[2].load.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_try_goes_where_the_call_has_not_been() {
        let e = endpoints(2);
        for _ in 0..4 {
            let first = e.pick(&[]).unwrap();
            let second = e.pick(&[first]).unwrap();
            assert_ne!(first, second);
            assert_eq!(e.pick(&[first, second]), None);
        }
    }

    #[test]
    fn a_down_endpoint_waits_while_another_is_up() {
        let e = endpoints(2);
        e.failed(0, "test");
        for _ in 0..4 {
            assert_eq!(e.pick(&[]), Some(1));
        }
        // With the other tried too, the down one is still tried.
        assert_eq!(e.pick(&[1]), Some(0));
        e.failed(1, "test");
        e.failed(1, "test");
        // Both down: the one down the longest (until the earliest) first.
        assert_eq!(e.pick(&[]), Some(0));
        e.answered(0);
        assert_eq!(e.pick(&[]), Some(0));
        let health = lock(&e.all[1].health);
        assert_eq!(health.failures, 2);
        let left = health.down_until.unwrap() - Instant::now();
        assert!(left > Duration::from_millis(1500) && left <= Duration::from_secs(2));
    }
}
