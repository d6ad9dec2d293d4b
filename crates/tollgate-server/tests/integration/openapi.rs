//! The OpenAPI document (`GET /v1/openapi.json`) holds: every route the server answers is in
//! it, every operation in it is answered with a status it documents, and each operation's
//! examples, sent to a server, get answers that validate against the schemas it documents.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tollgate_server::envoy::Envoy;
use tollgate_server::http::{AppState, Connection};
use tollgate_server::provider;
use tollgate_server::service::Service;
use tower::ServiceExt;

use crate::reference;

const RULES: &str = r#"
rules:
  - id: get-product
    match: { methods: [GET], path: "/v1/organizations/{org}/product/*" }
    key: [segment:org]
    tiers: [{ limit: 1000, period: 10s }]
  - id: tokens
    match: { path: "/v1/chat/**" }
    key: [header:x-tenant]
    tiers: [{ limit: 1000, period: 1h }]
    caller_limit: true
"#;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
"#;

/// The HTTP API of a service with the console on, and the directory of its rule files.
async fn server() -> (Connection, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = [("rules.yaml", RULES), ("envoy.yaml", ENVOY)]
        .into_iter()
        .map(|(name, text)| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    let config = provider::load(&files).unwrap();
    let service = Arc::new(Service::start(files, config).await.unwrap());
    service.enable_console(1 << 20, true);
    let state = AppState {
        envoy: Arc::new(Envoy::new(service.clone())),
        service,
        metrics: None,
        admin_token: Some("token".into()),
        max_body_bytes: 64 * 1024,
        connections: None,
    };
    let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    (Connection::new(state, peer), dir)
}

/// Sends `request`; the status, content type and body.
async fn send(http: &Connection, request: Request<Body>) -> (StatusCode, String, Vec<u8>) {
    let response = http.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let kind = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, kind, body.to_vec())
}

async fn document(http: &Connection) -> Value {
    let request = Request::get("/v1/openapi.json")
        .body(Body::empty())
        .unwrap();
    let (status, kind, body) = send(http, request).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::OK, "application/json")
    );
    serde_json::from_slice(&body).unwrap()
}

/// `schema` checked in the context of `document`'s components.
fn validate(document: &Value, schema: &Value, instance: &Value) -> Result<(), String> {
    let mut root = match schema {
        Value::Object(map) => map.clone(),
        other => panic!("not a schema: {other}"),
    };
    root.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    root.insert("components".into(), document["components"].clone());
    let validator = jsonschema::validator_for(&Value::Object(root)).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// An operation: its method, its path and what the document says of it.
type Operation = (String, String, Value);

/// Every operation: (method, path, operation), PUT before DELETE so that what one creates the
/// other deletes.
fn operations(document: &Value) -> Vec<Operation> {
    let mut out = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            out.push((method.clone(), path.clone(), operation.clone()));
        }
    }
    let order = |m: &str| {
        ["get", "post", "put", "delete"]
            .iter()
            .position(|x| *x == m)
            .unwrap_or(9)
    };
    out.sort_by_key(|(m, p, _)| (order(m), p.clone()));
    out
}

/// `path` with each parameter replaced by its example.
fn filled(path: &str, operation: &Value) -> String {
    let mut path = path.to_string();
    for param in operation["parameters"].as_array().into_iter().flatten() {
        if param["in"] == "path" {
            let name = param["name"].as_str().unwrap();
            let example = param["example"]
                .as_str()
                .unwrap_or_else(|| panic!("{path}: parameter {name} has no example"));
            path = path.replace(&format!("{{{name}}}"), example);
        }
    }
    path
}

/// Each request body example of `operation`: (content type, example).
fn request_examples(operation: &Value) -> Vec<(String, Value, Value)> {
    let mut out = Vec::new();
    if let Some(content) = operation["requestBody"]["content"].as_object() {
        for (kind, media) in content {
            if let Some(example) = media.get("example") {
                out.push((kind.clone(), example.clone(), media["schema"].clone()));
            }
            for (_, example) in media["examples"].as_object().into_iter().flatten() {
                out.push((
                    kind.clone(),
                    example["value"].clone(),
                    media["schema"].clone(),
                ));
            }
        }
    }
    out
}

