//! `examples/llm-proxy` end to end: the proxy and a stand-in model in this process, in front
//! of the real tollgate serving the example's rules file. A tenant's 10,000 tokens an hour:
//! three answers of 3,010 are committed at their count, the fourth is refused with
//! `Retry-After`; an answer below its estimate gives the difference back; a failed model
//! cancels; twenty requests in flight at once spend no more than the budget; a tollgate that
//! cannot be reached refuses rather than lets through.

use crate::support;

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::Server;

const BUDGET: u64 = 10_000;

/// Serves `app` on a free loopback port: its address.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{at}")
}

/// A proxy in front of a stand-in model, keeping budgets with `tollgate`.
async fn proxy(tollgate: &str) -> String {
    let model = serve(llm_proxy::model()).await;
    serve(llm_proxy::Proxy::new(tollgate, model).router()).await
}

/// Asks for an answer of `max_tokens` (none: the proxy's default) as `tenant`: the status,
/// `X-RateLimit-Remaining`, `Retry-After` and the body.
async fn ask(
    proxy: &str,
    tenant: &str,
    max_tokens: Option<u64>,
    model: &str,
) -> (u16, u64, Option<u64>, Value) {
    let mut body = json!({ "model": model, "messages": [{ "role": "user", "content": "Tell me about rate limits." }] });
    if let Some(max) = max_tokens {
        body["max_tokens"] = json!(max);
    }
    let answer = reqwest::Client::new()
        .post(format!("{proxy}{}", llm_proxy::PATH))
        .header("x-tenant", tenant)
        .json(&body)
        .send()
        .await
        .unwrap();
    let number = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (remaining, retry) = (number("x-ratelimit-remaining"), number("retry-after"));
    let status = answer.status().as_u16();
    (
        status,
        remaining.unwrap_or(u64::MAX),
        retry,
        answer.json().await.unwrap(),
    )
}

/// What `tenant` has left, as tollgate says (a look, cost 0).
async fn left(tollgate: &str, tenant: &str) -> u64 {
    let look = json!({ "request": { "method": "POST", "path": llm_proxy::PATH, "headers": { "x-tenant": tenant } }, "cost": 0 });
    let answer: Value = reqwest::Client::new()
        .post(format!("{tollgate}/v1/check"))
        .json(&look)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["decisions"][0]["remaining"].as_u64().unwrap()
}

/// `remaining` is `expected`, or above it by what the budget refilled since (10,000 an hour:
/// under 3 a second; the test takes a few).
fn about(remaining: u64, expected: u64) {
    assert!(
        (expected..=expected + 30).contains(&remaining),
        "{remaining} left, {expected} expected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_proxy_keeps_each_tenant_to_its_token_budget() {
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/llm-proxy/rules.yaml"
    ))
    .unwrap();
    let tollgate = Server::start(&[("rules.yaml", &rules)], &[]);
    let proxy = proxy(&tollgate.http).await;
    // 7 prompt tokens and 3,000 answered: three fit in 10,000, each committed at its count.
    for n in 1..=3 {
        let (status, remaining, _, body) = ask(&proxy, "acme", Some(3_000), "m").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["total_tokens"], 3_007);
        about(remaining, BUDGET - 3_007 * n);
    }
    let (status, _, retry, body) = ask(&proxy, "acme", Some(3_000), "m").await;
    assert_eq!(status, 429, "{body}");
    // 3,007 wanted, 979 left, at 10,000 an hour: 735 s.
    assert!(retry.is_some_and(|s| (700..=740).contains(&s)), "{retry:?}");
    // Below the estimate (256 asked by default, 100 answered): the difference comes back.
    let (status, remaining, _, _) = ask(&proxy, "beta", None, "m").await;
    assert_eq!(status, 200);
    about(remaining, BUDGET - 107);
    // A failed model spends nothing.
    let before = left(&tollgate.http, "beta").await;
    let (status, _, _, _) = ask(&proxy, "beta", Some(500), "fail").await;
    assert_eq!(status, 502);
    about(left(&tollgate.http, "beta").await, before);
    // Twenty in flight at once, 1,007 each: nine fit, and the budget is spent by no more.
    let asks = (0..20).map(|_| ask(&proxy, "gamma", Some(1_000), "m"));
    let answers = futures_util::future::join_all(asks).await;
    let served = answers.iter().filter(|a| a.0 == 200).count();
    assert_eq!(
        served,
        9,
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert!(answers.iter().all(|a| a.0 == 200 || a.0 == 429));
    about(left(&tollgate.http, "gamma").await, BUDGET - 9 * 1_007);
    // A tollgate that is gone: refused, not let through.
    drop(tollgate);
    let (status, _, _, body) = ask(&proxy, "acme", Some(10), "m").await;
    assert_eq!(status, 503, "{body}");
}
