//! The gateway's own counters, for its `/metrics` (`scrape`): the calls that come in
//! (gRFC A66's `grpc.server.call.*`), the tries of egress calls to remotes
//! (`grpc.client.attempt.*`), connections and refusals.
//!
//! A call is counted as started once its label is known: when the gateway has a backend
//! link for it, or when it is refused or answered by the gateway itself. Its duration runs
//! from the arrival of its headers until its response body ends (its trailers are sent) or
//! is dropped (the client reset the stream: `CANCELLED`), and goes to the histogram of its
//! status (`grpc-status` of its trailers, or of a trailers-only response).
//!
//! Labels stay bounded whatever callers send: `grpc_method` is `pkg.Service/Method` only
//! for a call that reached a backend of an allowed service (or a method the gateway
//! answers itself), `Method` a protobuf method name, and at most [`MAX_METHODS`] per
//! service; every other call is `other`, as gRFC A66 labels methods a server does not
//! know. When a service's table is full, a method whose every call ended `UNIMPLEMENTED`
//! (a name the backend does not know) gives its place up, its counts moving to `other`.
//! Egress tries are labelled the same way, and by `grpc_target`, the endpoint as
//! configured.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use netless::Code;

use crate::mapping::is_method_name;
use crate::prometheus::{Exposition, Histogram, Kind};

/// Methods labelled by name per service at most.
pub(crate) const MAX_METHODS: usize = 64;

/// The label of calls not labelled by their method.
const OTHER: &str = "other";

/// Status codes 0..=16.
const CODES: usize = 17;

/// Everything `/metrics` shows of the gateway itself.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Calls coming in.
    server: Table,
    /// Tries of egress calls.
    client: Table,
    /// Connections served now, and accepted so far.
    connections: AtomicU64,
    accepted: AtomicU64,
    /// Calls refused by the gateway itself, by status code.
    refused: [AtomicU64; CODES],
}

/// One label set's counts.
#[derive(Debug, Default)]
struct Series {
    started: AtomicU64,
    /// Started and not finished.
    in_flight: AtomicU64,
    by_status: [Histogram; CODES],
}

impl Series {
    /// Whether every call so far ended `UNIMPLEMENTED` and none is under way.
    fn only_unimplemented(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self
                .by_status
                .iter()
                .enumerate()
                .all(|(code, h)| code == Code::Unimplemented as usize || h.count() == 0)
    }

    fn absorb(&self, other: &Series) {
        let started = other.started.load(Ordering::Relaxed);
        self.started.fetch_add(started, Ordering::Relaxed);
        for (mine, theirs) in self.by_status.iter().zip(&other.by_status) {
            mine.absorb(theirs);
        }
    }
}

/// `(grpc_method, grpc_target)` (the target empty for calls coming in).
type Key = (String, String);

/// The series of one side, by label set.
#[derive(Debug, Default)]
struct Table {
    series: RwLock<HashMap<Key, Arc<Series>>>,
}

impl Table {
    /// The series of a call of `method` of `service` (`None`: not labelled by method) to
    /// `target`, counted as started.
    fn start(&self, labelled: Option<(&str, &str)>, target: &str) -> Arc<Series> {
        let method = labelled
            .filter(|(_, method)| is_method_name(method))
            .map(|(service, method)| format!("{service}/{method}"));
        let key = (
            method.unwrap_or_else(|| OTHER.to_string()),
            target.to_string(),
        );
        {
            let series = self.series.read().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = series.get(&key) {
                // Counted under the lock, so that a series given up is never counted in.
                s.started.fetch_add(1, Ordering::Relaxed);
                s.in_flight.fetch_add(1, Ordering::AcqRel);
                return s.clone();
            }
        }
        let mut series = self.series.write().unwrap_or_else(|e| e.into_inner());
        let other = (OTHER.to_string(), key.1.clone());
        let key = match labelled {
            Some((service, _)) if key.0 != OTHER && !series.contains_key(&key) => {
                if room_for(&mut series, service, &other) {
                    key
                } else {
                    other
                }
            }
            _ => key,
        };
        let s = series.entry(key).or_default().clone();
        s.started.fetch_add(1, Ordering::Relaxed);
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        s
    }