fn request(
    method: &str,
    path: &str,
    operation: &Value,
    body: Option<(&str, &Value)>,
) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method.to_uppercase().as_str())
        .uri(path);
    if operation.get("security").is_some() {
        builder = builder.header(header::AUTHORIZATION, "Bearer token");
    }
    for param in operation["parameters"].as_array().into_iter().flatten() {
        if param["in"] == "header"
            && let Some(example) = param["example"].as_str()
        {
            builder = builder.header(param["name"].as_str().unwrap(), example);
        }
    }
    match body {
        None => builder.body(Body::empty()).unwrap(),
        Some((kind, Value::String(text))) => builder
            .header(header::CONTENT_TYPE, kind)
            .body(Body::from(text.clone()))
            .unwrap(),
        Some((kind, json)) => builder
            .header(header::CONTENT_TYPE, kind)
            .body(Body::from(json.to_string()))
            .unwrap(),
    }
}

/// Checks an answer against what `operation` documents for its status.
fn check_answer(
    document: &Value,
    what: &str,
    operation: &Value,
    (status, kind, body): &(StatusCode, String, Vec<u8>),
) {
    let documented = &operation["responses"][status.as_str()];
    assert!(
        documented.is_object(),
        "{what}: answered {status}, which it does not document ({})",
        String::from_utf8_lossy(body)
    );
    let Some(content) = documented["content"].as_object() else {
        assert!(
            body.is_empty(),
            "{what}: {status} documents no body, and one came: {}",
            String::from_utf8_lossy(body)
        );
        return;
    };
    let essence = kind.split(';').next().unwrap_or_default().trim();
    let media = content
        .iter()
        .find(|(k, _)| k.split(';').next().unwrap_or_default().trim() == essence)
        .map(|(_, m)| m)
        .unwrap_or_else(|| {
            panic!(
                "{what}: {status} answered `{kind}`, documented {:?}",
                content.keys().collect::<Vec<_>>()
            )
        });
    if essence == "application/json" {
        let answer: Value =
            serde_json::from_slice(body).unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
        validate(document, &media["schema"], &answer).unwrap_or_else(|e| {
            panic!("{what}: {status} answer {answer} is not what it documents: {e}")
        });
    }
}

#[tokio::test]
async fn every_example_sent_gets_an_answer_the_document_describes() {
    let (http, _dir) = server().await;
    let document = document(&http).await;
    let mut sent = 0;
    for (method, path, operation) in operations(&document) {
        let uri = filled(&path, &operation);
        let examples = request_examples(&operation);
        if examples.is_empty() {
            let what = format!("{method} {uri}");
            let answer = send(&http, request(&method, &uri, &operation, None)).await;
            check_answer(&document, &what, &operation, &answer);
            sent += 1;
        }
        for (kind, example, schema) in examples {
            let what = format!("{method} {uri} with {example}");
            if kind == "application/json" {
                validate(&document, &schema, &example).unwrap_or_else(|e| {
                    panic!("{what}: the example is not what the request schema says: {e}")
                });
            }
            let answer = send(
                &http,
                request(&method, &uri, &operation, Some((&kind, &example))),
            )
            .await;
            check_answer(&document, &what, &operation, &answer);
            sent += 1;
        }
    }
    assert!(sent >= 25, "only {sent} requests sent");
}

/// Both of a check's 403 answers are what the document says: a stated limit no rule takes
/// (what is wrong), and a key on a deny list whose entry answers 403 (a check's answer).
#[tokio::test]
async fn a_checks_403_answers_are_what_the_document_says() {
    let (http, _dir) = server().await;
    let document = document(&http).await;
    let operation = &document["paths"]["/v1/check"]["post"];
    let check = |org: &str, limit: Option<u64>| {
        let path = format!("/v1/organizations/{org}/product/7");
        let mut body = json!({"request": {"method": "GET", "path": path}});
        if let Some(limit) = limit {
            body["limit"] = json!({"limit": limit, "period": "1m"});
        }
        Request::post("/v1/check")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let refused = send(&http, check("acme", Some(5))).await;
    assert_eq!(
        refused.0,
        StatusCode::FORBIDDEN,
        "{}",
        String::from_utf8_lossy(&refused.2)
    );
    check_answer(&document, "a stated limit", operation, &refused);
    let entry = Request::put("/v1/lists/deny/get-product/banned")
        .header(header::AUTHORIZATION, "Bearer token")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"status": 403}).to_string()))
        .unwrap();
    let (status, _, body) = send(&http, entry).await;
    assert!(
        status.is_success(),
        "{status}: {}",
        String::from_utf8_lossy(&body)
    );
    let denied = send(&http, check("banned", None)).await;
    assert_eq!(
        denied.0,
        StatusCode::FORBIDDEN,
        "{}",
        String::from_utf8_lossy(&denied.2)
    );
    let answer: Value = serde_json::from_slice(&denied.2).unwrap();
    assert_eq!(answer["decisions"][0]["source"], "list", "{answer}");
    check_answer(&document, "a deny entry's 403", operation, &denied);
}

