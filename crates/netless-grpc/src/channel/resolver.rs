//! The resolver: service names to targets, so a binary picks where a service is by its name
//! alone, from a table the deployment provides (`NETLESS_TARGETS`).
//!
//! This module owns the table's syntax and the lookup rule; it never connects.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use netless::{Code, Status};

use super::target::{is_service_name, Location, Target};

/// The environment variable naming the target table [`Resolver::from_env`] reads.
///
/// ```no_run
/// std::process::Command::new("routeguide_client")
///     .args(["--target", "routeguide.RouteGuide"])
///     .env(netless_grpc::TARGETS_ENV, "/etc/netless/targets")
///     .status()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub const TARGETS_ENV: &str = "NETLESS_TARGETS";

/// Service names to [`Location`]s.
///
/// A table has one `NAME TARGET[,TARGET...]` a line; `#` starts a comment, blank lines are
/// ignored. `NAME` is a service (`pkg.Service`) or a pattern: `pkg.*` (every service whose
/// name starts with `pkg.`) or `*` (every service). A target is any form
/// [`Channel::target`](super::Channel::target) takes; a bare name there means the local
/// netless service of that name.
///
/// A name's entry beats any pattern, and a longer pattern beats a shorter one. A name the
/// table does not mention is the local netless service of that name.
///
/// ```
/// use netless_grpc::{Location, Resolver};
/// let resolver: Resolver = "
///     ## where the route guide runs
///     routeguide.RouteGuide  http://10.77.0.2:50051
///     billing.*              https://billing.internal:443
///     billing.Audit          netless:billing.Audit
/// ".parse()?;
/// assert_eq!(
///     resolver.resolve("billing.Invoices"),
///     Some(&Location::Remote { uris: vec!["https://billing.internal:443".into()] })
/// );
/// assert!(resolver.resolve("billing.Audit").unwrap().is_local());
/// assert_eq!(resolver.resolve("helloworld.Greeter"), None);
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolver {
    names: HashMap<String, Location>,
    /// `(prefix, location)`: `pkg.*` is the prefix `pkg.`, `*` the empty one.
    patterns: Vec<(String, Location)>,
}

impl Resolver {
    /// An empty resolver: every name is the local netless service of that name.
    ///
    /// ```
    /// let resolver = netless_grpc::Resolver::new();
    /// assert!(resolver.is_empty());
    /// ```
    pub fn new() -> Resolver {
        Resolver::default()
    }

