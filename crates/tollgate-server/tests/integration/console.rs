//! The console in a real browser (headless Chromium over WebDriver), as a team uses it: signs
//! in with the admin token (and is refused without it), sees the traffic the test sends in
//! the overview and in a rule's charts and hot keys, resets a key, creates a rule through the
//! form (a broken one refused at its field), previews a tighter limit on the recorded
//! traffic, sees the new rule limit the next checks, explains a request without consuming,
//! deletes the rule, and reads the audit. Each page is saved as a screenshot
//! (`target/console-screenshots/`).

use crate::browser;
use crate::support;

use std::time::Duration;

use browser::Browser;
use serde_json::json;
use support::Server;

const TOKEN: &str = "console-s3cret";

fn rules() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let native = std::fs::read_to_string(format!("{root}/multi-tenant.yaml")).unwrap();
    // The example's own server section binds fixed ports: the test binds free ones.
    native
        .split("\nstore:")
        .nth(1)
        .map(|rest| format!("store:{rest}"))
        .unwrap()
}

async fn get_product(server: &Server, org: &str) -> u16 {
    let body =
        json!({"request": {"method": "GET", "path": format!("/v1/organizations/{org}/product/7")}});
    support::check(&reqwest::Client::new(), &server.http, body)
        .await
        .0
}

