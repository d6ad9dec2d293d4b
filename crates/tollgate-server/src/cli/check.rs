//! `tollgate check`: asks a running server about a request or a rule and key.

use std::process::ExitCode;

use anyhow::Context;

use super::bench;

/// Asks `server` to check `body`; prints the answer. Exit code 0 when admitted, 1 when
/// denied, 2 for any other answer.
pub(super) async fn run(server: &str, body: serde_json::Value) -> ExitCode {
    let url = bench::check_url(server);
    let answer = async {
        let response = reqwest::Client::new()
            .post(&url)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
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
    eprintln!("HTTP {status}");
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(json) => println!("{json:#}"),
        Err(_) => eprintln!("{}", text.trim_end()),
    }
    match status.as_u16() {
        200 => ExitCode::SUCCESS,
        429 => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}
