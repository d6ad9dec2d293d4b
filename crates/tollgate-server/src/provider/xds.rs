//! Envoy domains from an xDS management server, as the Envoy ratelimit service takes them with
//! `CONFIG_TYPE=GRPC_XDS_SOTW`: a subscription over ADS (state of the world) to
//! [`TYPE_URL`] resources, each of which is one domain in the shape of an Envoy file
//! (`proto/ratelimit/config/ratelimit/v3/rls_conf.proto`). Each push is handed to the service
//! as a [`Push`] and ACKed once it loaded, or NACKed with the reason why not (the limits in
//! use keep serving). When the server goes away, the last good push keeps serving and the
//! client subscribes again after a backoff, reporting the version it holds.

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use prost::Message;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::{XdsBackoff, XdsSettings};

/// The messages of `rls_conf.proto`, generated at build time (`build.rs`).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(
        env!("OUT_DIR"),
        "/ratelimit.config.ratelimit.v3.rs"
    ));
}

use proto::{RateLimitConfig, RateLimitDescriptor, RateLimitUnit};

/// The type of the resources subscribed to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The domains of one push, each as the text of an Envoy file named `xds:NAME`.
pub type Texts = Vec<(PathBuf, String)>;

/// One push from the management server, to be loaded; `answer` takes whether it loaded (the
/// reason when not), which the client ACKs or NACKs. Dropping it NACKs.
#[derive(Debug)]
pub struct Push {
    /// The domains pushed.
    pub texts: Texts,
    /// Where the outcome goes.
    pub answer: oneshot::Sender<Result<(), String>>,
}

/// Subscribes as `settings` say, in a task of its own, until the receiver is dropped.
pub fn spawn(settings: XdsSettings) -> mpsc::Receiver<Push> {
    let (pushes, received) = mpsc::channel(1);
    tokio::spawn(run(settings, pushes));
    received
}

/// The text of an Envoy file holding `config`, as the Envoy ratelimit service turns a resource
/// into its YAML (`ConfigXdsProtoToYaml`): an empty value is no value, a unit not set is
/// `UNKNOWN` (refused unless the limit is unlimited, as there).
pub fn file_text(config: &RateLimitConfig) -> String {
    fn descriptor(d: &RateLimitDescriptor) -> serde_json::Value {
        let mut out = json!({ "key": d.key });
        if !d.value.is_empty() {
            out["value"] = json!(d.value);
        }
        if let Some(limit) = &d.rate_limit {
            let unit = RateLimitUnit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
            let mut rate_limit = json!({
                "unit": unit,
                "requests_per_unit": limit.requests_per_unit,
                "unlimited": limit.unlimited,
                "replaces": limit.replaces.iter().map(|r| json!({ "name": r.name })).collect::<Vec<_>>(),
            });
            if !limit.name.is_empty() {
                rate_limit["name"] = json!(limit.name);
            }
            out["rate_limit"] = rate_limit;
        }
        if !d.descriptors.is_empty() {
            out["descriptors"] = d.descriptors.iter().map(descriptor).collect();
        }
        out["shadow_mode"] = json!(d.shadow_mode);
        out["detailed_metric"] = json!(d.detailed_metric);
        out["quota_mode"] = json!(d.quota_mode);
        if let Some(metadata) = &d.metadata {
            out["metadata"] = structure(metadata);
        }
        out
    }
    // Flow YAML (JSON) under the two top-level keys, which mark the text as an Envoy file:
    // the file parser reads it, with its errors and their places.
    let descriptors: Vec<_> = config.descriptors.iter().map(descriptor).collect();
    let descriptors = serde_json::to_string_pretty(&descriptors)
        .unwrap_or_default()
        .replace('\n', "\n  ");
    format!(
        "domain: {}\ndescriptors: {descriptors}\n",
        serde_json::Value::from(config.domain.as_str())
    )
}

fn structure(s: &Struct) -> serde_json::Value {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

/// The domains of a response, or why they cannot be read.
fn texts(response: &DiscoveryResponse) -> Result<Texts, String> {
    response
        .resources
        .iter()
        .map(|resource| {
            if resource.type_url != TYPE_URL {
                return Err(format!(
                    "a resource of type {}, not {TYPE_URL}",
                    resource.type_url
                ));
            }
            let config = RateLimitConfig::decode(resource.value.as_slice())
                .map_err(|e| format!("a resource that is not a RateLimitConfig: {e}"))?;
            let name = if config.name.is_empty() {
                &config.domain
            } else {
                &config.name
            };
            Ok((PathBuf::from(format!("xds:{name}")), file_text(&config)))
        })
        .collect()
}

/// The node the client presents: its id and metadata.
fn node(settings: &XdsSettings) -> Node {
    let fields = settings
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct { fields }),
        ..Node::default()
    }
}