    /// The table named by the `NETLESS_TARGETS` environment variable, or an empty resolver
    /// if it is not set (or empty).
    ///
    /// ```no_run
    /// // NETLESS_TARGETS=/etc/netless/targets
    /// let resolver = netless_grpc::Resolver::from_env()?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn from_env() -> Result<Resolver, Status> {
        match std::env::var_os(TARGETS_ENV) {
            Some(path) if !path.is_empty() => Resolver::load(path),
            _ => Ok(Resolver::new()),
        }
    }

    /// Reads the table in file `path`.
    ///
    /// ```no_run
    /// let resolver = netless_grpc::Resolver::load("/etc/netless/targets")?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn load(path: impl AsRef<Path>) -> Result<Resolver, Status> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Status::new(
                Code::FailedPrecondition,
                format!("cannot read the target table {}: {e}", path.display()),
            )
        })?;
        parse_table(&text).map_err(|(line, why)| {
            Status::invalid_argument(format!(
                "target table {}, line {line}: {why}",
                path.display()
            ))
        })
    }

    /// Parses a table (the same as `table.parse::<Resolver>()`).
    ///
    /// ```
    /// let err = netless_grpc::Resolver::parse("pkg.A http://a:1\npkg.B\n").unwrap_err();
    /// assert!(err.message().starts_with("target table, line 2:"), "{}", err.message());
    /// ```
    pub fn parse(table: &str) -> Result<Resolver, Status> {
        parse_table(table).map_err(|(line, why)| {
            Status::invalid_argument(format!("target table, line {line}: {why}"))
        })
    }

    /// Maps `name` (a service or a pattern) to `target`, replacing what it mapped to.
    ///
    /// ```
    /// let mut resolver = netless_grpc::Resolver::new();
    /// resolver.insert("routeguide.*", "127.0.0.1:50051")?;
    /// assert!(!resolver.resolve("routeguide.RouteGuide").unwrap().is_local());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn insert(&mut self, name: &str, target: &str) -> Result<(), Status> {
        let location = Target::parse(target)?.into_location();
        self.insert_location(name, location)
            .map_err(Status::invalid_argument)
    }

    /// Where `name` goes, if the table says: its own entry, else the longest pattern that
    /// matches it.
    ///
    /// ```
    /// let resolver: netless_grpc::Resolver = "* http://127.0.0.1:50051".parse()?;
    /// assert!(resolver.resolve("any.Service").is_some());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn resolve(&self, name: &str) -> Option<&Location> {
        if let Some(location) = self.names.get(name) {
            return Some(location);
        }
        self.patterns
            .iter()
            .filter(|(prefix, _)| name.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, location)| location)
    }

    /// Whether the table maps nothing.
    ///
    /// ```
    /// assert!(netless_grpc::Resolver::parse("# nothing yet\n")?.is_empty());
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.patterns.is_empty()
    }

    fn insert_location(&mut self, name: &str, location: Location) -> Result<(), String> {
        match pattern_prefix(name)? {
            Some(prefix) => {
                self.patterns.retain(|(p, _)| *p != prefix);
                self.patterns.push((prefix.to_string(), location));
            }
            None => {
                self.names.insert(name.to_string(), location);
            }
        }
        Ok(())
    }
}

impl FromStr for Resolver {
    type Err = Status;

    fn from_str(table: &str) -> Result<Resolver, Status> {
        Resolver::parse(table)
    }
}

/// `Some(prefix)` for a pattern, `None` for a service name.
fn pattern_prefix(name: &str) -> Result<Option<&str>, String> {
    if name == "*" {
        return Ok(Some(""));
    }
    if let Some(package) = name.strip_suffix(".*") {
        if is_service_name(package) {
            return Ok(Some(&name[..name.len() - 1]));
        }
    } else if is_service_name(name) {
        return Ok(None);
    }
    Err(format!(
        "`{name}` is neither a service name (`pkg.Service`) nor a pattern (`pkg.*` or `*`)"
    ))
}

