//! Client authentication by bearer token: the token a gateway requires in every call's
//! `authorization: Bearer <token>` metadata, compared in constant time, and the reading of
//! the file that holds it. It never logs or echoes a token, the expected one or a presented
//! one. (Authentication by client certificate is TLS's job: see `tls`.)

use std::path::Path;

use http::header::AUTHORIZATION;
use http::HeaderMap;
use netless::{Code, Status};

/// Calls in a row without the token after which the gateway closes their connection: a
/// client that lost or never had the token learns it at once, and one that keeps calling
/// without it holds no connection for long.
pub(crate) const MAX_FAILED_AUTHENTICATIONS: u32 = 3;

/// `status`, the refusal of the call that made [`MAX_FAILED_AUTHENTICATIONS`] in a row,
/// saying that its connection closes.
pub(crate) fn closing(status: &Status) -> Status {
    Status::new(
        status.code(),
        format!(
            "{}; the gateway closes this connection: {MAX_FAILED_AUTHENTICATIONS} calls in a \
             row did not authenticate",
            status.message()
        ),
    )
}

/// The token every call must present.
pub(crate) struct BearerToken(Box<[u8]>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl BearerToken {
    /// `token` must be 1..=4096 visible ASCII characters (what an HTTP header can carry
    /// unchanged).
    pub(crate) fn new(token: &[u8]) -> Result<BearerToken, String> {
        if token.is_empty() || token.len() > 4096 || !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(
                "a bearer token must be 1 to 4096 visible ASCII characters (no spaces)".into(),
            );
        }
        Ok(BearerToken(token.into()))
    }

    /// `Ok` if `headers` carry `authorization: Bearer <this token>`; else `UNAUTHENTICATED`
    /// with a message that says what is expected and repeats no token.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), Status> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(Status::new(
                Code::Unauthenticated,
                "this gateway requires the metadata `authorization: Bearer <token>`; the \
                 call carried none (or more than one)",
            ));
        };
        let presented = value.as_bytes();
        let token = match presented.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => presented[7..].trim_ascii(),
            _ => &[][..],
        };
        if token.is_empty() || !constant_time_eq(&self.0, token) {
            return Err(Status::new(
                Code::Unauthenticated,
                "this gateway requires the metadata `authorization: Bearer <token>`; the \
                 call's does not carry its token",
            ));
        }
        Ok(())
    }
}

/// Whether `presented` equals `expected`, in a time that depends on `expected`'s length
/// only: every byte of it is compared, whatever `presented` holds.
fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != presented.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= e ^ presented.get(i).copied().unwrap_or(!e);
    }
    std::hint::black_box(diff) == 0
}

/// Reads a bearer token from `path`: its content less surrounding whitespace. Refuses a file
/// that group or others may read or write (as ssh refuses such a private key): anyone who
/// can read the token can call every service the gateway forwards.
///
/// ```no_run
/// let token = netless_grpc::read_token_file("/etc/gateway/token".as_ref())?;
/// let gateway = netless_grpc::Gateway::builder(netless::ClientConfig::default())
///     .allow("helloworld.*")
///     .bearer_token(token)
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_token_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta =
        std::fs::metadata(path).map_err(|e| format!("reading the token file {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("the token file {shown} is not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the token file {shown} is open to group or others (mode {mode:03o}): \
             `chmod 600 {shown}`"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("reading the token file {shown}: {e}"))?;
    let token = bytes.trim_ascii().to_vec();
    BearerToken::new(&token).map_err(|e| format!("the token file {shown}: {e}"))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_right_token_passes_and_nothing_else_does() {
        let token = BearerToken::new(b"s3cret-token").unwrap();
        assert!(token.check(&headers(&["Bearer s3cret-token"])).is_ok());
        assert!(token.check(&headers(&["bearer s3cret-token"])).is_ok());
        for bad in [
            &[][..],
            &["Bearer s3cret-tokeN"][..],
            &["Bearer s3cret-token2"],
            &["Bearer s3cret"],
            &["Basic s3cret-token"],
            &["s3cret-token"],
            &["Bearer "],
            &["Bearer s3cret-token", "Bearer s3cret-token"],
        ] {
            let status = token.check(&headers(bad)).unwrap_err();
            assert_eq!(status.code(), Code::Unauthenticated, "{bad:?}");
            assert!(!status.message().contains("s3cret"), "{status}");
        }
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn equality_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"\xff", b""));
    }

    #[test]
    fn token_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("nl-token-{}", std::process::id()));
        std::fs::write(&path, "  tok3n\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_token_file(&path).unwrap_err();
        assert!(err.contains("chmod 600") && !err.contains("tok3n"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_token_file(&path).unwrap(), b"tok3n");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_token_file(&path).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
