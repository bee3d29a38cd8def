//! Which services the gateway forwards: the allow-list of patterns its owner gave, and the
//! internal services it never forwards whatever the list says. It owns the matching of a
//! service name against the list; it never looks at sockets or backends.
//!
//! A pattern is a service name (`helloworld.Greeter`, exactly), a package prefix
//! (`helloworld.*`: every service whose name starts with `helloworld.`), or `*` (every
//! service). Internal services, whose names start with `netless.` or `netless-` in any case
//! (`netless.ctl`, the pool coordinators `netless-domain.NAME`), are never forwarded: a
//! pattern naming only such services is refused when the gateway is built.

/// The longest pattern: a service name is at most 100 characters.
const MAX_PATTERN: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    /// This service only.
    Exact(String),
    /// Every service whose name starts with this (which ends with `.`).
    Prefix(String),
    /// Every service.
    Any,
}

impl Pattern {
    fn matches(&self, service: &str) -> bool {
        match self {
            Pattern::Exact(name) => name == service,
            Pattern::Prefix(prefix) => service.starts_with(prefix.as_str()),
            Pattern::Any => true,
        }
    }
}

/// The services a gateway forwards (none until a pattern is added).
#[derive(Clone, Debug, Default)]
pub(crate) struct AllowList {
    patterns: Vec<Pattern>,
}

impl AllowList {
    /// Adds `pattern` (see the module's documentation); `Err` says what is wrong with it.
    pub(crate) fn add(&mut self, pattern: &str) -> Result<(), String> {
        let parsed = parse(pattern)?;
        if !self.patterns.contains(&parsed) {
            self.patterns.push(parsed);
        }
        Ok(())
    }

    /// Whether calls to `service` are forwarded: it matches a pattern and is not internal.
    pub(crate) fn allows(&self, service: &str) -> bool {
        !is_internal(service) && self.patterns.iter().any(|p| p.matches(service))
    }

    /// Whether a pattern names `service` itself, not by a prefix or `*` (and it is not
    /// internal).
    pub(crate) fn names(&self, service: &str) -> bool {
        !is_internal(service)
            && self
                .patterns
                .iter()
                .any(|p| matches!(p, Pattern::Exact(name) if name == service))
    }

    /// Whether no pattern was added (the gateway forwards nothing).
    pub(crate) fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

/// Whether `service` is one of netless's own (`netless.*`, `netless-*`, in any case), which
/// only local processes of the owner may call: the control service, the pool coordinators,
/// the stream methods.
pub(crate) fn is_internal(service: &str) -> bool {
    let head = service.as_bytes().get(..8);
    service.eq_ignore_ascii_case("netless")
        || head.is_some_and(|h| {
            h.eq_ignore_ascii_case(b"netless.") || h.eq_ignore_ascii_case(b"netless-")
        })
}

/// Checks that `name` can be a service the gateway serves itself (an egress service): a
/// name as an exact pattern takes it, and not an internal one; `Err` says what is wrong.
pub(crate) fn check_service_name(name: &str) -> Result<(), String> {
    if is_internal(name) {
        return Err(format!(
            "`{name}` is a name of netless's internal services (`netless.*`, `netless-*`), \
             which a gateway never serves"
        ));
    }
    match parse(name) {
        Ok(Pattern::Exact(_)) => Ok(()),
        Ok(_) => Err(format!(
            "`{name}` is a pattern, not a service name (`pkg.Service`)"
        )),
        Err(_) => Err(format!(
            "`{name}` is not a service name: give `pkg.Service`"
        )),
    }
}

fn parse(pattern: &str) -> Result<Pattern, String> {
    if pattern == "*" {
        return Ok(Pattern::Any);
    }
    let (name, prefix) = match pattern.strip_suffix(".*") {
        Some(package) => (package, true),
        None => (pattern, false),
    };
    let valid = !name.is_empty()
        && pattern.len() <= MAX_PATTERN
        && !name.starts_with('.')
        && !name.ends_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(format!(
            "`{pattern}` is not a service pattern: give `pkg.Service` (that service), \
             `pkg.*` (every service of package `pkg`) or `*` (every service)"
        ));
    }
    let parsed = if prefix {
        Pattern::Prefix(format!("{name}."))
    } else {
        Pattern::Exact(name.to_string())
    };
    let internal = match &parsed {
        Pattern::Prefix(prefix) => is_internal(prefix),
        _ => is_internal(name),
    };
    if internal {
        return Err(format!(
            "`{pattern}` names netless's internal services (`netless.*`, `netless-*`), which \
             a gateway never forwards"
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(patterns: &[&str]) -> AllowList {
        let mut list = AllowList::default();
        for p in patterns {
            list.add(p).unwrap();
        }
        list
    }

    #[test]
    fn nothing_is_forwarded_until_allowed() {
        let list = AllowList::default();
        assert!(list.is_empty());
        assert!(!list.allows("helloworld.Greeter"));
    }

    #[test]
    fn exact_names_prefixes_and_everything() {
        let some = list(&["helloworld.Greeter", "routeguide.*"]);
        assert!(some.allows("helloworld.Greeter"));
        assert!(!some.allows("helloworld.Greeter2"));
        assert!(!some.allows("helloworld.Other"));
        assert!(some.allows("routeguide.RouteGuide"));
        assert!(some.allows("routeguide.v2.RouteGuide"));
        assert!(!some.allows("routeguide"));
        assert!(!some.allows("routeguidex.RouteGuide"));
        let all = list(&["*"]);
        assert!(all.allows("anything.At-all"));
    }

    #[test]
    fn internal_services_are_never_forwarded() {
        let all = list(&["*"]);
        for internal in [
            "netless.ctl",
            "netless.stream",
            "netless-domain.shop",
            "NETLESS.ctl",
            "Netless-Domain.x",
            "netless",
        ] {
            assert!(is_internal(internal), "{internal}");
            assert!(!all.allows(internal), "{internal}");
        }
        assert!(!is_internal("netlessly.Fine"));
        assert!(all.allows("netlessly.Fine"));
        for pattern in [
            "netless.ctl",
            "netless.*",
            "netless-domain.*",
            "NetLess.x.*",
        ] {
            let err = AllowList::default().add(pattern).unwrap_err();
            assert!(err.contains("internal"), "{pattern}: {err}");
        }
    }

    #[test]
    fn service_names_are_exact_and_not_internal() {
        assert!(check_service_name("shop.Orders").is_ok());
        for (name, why) in [
            ("shop.*", "pattern"),
            ("*", "pattern"),
            ("a b", "not a service name"),
            ("", "not a service name"),
            ("netless.ctl", "internal"),
        ] {
            let err = check_service_name(name).unwrap_err();
            assert!(err.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for pattern in [
            "",
            ".*",
            "a.",
            ".a",
            "a/b",
            "a.**",
            "*.Greeter",
            "pkg*",
            "a b",
        ] {
            let err = AllowList::default().add(pattern).unwrap_err();
            assert!(err.contains("not a service pattern"), "{pattern}: {err}");
        }
        let long = "a".repeat(101);
        assert!(AllowList::default().add(&long).is_err());
    }
}
