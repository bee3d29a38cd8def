//! Target strings: what a [`Channel`](super::Channel) is asked to reach, and the
//! [`Location`] it resolves to.
//!
//! This module owns the target grammar and nothing else: it neither reads the resolver's
//! table nor connects.
//!
//! ```text
//! target   = item *("," item)
//! item     = name                       ; pkg.Service: looked up in the resolver, else local
//!          | "netless:" name            ; the local netless service, explicitly
//!          | ("http" | "https") "://" host [":" port] ["/"]
//!          | host ":" port              ; plain HTTP/2
//!          | "dns:///" host ":" port    ; plain HTTP/2, the name resolved when connecting
//! ```
//!
//! A list of several items balances across them, so every item of a list must be remote.

use std::fmt;

use netless::Status;

/// Where a [`Channel`](super::Channel) sends its calls.
///
/// Its `Display` is a target that reaches the same place:
///
/// ```
/// use netless_grpc::Location;
/// let local = Location::Local { service: "routeguide.RouteGuide".into() };
/// assert_eq!(local.to_string(), "netless:routeguide.RouteGuide");
/// let remote = Location::Remote { uris: vec!["http://10.77.0.2:50051".into()] };
/// assert_eq!(remote.to_string(), "http://10.77.0.2:50051");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// The netless service of this name, over shared memory.
    Local {
        /// The service (`pkg.Service`).
        service: String,
    },
    /// gRPC servers over HTTP/2, each `http://host:port` or `https://host:port`; calls
    /// balance across them when there are several.
    Remote {
        /// The servers' URIs, without a path.
        uris: Vec<String>,
    },
}

impl Location {
    /// Whether calls go over netless shared memory.
    ///
    /// ```
    /// use netless_grpc::Location;
    /// assert!(Location::Local { service: "pkg.Echo".into() }.is_local());
    /// assert!(!Location::Remote { uris: vec!["http://127.0.0.1:50051".into()] }.is_local());
    /// ```
    pub fn is_local(&self) -> bool {
        matches!(self, Location::Local { .. })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local { service } => write!(f, "netless:{service}"),
            Location::Remote { uris } => f.write_str(&uris.join(",")),
        }
    }
}

/// A target as written: a bare name still to be resolved, or a place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `pkg.Service`: the resolver decides, else the local netless service of that name.
    Name(String),
    /// Any other form: where it says.
    At(Location),
}

impl Target {
    /// Parses `text` (surrounding white space ignored).
    pub(crate) fn parse(text: &str) -> Result<Target, Status> {
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        if let [item] = items[..] {
            return parse_item(item, text);
        }
        let mut uris = Vec::with_capacity(items.len());
        for item in items {
            match parse_item(item, text)? {
                Target::At(Location::Remote { uris: one }) => uris.extend(one),
                _ => {
                    return Err(not_a_target(
                        text,
                        "a list balances across servers, so each item must be remote \
                         (http://, https://, host:port or dns:///)",
                    ))
                }
            }
        }
        Ok(Target::At(Location::Remote { uris }))
    }

    /// The place, a bare name meaning the local netless service of that name.
    pub(crate) fn into_location(self) -> Location {
        match self {
            Target::Name(service) => Location::Local { service },
            Target::At(location) => location,
        }
    }
}

fn parse_item(item: &str, whole: &str) -> Result<Target, Status> {
    if item.is_empty() {
        return Err(not_a_target(whole, "it has an empty item"));
    }
    if let Some(service) = item.strip_prefix("netless:") {
        if !is_service_name(service) {
            return Err(not_a_target(
                whole,
                "`netless:` takes a service name such as `pkg.Service`",
            ));
        }
        return Ok(Target::At(Location::Local {
            service: service.to_string(),
        }));
    }
    if let Some(rest) = item.strip_prefix("dns:") {
        let Some(host_port) = rest.strip_prefix("///") else {
            return Err(not_a_target(
                whole,
                "write `dns:///host:port`: naming a DNS server is not supported",
            ));
        };
        return remote("http", host_port, true, whole);
    }
    if let Some((scheme, rest)) = item.split_once("://") {
        return match scheme {
            "http" | "https" => remote(scheme, rest, false, whole),
            _ => Err(not_a_target(whole, "the scheme must be http or https")),
        };
    }
    if item.contains(':') {
        return remote("http", item, true, whole);
    }
    if is_service_name(item) {
        return Ok(Target::Name(item.to_string()));
    }
    Err(not_a_target(
        whole,
        "a service name has only letters, digits, `.`, `_` and `-`",
    ))
}

