//! The remote path: calls to gRPC servers elsewhere go over HTTP/2 through tonic's own
//! transport (`tonic::transport::Channel`), so any gRPC server in any language answers.
//!
//! This module owns building that channel from a [`Location::Remote`] and turning its
//! transport failures into gRPC statuses; the calls themselves pass through unchanged.

use std::error::Error as StdError;

use netless::{Code, Status};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tower::ServiceExt as _;

use super::local::status_response;
use super::options::ChannelOptions;

/// A lazily connecting tonic channel to `uris`, balanced across them when there are
/// several. Connections are made by the first call, in the current tokio runtime.
pub(super) fn connect(
    uris: &[String],
    options: &ChannelOptions,
) -> Result<tonic::transport::Channel, Status> {
    if tokio::runtime::Handle::try_current().is_err() {
        // tonic runs the channel's connections as tasks of the runtime it is made in.
        return Err(Status::new(
            Code::FailedPrecondition,
            "a channel to a remote target is made inside a tokio runtime, which runs its \
             connections",
        ));
    }
    let endpoints = uris
        .iter()
        .map(|uri| endpoint(uri, options))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match &endpoints[..] {
        [one] => one.connect_lazy(),
        _ => tonic::transport::Channel::balance_list(endpoints.into_iter()),
    })
}

fn endpoint(uri: &str, options: &ChannelOptions) -> Result<Endpoint, Status> {
    let invalid = |e: &dyn std::fmt::Display| {
        Status::invalid_argument(format!("`{uri}` is not a usable server address: {e}"))
    };
    let mut endpoint = Endpoint::from_shared(uri.to_string())
        .map_err(|e| invalid(&e))?
        .connect_timeout(options.client.connect_timeout)
        .tcp_nodelay(true);
    if uri.starts_with("https://") {
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(options.ca_pem(uri)?));
        if let Some(domain) = &options.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| invalid(&e))?;
    }
    Ok(endpoint)
}

/// One call through `channel`; a transport failure becomes a trailers-only response, as a
/// netless failure does on the local path.
pub(super) async fn call(
    channel: tonic::transport::Channel,
    target: &str,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    match channel.oneshot(request).await {
        Ok(response) => response,
        Err(error) => status_response(&transport_status(&error, target)),
    }
}

/// The status for a failure of tonic's transport: the deadline's expiry is
/// `DEADLINE_EXCEEDED`, everything else (refused, reset, no route, TLS) `UNAVAILABLE`,
/// each with the causes' own words (which name the target, never a local path).
pub(super) fn transport_status(error: &(dyn StdError + 'static), target: &str) -> Status {
    let mut causes: Vec<String> = Vec::new();
    let mut source = Some(error);
    while let Some(error) = source {
        if error.downcast_ref::<tonic::TimeoutExpired>().is_some() {
            return Status::deadline_exceeded(format!(
                "the deadline expired before `{target}` answered"
            ));
        }
        let text = error.to_string();
        // Layers often repeat their source's words in their own.
        if !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        source = error.source();
    }
    Status::unavailable(format!("`{target}` is unavailable: {}", causes.join(": ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<dyn StdError + Send + Sync>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn a_refused_connection_is_unavailable_with_every_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(refused)),
            ))),
        );
        let status = transport_status(&error, "http://127.0.0.1:1");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "`http://127.0.0.1:1` is unavailable: transport error: tcp connect error: \
             connection refused"
        );
    }

    #[test]
    fn an_expired_deadline_is_deadline_exceeded() {
        let error = Layer("transport error", Some(Box::new(tonic::TimeoutExpired(()))));
        let status = transport_status(&error, "http://a:1");
        assert_eq!(status.code(), Code::DeadlineExceeded);
    }

    #[test]
    fn https_without_a_ca_says_how_to_give_one() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _context = runtime.enter();
        let mut options = ChannelOptions::new();
        if std::env::var_os(super::super::options::TLS_CA_ENV).is_some() {
            // A CA from the environment would be used; give a bad one explicitly instead.
            options = options.tls_ca_pem(b"not a certificate".to_vec());
            let _ = connect(&["https://localhost:1".into()], &options);
            return;
        }
        let err = connect(&["https://localhost:1".into()], &options).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(
            err.message().contains("NETLESS_TLS_CA"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn outside_a_runtime_a_remote_channel_is_refused_not_a_panic() {
        let err = connect(&["http://127.0.0.1:1".into()], &ChannelOptions::new()).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("tokio runtime"));
    }
}
