//! Server reflection (`grpc.reflection.v1` and `v1alpha`), answered by the gateway. It has
//! no `.proto` of its backends, so it tells what it knows and asks for the rest:
//!
//! - **ListServices**: the services the allow-list lets in whose servers are up (their
//!   sockets in the gateway's socket directory, each `SERVING` as `grpc.health.v1` tells
//!   it), and the gateway's own three.
//! - **Descriptors** (`FileContainingSymbol`, `FileByFilename`, the extension queries):
//!   of the gateway's own services, from the descriptors `tonic-health` and
//!   `tonic-reflection` ship; of anything else, asked of the netless service
//!   `grpc.reflection.v1.ServerReflection` (else `grpc.reflection.v1alpha...`) in the
//!   socket directory, if a local process serves one (say, a `GrpcServer` with
//!   `tonic-reflection`'s service and its backends' descriptors), else `NOT_FOUND`. What
//!   comes back is filtered: every service the allow-list does not let in is taken out of
//!   each file, and a request for such a service (or one of its methods) is `NOT_FOUND`,
//!   as if it did not exist. Messages and enums are left as they are: they name no service.

use std::time::{Duration, Instant};

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_reflection::pb::{v1, v1alpha};
use v1::server_reflection_request::MessageRequest;
use v1::server_reflection_response::MessageResponse;

use super::allow::AllowList;
use super::health::serving_status;
use super::own::{is_own, OWN, REFLECTION_V1, REFLECTION_V1ALPHA};
use super::Gateway;
use crate::channel::Channel;

/// How long a backend's reflection service has to answer one request.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Services listed at most.
const MAX_LISTED: usize = 1000;

/// The reflection service of one call (both versions; `v1alpha` through [`V1Alpha`]).
pub(super) struct Reflection {
    gateway: Gateway,
    /// The call's deadline, which ends its stream.
    deadline: Option<Instant>,
}

/// The same, answering `v1alpha` (its messages are `v1`'s, field for field).
pub(super) struct V1Alpha(pub(super) Reflection);

impl Reflection {
    pub(super) fn new(gateway: Gateway, deadline: Option<Instant>) -> Reflection {
        Reflection { gateway, deadline }
    }

    /// The answer to one request.
    async fn answer(&self, request: v1::ServerReflectionRequest) -> v1::ServerReflectionResponse {
        let message = match &request.message_request {
            None => error(tonic::Code::InvalidArgument, "the request asks nothing"),
            Some(MessageRequest::ListServices(_)) => {
                let names = self.services().await;
                MessageResponse::ListServicesResponse(v1::ListServiceResponse {
                    service: names
                        .into_iter()
                        .map(|name| v1::ServiceResponse { name })
                        .collect(),
                })
            }
            Some(asked) => match own_files(asked) {
                Some(files) => files,
                None => self.ask_backend(&request).await,
            },
        };
        v1::ServerReflectionResponse {
            valid_host: request.host.clone(),
            original_request: Some(request),
            message_response: Some(message),
        }
    }

    /// Asks the backends' reflection service, if there is one, and filters its answer.
    async fn ask_backend(&self, request: &v1::ServerReflectionRequest) -> MessageResponse {
        let inner = &*self.gateway.inner;
        let not_found = || error(tonic::Code::NotFound, "not found");
        for (service, alpha) in [(REFLECTION_V1, false), (REFLECTION_V1ALPHA, true)] {
            let deadline = Instant::now() + inner.limits.backend_connect_timeout;
            let backend = inner.backends.get(service);
            let Ok(link) = backend.link(inner.backends.spec(), Some(deadline)).await else {
                continue;
            };
            let channel = Channel::from_client(link.client().clone());
            let asked = tokio::time::timeout(ASK_TIMEOUT, ask(channel, request.clone(), alpha));
            let Ok(Some(mut answer)) = asked.await else {
                return error(tonic::Code::Unavailable, "the reflection service failed");
            };
            let asked_symbol = match &request.message_request {
                Some(MessageRequest::FileContainingSymbol(symbol)) => Some(symbol.as_str()),
                _ => None,
            };
            if let MessageResponse::FileDescriptorResponse(files) = &mut answer {
                let removed = strip_services(&mut files.file_descriptor_proto, &inner.allow);
                let hidden = asked_symbol.is_some_and(|symbol| {
                    removed.iter().any(|gone| {
                        symbol == gone
                            || symbol
                                .strip_prefix(gone.as_str())
                                .is_some_and(|r| r.starts_with('.'))
                    })
                });
                if hidden {
                    return not_found();
                }
            }
            if let MessageResponse::ListServicesResponse(_) = answer {
                // Not asked of it: the gateway lists what it lets in itself.
                return not_found();
            }
            return answer;
        }
        not_found()
    }
}

