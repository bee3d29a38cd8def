//! What remote callers hear: the statuses the gateway gives when it refuses or fails a call
//! itself, with the code a gRPC client expects and a message that says what to do, naming
//! nothing local (no socket directory, no path, no token); and the rule for the error
//! messages that pass through it (the netless client's own, and backends' trailers), which
//! keeps their code and their sense but takes out what names the machine: paths, and the
//! values of uids, gids and pids. The detail, where there is any, goes to the gateway's own
//! log.

use std::borrow::Cow;
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

/// Takes local detail out of the messages that leave the gateway for a remote caller.
///
/// The gateway cannot tell which words of a message passed through are local, so it goes by
/// what they look like, wherever they stand:
/// - a path in the socket directory, or the directory itself, becomes `<socket directory>`;
/// - any other path becomes `<path>`: a word with a `/` that starts with `/` or `~` (so
///   `/proc/self/fd/7` and every absolute path), `./` or `../`, or that has two or more
///   (`run/user/1000/netless`); a gRPC method path (`/pkg.Service/Method`) is not a path;
/// - the value after `uid`, `gid` or `pid` (or a name ending in `_uid` and the like), a
///   number or a `[..]` list of them, becomes `<id>` or `<ids>` (`uid 1000`, `uids [0, 7]`,
///   `pid: 42`, `expect_server_uid to 1001`).
///
/// The code is kept, and so is the rest of the message: what failed, and what to do.
#[derive(Debug)]
pub(crate) struct Scrubber {
    /// The socket directory as configured and as resolved (they may differ by symlinks),
    /// longest first.
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
        dirs.retain(|d| d.len() > 1);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        dirs.dedup();
        Scrubber { dirs }
    }

    /// `message` as a remote caller may see it.
    pub(crate) fn message<'a>(&self, message: &'a str) -> Cow<'a, str> {
        let words = words(message);
        let mut out = String::with_capacity(message.len());
        let mut i = 0;
        while let Some(&(word, text)) = words.get(i) {
            i += 1;
            if !word {
                out.push_str(text);
                continue;
            }
            // A sentence's full stop is not part of a path.
            let bare = text.trim_end_matches('.');
            let dots = &text[bare.len()..];
            if self.in_socket_directory(bare) {
                out.push_str("<socket directory>");
                out.push_str(dots);
            } else if is_path(bare) {
                out.push_str("<path>");
                out.push_str(dots);
            } else {
                out.push_str(text);
                if names_an_id(text) {
                    i = id_value(&words, i, &mut out);
                }
            }
        }
        if out == message {
            Cow::Borrowed(message)
        } else {
            tracing::debug!("gateway: a message to a remote caller said `{message}`");
            Cow::Owned(out)
        }
    }

    fn in_socket_directory(&self, word: &str) -> bool {
        self.dirs.iter().any(|dir| {
            word.strip_prefix(dir.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }

    /// `status` as a remote caller may see it.
    pub(crate) fn status(&self, status: &Status) -> Status {
        match self.message(status.message()) {
            Cow::Borrowed(_) => status.clone(),
            Cow::Owned(message) => Status::new(status.code(), message),
        }
    }

    /// Rewrites the error message in `trailers` (or in the headers of a trailers-only
    /// response) as a remote caller may see it.
    pub(crate) fn trailers(&self, trailers: &mut HeaderMap) {
        if !trailers.contains_key("grpc-message") {
            return;
        }
        let Some(status) = tonic::Status::from_header_map(trailers) else {
            return;
        };
        if let Cow::Owned(message) = self.message(status.message()) {
            let _ = tonic::Status::new(status.code(), message).add_header(trailers);
        }
    }
}

/// Characters of the words the rule looks at: those of names, numbers and paths.
fn in_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '~' | '+' | '@' | '%')
}

/// `message` cut into words (`true`) and the single characters between them (`false`).
fn words(message: &str) -> Vec<(bool, &str)> {
    let mut words = Vec::new();
    let mut start = None;
    for (at, c) in message.char_indices() {
        match (in_word(c), start) {
            (true, None) => start = Some(at),
            (true, Some(_)) => {}
            (false, from) => {
                if let Some(from) = from {
                    words.push((true, &message[from..at]));
                }
                start = None;
                words.push((false, &message[at..at + c.len_utf8()]));
            }
        }
    }
    if let Some(from) = start {
        words.push((true, &message[from..]));
    }
    words
}

/// Whether `word` is a path (see [`Scrubber`]).
fn is_path(word: &str) -> bool {
    word.contains('/')
        && !is_method_path(word)
        && (word.starts_with(['/', '~'])
            || word.starts_with("./")
            || word.starts_with("../")
            || word.matches('/').count() >= 2)
}

/// `/pkg.Service/Method` (or without the first `/`): what a caller called, not a file.
fn is_method_path(word: &str) -> bool {
    let word = word.strip_prefix('/').unwrap_or(word);
    let Some((service, method)) = word.split_once('/') else {
        return false;
    };
    let name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    service.contains('.')
        && service.starts_with(|c: char| c.is_ascii_alphabetic())
        && service.chars().all(|c| name(c) || c == '.' || c == '-')
        && !method.is_empty()
        && method.chars().all(name)
}

