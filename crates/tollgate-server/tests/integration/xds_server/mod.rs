//! An xDS management server of the tests' own, as go-control-plane's snapshot cache serves
//! envoyproxy/ratelimit: ADS, state of the world, one snapshot (a version and its
//! `RateLimitConfig` resources) for every node; a stream is sent the snapshot once the client
//! asked and whenever it changes, unless the client already holds its version. Every request
//! is kept, so that tests can read ACKs and NACKs. It runs on a runtime of its own, so that
//! [`Management::kill`] drops its connections as a crashed server would.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tollgate_server::provider::xds::TYPE_URL;
use tollgate_server::provider::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// A snapshot: its version and its resources.
pub type Snapshot = (String, Vec<RateLimitConfig>);

/// What the server holds and has been told; kept across restarts.
#[derive(Debug)]
pub struct State {
    snapshot: watch::Sender<Option<Snapshot>>,
    /// Every request received, in order.
    pub requests: Mutex<Vec<DiscoveryRequest>>,
    /// The metadata each stream opened with.
    pub headers: Mutex<Vec<tonic::metadata::MetadataMap>>,
}

/// TLS of the server: its certificate and key, and the CA a client's certificate must chain
/// to (PEM files).
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: std::path::PathBuf,
}

/// A running management server.
pub struct Management {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
    tls: Option<Tls>,
}

struct Ads(Arc<State>);

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let state = self.0.clone();
        state
            .headers
            .lock()
            .unwrap()
            .push(request.metadata().clone());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut snapshots = state.snapshot.subscribe();
            // The version the client holds, once it asked; what this stream sent last.
            let mut held: Option<String> = None;
            let mut sent: Option<String> = None;
            let mut nonce = 0u64;
            loop {
                tokio::select! {
                    request = incoming.message() => match request {
                        Ok(Some(request)) => {
                            held = Some(request.version_info.clone());
                            state.requests.lock().unwrap().push(request);
                        }
                        _ => return,
                    },
                    changed = snapshots.changed() => if changed.is_err() { return },
                }
                let Some(held) = &held else { continue };
                let Some((version, resources)) = snapshots.borrow_and_update().clone() else {
                    continue;
                };
                if *held == version || sent.as_ref() == Some(&version) {
                    continue;
                }
                nonce += 1;
                let response = DiscoveryResponse {
                    version_info: version.clone(),
                    type_url: TYPE_URL.into(),
                    nonce: nonce.to_string(),
                    resources: resources
                        .iter()
                        .map(|r| Any {
                            type_url: TYPE_URL.into(),
                            value: r.encode_to_vec(),
                        })
                        .collect(),
                    ..DiscoveryResponse::default()
                };
                sent = Some(version);
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

impl Management {
    /// Serves `snapshot` (none: nothing until [`set`](Self::set)) on a free loopback port.
    pub fn start(snapshot: Option<Snapshot>, tls: Option<Tls>) -> Self {
        Self::start_on(([127, 0, 0, 1], 0).into(), snapshot, tls)
    }

    /// As [`start`](Self::start), on `addr` (port 0: a free one).
    pub fn start_on(addr: SocketAddr, snapshot: Option<Snapshot>, tls: Option<Tls>) -> Self {
        let state = Arc::new(State {
            snapshot: watch::channel(snapshot).0,
            requests: Mutex::default(),
            headers: Mutex::default(),
        });
        let addr = std::net::TcpListener::bind(addr)
            .unwrap()
            .local_addr()
            .unwrap();
        let mut server = Self {
            addr,
            state,
            runtime: None,
            tls,
        };
        server.restart();
        server
    }

    /// Serves again on the same port, after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (state, addr, tls) = (self.state.clone(), self.addr, self.tls.clone());
        // The port may linger a moment after a kill.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(addr) {
                Ok(listener) => break listener,
                Err(e) if Instant::now() > deadline => panic!("cannot bind {addr}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        listener.set_nonblocking(true).unwrap();
        runtime.spawn(async move {
            let mut builder = Server::builder();
            if let Some(tls) = tls {
                let read = |p: &std::path::PathBuf| std::fs::read(p).unwrap();
                builder = builder
                    .tls_config(
                        ServerTlsConfig::new()
                            .identity(Identity::from_pem(read(&tls.cert), read(&tls.key)))
                            .client_ca_root(Certificate::from_pem(read(&tls.client_ca))),
                    )
                    .unwrap();
            }
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = builder
                .add_service(AggregatedDiscoveryServiceServer::new(Ads(state)))
                .serve_with_incoming(incoming)
                .await;
        });
        self.runtime = Some(runtime);
    }

    /// Stops at once, dropping every connection.
    pub fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Serves `snapshot` from now on.
    pub fn set(&self, version: &str, resources: Vec<RateLimitConfig>) {
        self.state
            .snapshot
            .send_replace(Some((version.to_string(), resources)));
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until a request passes `test`; returns it.
    pub fn wait_for_request(
        &self,
        within: Duration,
        test: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let deadline = Instant::now() + within;
        loop {
            if let Some(r) = self.requests().into_iter().find(|r| test(r)) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no such request within {within:?}: {:#?}",
                self.requests()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `CONFIG_GRPC_XDS_SERVER_URL=...` for this server.
    pub fn url_setting(&self) -> String {
        format!("CONFIG_GRPC_XDS_SERVER_URL={}", self.addr)
    }
}

impl Drop for Management {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A resource holding the Envoy file `yaml`, as a management server would push the same
/// limits: the file's fields, one for one.
pub fn resource(name: &str, yaml: &str) -> RateLimitConfig {
    let file: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    RateLimitConfig {
        name: name.into(),
        domain: file["domain"].as_str().unwrap().into(),
        descriptors: descriptors(&file["descriptors"]),
    }
}

fn descriptors(list: &serde_json::Value) -> Vec<RateLimitDescriptor> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let flag = |v: &serde_json::Value| v.as_bool().unwrap_or(false);
    list.as_array()
        .map(|list| {
            list.iter()
                .map(|d| {
                    assert!(
                        d.get("share_threshold").is_none() && d.get("value_to_metric").is_none(),
                        "RateLimitConfig has no share_threshold or value_to_metric"
                    );
                    RateLimitDescriptor {
                        key: text(&d["key"]),
                        value: text(&d["value"]),
                        rate_limit: d.get("rate_limit").map(|r| RateLimitPolicy {
                            unit: r["unit"]
                                .as_str()
                                .and_then(|u| RateLimitUnit::from_str_name(&u.to_ascii_uppercase()))
                                .unwrap_or(RateLimitUnit::Unknown)
                                as i32,
                            requests_per_unit: r["requests_per_unit"].as_u64().unwrap_or(0) as u32,
                            unlimited: flag(&r["unlimited"]),
                            name: text(&r["name"]),
                            replaces: r["replaces"]
                                .as_array()
                                .map(|l| {
                                    l.iter()
                                        .map(|x| RateLimitReplace {
                                            name: text(&x["name"]),
                                        })
                                        .collect()
                                })
                                .unwrap_or_default(),
                        }),
                        descriptors: descriptors(&d["descriptors"]),
                        shadow_mode: flag(&d["shadow_mode"]),
                        detailed_metric: flag(&d["detailed_metric"]),
                        quota_mode: flag(&d["quota_mode"]),
                        metadata: None,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}
