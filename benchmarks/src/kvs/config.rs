//! Which server setups `slo_buffers` runs ([`Config::plan`]), how each provisions its
//! receive buffer and dispatches requests, and which are swept together ([`groups`]). It
//! decides sizes and names, never measures.

use serde::Serialize;

use super::store;

/// Connection counts of the provisioning sweep.
pub(super) const CONNECTIONS: [usize; 3] = [16, 128, 1024];
/// Connections of the dispatch part and of the no-SLO baseline.
const DISPATCH_CONNECTIONS: usize = 128;
/// The SLO, in mean zero-load service times (NEBULA §VI).
pub(super) const SLO_RATIO: f64 = 10.0;
/// Per-connection receive buffer: HTTP/2's initial flow-control window.
const CONNECTION_BUFFER: usize = 64 * 1024;
/// Bytes of the runtime's request header (a request takes header + method + payload,
/// rounded up to 64-byte blocks).
const REQUEST_HEADER: usize = 64;
/// Mean request size, method and payload: half `Get` (3 + 16 + 9 B), half `Set` (3 + 528 +
/// 9 B).
pub(super) const MEAN_REQUEST: usize = (3
    + store::KEY_BYTES
    + store::STAMP_BYTES
    + 3
    + store::KEY_BYTES
    + store::VALUE_BYTES
    + store::STAMP_BYTES)
    / 2;
/// Largest request with its header, in whole blocks: a `Set`.
const LARGEST_REQUEST: usize =
    (REQUEST_HEADER + 3 + store::KEY_BYTES + store::VALUE_BYTES + store::STAMP_BYTES)
        .next_multiple_of(64);

/// Receive-buffer provisioning (NEBULA §V-B), as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provisioning {
    /// One buffer for every connection.
    Shared,
    /// One buffer per worker.
    PerWorker,
    /// One buffer per connection.
    PerConnection,
}

impl From<Provisioning> for netless::Provisioning {
    fn from(p: Provisioning) -> netless::Provisioning {
        match p {
            Provisioning::Shared => netless::Provisioning::Shared,
            Provisioning::PerWorker => netless::Provisioning::PerWorker,
            Provisioning::PerConnection => netless::Provisioning::PerConnection,
        }
    }
}

/// Dispatch of requests to workers (NEBULA §V-E), as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    /// One queue; an idle worker takes the oldest request.
    Single,
    /// One queue; a worker holds up to two requests.
    Jbsq2,
    /// One queue per worker.
    Partitioned,
}

impl From<Dispatch> for netless::Dispatch {
    fn from(d: Dispatch) -> netless::Dispatch {
        match d {
            Dispatch::Single => netless::Dispatch::SingleQueue,
            Dispatch::Jbsq2 => netless::Dispatch::Jbsq2,
            Dispatch::Partitioned => netless::Dispatch::Partitioned,
        }
    }
}

/// How a configuration's receive buffer is provisioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Buffer {
    /// Sized for the SLO's queue-depth limit (see the module docs).
    DepthSized,
    /// Sized by the runtime from the SLO.
    RuntimeSlo,
    /// 64 KiB per connection.
    Window64K,
    /// The runtime's default with no SLO (1 MiB).
    Default,
}

/// One server setup and the connections it is loaded through.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Config {
    /// Short name: provisioning variant, dispatch, workers.
    pub mode: String,
    pub provisioning: Provisioning,
    pub dispatch: Dispatch,
    pub workers: usize,
    pub connections: usize,
    pub buffer: Buffer,
    /// Whether the server has the SLO (and so a queue-depth limit).
    pub slo: bool,
}

impl Config {
    pub(super) fn new(
        mode: &str,
        provisioning: Provisioning,
        dispatch: Dispatch,
        workers: usize,
        connections: usize,
        buffer: Buffer,
    ) -> Config {
        Config {
            mode: mode.to_string(),
            provisioning,
            dispatch,
            workers,
            connections,
            buffer,
            slo: buffer != Buffer::Default
                && !(buffer == Buffer::Window64K && mode.ends_with("noslo")),
        }
    }

