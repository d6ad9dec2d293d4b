//! What the process tells about itself besides metrics: log lines on stderr (`RUST_LOG`, else
//! the Envoy service's `LOG_LEVEL`; `LOG_FORMAT=json` for JSON lines), and, when
//! `server.tracing` (or `TRACING_ENABLED`) asks, OpenTelemetry traces over OTLP, as
//! envoyproxy/ratelimit exports them: a span per check, a child of the caller's (W3C
//! `traceparent`, or B3 in one header or several), with the rule, the store and what decided,
//! and a child span per Redis call (target `tollgate::redis`, from the library).
//!
//! Off, traces cost one relaxed load per check ([`on`]): no span is made, and the library's
//! Redis spans are disabled at their call sites, as no subscriber layer wants them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use opentelemetry::propagation::text_map_propagator::FieldIter;
use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{TracingProtocol, TracingSettings};
use crate::envoy::settings;

/// Whether spans are exported.
static ON: AtomicBool = AtomicBool::new(false);

/// The sampling rate of traces started here (an `f64`'s bits).
static RATE: AtomicU64 = AtomicU64::new(0);

/// Whether spans are exported: the one thing a check pays for when they are not.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The exporter, kept to flush what it holds when the process ends.
#[derive(Debug)]
pub struct Traces(SdkTracerProvider);

impl Traces {
    /// Sends the spans not yet sent, and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!(error = %e, "the last spans were not all sent");
        }
    }
}

/// Installs logging, and traces when `traces` asks for them; the exporter to flush at exit.
/// Called once, within the Tokio runtime (spans are exported from its tasks). An exporter
/// that cannot be made is logged, and the service runs without traces.
pub fn init(traces: Option<&TracingSettings>) -> Option<Traces> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| settings::log_level().into());
    // LOG_FORMAT=json (the Envoy service's setting): one JSON object a line. A bad value is
    // refused when `serve` reads the settings; until then, text.
    let json = settings::log_json().unwrap_or(false);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let provider = match traces.map(provider) {
        Some(Ok(provider)) => provider,
        Some(Err(e)) => {
            eprintln!("error: traces are off: {e:#}");
            logs_only(filter, json, ansi);
            return None;
        }
        None => {
            logs_only(filter, json, ansi);
            return None;
        }
    };
    // With traces, each layer has its filter: the log lines the level's, the exporter only
    // the spans made for traces (the checks' and the Redis calls').
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed()
    };
    let wanted = Targets::new()
        .with_target("tollgate::traces", LevelFilter::TRACE)
        .with_target("tollgate::redis", LevelFilter::TRACE);
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("tollgate"))
        .with_filter(wanted)
        .boxed();
    tracing_subscriber::registry()
        .with(vec![logs, spans])
        .init();
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(B3::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    if let Some(t) = traces {
        RATE.store(t.sampling_rate.to_bits(), Ordering::Relaxed);
        tracing::info!(
            service = %t.service_name,
            protocol = ?t.protocol,
            sampling_rate = t.sampling_rate,
            "exporting traces over OTLP"
        );
    }
    ON.store(true, Ordering::Relaxed);
    Some(Traces(provider))
}

/// Log lines alone, their level one filter for the whole subscriber, as before traces existed:
/// callsites below it are off for good, with no per-layer filter to ask.
fn logs_only(filter: tracing_subscriber::EnvFilter, json: bool, ansi: bool) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(ansi).init();
    }
}

/// The provider exporting as `settings` say, in batches from the runtime's tasks.
fn provider(settings: &TracingSettings) -> anyhow::Result<SdkTracerProvider> {
    let exporter = match settings.protocol {
        TracingProtocol::Http => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
        TracingProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
    };
    let instance = if settings.service_instance_id.is_empty() {
        random_uuid()
    } else {
        settings.service_instance_id.clone()
    };
    let mut resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.instance.id", instance));
    if !settings.service_namespace.is_empty() {
        resource = resource.with_attribute(KeyValue::new(
            "service.namespace",
            settings.service_namespace.clone(),
        ));
    }
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    // As there: a caller's decision stands; traces started here are kept at the rate.
    let sampler =
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling_rate)));
    Ok(SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_resource(resource.build())
        .with_span_processor(processor)
        .build())
}