/// `scheme://authority` from the text after the scheme, which must name a host (and a port
/// when `needs_port`), and no path, query or user.
fn remote(scheme: &str, rest: &str, needs_port: bool, whole: &str) -> Result<Target, Status> {
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(not_a_target(
            whole,
            "a server is host:port, with no path, query or user",
        ));
    }
    // After an IPv6 address's brackets, or after the last colon of anything else.
    let port = match authority.strip_prefix('[') {
        Some(rest) => rest
            .split_once(']')
            .map(|(_, after)| after.strip_prefix(':')),
        None => Some(authority.rsplit_once(':').map(|(_, port)| port)),
    };
    let port_ok = |port: &str| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    match port {
        None => return Err(not_a_target(whole, "the host is not valid")),
        Some(Some(port)) if !port_ok(port) || port.parse::<u16>().is_err() => {
            return Err(not_a_target(whole, "the port is not a number up to 65535"))
        }
        Some(None) if needs_port => return Err(not_a_target(whole, "a server is host:port")),
        _ => {}
    }
    let uri = format!("{scheme}://{authority}");
    let parsed: http::Uri = uri
        .parse()
        .map_err(|_| not_a_target(whole, "the host is not valid"))?;
    if parsed.host().unwrap_or_default().is_empty() {
        return Err(not_a_target(whole, "the host is not valid"));
    }
    Ok(Target::At(Location::Remote { uris: vec![uri] }))
}

/// A gRPC service name or a netless one: `pkg.Service`, `netless-domain.NAME`.
pub(crate) fn is_service_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn not_a_target(target: &str, why: &str) -> Status {
    Status::invalid_argument(format!(
        "`{target}` is not a target: {why} (targets: `pkg.Service`, `netless:pkg.Service`, \
         `http://host:port`, `https://host:port`, `host:port`, `dns:///host:port`, or a \
         comma-separated list of remote ones)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Location {
        match Target::parse(text).unwrap() {
            Target::At(location) => location,
            Target::Name(name) => panic!("{text}: a name, {name}"),
        }
    }

    fn remote(uris: &[&str]) -> Location {
        Location::Remote {
            uris: uris.iter().map(|u| u.to_string()).collect(),
        }
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(
            Target::parse("routeguide.RouteGuide").unwrap(),
            Target::Name("routeguide.RouteGuide".into())
        );
        assert_eq!(
            at("netless:routeguide.RouteGuide"),
            Location::Local {
                service: "routeguide.RouteGuide".into()
            }
        );
        assert_eq!(
            at("http://10.77.0.2:50051"),
            remote(&["http://10.77.0.2:50051"])
        );
        assert_eq!(
            at("http://10.77.0.2:50051/"),
            remote(&["http://10.77.0.2:50051"])
        );
        assert_eq!(at("https://example.com"), remote(&["https://example.com"]));
        assert_eq!(at("localhost:50051"), remote(&["http://localhost:50051"]));
        assert_eq!(at("[::1]:50051"), remote(&["http://[::1]:50051"]));
        assert_eq!(at("dns:///localhost:7"), remote(&["http://localhost:7"]));
        assert_eq!(
            at(" http://a:1 , b:2,dns:///c:3 "),
            remote(&["http://a:1", "http://b:2", "http://c:3"])
        );
    }

    #[test]
    fn display_is_a_target_for_the_same_place() {
        for text in ["netless:pkg.Echo", "http://a:1,https://b:2"] {
            assert_eq!(at(text).to_string(), text);
            assert_eq!(at(&at(text).to_string()), at(text));
        }
    }

    #[test]
    fn malformed_targets_say_why() {
        for (text, why) in [
            ("", "empty item"),
            ("http://a:1,", "empty item"),
            ("netless:", "takes a service name"),
            ("netless:a/b", "takes a service name"),
            ("dns://8.8.8.8/a:1", "naming a DNS server"),
            ("ftp://a:1", "http or https"),
            ("http://a:1/prefix", "no path"),
            ("http://user@a:1", "no path, query or user"),
            ("http://", "no path"),
            ("a:b", "port is not a number"),
            ("localhost:", "port is not a number"),
            ("http://a:99999", "port is not a number"),
            ("[::1", "host is not valid"),
            ("[::1]", "a server is host:port"),
            ("dns:///localhost", "a server is host:port"),
            ("http://:80", "host is not valid"),
            ("pkg Service", "service name"),
            ("http://a:1,pkg.Echo", "each item must be remote"),
            ("netless:a.B,netless:c.D", "each item must be remote"),
        ] {
            let err = Target::parse(text).unwrap_err();
            assert_eq!(err.code(), netless::Code::InvalidArgument, "{text}");
            assert!(err.message().contains(why), "{text}: {}", err.message());
            assert!(err.message().contains("is not a target"), "{text}");
        }
    }
}
