//! An LLM proxy that keeps each tenant to a token budget through tollgate, and a stand-in
//! model to put behind it.
//!
//! An answer's tokens are known only once it is done, and many requests of one tenant may be
//! in flight at once, so the proxy does not check a cost of 0 and report after (every request
//! in flight would pass before any reported): for each request it
//!
//! 1. reserves an estimate with tollgate (`POST /v1/reservations`: the prompt's tokens, about
//!    four characters each, and the answer's `max_tokens`), and answers 429 with `Retry-After`
//!    when the tenant's budget cannot take it;
//! 2. forwards the request to the model;
//! 3. commits the answer's `usage.total_tokens` (`POST /v1/reservations/{id}/commit`): less
//!    than the estimate gives the difference back, more takes the excess and leaves the tenant
//!    in debt until its budget refills. A model that fails cancels the reservation
//!    (`DELETE /v1/reservations/{id}`).
//!
//! A tollgate it cannot reach is an error (503), never a request let through uncounted. A
//! reservation the proxy never settles (it crashed mid-request) is consumed at its estimate
//! when it expires, as the rules file says.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// The path the proxy serves and the model answers on.
pub const PATH: &str = "/v1/chat/completions";

/// What an answer may count when the request does not say (`max_tokens`).
pub const DEFAULT_MAX_TOKENS: u64 = 256;

/// Where the proxy sends its reservations and its requests.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// tollgate's HTTP address, e.g. `http://127.0.0.1:8080`.
    pub tollgate: String,
    /// The model's address, e.g. `http://127.0.0.1:9000`.
    pub model: String,
    client: reqwest::Client,
}

impl Proxy {
    /// A proxy in front of `model`, keeping budgets with the tollgate service at `tollgate`.
    pub fn new(tollgate: impl Into<String>, model: impl Into<String>) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("a client with a timeout");
        Self {
            tollgate: tollgate.into().trim_end_matches('/').to_string(),
            model: model.into().trim_end_matches('/').to_string(),
            client,
        }
    }

    /// The proxy's routes: `POST /v1/chat/completions`, with the tenant in `x-tenant`.
    pub fn router(self) -> Router {
        Router::new().route(PATH, post(complete)).with_state(self)
    }
}

/// The tokens a request may count at most: its prompt's (about four characters each) and its
/// answer's `max_tokens`.
pub fn estimate(request: &Value) -> u64 {
    let characters: usize = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .map(str::len)
        .sum();
    let prompt = (characters as u64).div_ceil(4);
    prompt + request["max_tokens"].as_u64().unwrap_or(DEFAULT_MAX_TOKENS)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

/// The rate limit fields of tollgate's answer, to pass on to the client.
fn fields(from: &reqwest::header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ] {
        if let Some(value) = from.get(name)
            && let Ok(value) = HeaderValue::from_bytes(value.as_bytes())
        {
            out.insert(HeaderName::from_static(name), value);
        }
    }
    out
}

async fn complete(State(proxy): State<Proxy>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(tenant) = headers.get("x-tenant").and_then(|v| v.to_str().ok()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the x-tenant header names whose budget pays",
        );
    };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    // 1. Reserve the estimate.
    let estimate = estimate(&request);
    let asked = json!({
        "request": { "method": "POST", "path": PATH, "headers": { "x-tenant": tenant } },
        "cost": estimate,
    });
    let reserved = proxy
        .client
        .post(format!("{}/v1/reservations", proxy.tollgate))
        .json(&asked)
        .send()
        .await;
    let reserved = match reserved {
        Ok(answer) => answer,
        Err(e) => {
            tracing::error!(error = %e, "tollgate cannot be reached: refusing, not letting through");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the token budget cannot be checked now",
            );
        }
    };
    let status = reserved.status();
    let limits = fields(reserved.headers());
    let reservation: Value = reserved.json().await.unwrap_or(Value::Null);
    if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        let message = format!("tenant `{tenant}` has spent its token budget for now");
        return (
            StatusCode::TOO_MANY_REQUESTS,
            limits,
            error(StatusCode::TOO_MANY_REQUESTS, message),
        )
            .into_response();
    }
    if !status.is_success() {
        tracing::error!(%status, answer = %reservation, "tollgate refused the reservation");
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the token budget cannot be checked now",
        );
    }
    // None when no rule applies, or when tollgate's store failed and its failure policy let
    // the request through uncounted (tollgate says so in its log and metrics).
    let id = reservation["id"].as_str().map(str::to_string);

    // 2. Forward to the model.
    let answered = proxy
        .client
        .post(format!("{}{PATH}", proxy.model))
        .json(&request)
        .send()
        .await;
    let answered = match answered {
        Ok(answer) if answer.status().is_success() => answer.json::<Value>().await.ok(),
        Ok(answer) => {
            tracing::warn!(status = %answer.status(), "the model failed");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "the model cannot be reached");
            None
        }
    };
    let Some(answer) = answered else {
        if let Some(id) = &id {
            settle(&proxy, id, None).await;
        }
        return error(StatusCode::BAD_GATEWAY, "the model did not answer");
    };

    // 3. Commit what the answer counted.
    let used = answer["usage"]["total_tokens"].as_u64();
    if used.is_none() {
        tracing::warn!("the answer counts no tokens: its estimate is kept");
    }
    let limits = match &id {
        Some(id) => settle(&proxy, id, Some(used.unwrap_or(estimate)))
            .await
            .unwrap_or(limits),
        None => limits,
    };
    (StatusCode::OK, limits, axum::Json(answer)).into_response()
}

/// Commits reservation `id` at `used` tokens, or cancels it (`None`): the rate limit fields
/// after it, if tollgate took it.
async fn settle(proxy: &Proxy, id: &str, used: Option<u64>) -> Option<HeaderMap> {
    let url = format!("{}/v1/reservations/{id}", proxy.tollgate);
    let settled = match used {
        Some(cost) => {
            let url = format!("{url}/commit");
            proxy
                .client
                .post(url)
                .json(&json!({ "cost": cost }))
                .send()
                .await
        }
        None => proxy.client.delete(url).send().await,
    };
    match settled {
        Ok(answer) if answer.status().is_success() => Some(fields(answer.headers())),
        Ok(answer) => {
            // 404: it expired first, and was settled as the rules say.
            tracing::warn!(status = %answer.status(), reservation = id, "not settled");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, reservation = id, "not settled: it expires as the rules say");
            None
        }
    }
}

/// A stand-in for a model: answers `POST /v1/chat/completions` as an OpenAI-style API does,
/// counting the prompt's tokens (about four characters each) and as many answer tokens as
/// `max_tokens` allows (or 100), in `usage`. A request for model `fail` gets a 500.
pub fn model() -> Router {
    Router::new().route(
        PATH,
        post(|axum::Json(request): axum::Json<Value>| async move {
            if request["model"] == "fail" {
                return error(StatusCode::INTERNAL_SERVER_ERROR, "the model failed");
            }
            let prompt = estimate(&json!({ "messages": request["messages"], "max_tokens": 0 }));
            let completion = request["max_tokens"].as_u64().unwrap_or(100);
            let answer = json!({
                "object": "chat.completion",
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": "…" } }],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            });
            axum::Json(answer).into_response()
        }),
    )
}