/// One request to a backend's reflection service over netless, and its answer.
async fn ask(
    channel: Channel,
    request: v1::ServerReflectionRequest,
    alpha: bool,
) -> Option<MessageResponse> {
    if alpha {
        let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
        let request: v1alpha::ServerReflectionRequest = transcode(&request)?;
        let mut answers = client
            .server_reflection_info(tokio_stream::once(request))
            .await
            .ok()?
            .into_inner();
        let answer = match answers.message().await {
            Ok(answer) => answer?,
            Err(status) => return Some(status_error(&status)),
        };
        let answer: v1::ServerReflectionResponse = transcode(&answer)?;
        answer.message_response
    } else {
        let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
        let mut answers = client
            .server_reflection_info(tokio_stream::once(request))
            .await
            .ok()?
            .into_inner();
        match answers.message().await {
            Ok(answer) => answer?.message_response,
            Err(status) => Some(status_error(&status)),
        }
    }
}

/// A backend's stream that ended with `status` (as `tonic-reflection` ends one for a
/// symbol it does not know), as an error answer: its code, and no words of the backend's.
fn status_error(status: &tonic::Status) -> MessageResponse {
    match status.code() {
        tonic::Code::NotFound => error(tonic::Code::NotFound, "not found"),
        code => error(code, "the reflection service failed"),
    }
}

/// A message as the other version's same message (their fields are the same).
fn transcode<A: prost::Message, B: prost::Message + Default>(message: &A) -> Option<B> {
    B::decode(message.encode_to_vec().as_slice()).ok()
}

fn error(code: tonic::Code, message: &str) -> MessageResponse {
    MessageResponse::ErrorResponse(v1::ErrorResponse {
        error_code: code as i32,
        error_message: message.to_string(),
    })
}

/// The descriptors of the gateway's own services (health, reflection v1 and v1alpha).
fn own_descriptors() -> Vec<FileDescriptorProto> {
    [
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        v1::FILE_DESCRIPTOR_SET,
        v1alpha::FILE_DESCRIPTOR_SET,
    ]
    .iter()
    .filter_map(|set| FileDescriptorSet::decode(*set).ok())
    .flat_map(|set| set.file)
    .collect()
}

/// The answer to `asked` from the gateway's own descriptors, if it is about them.
fn own_files(asked: &MessageRequest) -> Option<MessageResponse> {
    let files = own_descriptors();
    let found = files.into_iter().find(|file| match asked {
        MessageRequest::FileByFilename(name) => file.name() == name,
        MessageRequest::FileContainingSymbol(symbol) => defines(file, symbol),
        _ => false,
    })?;
    Some(MessageResponse::FileDescriptorResponse(
        v1::FileDescriptorResponse {
            file_descriptor_proto: vec![found.encode_to_vec()],
        },
    ))
}