    /// The configurations of a run, in the order they run.
    pub(super) fn plan(quick: bool) -> Vec<Config> {
        use Buffer::*;
        use Dispatch::*;
        use Provisioning::*;
        let mut plan = Vec::new();
        for &c in &CONNECTIONS {
            plan.push(Config::new("shared", Shared, Single, 1, c, DepthSized));
            if !quick {
                plan.push(Config::new("shared-slo", Shared, Single, 1, c, RuntimeSlo));
            }
            plan.push(Config::new(
                "per-connection",
                PerConnection,
                Single,
                1,
                c,
                Window64K,
            ));
        }
        if !quick {
            let c = DISPATCH_CONNECTIONS;
            plan.push(Config::new(
                "per-connection-noslo",
                PerConnection,
                Single,
                1,
                c,
                Window64K,
            ));
            for (mode, p, d) in [
                ("shared/single/2w", Shared, Single),
                ("shared/jbsq2/2w", Shared, Jbsq2),
                ("shared/partitioned/2w", Shared, Partitioned),
                ("per-worker/partitioned/2w", PerWorker, Partitioned),
            ] {
                plan.push(Config::new(mode, p, d, 2, c, DepthSized));
            }
        }
        plan
    }

    /// Requests one queue may hold under the SLO, for each of the workers draining it.
    pub(super) fn depth_limit(&self) -> u32 {
        let k = match self.dispatch {
            Dispatch::Partitioned => 1,
            _ => self.workers as u32,
        };
        netless::sizing::depth_limit(k, SLO_RATIO)
    }

    /// The receive buffer to ask for (whole, per worker or per connection), if not the
    /// runtime's choice.
    pub(super) fn buffer_bytes(&self) -> Option<usize> {
        match self.buffer {
            Buffer::DepthSized => {
                let queues = match (self.provisioning, self.dispatch) {
                    (Provisioning::PerWorker, _) => 1,
                    (_, Dispatch::Partitioned) => self.workers,
                    _ => 1,
                };
                let drainers = match (self.provisioning, self.dispatch) {
                    (_, Dispatch::Partitioned) | (Provisioning::PerWorker, _) => 1,
                    _ => self.workers,
                };
                let requests = (self.depth_limit() as usize + drainers) * queues;
                Some((requests * LARGEST_REQUEST * 2).next_power_of_two())
            }
            Buffer::Window64K => Some(CONNECTION_BUFFER),
            Buffer::RuntimeSlo | Buffer::Default => None,
        }
    }
}

/// A clap value's name (`per-connection`).
pub(super) fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// The configurations swept together: those of the provisioning comparison
/// (`shared`, `shared-slo`, `per-connection`) at the same connection count; every other
/// configuration alone.
pub(super) fn groups(plan: &[Config]) -> Vec<Vec<&Config>> {
    let compared =
        |c: &Config| matches!(c.mode.as_str(), "shared" | "shared-slo" | "per-connection");
    let mut groups: Vec<Vec<&Config>> = Vec::new();
    for config in plan {
        match groups.last_mut() {
            Some(g)
                if compared(config) && compared(g[0]) && g[0].connections == config.connections =>
            {
                g.push(config)
            }
            _ => groups.push(vec![config]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_buffer_sizes() {
        assert_eq!(MEAN_REQUEST, 284);
        assert_eq!(LARGEST_REQUEST, 640);
        let quick = Config::plan(true);
        assert_eq!(quick.len(), 6);
        assert!(quick.iter().all(|c| c.slo && c.workers == 1));
        let full = Config::plan(false);
        assert_eq!(full.len(), 14);
        let noslo = full
            .iter()
            .find(|c| c.mode == "per-connection-noslo")
            .unwrap();
        assert!(!noslo.slo);
        // The provisioning comparison is swept three at a time per connection count.
        let sizes: Vec<usize> = groups(&full).iter().map(Vec::len).collect();
        assert_eq!(sizes, [3, 3, 3, 1, 1, 1, 1, 1]);
        assert_eq!(
            groups(&quick).iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 2, 2]
        );
        let shared = &full[0];
        assert_eq!(shared.depth_limit(), 8);
        // (8 + 1) requests of 640 B, doubled, to a power of two.
        assert_eq!(shared.buffer_bytes(), Some(16 * 1024));
        let two = full.iter().find(|c| c.mode == "shared/single/2w").unwrap();
        assert_eq!(two.depth_limit(), 17);
        assert_eq!(two.buffer_bytes(), Some(32 * 1024));
        let part = full
            .iter()
            .find(|c| c.mode == "per-worker/partitioned/2w")
            .unwrap();
        assert_eq!(part.depth_limit(), 8);
        assert_eq!(part.buffer_bytes(), Some(16 * 1024));
        assert_eq!(full[1].buffer_bytes(), None);
        assert_eq!(serde_plain(&Provisioning::PerConnection), "per-connection");
    }
}