/// A version 4 UUID, for `service.instance.id`.
fn random_uuid() -> String {
    let mut bytes: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Zipkin's B3 propagation, as envoyproxy/ratelimit reads it (Go's `b3.New()`): the `b3`
/// header (`trace-span[-sampled[-parent]]`), else `X-B3-TraceId`, `X-B3-SpanId`,
/// `X-B3-Sampled` and `X-B3-Flags` (debug, which means sampled). A trace id of 16 hex digits
/// is padded to 32. With no sampling state (deferred), the trace is continued unsampled, so
/// that the sampling rate here does not override a caller that did not decide. Answers inject
/// nothing (the service calls no one), so injection writes the single header only.
#[derive(Debug)]
struct B3 {
    fields: [String; 5],
}

impl B3 {
    fn new() -> Self {
        Self {
            fields: [
                "b3",
                "x-b3-traceid",
                "x-b3-spanid",
                "x-b3-sampled",
                "x-b3-flags",
            ]
            .map(String::from),
        }
    }

    fn context(trace: &str, span: &str, sampled: Option<&str>, debug: bool) -> Option<SpanContext> {
        let trace = match trace.len() {
            16 => format!("{trace:0>32}"),
            32 => trace.to_string(),
            _ => return None,
        };
        if span.len() != 16 {
            return None;
        }
        let flags = match (debug, sampled) {
            (true, _) | (false, Some("1" | "d" | "true")) => TraceFlags::SAMPLED,
            (false, Some("0" | "false") | None) => TraceFlags::default(),
            (false, Some(_)) => return None,
        };
        let context = SpanContext::new(
            TraceId::from_hex(&trace).ok()?,
            SpanId::from_hex(span).ok()?,
            flags,
            true,
            TraceState::default(),
        );
        context.is_valid().then_some(context)
    }

    fn read(extractor: &dyn Extractor) -> Option<SpanContext> {
        if let Some(single) = extractor.get("b3") {
            let parts: Vec<&str> = single.trim().split('-').collect();
            if (2..=4).contains(&parts.len()) {
                return Self::context(parts[0], parts[1], parts.get(2).copied(), false);
            }
        }
        Self::context(
            extractor.get("x-b3-traceid")?.trim(),
            extractor.get("x-b3-spanid")?.trim(),
            extractor.get("x-b3-sampled").map(str::trim),
            extractor.get("x-b3-flags").map(str::trim) == Some("1"),
        )
    }
}

impl TextMapPropagator for B3 {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if context.is_valid() {
            let sampled = if context.is_sampled() { "1" } else { "0" };
            injector.set(
                "b3",
                format!("{}-{}-{sampled}", context.trace_id(), context.span_id()),
            );
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        match Self::read(extractor) {
            Some(context) => cx.with_remote_span_context(context),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        FieldIter::new(&self.fields)
    }
}

/// Request headers as the propagators read them.
struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// A span for one check named `name` (`ShouldRateLimit`, `POST /v1/check`), a child of the
/// trace the caller's `headers` carry; [`tracing::Span::none`] when traces are off or the
/// check is not sampled. Its fields are filled by [`record`].
pub fn check_span(
    name: &'static str,
    headers: &axum::http::HeaderMap,
    store: &'static str,
) -> tracing::Span {
    if !on() {
        return tracing::Span::none();
    }
    // Only a request carrying a trace is read by the propagators (a lock and three readers).
    let carries = ["traceparent", "b3", "x-b3-traceid"]
        .iter()
        .any(|name| headers.contains_key(*name));
    let parent: Context = if carries {
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)))
    } else {
        Context::new()
    };
    // Sampled here, before a span is made: the caller's decision when it sent one, else
    // the rate (parent-based, as envoyproxy/ratelimit samples).
    let caller = parent.span().span_context().clone();
    let kept = if caller.is_valid() {
        caller.is_sampled()
    } else {
        fastrand::f64() < f64::from_bits(RATE.load(Ordering::Relaxed))
    };
    if !kept {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: "tollgate::traces",
        "check",
        otel.name = name,
        otel.kind = "server",
        tollgate.rule = tracing::field::Empty,
        tollgate.domain = tracing::field::Empty,
        tollgate.store = store,
        tollgate.decided_by = tracing::field::Empty,
        tollgate.allowed = tracing::field::Empty,
    );
    let _ = tracing_opentelemetry::OpenTelemetrySpanExt::set_parent(&span, parent);
    span
}