/// Whether `file` declares `symbol` (`pkg.Service`, `pkg.Service.Method`, `pkg.Message`,
/// `pkg.Message.Nested`, `pkg.Enum`).
fn defines(file: &FileDescriptorProto, symbol: &str) -> bool {
    let local = match file.package() {
        "" => symbol,
        package => match symbol
            .strip_prefix(package)
            .and_then(|rest| rest.strip_prefix('.'))
        {
            Some(local) => local,
            None => return false,
        },
    };
    let services = file.service.iter().any(|s| {
        local == s.name()
            || local
                .strip_prefix(s.name())
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|m| s.method.iter().any(|x| x.name() == m))
    });
    let enums = file.enum_type.iter().any(|e| e.name() == local);
    services || enums || file.message_type.iter().any(|m| message_defines(m, local))
}

fn message_defines(message: &DescriptorProto, local: &str) -> bool {
    if local == message.name() {
        return true;
    }
    let Some(rest) = local
        .strip_prefix(message.name())
        .and_then(|rest| rest.strip_prefix('.'))
    else {
        return false;
    };
    message.enum_type.iter().any(|e| e.name() == rest)
        || message.nested_type.iter().any(|n| message_defines(n, rest))
}

/// Takes every service the allow-list does not let in (the gateway's own are kept) out of
/// the encoded `files`, dropping any that does not decode; returns the full names of the
/// services taken out.
fn strip_services(files: &mut Vec<Vec<u8>>, allow: &AllowList) -> Vec<String> {
    let mut removed = Vec::new();
    files.retain_mut(|bytes| {
        let Ok(mut file) = FileDescriptorProto::decode(bytes.as_slice()) else {
            return false;
        };
        let package = file.package().to_string();
        let before = file.service.len();
        file.service.retain(|service| {
            let full = match package.as_str() {
                "" => service.name().to_string(),
                package => format!("{package}.{}", service.name()),
            };
            let keep = allow.allows(&full) || is_own(&full);
            if !keep {
                removed.push(full);
            }
            keep
        });
        if file.service.len() != before {
            *bytes = file.encode_to_vec();
        }
        true
    });
    removed
}

impl Reflection {
    /// The services reflection lists: the gateway's own, and those the allow-list lets in
    /// that are up, from the socket directory.
    async fn services(&self) -> Vec<String> {
        let inner = &*self.gateway.inner;
        let dir = inner.backends.spec().config.dir.clone();
        let mut candidates: Vec<String> = dir
            .and_then(|dir| std::fs::read_dir(dir).ok())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| service_of_socket(entry.file_name().to_str()?))
            .filter(|name| inner.allow.allows(name))
            .collect();
        candidates.sort();
        candidates.dedup();
        let mut checks = tokio::task::JoinSet::new();
        for name in candidates.into_iter().take(MAX_LISTED) {
            let gateway = self.gateway.clone();
            checks.spawn(async move {
                let status = serving_status(&gateway, &name).await;
                (status == Some(ServingStatus::Serving)).then_some(name)
            });
        }
        let mut names: Vec<String> = OWN.iter().map(|s| s.to_string()).collect();
        while let Some(checked) = checks.join_next().await {
            if let Ok(Some(name)) = checked {
                names.push(name);
            }
        }
        names.sort();
        names
    }
}

/// The service of a server's socket `SERVICE.sock` or `SERVICE#N.sock`.
fn service_of_socket(file_name: &str) -> Option<String> {
    let stem = file_name.strip_suffix(".sock")?;
    if stem.starts_with('.') {
        return None;
    }
    let service = stem.rsplit_once('#').map_or(stem, |(service, _)| service);
    (!service.is_empty()).then(|| service.to_string())
}

