//! What remote callers hear when the gateway refuses or fails a call itself: a status with
//! the code a gRPC client expects and a message that says what to do, naming nothing local
//! (no socket directory, no path, no token). The detail, where there is any, goes to the
//! gateway's own log. This module also takes the socket directory out of the error messages
//! that pass through (the netless client's own, and backends' trailers).

use std::path::Path;

use http::HeaderMap;
use netless::{Code, Status};

use super::backends::NoLink;

/// At most this much of a caller's path or service name is repeated back to it.
const MAX_ECHO: usize = 100;

fn shown(name: &str) -> String {
    match name.char_indices().nth(MAX_ECHO) {
        Some((end, _)) => format!("{}…", &name[..end]),
        None => name.to_string(),
    }
}

/// `UNIMPLEMENTED` for a service the gateway does not forward. The same whether the service
/// is not allowed, internal, or allowed but not running, so the answer tells a caller
/// nothing about which services exist.
pub(crate) fn unknown_service(service: &str) -> Status {
    Status::new(
        Code::Unimplemented,
        format!(
            "unknown service `{}`: this gateway forwards no service of that name",
            shown(service)
        ),
    )
}

/// `UNIMPLEMENTED` for a path that is not `/package.Service/Method`.
pub(crate) fn not_a_method_path(path: &str) -> Status {
    Status::new(
        Code::Unimplemented,
        format!(
            "`{}` is not a gRPC method path (/package.Service/Method)",
            shown(path)
        ),
    )
}

/// The status of a call that found no link to `service`.
pub(crate) fn no_link(service: &str, why: NoLink) -> Status {
    let service = shown(service);
    match why {
        NoLink::Unknown => unknown_service(&service),
        NoLink::Unavailable => Status::unavailable(format!(
            "service `{service}` is unavailable: the gateway could not connect to it; retry later"
        )),
        NoLink::Deadline => Status::deadline_exceeded(format!(
            "the deadline passed while the gateway connected to service `{service}`"
        )),
        NoLink::Busy => service_busy(&service),
    }
}

/// `RESOURCE_EXHAUSTED`: the service's share of the gateway is in use.
pub(crate) fn service_busy(service: &str) -> Status {
    Status::resource_exhausted(format!(
        "service `{}` has as many calls through this gateway as it takes: retry later",
        shown(service)
    ))
}

/// `DEADLINE_EXCEEDED`: the call waited for one of its connection's call slots until its
/// deadline.
pub(crate) fn connection_busy(max_calls: usize) -> Status {
    Status::deadline_exceeded(format!(
        "the deadline passed while this call waited its turn: a connection has at most \
         {max_calls} calls under way at this gateway; finish or cancel some, or open another \
         connection"
    ))
}

/// Takes the socket directory out of messages that leave the gateway.
#[derive(Debug)]
pub(crate) struct Scrubber {
    /// The directory as configured and as resolved (they may differ by symlinks).
    dirs: Vec<String>,
}

impl Scrubber {
    pub(crate) fn new(dir: Option<&Path>) -> Scrubber {
        let mut dirs = Vec::new();
        if let Some(dir) = dir {
            dirs.push(dir.display().to_string());
            if let Ok(real) = dir.canonicalize() {
                dirs.push(real.display().to_string());
            }
        }
        // Longest first, so a directory inside another is replaced whole.
        dirs.retain(|d| d.len() > 1);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        dirs.dedup();
        Scrubber { dirs }
    }

    fn needs(&self, message: &str) -> bool {
        self.dirs.iter().any(|d| message.contains(d.as_str()))
    }

    fn message(&self, message: &str) -> String {
        let mut out = message.to_string();
        for dir in &self.dirs {
            out = out.replace(dir.as_str(), "<socket directory>");
        }
        out
    }

    /// `status` as a remote caller may see it.
    pub(crate) fn status(&self, status: &Status) -> Status {
        if self.needs(status.message()) {
            Status::new(status.code(), self.message(status.message()))
        } else {
            status.clone()
        }
    }

    /// Rewrites the error message in `trailers` if it names the socket directory.
    pub(crate) fn trailers(&self, trailers: &mut HeaderMap) {
        if self.dirs.is_empty() || !trailers.contains_key("grpc-message") {
            return;
        }
        let Some(status) = tonic::Status::from_header_map(trailers) else {
            return;
        };
        if self.needs(status.message()) {
            let clean = tonic::Status::new(status.code(), self.message(status.message()));
            let _ = clean.add_header(trailers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_lose_the_socket_directory() {
        let scrubber = Scrubber::new(Some(Path::new("/run/user/7/netless")));
        let status = Status::unavailable(
            "service `a.B` not found in /run/user/7/netless: is its server running?",
        );
        let clean = scrubber.status(&status);
        assert_eq!(clean.code(), Code::Unavailable);
        assert!(!clean.message().contains("/run/user"), "{clean}");
        let mut trailers = HeaderMap::new();
        let _ = tonic::Status::unavailable("at /run/user/7/netless/a.B.sock: gone")
            .add_header(&mut trailers);
        scrubber.trailers(&mut trailers);
        let seen = tonic::Status::from_header_map(&trailers).unwrap();
        assert_eq!(seen.code(), tonic::Code::Unavailable);
        assert_eq!(seen.message(), "at <socket directory>/a.B.sock: gone");
    }

    #[test]
    fn long_names_are_cut() {
        let status = unknown_service(&"x".repeat(500));
        assert!(status.message().len() < 200, "{status}");
        assert_eq!(status.code(), Code::Unimplemented);
    }
}