/// Fills the current span, when it is a check's (of [`check_span`]), with what the check
/// found: the rules, what decided (the store by its kind, `redis` or `memory`..., a failure
/// `policy`, the local `cache` of denials, or a `list`) and whether it was allowed. Nothing
/// when traces are off.
pub fn record(decisions: &[tollgate::Decision]) {
    if !on() {
        return;
    }
    let span = tracing::Span::current();
    if span
        .metadata()
        .is_none_or(|m| m.target() != "tollgate::traces")
    {
        return;
    }
    let mut rules: Vec<&str> = decisions.iter().map(|d| d.rule()).collect();
    rules.sort_unstable();
    rules.dedup();
    let mut decided: Vec<&'static str> = decisions.iter().map(|d| source(d.source())).collect();
    decided.sort_unstable();
    decided.dedup();
    span.record("tollgate.rule", rules.join(",").as_str());
    span.record("tollgate.decided_by", decided.join(",").as_str());
    span.record("tollgate.allowed", decisions.iter().all(|d| d.allowed()));
}

/// Fills `span` (of [`check_span`]) with the Envoy domain asked about.
pub fn record_domain(span: &tracing::Span, domain: &str) {
    if !span.is_none() {
        span.record("tollgate.domain", domain);
    }
}

/// What decided, as a trace names it.
fn source(source: tollgate::Source) -> &'static str {
    use tollgate::Source;
    match source {
        Source::Memory => "memory",
        Source::Redis => "redis",
        Source::RedisModule => "redis_module",
        Source::Hybrid => "hybrid",
        Source::Lease => "lease",
        Source::Global => "global",
        Source::Partitioned => "partitioned",
        Source::FailOpen | Source::FailClosed | Source::Fallback => "policy",
        Source::Cache => "cache",
        Source::Listed => "list",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(headers: &[(&str, &str)]) -> Option<SpanContext> {
        let map: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cx = B3::new().extract(&map);
        let context = cx.span().span_context().clone();
        context.is_valid().then_some(context)
    }

    #[test]
    fn b3_in_one_header_or_several() {
        let single =
            read(&[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1")]).unwrap();
        assert_eq!(
            single.trace_id().to_string(),
            "80f198ee56343ba864fe8b2a57d3eff7"
        );
        assert_eq!(single.span_id().to_string(), "e457b5a2e4d86bd1");
        assert!(single.is_sampled() && single.is_remote());
        let multi = read(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "0"),
        ])
        .unwrap();
        assert_eq!(
            multi.trace_id().to_string(),
            "000000000000000064fe8b2a57d3eff7"
        );
        assert!(!multi.is_sampled());
        let debug = read(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-flags", "1"),
        ])
        .unwrap();
        assert!(debug.is_sampled());
        // Deferred: continued, not sampled.
        let deferred = read(&[("b3", "64fe8b2a57d3eff7-e457b5a2e4d86bd1")]).unwrap();
        assert!(!deferred.is_sampled());
        for bad in [
            vec![("b3", "0")],
            vec![("b3", "xyz-e457b5a2e4d86bd1-1")],
            vec![("b3", "64fe8b2a57d3eff7-e457b5a2e4d86bd1-maybe")],
            vec![("x-b3-traceid", "64fe8b2a57d3eff7")],
            vec![
                ("x-b3-traceid", "00000000000000000000000000000000"),
                ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ],
        ] {
            assert!(read(&bad).is_none(), "{bad:?}");
        }
    }
}
