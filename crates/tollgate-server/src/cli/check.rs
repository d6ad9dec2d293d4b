//! `tollgate check`: asks a running server about a request or a rule and key: a check, or
//! metered work (a report, a reservation, its commit or cancellation).

use std::process::ExitCode;

use anyhow::Context;

use super::bench;

/// What `check` asks.
#[derive(Debug)]
pub(super) enum Call {
    /// `POST /v1/check` with this body.
    Check(serde_json::Value),
    /// `POST /v1/report` with this body.
    Report(serde_json::Value),
    /// `POST /v1/reservations` with this body.
    Reserve(serde_json::Value),
    /// `POST /v1/reservations/{id}/commit` at this cost.
    Commit(String, u64),
    /// `DELETE /v1/reservations/{id}`.
    Cancel(String),
}

/// Asks `server` for `call`; prints the answer. Exit code 0 when admitted, 1 when denied (or
/// in debt after a report or a commit), 2 for any other answer.
pub(super) async fn run(server: &str, call: Call) -> ExitCode {
    let base = bench::check_url(server);
    let base = base.trim_end_matches("/check");
    let client = reqwest::Client::new();
    let request = match &call {
        Call::Check(body) => client.post(format!("{base}/check")).json(body),
        Call::Report(body) => client.post(format!("{base}/report")).json(body),
        Call::Reserve(body) => client.post(format!("{base}/reservations")).json(body),
        Call::Commit(id, cost) => client
            .post(format!("{base}/reservations/{id}/commit"))
            .json(&serde_json::json!({ "cost": cost })),
        Call::Cancel(id) => client.delete(format!("{base}/reservations/{id}")),
    };
    let answer = async {
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach {base}"))?;
        let status = response.status();
        let text = response.text().await.context("the answer was cut short")?;
        anyhow::Ok((status, text))
    };
    let (status, text) = match answer.await {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let json = serde_json::from_str::<serde_json::Value>(&text);
    match json.as_ref().ok().and_then(|j| j["region"].as_str()) {
        // A global rule decided: the region that answered.
        Some(region) => eprintln!("HTTP {status} (region {region})"),
        None => eprintln!("HTTP {status}"),
    }
    match &json {
        Ok(json) => println!("{json:#}"),
        Err(_) => eprintln!("{}", text.trim_end()),
    }
    let allowed = json.is_ok_and(|j| j["allowed"] != false);
    match status.as_u16() {
        200 if allowed => ExitCode::SUCCESS,
        200 | 429 => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}