/// Answers the requests of one stream with `answer`, in order, until the client ends it
/// or `deadline` passes (then `DEADLINE_EXCEEDED`).
macro_rules! serve_stream {
    ($request:expr, $deadline:expr, $answer:expr) => {{
        let mut inbound = $request.into_inner();
        let deadline: Option<Instant> = $deadline;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let ends = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(ends);
            loop {
                let request = tokio::select! {
                    () = tx.closed() => return,
                    () = &mut ends => {
                        let passed = tonic::Status::deadline_exceeded("the call's deadline passed");
                        let _ = tx.send(Err(passed)).await;
                        return;
                    }
                    next = inbound.message() => match next {
                        Ok(Some(request)) => request,
                        _ => return,
                    },
                };
                if tx.send(Ok($answer(request).await)).await.is_err() {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }};
}

#[tonic::async_trait]
impl v1::server_reflection_server::ServerReflection for Reflection {
    type ServerReflectionInfoStream =
        ReceiverStream<Result<v1::ServerReflectionResponse, tonic::Status>>;

    async fn server_reflection_info(
        &self,
        request: tonic::Request<tonic::Streaming<v1::ServerReflectionRequest>>,
    ) -> Result<tonic::Response<Self::ServerReflectionInfoStream>, tonic::Status> {
        let this = Reflection::new(self.gateway.clone(), self.deadline);
        serve_stream!(request, self.deadline, |r| this.answer(r))
    }
}

#[tonic::async_trait]
impl v1alpha::server_reflection_server::ServerReflection for V1Alpha {
    type ServerReflectionInfoStream =
        ReceiverStream<Result<v1alpha::ServerReflectionResponse, tonic::Status>>;

    async fn server_reflection_info(
        &self,
        request: tonic::Request<tonic::Streaming<v1alpha::ServerReflectionRequest>>,
    ) -> Result<tonic::Response<Self::ServerReflectionInfoStream>, tonic::Status> {
        let this = Reflection::new(self.0.gateway.clone(), self.0.deadline);
        serve_stream!(
            request,
            self.0.deadline,
            |r: v1alpha::ServerReflectionRequest| {
                let this = &this;
                async move {
                    let request = transcode(&r).unwrap_or_default();
                    let answer = this.answer(request).await;
                    transcode(&answer).unwrap_or_default()
                }
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{MethodDescriptorProto, ServiceDescriptorProto};

    fn file(package: &str, services: &[&str]) -> FileDescriptorProto {
        FileDescriptorProto {
            name: Some("x.proto".into()),
            package: Some(package.into()),
            service: services
                .iter()
                .map(|name| ServiceDescriptorProto {
                    name: Some(name.to_string()),
                    method: vec![MethodDescriptorProto {
                        name: Some("Get".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            message_type: vec![DescriptorProto {
                name: Some("Req".into()),
                nested_type: vec![DescriptorProto {
                    name: Some("Inner".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn services_not_let_in_are_taken_out() {
        let mut allow = AllowList::default();
        allow.add("shop.Orders").unwrap();
        let mut files = vec![
            file("shop", &["Orders", "Admin"]).encode_to_vec(),
            b"\xffnot a descriptor".to_vec(),
        ];
        let removed = strip_services(&mut files, &allow);
        assert_eq!(removed, ["shop.Admin"]);
        assert_eq!(files.len(), 1);
        let kept = FileDescriptorProto::decode(files[0].as_slice()).unwrap();
        let names: Vec<&str> = kept.service.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["Orders"]);
    }

    #[test]
    fn symbols_are_found_where_they_are_declared() {
        let f = file("shop", &["Orders"]);
        for symbol in [
            "shop.Orders",
            "shop.Orders.Get",
            "shop.Req",
            "shop.Req.Inner",
        ] {
            assert!(defines(&f, symbol), "{symbol}");
        }
        for symbol in [
            "shop.Order",
            "shop.Orders.Put",
            "shop",
            "other.Orders",
            "shop.Req.X",
        ] {
            assert!(!defines(&f, symbol), "{symbol}");
        }
    }

    #[test]
    fn the_gateways_own_descriptors_answer_for_its_services() {
        for service in OWN {
            let asked = MessageRequest::FileContainingSymbol(service.to_string());
            assert!(own_files(&asked).is_some(), "{service}");
        }
        let asked = MessageRequest::FileContainingSymbol("helloworld.Greeter".into());
        assert!(own_files(&asked).is_none());
        assert_eq!(service_of_socket("a.B#2.sock").as_deref(), Some("a.B"));
        assert_eq!(service_of_socket(".x.sock"), None);
    }
}