#[tokio::test]
async fn every_answer_example_is_what_its_schema_says() {
    let (http, _dir) = server().await;
    let document = document(&http).await;
    let mut checked = 0;
    for (method, path, operation) in operations(&document) {
        for (status, response) in operation["responses"].as_object().unwrap() {
            for (kind, media) in response["content"].as_object().into_iter().flatten() {
                if kind != "application/json" {
                    continue;
                }
                if let Some(example) = media.get("example") {
                    validate(&document, &media["schema"], example)
                        .unwrap_or_else(|e| panic!("{method} {path} {status}: {e}"));
                    checked += 1;
                }
            }
        }
    }
    for (name, schema) in document["components"]["schemas"].as_object().unwrap() {
        if let Some(example) = schema.get("example") {
            validate(&document, schema, example).unwrap_or_else(|e| panic!("schema {name}: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} examples checked");
}

/// Every string literal that is a path (`"/v1/..."`) in the HTTP part's source.
fn paths_in_source() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // Where a path is served: documented (`path = "..."`) or compared with (`const`).
        let served = |l: &&str| l.contains("path = \"") || l.trim_start().starts_with("const ");
        for line in text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(served)
        {
            for literal in line.split('"').skip(1).step_by(2) {
                let route = literal.starts_with("/v1/")
                    || literal.starts_with("/console")
                    || ["/healthz", "/readyz", "/healthcheck", "/json", "/metrics"]
                        .contains(&literal);
                if route && !literal.contains(' ') && !literal.contains('*') {
                    out.insert(literal.to_string());
                }
            }
        }
        assert!(
            !text.contains(".route(")
                && !text.contains(".route_service(")
                && !text.contains(".nest("),
            "{}: a route added with axum's own methods is not documented; use OpenApiRouter::routes(routes!(...))",
            path.display()
        );
    }
    out
}

#[tokio::test]
async fn every_route_the_server_answers_is_in_the_document() {
    let (http, _dir) = server().await;
    let document = document(&http).await;
    let documented: BTreeSet<String> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let named = paths_in_source();
    let missing: Vec<_> = named.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "paths served but not in the document: {missing:?}"
    );
    // And the document names nothing the server does not answer.
    for (method, path, operation) in operations(&document) {
        let uri = filled(&path, &operation);
        let (status, _, _) = send(&http, request(&method, &uri, &operation, None)).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        let fallback = status == StatusCode::NOT_FOUND && operation["responses"]["404"].is_null();
        assert!(!fallback, "{method} {uri}: 404, which it does not document");
    }
}

/// A schema's type, as a reader says it.
fn kind(document: &Value, schema: &Value) -> String {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        let target = &document["components"]["schemas"][name];
        if let Some(choices) = target["enum"].as_array() {
            let words: Vec<String> = choices
                .iter()
                .filter_map(Value::as_str)
                .map(|w| format!("`{w}`"))
                .collect();
            return format!("one of {}", words.join(", "));
        }
        return format!("[{name}](#{})", name.to_lowercase());
    }
    if let Some(choices) = schema["oneOf"].as_array().or(schema["anyOf"].as_array()) {
        let kinds: Vec<String> = choices
            .iter()
            .filter(|c| c["type"] != "null")
            .map(|c| kind(document, c))
            .collect();
        return kinds.join(" or ");
    }
    if let Some(choices) = schema["enum"].as_array() {
        let words: Vec<String> = choices
            .iter()
            .filter_map(Value::as_str)
            .map(|w| format!("`{w}`"))
            .collect();
        return format!("one of {}", words.join(", "));
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    match types.as_slice() {
        ["array"] => format!("list of {}", kind(document, &schema["items"])),
        ["object"] => "object".into(),
        ["integer"] => "whole number".into(),
        ["boolean"] => "true or false".into(),
        ["string"] => "text".into(),
        [] => "any".into(),
        other => other.join(" or "),
    }
}

