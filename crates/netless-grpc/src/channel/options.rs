//! How [`Channel::target_with`](super::Channel::target_with) reaches a target: the netless
//! client configuration (for a remote target, its connect and default timeouts), the
//! resolver, TLS and the connect timeout.

use std::time::Duration;

use netless::{ClientConfig, Code, Status};

use super::resolver::Resolver;

/// The environment variable naming a PEM file of the CA certificates that verify `https`
/// servers when [`ChannelOptions::tls_ca_pem`] gives none.
///
/// ```no_run
/// std::process::Command::new("routeguide_client")
///     .args(["--target", "https://routeguide.internal:443"])
///     .env(netless_grpc::TLS_CA_ENV, "/etc/netless/ca.pem")
///     .status()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub const TLS_CA_ENV: &str = "NETLESS_TLS_CA";

/// Options for [`Channel::target_with`](super::Channel::target_with).
///
/// ```
/// use std::time::Duration;
/// use netless_grpc::{ChannelOptions, Resolver};
/// let options = ChannelOptions::new()
///     .client_config(netless::ClientConfig::default())
///     .resolver("routeguide.* http://127.0.0.1:50051".parse::<Resolver>()?)
///     .connect_timeout(Duration::from_secs(2));
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ChannelOptions {
    pub(super) client: ClientConfig,
    pub(super) resolver: Option<Resolver>,
    tls_ca_pem: Option<Vec<u8>>,
    pub(super) tls_domain: Option<String>,
}

impl ChannelOptions {
    /// The defaults: `ClientConfig::default()`, the `NETLESS_TARGETS` table, the
    /// `NETLESS_TLS_CA` file.
    ///
    /// ```
    /// let options = netless_grpc::ChannelOptions::new();
    /// ```
    pub fn new() -> ChannelOptions {
        ChannelOptions::default()
    }

    /// The netless client configuration for a local target (socket directory, fabric,
    /// domain, ...). Of it, a remote target uses `connect_timeout` and `default_timeout`:
    /// a call that sets no deadline gets that much, sent to the server as `grpc-timeout`
    /// and held to by the channel itself, so that a server that never answers fails the
    /// call with `DEADLINE_EXCEEDED` rather than hang it.
    ///
    /// ```
    /// let config = netless::ClientConfig {
    ///     dir: Some("/run/netless-test".into()),
    ///     ..Default::default()
    /// };
    /// let options = netless_grpc::ChannelOptions::new().client_config(config);
    /// ```
    pub fn client_config(mut self, config: ClientConfig) -> ChannelOptions {
        self.client = config;
        self
    }

    /// Resolves bare service names with `resolver` instead of the `NETLESS_TARGETS` table.
    ///
    /// ```
    /// // Every name is local, whatever NETLESS_TARGETS says.
    /// let options = netless_grpc::ChannelOptions::new().resolver(netless_grpc::Resolver::new());
    /// ```
    pub fn resolver(mut self, resolver: Resolver) -> ChannelOptions {
        self.resolver = Some(resolver);
        self
    }

    /// The CA certificates (PEM) that verify `https` servers, instead of the file named by
    /// `NETLESS_TLS_CA`.
    ///
    /// ```no_run
    /// let pem = std::fs::read("/etc/netless/ca.pem")?;
    /// let options = netless_grpc::ChannelOptions::new().tls_ca_pem(pem);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> ChannelOptions {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// The name an `https` server's certificate must carry, when it is not the target's
    /// host (as when connecting by address).
    ///
    /// ```
    /// let options = netless_grpc::ChannelOptions::new().tls_domain("routeguide.internal");
    /// ```
    pub fn tls_domain(mut self, name: impl Into<String>) -> ChannelOptions {
        self.tls_domain = Some(name.into());
        self
    }

    /// How long connecting may take, to a local service or a remote server (default 5 s).
    ///
    /// ```
    /// let options = netless_grpc::ChannelOptions::new()
    ///     .connect_timeout(std::time::Duration::from_millis(500));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> ChannelOptions {
        self.client.connect_timeout = timeout;
        self
    }

    /// The CA certificates for `https`: the options' own, else the `NETLESS_TLS_CA` file.
    pub(super) fn ca_pem(&self, target: &str) -> Result<Vec<u8>, Status> {
        if let Some(pem) = &self.tls_ca_pem {
            return Ok(pem.clone());
        }
        match std::env::var_os(TLS_CA_ENV) {
            Some(path) if !path.is_empty() => std::fs::read(&path).map_err(|e| {
                Status::new(
                    Code::FailedPrecondition,
                    format!(
                        "cannot read the CA file {} named by {TLS_CA_ENV}: {e}",
                        std::path::Path::new(&path).display()
                    ),
                )
            }),
            _ => Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "`{target}` needs CA certificates to verify the server: give \
                     ChannelOptions::tls_ca_pem or set {TLS_CA_ENV} to a PEM file"
                ),
            )),
        }
    }
}