/// Where the client stands: the version it ACKed last and the nonce of the last response,
/// both sent on every request (and on resubscribing), as go-control-plane's client does.
#[derive(Debug, Default)]
struct Standing {
    version: String,
    nonce: String,
}

impl Standing {
    fn request(&self, node: &Node, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.version.clone(),
            node: Some(node.clone()),
            type_url: TYPE_URL.to_string(),
            response_nonce: self.nonce.clone(),
            error_detail: error.map(|message| envoy_types::pb::google::rpc::Status {
                code: tonic::Code::InvalidArgument as i32,
                message,
                ..Default::default()
            }),
            ..DiscoveryRequest::default()
        }
    }
}

async fn run(settings: XdsSettings, pushes: mpsc::Sender<Push>) {
    let node = node(&settings);
    let mut standing = Standing::default();
    let mut attempt = 0;
    loop {
        let channel = connect(&settings).await;
        crate::metrics::xds_connected(true);
        let outcome = subscribe(&settings, channel, &node, &mut standing, &pushes).await;
        crate::metrics::xds_connected(false);
        match outcome {
            Ended::Stopped => return,
            Ended::Broken { answered, why } => {
                if answered {
                    attempt = 0;
                }
                let wait = backoff(&settings.backoff, attempt, fastrand::f64());
                attempt += 1;
                tracing::warn!(
                    error = %why,
                    retry_in = ?wait,
                    version = %standing.version,
                    "the xDS subscription broke: the last configuration it gave keeps serving"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// How a subscription ended.
enum Ended {
    /// The service no longer takes pushes.
    Stopped,
    /// The stream failed or the server ended it; whether it had answered at least once.
    Broken { answered: bool, why: String },
}

/// A channel to the management server, trying every `connect_retry` (± half of it) until
/// one opens.
async fn connect(settings: &XdsSettings) -> Channel {
    loop {
        match endpoint(settings) {
            Ok(endpoint) => match endpoint.connect().await {
                Ok(channel) => {
                    tracing::info!(server = %settings.url, "connected to the xDS management server");
                    return channel;
                }
                Err(e) => tracing::warn!(
                    server = %settings.url,
                    error = %format!("{:#}", anyhow::Error::new(e)),
                    "cannot connect to the xDS management server"
                ),
            },
            Err(e) => {
                tracing::error!(server = %settings.url, error = %e, "the xDS server's settings")
            }
        }
        let jitter = 0.5 + fastrand::f64();
        tokio::time::sleep(settings.connect_retry.mul_f64(jitter)).await;
    }
}

/// The endpoint of the settings' URL (`http://` added to a bare `host:port`, `https://` with
/// TLS), with its TLS.
fn endpoint(settings: &XdsSettings) -> Result<Endpoint, String> {
    let url = if settings.url.contains("://") {
        settings.url.clone()
    } else if settings.tls.is_some() {
        format!("https://{}", settings.url)
    } else {
        format!("http://{}", settings.url)
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL `{url}`: {e}"))?
        .connect_timeout(Duration::from_secs(10));
    if let Some(tls) = &settings.tls {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca)?)),
            None => config.with_webpki_roots(),
        };
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(san) = &tls.san {
            config = config.domain_name(san.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| format!("TLS to the xDS server: {e}"))?;
    }
    Ok(endpoint)
}

/// One subscription on `channel`, until it breaks or the service stops taking pushes.
async fn subscribe(
    settings: &XdsSettings,
    channel: Channel,
    node: &Node,
    standing: &mut Standing,
    pushes: &mpsc::Sender<Push>,
) -> Ended {
    let broken = |answered, why: String| Ended::Broken { answered, why };
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if let Some(max) = settings.max_message {
        client = client.max_decoding_message_size(max);
    }
    let (requests, outgoing) = mpsc::channel(4);
    // The first request: the version held, if any, so that a server that has nothing newer
    // need not send it again.
    let _ = requests.send(standing.request(node, None)).await;
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
    for (name, value) in &settings.headers {
        let key = tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes());
        match (key, value.parse()) {
            (Ok(key), Ok(value)) => {
                request.metadata_mut().insert(key, value);
            }
            _ => tracing::warn!(header = %name, "an xDS header that cannot be sent is left out"),
        }
    }
    let mut responses = match client.stream_aggregated_resources(request).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return broken(false, status.to_string()),
    };
    let mut answered = false;
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return broken(answered, "the server ended the stream".into()),
            Err(status) => return broken(answered, status.to_string()),
        };
        answered = true;
        standing.nonce = response.nonce.clone();
        let outcome = match texts(&response) {
            Err(why) => Err(why),
            Ok(texts) => {
                let (answer, outcome) = oneshot::channel();
                if pushes.send(Push { texts, answer }).await.is_err() {
                    return Ended::Stopped;
                }
                outcome
                    .await
                    .unwrap_or_else(|_| Err("the service stopped".into()))
            }
        };
        let request = match outcome {
            Ok(()) => {
                standing.version = response.version_info.clone();
                tracing::info!(version = %standing.version, domains = response.resources.len(), "xDS configuration applied");
                crate::metrics::xds_push("applied");
                standing.request(node, None)
            }
            Err(why) => {
                tracing::error!(
                    version = %response.version_info,
                    error = %why,
                    "xDS configuration rejected (NACK): the limits in use keep serving"
                );
                crate::metrics::xds_push("rejected");
                standing.request(node, Some(why))
            }
        };
        if requests.send(request).await.is_err() {
            return broken(answered, "the request stream closed".into());
        }
    }
}