/// The resolver a table describes, or the number of its first bad line and what is wrong.
fn parse_table(text: &str) -> Result<Resolver, (usize, String)> {
    let mut resolver = Resolver::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line
            .split_once('#')
            .map_or(line, |(before, _)| before)
            .trim();
        if line.is_empty() {
            continue;
        }
        let Some((name, target)) = line.split_once(char::is_whitespace) else {
            return Err((
                number,
                format!("`{line}` has no target: write `NAME TARGET`"),
            ));
        };
        if let Some(first) = seen.insert(name, number) {
            return Err((
                number,
                format!("`{name}` is already mapped on line {first}"),
            ));
        }
        let location = Target::parse(target.trim())
            .map_err(|status| (number, status.message().to_string()))?
            .into_location();
        resolver
            .insert_location(name, location)
            .map_err(|why| (number, why))?;
    }
    Ok(resolver)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(service: &str) -> Location {
        Location::Local {
            service: service.into(),
        }
    }

    fn remote(uri: &str) -> Location {
        Location::Remote {
            uris: vec![uri.into()],
        }
    }

    #[test]
    fn a_table_maps_names_and_patterns() {
        let resolver = Resolver::parse(
            "# comment\n\
             \n\
             routeguide.RouteGuide http://10.77.0.2:50051   # trailing comment\n\
             \tbilling.*\t https://billing:443 , billing2:443\n\
             billing.Audit netless:billing.Audit\n\
             billing.eu.* billing-eu.Proxy\n\
             * localhost:9000\n",
        )
        .unwrap();
        assert_eq!(
            resolver.resolve("routeguide.RouteGuide"),
            Some(&remote("http://10.77.0.2:50051"))
        );
        assert_eq!(
            resolver.resolve("billing.Invoices"),
            Some(&Location::Remote {
                uris: vec!["https://billing:443".into(), "http://billing2:443".into()]
            })
        );
        // A name's own entry beats a pattern; a longer pattern beats a shorter one.
        assert_eq!(
            resolver.resolve("billing.Audit"),
            Some(&local("billing.Audit"))
        );
        assert_eq!(
            resolver.resolve("billing.eu.Tax"),
            Some(&local("billing-eu.Proxy"))
        );
        assert_eq!(
            resolver.resolve("other.Thing"),
            Some(&remote("http://localhost:9000"))
        );
        // `pkg.*` needs the dot: `billingx.Y` is not in `billing.*`.
        assert_eq!(
            resolver.resolve("billingx.Y"),
            Some(&remote("http://localhost:9000"))
        );
    }

    #[test]
    fn an_unmapped_name_resolves_to_nothing() {
        let resolver = Resolver::parse("pkg.* http://a:1").unwrap();
        assert_eq!(resolver.resolve("other.Service"), None);
        assert_eq!(resolver.resolve("pkg"), None);
        assert!(Resolver::parse("").unwrap().is_empty());
    }

    #[test]
    fn insert_replaces() {
        let mut resolver = Resolver::new();
        resolver.insert("pkg.A", "http://a:1").unwrap();
        resolver.insert("pkg.A", "http://b:2").unwrap();
        resolver.insert("pkg.*", "http://c:3").unwrap();
        resolver.insert("pkg.*", "netless:pkg.Local").unwrap();
        assert_eq!(resolver.resolve("pkg.A"), Some(&remote("http://b:2")));
        assert_eq!(resolver.resolve("pkg.B"), Some(&local("pkg.Local")));
        assert!(resolver.insert("pkg.A", "ftp://x:1").is_err());
        assert!(resolver.insert("a.*.b", "http://x:1").is_err());
    }

    #[test]
    fn a_bad_line_is_named_by_its_number() {
        for (table, line, why) in [
            ("pkg.A http://a:1\npkg.B\n", 2, "has no target"),
            ("\n\npkg.A ftp://a:1", 3, "scheme must be http or https"),
            (
                "pkg.A http://a:1\n# x\npkg.A http://b:2",
                3,
                "already mapped on line 1",
            ),
            ("a.*.b http://a:1", 1, "neither a service name"),
            ("pkg/A http://a:1", 1, "neither a service name"),
            ("*.x http://a:1", 1, "neither a service name"),
            ("pkg.A http://a:1 http://b:2", 1, "not a target"),
            (
                "pkg.A http://a:1,netless:pkg.B",
                1,
                "each item must be remote",
            ),
        ] {
            let err = Resolver::parse(table).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{table}");
            let prefix = format!("target table, line {line}: ");
            assert!(
                err.message().starts_with(&prefix),
                "{table}: {}",
                err.message()
            );
            assert!(err.message().contains(why), "{table}: {}", err.message());
        }
    }

    #[test]
    fn load_names_the_file_in_its_errors() {
        let dir = std::env::temp_dir().join(format!("nl-resolver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("targets");
        std::fs::write(&path, "pkg.A http://a:1\n\npkg.B nope:x\n").unwrap();
        let err = Resolver::load(&path).unwrap_err();
        assert!(
            err.message()
                .starts_with(&format!("target table {}, line 3:", path.display())),
            "{}",
            err.message()
        );
        std::fs::write(&path, "pkg.A http://a:1\n").unwrap();
        let resolver = Resolver::load(&path).unwrap();
        assert_eq!(resolver.resolve("pkg.A"), Some(&remote("http://a:1")));
        let missing = Resolver::load(dir.join("missing")).unwrap_err();
        assert_eq!(missing.code(), Code::FailedPrecondition);
        assert!(missing.message().contains("cannot read the target table"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
