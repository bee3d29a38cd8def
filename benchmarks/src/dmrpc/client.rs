//! The client side of `pass_by_reference`: one measured window of calls, kept in flight
//! on a pipeline (the chain, the load balancer) or made one at a time (copy-on-write), every
//! reply checked; and the counters of the processes involved before and after it. It never
//! decides which variant runs when: the experiments interleave the windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{CallOptions, Client, Code, Pipeline};
use netless_pool::{Domain, Ref, SharedBuf};

use super::data::{u64s, Counts};
use crate::harness::histogram::new_histogram;

/// What one measured window gave.
pub(super) struct Window {
    pub(super) calls: u64,
    pub(super) elapsed: Duration,
    pub(super) hist: Histogram<u64>,
    pub(super) retries: u64,
    /// This process's payload and Ref bytes sent.
    pub(super) payload_bytes: u64,
    pub(super) handle_bytes: u64,
    pub(super) share_ns: u64,
    pub(super) map_ns: u64,
    pub(super) copy_ns: u64,
    pub(super) write_ns: u64,
    pub(super) unmap_ns: u64,
}

impl Window {
    pub(super) fn new() -> Window {
        Window {
            calls: 0,
            elapsed: Duration::ZERO,
            hist: new_histogram(),
            retries: 0,
            payload_bytes: 0,
            handle_bytes: 0,
            share_ns: 0,
            map_ns: 0,
            copy_ns: 0,
            write_ns: 0,
            unmap_ns: 0,
        }
    }
}

/// What the client sends: the array itself, or a fresh Ref to its copy in the pool.
#[derive(Clone)]
pub(super) enum Payload {
    Value(Arc<Vec<u8>>),
    Ref(Arc<SharedBuf>),
}

impl Payload {
    /// The array's size.
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Value(data) => data.len(),
            Payload::Ref(buf) => buf.len(),
        }
    }
}

/// Keeps `in_flight` calls of `method` outstanding on `pipe` for `window`, checking every
/// reply against `expect`; calls refused with RESOURCE_EXHAUSTED (a full receive buffer
/// somewhere) are counted as retries and made again once replies come.
pub(super) fn closed_loop(
    pipe: &mut Pipeline,
    method: &str,
    payload: &Payload,
    expect: u64,
    in_flight: usize,
    window: Duration,
    domain: &Domain,
) -> anyhow::Result<Window> {
    let started = Instant::now();
    let deadline = started + window;
    let mut w = Window::new();
    // By call slot: when it was sent, and its Ref (revoked if the call fails).
    let mut sent: Vec<Option<(Instant, Option<Ref>)>> = Vec::new();
    let mut outstanding = 0usize;
    let mut failure: Option<String> = None;
    loop {
        let now = Instant::now();
        while outstanding < in_flight && now < deadline {
            let (bytes, r) = match payload {
                Payload::Value(_) => (None, None),
                Payload::Ref(buf) => {
                    let r = buf.share()?;
                    (Some(r.to_bytes()), Some(r))
                }
            };
            let body: &[u8] = match (payload, &bytes) {
                (Payload::Value(data), _) => data,
                (_, Some(b)) => b,
                _ => unreachable!("a Ref payload has its bytes"),
            };
            match pipe.submit(method, body) {
                Ok(id) => {
                    let slot = Pipeline::slot(id);
                    if sent.len() <= slot {
                        sent.resize_with(slot + 1, || None);
                    }
                    sent[slot] = Some((Instant::now(), r));
                    outstanding += 1;
                    match payload {
                        Payload::Value(data) => w.payload_bytes += data.len() as u64,
                        Payload::Ref(_) => w.handle_bytes += Ref::LEN as u64,
                    }
                }
                Err(status) if status.code() == Code::ResourceExhausted && outstanding > 0 => {
                    if let Some(r) = r {
                        let _ = domain.revoke(&r);
                    }
                    w.retries += 1;
                    break;
                }
                Err(status) => bail!("`{method}` failed: {status}"),
            }
        }
        if outstanding == 0 {
            break;
        }
        pipe.wait(Some(Duration::from_secs(10)))
            .with_context(|| format!("waiting for `{method}`"))?;
        pipe.poll(|id, reply| {
            let Some((t, r)) = sent.get_mut(Pipeline::slot(id)).and_then(Option::take) else {
                return;
            };
            outstanding -= 1;
            match reply {
                Ok(bytes) if u64s(bytes).as_slice() == [expect] => {
                    w.hist.saturating_record(t.elapsed().as_nanos() as u64);
                    w.calls += 1;
                }
                Ok(bytes) => {
                    failure.get_or_insert(format!(
                        "`{method}` returned {:?}, expected the sum {expect}",
                        u64s(bytes)
                    ));
                }
                Err(status) if status.code() == Code::ResourceExhausted => {
                    if let Some(r) = r {
                        let _ = domain.revoke(&r);
                    }
                    w.retries += 1;
                }
                Err(status) => {
                    failure.get_or_insert(format!("`{method}` failed: {status}"));
                }
            }
        })?;
        if let Some(failure) = failure.take() {
            bail!(failure);
        }
    }
    w.elapsed = started.elapsed();
    Ok(w)
}