/// The API as a page: each operation with what it takes and answers, then each schema's
/// fields.
fn render(document: &Value) -> String {
    let mut out = String::new();
    let mut by_tag: Vec<(String, Vec<Operation>)> = Vec::new();
    for tag in document["tags"].as_array().unwrap() {
        let name = tag["name"].as_str().unwrap().to_string();
        by_tag.push((name, Vec::new()));
    }
    let order = |m: &str| {
        ["get", "post", "put", "delete"]
            .iter()
            .position(|x| *x == m)
            .unwrap_or(9)
    };
    let mut all = operations(document);
    all.sort_by_key(|(m, p, _)| (p.clone(), order(m)));
    for (method, path, operation) in all {
        let tag = operation["tags"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some((_, list)) = by_tag.iter_mut().find(|(t, _)| *t == tag) {
            list.push((method, path, operation));
        }
    }
    for tag in document["tags"].as_array().unwrap() {
        let name = tag["name"].as_str().unwrap();
        let list = &by_tag.iter().find(|(t, _)| t == name).unwrap().1;
        out.push_str(&format!(
            "## {name}\n\n{}\n\n",
            tag["description"].as_str().unwrap_or_default()
        ));
        for (method, path, operation) in list {
            out.push_str(&format!("### `{} {path}`\n\n", method.to_uppercase()));
            for part in ["summary", "description"] {
                if let Some(text) = operation[part].as_str() {
                    out.push_str(&format!("{}\n\n", text.trim()));
                }
            }
            if operation.get("security").is_some() {
                out.push_str("Needs `Authorization: Bearer <admin token>`.\n\n");
            }
            for param in operation["parameters"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "- {} `{}`: {}\n",
                    param["in"].as_str().unwrap_or_default(),
                    param["name"].as_str().unwrap_or_default(),
                    reference::cell(param["description"].as_str().unwrap_or_default())
                ));
            }
            if operation["parameters"].is_array() {
                out.push('\n');
            }
            for (kind_name, example, schema) in request_examples(operation) {
                out.push_str(&format!(
                    "Request ({kind_name}, {}):\n\n",
                    kind(document, &schema)
                ));
                match example {
                    Value::String(text) => {
                        out.push_str(&format!("```yaml\n{}\n```\n\n", text.trim_end()))
                    }
                    json => out.push_str(&format!(
                        "```json\n{}\n```\n\n",
                        serde_json::to_string_pretty(&json).unwrap()
                    )),
                }
            }
            out.push_str("| status | answer | body |\n| --- | --- | --- |\n");
            for (status, response) in operation["responses"].as_object().unwrap() {
                let body = response["content"]
                    .as_object()
                    .map(|c| {
                        c.iter()
                            .map(|(k, m)| format!("{k}: {}", kind(document, &m["schema"])))
                            .collect::<Vec<_>>()
                            .join("; ")
                    })
                    .unwrap_or_default();
                out.push_str(&format!(
                    "| {status} | {} | {} |\n",
                    reference::cell(response["description"].as_str().unwrap_or_default()),
                    reference::cell(&body)
                ));
            }
            out.push('\n');
            for (status, response) in operation["responses"].as_object().unwrap() {
                let example = response["content"]["application/json"]["example"].clone();
                if !example.is_null() {
                    out.push_str(&format!(
                        "Answer {status}:\n\n```json\n{}\n```\n\n",
                        serde_json::to_string_pretty(&example).unwrap()
                    ));
                }
            }
        }
    }
    out.push_str("## Schemas\n\n");
    for (name, schema) in document["components"]["schemas"].as_object().unwrap() {
        out.push_str(&format!(
            "### {name}\n\n{}\n\n",
            reference::cell(schema["description"].as_str().unwrap_or_default())
        ));
        if let Some(properties) = schema["properties"].as_object() {
            let required: BTreeSet<&str> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push_str("| field | type | meaning |\n| --- | --- | --- |\n");
            for (field, property) in properties {
                let optional = if required.contains(field.as_str()) {
                    ""
                } else {
                    " (optional)"
                };
                out.push_str(&format!(
                    "| `{field}`{optional} | {} | {} |\n",
                    reference::cell(&kind(document, property)),
                    reference::cell(property["description"].as_str().unwrap_or_default())
                ));
            }
            out.push('\n');
        } else if schema.get("enum").is_some() || schema.get("oneOf").is_some() {
            out.push_str(&format!("{}\n\n", kind(document, schema)));
        }
    }
    out
}

#[tokio::test]
async fn the_page_is_the_document() {
    let (http, _dir) = server().await;
    let document = document(&http).await;
    reference::check_block("http-api.md", "api", &render(&document));
}