/// Whether the value after `word` is a user's, group's or process's id.
fn names_an_id(word: &str) -> bool {
    let word = word.to_ascii_lowercase();
    let word = word.strip_suffix('s').unwrap_or(&word);
    ["uid", "gid", "pid", "euid", "egid"].contains(&word)
        || ["_uid", "_gid", "_pid"]
            .iter()
            .any(|end| word.ends_with(end))
}

/// Writes the words from `words[at]` to `out`, the id they start with (after spaces, `=`,
/// `:`, `(` and at most one of `to`, `is`, `of`) replaced; returns the index of the first
/// word not written. Writes nothing if no id follows.
fn id_value(words: &[(bool, &str)], at: usize, out: &mut String) -> usize {
    let mut i = at;
    let mut linked = false;
    let value = loop {
        match words.get(i) {
            Some(&(false, " " | "=" | ":" | "(")) => i += 1,
            Some(&(true, "to" | "is" | "of")) if !linked => {
                linked = true;
                i += 1;
            }
            Some(&(true, word)) if word.chars().all(|c| c.is_ascii_digit()) => {
                break (i + 1, "<id>");
            }
            Some(&(false, "[")) => {
                let list = words[i + 1..].iter().position(|&(_, w)| w == "]");
                let Some(len) = list else { return at };
                let numbers = words[i + 1..i + 1 + len].iter().all(|&(word, w)| {
                    if word {
                        w.chars().all(|c| c.is_ascii_digit())
                    } else {
                        matches!(w, "," | " ")
                    }
                });
                if !numbers {
                    return at;
                }
                break (i + len + 2, "<ids>");
            }
            _ => return at,
        }
    };
    for &(_, text) in &words[at..i] {
        out.push_str(text);
    }
    out.push_str(value.1);
    value.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_nothing_local() {
        let scrubber = Scrubber::new(Some(Path::new("/run/user/7/netless")));
        let cases = [
            (
                "service `a.B` not found in /run/user/7/netless: is its server running?",
                "service `a.B` not found in <socket directory>: is its server running?",
            ),
            (
                "uid 1001 gid 1001 is not allowed to use service `a.B` (its ACL admits uids \
                 [1000, 1002], gids [27])",
                "uid <id> gid <id> is not allowed to use service `a.B` (its ACL admits uids \
                 <ids>, gids <ids>)",
            ),
            (
                "service `a.B` at /proc/self/fd/7/a.B.sock is served by uid 1001, not by uid \
                 1000 (the socket directory's owner): set ClientConfig::expect_server_uid to \
                 1001",
                "service `a.B` at <path> is served by uid <id>, not by uid <id> (the socket \
                 directory's owner): set ClientConfig::expect_server_uid to <id>",
            ),
            (
                "the socket directory /tmp/netless-0 is owned by uid 1001, which is neither \
                 ours (uid 0) nor root's.",
                "the socket directory <path> is owned by uid <id>, which is neither ours \
                 (uid <id>) nor root's.",
            ),
            (
                "opening /home/alice/.netless/x.sock: permission denied (os error 13); see \
                 ~/.config/netless, ./run/a and \"/var/lib/x\".",
                "opening <path>: permission denied (os error 13); see <path>, <path> and \
                 \"<path>\".",
            ),
            (
                "receive queue 3 of uid 1000's clients: PeerCred { pid: 4242, uid: 1000, gid: \
                 100 }, relative dir run/user/1000/netless",
                "receive queue 3 of uid <id>'s clients: PeerCred { pid: <id>, uid: <id>, gid: \
                 <id> }, relative dir <path>",
            ),
        ];
        for (message, public) in cases {
            let clean = scrubber.status(&Status::new(Code::PermissionDenied, message));
            assert_eq!(clean.code(), Code::PermissionDenied);
            assert_eq!(clean.message(), public);
        }
        // What names nothing local is left as it is.
        for message in [
            "no such person: nobody",
            "method /helloworld.Greeter/SayHello: helloworld.Greeter/SayHello is unknown",
            "a connection may hold 3/4 of the buffer, read/write, at most 4096 bytes",
            "the uid of the caller is unknown; pid [not a number]",
            "",
        ] {
            assert!(
                matches!(scrubber.message(message), Cow::Borrowed(_)),
                "{message}"
            );
        }
        // The directory as configured, relative or not, whatever follows it.
        let relative = Scrubber::new(Some(Path::new("sockets/netless")));
        assert_eq!(
            relative.message("at sockets/netless/a.B.sock: gone"),
            "at <socket directory>: gone"
        );
    }

    #[test]
    fn trailers_are_scrubbed_and_keep_their_code() {
        let scrubber = Scrubber::new(None);
        let mut trailers = HeaderMap::new();
        let _ = tonic::Status::unavailable("at /run/user/7/x/a.B.sock (uid 7): gone")
            .add_header(&mut trailers);
        scrubber.trailers(&mut trailers);
        let seen = tonic::Status::from_header_map(&trailers).unwrap();
        assert_eq!(seen.code(), tonic::Code::Unavailable);
        assert_eq!(seen.message(), "at <path> (uid <id>): gone");
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", http::HeaderValue::from_static("0"));
        scrubber.trailers(&mut ok);
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn long_names_are_cut() {
        let status = unknown_service(&"x".repeat(500));
        assert!(status.message().len() < 200, "{status}");
        assert_eq!(status.code(), Code::Unimplemented);
    }
}