    fn is_empty(&self) -> bool {
        self.series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The series sorted by label set, for a stable exposition.
    fn sorted(&self) -> Vec<(Key, Arc<Series>)> {
        let series = self.series.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(Key, Arc<Series>)> =
            series.iter().map(|(k, s)| (k.clone(), s.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// Whether `service` may have one more method's series in `series`, after giving up, if
/// it must, one whose every call ended `UNIMPLEMENTED` (its counts go to `other`).
fn room_for(series: &mut HashMap<Key, Arc<Series>>, service: &str, other: &Key) -> bool {
    let prefix = format!("{service}/");
    let mine: Vec<&Key> = series
        .keys()
        .filter(|(m, t)| *t == other.1 && m.starts_with(&prefix))
        .collect();
    if mine.len() < MAX_METHODS {
        return true;
    }
    let Some(gone) = mine
        .into_iter()
        .find(|k| series[*k].only_unimplemented())
        .cloned()
    else {
        return false;
    };
    let gone = series.remove(&gone).expect("listed above");
    series.entry(other.clone()).or_default().absorb(&gone);
    true
}

impl Metrics {
    /// A call coming in, timed from now.
    pub(crate) fn server_call(self: &Arc<Self>) -> ServerCall {
        ServerCall {
            metrics: self.clone(),
            started: Instant::now(),
            record: None,
            refused: false,
        }
    }

    /// A try of an egress call of `method` of `service` at endpoint `target`, started now.
    pub(crate) fn client_attempt(
        self: &Arc<Self>,
        service: &str,
        method: &str,
        target: &str,
    ) -> Record {
        Record {
            series: self.client.start(Some((service, method)), target),
            started: Instant::now(),
            refused: None,
            done: false,
        }
    }

    /// A connection accepted; it counts as open until the guard drops.
    pub(crate) fn connection(self: &Arc<Self>) -> ConnectionGuard {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.clone())
    }

    /// Writes the gateway's families; `refused_connections` is the gateway's own count.
    pub(crate) fn write(&self, out: &mut Exposition, refused_connections: u64) {
        let server = self.server.sorted();
        out.family(
            "grpc_server_call_started_total",
            Kind::Counter,
            "Calls the gateway received (counted once admitted to a backend, refused or \
             answered by the gateway).",
        );
        for ((method, _), s) in &server {
            let started = s.started.load(Ordering::Relaxed);
            out.sample(
                "grpc_server_call_started_total",
                &[("grpc_method", method)],
                started,
            );
        }
        let name = "grpc_server_call_duration_seconds";
        out.family(
            name,
            Kind::Histogram,
            "Time from a call's headers to the end of its response, by status.",
        );
        write_durations(out, name, &server, false);
        if !self.client.is_empty() {
            let client = self.client.sorted();
            out.family(
                "grpc_client_attempt_started_total",
                Kind::Counter,
                "Tries of egress calls at remote endpoints.",
            );
            for ((method, target), s) in &client {
                let labels = [("grpc_method", method.as_str()), ("grpc_target", target)];
                let started = s.started.load(Ordering::Relaxed);
                out.sample("grpc_client_attempt_started_total", &labels, started);
            }
            let name = "grpc_client_attempt_duration_seconds";
            out.family(
                name,
                Kind::Histogram,
                "Time from the start of a try of an egress call to the end of its response, \
                 by status.",
            );
            write_durations(out, name, &client, true);
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.family(
            "netless_gateway_connections",
            Kind::Gauge,
            "Connections served now.",
        );
        out.sample("netless_gateway_connections", &[], load(&self.connections));
        out.family(
            "netless_gateway_connections_accepted_total",
            Kind::Counter,
            "Connections accepted and served.",
        );
        out.sample(
            "netless_gateway_connections_accepted_total",
            &[],
            load(&self.accepted),
        );
        out.family(
            "netless_gateway_connections_refused_total",
            Kind::Counter,
            "Connections closed on accept: max_connections, or max_connections_per_peer.",
        );
        out.sample(
            "netless_gateway_connections_refused_total",
            &[],
            refused_connections,
        );
        out.family(
            "netless_gateway_calls_refused_total",
            Kind::Counter,
            "Calls the gateway refused itself (token, allow-list, limits, no backend), by \
             status.",
        );
        for (code, n) in self.refused.iter().enumerate() {
            let n = load(n);
            if n > 0 {
                let status = code_name(code);
                out.sample(
                    "netless_gateway_calls_refused_total",
                    &[("grpc_status", status)],
                    n,
                );
            }
        }
    }
}

fn code_name(code: usize) -> &'static str {
    Code::from_u16(code as u16).map_or("UNKNOWN", Code::name)
}

/// The duration histograms of `series`, one per status seen.
fn write_durations(out: &mut Exposition, name: &str, series: &[(Key, Arc<Series>)], target: bool) {
    for ((method, t), s) in series {
        for (code, h) in s.by_status.iter().enumerate() {
            if h.count() == 0 {
                continue;
            }
            let status = code_name(code);
            if target {
                let labels = [
                    ("grpc_method", method.as_str()),
                    ("grpc_target", t),
                    ("grpc_status", status),
                ];
                h.write(out, name, &labels);
            } else {
                h.write(
                    out,
                    name,
                    &[("grpc_method", method.as_str()), ("grpc_status", status)],
                );
            }
        }
    }
}

/// An open connection (see [`Metrics::connection`]).
#[derive(Debug)]
pub(crate) struct ConnectionGuard(Arc<Metrics>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A call coming in, until its label is known ([`ServerCall::label`]) and its response
/// is on its way ([`ServerCall::respond`]).
#[derive(Debug)]
pub(crate) struct ServerCall {
    metrics: Arc<Metrics>,
    started: Instant,
    record: Option<Record>,
    refused: bool,
}

impl ServerCall {
    /// The call goes to (or is answered as) `method` of `service`: counted as started.
    pub(crate) fn label(&mut self, service: &str, method: &str) {
        if self.record.is_none() {
            let series = self.metrics.server.start(Some((service, method)), "");
            self.record = Some(Record {
                series,
                started: self.started,
                refused: None,
                done: false,
            });
        }
    }

    /// The gateway refuses the call itself.
    pub(crate) fn refused(&mut self) {
        self.refused = true;
    }

    /// Counts the call (as `other` if it has no label yet) and follows its response to
    /// its end.
    pub(crate) fn respond(
        self,
        response: http::Response<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let ServerCall {
            metrics,
            started,
            record,
            refused,
        } = self;
        let mut record = record.unwrap_or_else(|| Record {
            series: metrics.server.start(None, ""),
            started,
            refused: None,
            done: false,
        });
        if refused {
            record.refused = Some(metrics.clone());
        }
        observe(response, record)
    }
}

/// Follows `response` to its end and counts it in `record`: at once for a trailers-only
/// response, else when its trailers pass or its body is dropped.
pub(crate) fn observe(
    response: http::Response<tonic::body::Body>,
    record: Record,
) -> http::Response<tonic::body::Body> {
    if let Some(code) = status_of(response.headers()) {
        record.finish(code);
        return response;
    }
    response.map(|inner| {
        tonic::body::Body::new(Observed {
            inner,
            record: Some(record),
        })
    })
}

fn status_of(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?;
    let code = value.to_str().ok().and_then(|v| v.parse::<u16>().ok());
    Some(code.and_then(Code::from_u16).unwrap_or(Code::Unknown))
}

/// One call's (or try's) place in a series, counted when it ends; dropped unfinished, it
/// ends `CANCELLED`.
#[derive(Debug)]
pub(crate) struct Record {
    series: Arc<Series>,
    started: Instant,
    /// For a call the gateway refused: where refusals are counted.
    refused: Option<Arc<Metrics>>,
    done: bool,
}

impl Record {
    /// Ends the call with `code`.
    pub(crate) fn finish(mut self, code: Code) {
        self.end(code);
    }

    fn end(&mut self, code: Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let i = (code as usize).min(CODES - 1);
        self.series.by_status[i].observe(self.started.elapsed());
        self.series.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(metrics) = self.refused.take() {
            metrics.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.end(Code::Cancelled);
    }
}

/// A response body that counts its call when its trailers pass or it is dropped.
struct Observed {
    inner: tonic::body::Body,
    record: Option<Record>,
}

impl Body for Observed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let code = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame
                .trailers_ref()
                .map(|t| status_of(t).unwrap_or(Code::Unknown)),
            // hyper resets the stream: the client sees INTERNAL.
            Poll::Ready(Some(Err(_))) => Some(Code::Internal),
            // A gRPC response without trailers is malformed.
            Poll::Ready(None) => Some(Code::Unknown),
            Poll::Pending => None,
        };
        if let Some(record) = code.and_then(|code| Some((code, this.record.take()?))) {
            record.1.finish(record.0);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            // Ended without trailers (hyper stops at `is_end_stream`), or reset.
            let code = if self.inner.is_end_stream() {
                Code::Unknown
            } else {
                Code::Cancelled
            };
            record.finish(code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durations(table: &Table, method: &str, code: Code) -> u64 {
        let series = table.series.read().unwrap();
        series
            .get(&(method.to_string(), String::new()))
            .map_or(0, |s| s.by_status[code as usize].count())
    }

    #[test]
    fn methods_are_labelled_up_to_a_bound_and_unknown_ones_give_way() {
        let metrics = Arc::new(Metrics::default());
        let table = &metrics.server;
        for i in 0..MAX_METHODS {
            let record = Record {
                series: table.start(Some(("a.S", &format!("M{i}"))), ""),
                started: Instant::now(),
                refused: None,
                done: false,
            };
            record.finish(Code::Unimplemented);
        }
        // Not a method name: `other`, whatever the room.
        table
            .start(Some(("a.S", "x/y")), "")
            .in_flight
            .store(0, Ordering::Relaxed);
        // The table is full of names the backend did not know: one gives way.
        let real = Record {
            series: table.start(Some(("a.S", "Real")), ""),
            started: Instant::now(),
            refused: None,
            done: false,
        };
        real.finish(Code::Ok);
        assert_eq!(durations(table, "a.S/Real", Code::Ok), 1);
        assert_eq!(durations(table, OTHER, Code::Unimplemented), 1);
        // Another service has a table of its own.
        table
            .start(Some(("b.S", "M0")), "")
            .in_flight
            .store(0, Ordering::Relaxed);
        assert!(table
            .series
            .read()
            .unwrap()
            .contains_key(&("b.S/M0".into(), String::new())));
        let sorted = table.sorted();
        assert_eq!(
            sorted.len(),
            MAX_METHODS + 2,
            "{:?}",
            sorted.iter().map(|s| &s.0).collect::<Vec<_>>()
        );
        let started: u64 = sorted
            .iter()
            .map(|(_, s)| s.started.load(Ordering::Relaxed))
            .sum();
        assert_eq!(started, MAX_METHODS as u64 + 3);
    }

    #[test]
    fn a_full_table_of_real_methods_keeps_them() {
        let metrics = Arc::new(Metrics::default());
        let table = &metrics.server;
        for i in 0..MAX_METHODS {
            table.start(Some(("a.S", &format!("M{i}"))), "");
        }
        let series = table.start(Some(("a.S", "Late")), "");
        assert!(Arc::ptr_eq(
            &series,
            &table.series.read().unwrap()[&(OTHER.into(), String::new())]
        ));
    }

    #[test]
    fn a_dropped_call_is_cancelled_and_a_refusal_counted() {
        let metrics = Arc::new(Metrics::default());
        let mut call = metrics.server_call();
        call.refused();
        let response = call.respond(crate::channel::status_response(&netless::Status::new(
            Code::Unauthenticated,
            "no",
        )));
        drop(response);
        assert_eq!(durations(&metrics.server, OTHER, Code::Unauthenticated), 1);
        assert_eq!(
            metrics.refused[Code::Unauthenticated as usize].load(Ordering::Relaxed),
            1
        );
        let mut call = metrics.server_call();
        call.label("a.S", "M");
        let streaming = http::Response::new(tonic::body::Body::empty());
        drop(call.respond(streaming));
        assert_eq!(durations(&metrics.server, "a.S/M", Code::Unknown), 1);
    }
}