/// One operation at a time for `window`: `share()` the buffer, the callee maps it and writes
/// (method `cow/‰` or `copy/‰`); checks what the callee saw.
pub(super) fn sequential_ops(
    client: &Client,
    method: &str,
    buf: &SharedBuf,
    data: &[u8],
    window: Duration,
) -> anyhow::Result<Window> {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let (head, tail) = (word(&data[..8]), word(&data[data.len() - 8..]));
    let options = CallOptions::new();
    let mut w = Window::new();
    let mut out = Vec::new();
    let started = Instant::now();
    while started.elapsed() < window {
        let t = Instant::now();
        let r = buf.share()?;
        let share_ns = t.elapsed().as_nanos() as u64;
        client
            .call_into(method, &r.to_bytes(), &options, &mut out)
            .with_context(|| format!("`{method}`"))?;
        w.hist.saturating_record(t.elapsed().as_nanos() as u64);
        let &[map_ns, copy_ns, write_ns, unmap_ns, h, tl] = u64s(&out).as_slice() else {
            bail!("`{method}` returned {} bytes", out.len());
        };
        if (h, tl) != (head, tail) {
            bail!("`{method}`: the callee saw {h:#x}..{tl:#x}, not the client's data");
        }
        w.calls += 1;
        w.handle_bytes += Ref::LEN as u64;
        w.share_ns += share_ns;
        w.map_ns += map_ns;
        w.copy_ns += copy_ns;
        w.write_ns += write_ns;
        w.unmap_ns += unmap_ns;
    }
    w.elapsed = started.elapsed();
    Ok(w)
}

/// This process's counters (pool only; its sends are counted per window) and each peer's.
pub(super) fn snapshot(domain: &Domain, peers: &[&Client]) -> anyhow::Result<Vec<Counts>> {
    let pool = domain.stats();
    let mut all = vec![Counts {
        pool_bytes: pool.bytes_copied,
        pool_pages: pool.pages_copied,
        ..Default::default()
    }];
    for peer in peers {
        let reply = peer
            .call("stats", b"", &CallOptions::new())
            .with_context(|| format!("stats of `{}`", peer.service()))?;
        all.push(
            Counts::from_fields(&u64s(&reply.payload))
                .with_context(|| format!("`{}` sent malformed stats", peer.service()))?,
        );
    }
    Ok(all)
}

/// Per-process deltas, with this process's sends of the window added to its entry.
pub(super) fn deltas(before: &[Counts], after: &[Counts], w: &Window) -> Vec<Counts> {
    let mut d: Vec<Counts> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.zip(*b, u64::wrapping_sub))
        .collect();
    d[0].payload_bytes += w.payload_bytes;
    d[0].handle_bytes += w.handle_bytes;
    d
}