async fn api(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    reqwest::Client::new()
        .request(method, format!("{}{path}", server.http))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser() {
    let envoy = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/envoy-ratelimit.yaml"
    ))
    .unwrap();
    let server = Server::start(
        &[("rules.yaml", &rules()), ("envoy.yaml", &envoy)],
        &["--admin-token", TOKEN],
    );
    let browser = Browser::start().await;
    let console = format!("{}/console", server.http);

    // Refused without the token; in with it.
    browser.goto(&console).await;
    browser.fill("#token", "wrong").await;
    browser.click("#login-button").await;
    browser
        .wait_text("#login-error", Duration::from_secs(5), |t| {
            t.contains("refused")
        })
        .await;
    browser.screenshot("01-login-refused").await;
    let bar = browser
        .script("return getComputedStyle(document.getElementById('bar')).display")
        .await;
    assert_eq!(bar, json!("none"), "no navigation before signing in");
    let api_without = reqwest::get(format!("{}/v1/console/overview", server.http))
        .await
        .unwrap();
    assert_eq!(api_without.status(), 401);
    browser.fill("#token", TOKEN).await;
    browser.click("#login-button").await;
    browser.find("#rate-allowed").await;

    // Traffic sent now appears in the overview within a few seconds.
    for _ in 0..40 {
        assert_eq!(get_product(&server, "acme").await, 200);
    }
    for _ in 0..8 {
        get_product(&server, "globex").await;
    }
    browser
        .wait_text("#rate-allowed", Duration::from_secs(8), |t| {
            t != "0.0/s" && !t.is_empty()
        })
        .await;
    let svg = browser
        .script("return document.querySelectorAll('#view svg.chart polyline').length")
        .await;
    assert_eq!(svg, json!(3), "admitted, denied and shadow lines");
    browser.screenshot("02-overview").await;

    // The rules of both example files are listed.
    browser.click("a[href='#/rules']").await;
    browser.find("tr[data-rule='get-product']").await;
    browser.find("tr[data-rule='put-product']").await;
    let envoy_rows = browser
        .script("return [...document.querySelectorAll('tr[data-rule]')].filter(r => r.dataset.rule.startsWith('edge.')).length")
        .await;
    assert!(
        envoy_rows.as_u64().unwrap() >= 4,
        "the Envoy file's limits: {envoy_rows}"
    );
    browser.fill("#rules-search", "put").await;
    browser
        .wait_text("#rules-table tbody", Duration::from_secs(5), |t| {
            !t.contains("get-product")
        })
        .await;
    browser.screenshot("03-rules").await;
    // Cleared as a user does, key by key; the list is whole again.
    browser
        .keys("#rules-search", "\u{E003}\u{E003}\u{E003}")
        .await;
    browser
        .wait_text("#rules-table tbody", Duration::from_secs(5), |t| {
            t.contains("get-product")
        })
        .await;

    // A rule's page: its chart, and acme, the hottest key.
    browser.goto(&format!("{console}#/rule/get-product")).await;
    let hottest = browser
        .wait_text(
            "#hot-hits tbody tr:first-child td:first-child",
            Duration::from_secs(8),
            |t| t.starts_with("acme"),
        )
        .await;
    assert!(hottest.contains("GET"), "{hottest}");
    browser.screenshot("04-rule").await;

    // Resetting acme gives its whole limit back (an audited action).
    browser
        .script("window.confirm = () => true; return true")
        .await;
    browser
        .click("#hot-hits tbody tr:first-child button.reset")
        .await;
    browser
        .wait_text("#rule-message", Duration::from_secs(5), |t| {
            t.starts_with("Reset")
        })
        .await;
    let look = api(
        &server,
        reqwest::Method::POST,
        "/v1/console/explain",
        json!({"request": {"method": "GET", "path": "/v1/organizations/acme/product/7"}}),
    )
    .await;
    assert_eq!(look["matches"][0]["remaining"], json!(1000), "{look}");

    // A new rule through the form: broken first, refused at its field.
    browser.goto(&format!("{console}#/new")).await;
    browser.fill("#f-id", "tight").await;
    browser
        .fill("#f-path", "/v1/organizations/{org}/product/*")
        .await;
    browser.fill("#f-key", "segment:org").await;
    browser.fill("#f-algorithm", "fixed_window").await;
    browser.fill("#f-tier-0-limit", "0").await;
    // An hour, not a minute: the rule's window must not turn between the checks below and
    // the explanations that follow them, seconds later on a loaded machine.
    browser.fill("#f-tier-0-period", "1h").await;
    browser.click("#validate").await;
    let error = browser
        .wait_text("#error-message", Duration::from_secs(5), |t| !t.is_empty())
        .await;
    assert!(
        error.contains("tiers[0].limit: must be at least 1"),
        "{error}"
    );
    let marked = browser
        .script("return document.querySelector('#f-tier-0-limit').classList.contains('invalid')")
        .await;
    assert_eq!(marked, json!(true), "the limit's field is marked");
    browser.screenshot("05-editor-error").await;

    // Fixed: its impact on the traffic recorded (acme sent 40 within the hour; 5 pass).
    browser.fill("#f-tier-0-limit", "5").await;
    browser.click("#preview").await;
    let denied = browser
        .wait_text("#preview-denied", Duration::from_secs(5), |t| !t.is_empty())
        .await;
    let denied: u64 = denied.replace(',', "").parse().unwrap();
    assert!(
        denied >= 35,
        "the preview denies what acme sent past 5: {denied}"
    );
    browser.find("#preview-keys").await;
    browser.screenshot("06-preview").await;

    // Enforced and saved, after the diff: the next checks are limited by it.
    browser.script("document.querySelector('#f-shadow').checked = false; document.querySelector('#f-shadow').dispatchEvent(new Event('change', {bubbles: true})); return true").await;
    browser.click("#review").await;
    let shown = browser
        .wait_text("#diff", Duration::from_secs(5), |t| t.contains("id: tight"))
        .await;
    assert!(shown.contains("+ "), "{shown}");
    browser.screenshot("07-review").await;
    browser.click("#save").await;
    browser
        .wait_text("#view h1", Duration::from_secs(5), |t| {
            t.starts_with("tight")
        })
        .await;
    // get-product counts in fixed windows of 10 s: the look below sees these checks only if
    // its window is theirs.
    let window = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_secs() / 10
    };
    let checked_in = window();
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(get_product(&server, "newco").await);
        }
        statuses
    };
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);

    // Explain a request: both rules match; tight denies; nothing is consumed.
    browser.goto(&format!("{console}#/explain")).await;
    browser
        .fill("#x-path", "/v1/organizations/newco/product/7")
        .await;
    for _ in 0..2 {
        browser.click("#explain-request").await;
        let status = browser
            .wait_text("#explain-status", Duration::from_secs(5), |t| !t.is_empty())
            .await;
        assert!(status.starts_with("429"), "{status}");
    }
    let rows = browser
        .script("return document.querySelectorAll('#explain-matches tbody tr[data-rule]').length")
        .await;
    assert_eq!(rows, json!(2));
    browser.screenshot("08-explain").await;
    let look = api(
        &server,
        reqwest::Method::POST,
        "/v1/console/explain",
        json!({"rule": "get-product", "key": "5:newco33:/v1/organizations/{org}/product/*3:GET"}),
    )
    .await;
    let remaining = look["matches"][0]["remaining"].as_u64().unwrap();
    if window() != checked_in {
        // A new window began since: it holds at most the five.
        assert!(remaining >= 1000 - 5, "{look}");
    } else {
        assert_eq!(
            remaining,
            1000 - 5,
            "five admitted took one each; the sixth, denied by tight, took nothing; explaining took nothing"
        );
    }

    // Deleted from its page; gone from the list.
    browser.goto(&format!("{console}#/rule/tight")).await;
    browser
        .script("window.confirm = () => true; return true")
        .await;
    browser.click("#delete").await;
    browser.find("tr[data-rule='get-product']").await;
    let gone = browser
        .script("return document.querySelector(\"tr[data-rule='tight']\") === null")
        .await;
    assert_eq!(gone, json!(true));
    assert_eq!(
        get_product(&server, "newco").await,
        200,
        "no longer limited by tight"
    );

    // A tenant's plan set on the Plans page: the key as the console shows it.
    let shown = api(
        &server,
        reqwest::Method::POST,
        "/v1/console/explain",
        json!({"request": {"method": "GET", "path": "/v1/organizations/planco/product/7"}}),
    )
    .await;
    let key = shown["matches"][0]["display"].as_str().unwrap().to_string();
    browser.goto(&format!("{console}#/rule/get-product")).await;
    browser.click("#rule-plans a").await;
    browser
        .wait_text("#plans tbody", Duration::from_secs(5), |t| {
            t.contains("No plan")
        })
        .await;
    browser.fill("#p-key", &key).await;
    browser.fill("#p-limit", "2").await;
    browser.fill("#p-period", "1h").await;
    browser.click("#save-plan").await;
    browser
        .wait_text("#plan-message", Duration::from_secs(5), |t| {
            t.starts_with("Saved")
        })
        .await;
    let row = browser
        .wait_text("#plans tbody", Duration::from_secs(5), |t| {
            t.contains("2/1h")
        })
        .await;
    assert!(row.contains("planco"), "{row}");
    browser.screenshot("10-plans").await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get_product(&server, "planco").await);
    }
    assert_eq!(statuses, [200, 200, 429], "the plan applies at once");
    browser.click("#plans button.delete-plan").await;
    browser
        .wait_text("#plan-message", Duration::from_secs(5), |t| {
            t.starts_with("Deleted")
        })
        .await;
    assert_eq!(
        get_product(&server, "planco").await,
        200,
        "the rule's tiers again"
    );

    // A key denied on the Lists page, for every rule: refused at once; deleted, served again.
    browser.goto(&format!("{console}#/lists")).await;
    browser
        .wait_text("#lists tbody", Duration::from_secs(5), |t| {
            t.contains("No entry")
        })
        .await;
    browser.fill("#l-key", &key).await;
    browser.fill("#l-reason", "scraping").await;
    browser.click("#save-entry").await;
    browser
        .wait_text("#list-message", Duration::from_secs(5), |t| {
            t.starts_with("Put")
        })
        .await;
    let row = browser
        .wait_text("#lists tbody", Duration::from_secs(5), |t| {
            t.contains("scraping")
        })
        .await;
    assert!(
        row.contains("every rule") && row.contains("planco"),
        "{row}"
    );
    browser.screenshot("11-lists").await;
    assert_eq!(get_product(&server, "planco").await, 429, "denied at once");
    browser.click("#lists button.delete-entry").await;
    browser
        .wait_text("#list-message", Duration::from_secs(5), |t| {
            t.starts_with("Took")
        })
        .await;
    assert_eq!(get_product(&server, "planco").await, 200, "served again");

    // The audit log has the reset, the creation, the deletion and the plan.
    browser.goto(&format!("{console}#/audit")).await;
    let audit = browser
        .wait_text("#audit tbody", Duration::from_secs(5), |t| {
            t.contains("delete override")
        })
        .await;
    for action in ["reset", "create", "delete", "override", "deny list"] {
        assert!(audit.contains(action), "{audit}");
    }
    browser.screenshot("09-audit").await;

    // Signed out, the token is gone from the tab.
    browser.click("#logout").await;
    let kept = browser
        .script("return sessionStorage.getItem('tollgate-token')")
        .await;
    assert_eq!(kept, json!(null));

    // Done, the browser leaves nothing behind: no process of its profile, no profile.
    let profile = browser.profile();
    let profile_name = profile.to_string_lossy().into_owned();
    assert!(
        !browser::processes_naming(&profile_name).is_empty(),
        "the browser runs in its profile"
    );
    drop(browser);
    assert_eq!(
        browser::processes_naming(&profile_name),
        Vec::<u32>::new(),
        "browser processes left running"
    );
    assert!(
        !profile.exists(),
        "the profile {profile_name} is left behind"
    );
}

/// Without an admin token there is no console: the page and its API are not found.
#[tokio::test]
async fn no_token_no_console() {
    let server = Server::start(&[("rules.yaml", &rules())], &[]);
    for path in ["/console", "/v1/console/overview"] {
        let answer = reqwest::get(format!("{}{path}", server.http))
            .await
            .unwrap();
        assert_eq!(answer.status(), 404, "{path}");
    }
}