/// The wait before subscribing again after `attempt` attempts, as jpillora's backoff (which
/// the Envoy ratelimit service uses) computes it, `draw` being uniform in `[0, 1)`.
fn backoff(b: &XdsBackoff, attempt: i32, draw: f64) -> Duration {
    let (min, max) = (b.initial, b.max);
    if min >= max {
        return max;
    }
    let min_f = min.as_secs_f64();
    let mut grown = min_f * b.factor.powi(attempt);
    if b.jitter {
        grown = draw * (grown - min_f) + min_f;
    }
    if !grown.is_finite() || grown >= max.as_secs_f64() {
        return max;
    }
    Duration::from_secs_f64(grown.max(min_f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff_of(factor: f64, jitter: bool) -> XdsBackoff {
        XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor,
            jitter,
        }
    }

    #[test]
    fn the_default_factor_keeps_every_wait_at_the_initial_interval() {
        let b = backoff_of(0.5, true);
        for attempt in 0..20 {
            for draw in [0.0, 0.5, 0.999] {
                assert_eq!(backoff(&b, attempt, draw), Duration::from_secs(10));
            }
        }
    }

    #[test]
    fn a_factor_above_one_grows_to_the_max() {
        let b = backoff_of(2.0, false);
        let waits: Vec<u64> = (0..5).map(|a| backoff(&b, a, 0.0).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 60, 60]);
        // With jitter, between the initial interval and the grown one.
        let j = backoff_of(2.0, true);
        assert_eq!(backoff(&j, 2, 0.5), Duration::from_secs(25));
    }

    #[test]
    fn a_resource_reads_as_the_envoy_file_it_stands_for() {
        use proto::{RateLimitPolicy, RateLimitReplace};
        let config = RateLimitConfig {
            name: "foo".into(),
            domain: "foo".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k1".into(),
                value: "v1".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit: 3,
                    name: "one".into(),
                    replaces: vec![RateLimitReplace { name: "two".into() }],
                    ..RateLimitPolicy::default()
                }),
                descriptors: vec![RateLimitDescriptor {
                    key: "k2".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..RateLimitPolicy::default()
                    }),
                    shadow_mode: true,
                    ..RateLimitDescriptor::default()
                }],
                ..RateLimitDescriptor::default()
            }],
        };
        let text: serde_json::Value = serde_saphyr::from_str(&file_text(&config)).unwrap();
        assert_eq!(text["domain"], "foo");
        let d = &text["descriptors"][0];
        assert_eq!((&d["key"], &d["value"]), (&json!("k1"), &json!("v1")));
        assert_eq!(d["rate_limit"]["unit"], "MINUTE");
        assert_eq!(d["rate_limit"]["name"], "one");
        assert_eq!(d["rate_limit"]["replaces"][0]["name"], "two");
        let inner = &d["descriptors"][0];
        assert!(inner.get("value").is_none(), "an empty value is no value");
        assert_eq!(inner["rate_limit"]["unit"], "UNKNOWN");
        assert_eq!(inner["shadow_mode"], true);
    }
}
