//! A headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`, which
//! `scripts/test` installs when missing): the test starts its own `chromedriver` on a free
//! port, one browser session in a profile of its own, and when dropped quits the browser, stops
//! the driver, ends any of the browser's processes still running and removes the profile.
//! Screenshots go to `target/console-screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub(crate) struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: reqwest::Client,
    _profile: tempfile::TempDir,
    pub(crate) shots: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The session's end quits the browser; killing the driver alone leaves it running.
        let _ = self.quit_session();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Whatever of the browser still runs (a helper the quit left behind) is found by its
        // profile, which no other process names.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = processes_naming(&self._profile.path().to_string_lossy());
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .arg("-9")
                    .args(left.iter().map(u32::to_string))
                    .status();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The processes whose command line names `text`.
pub(crate) fn processes_naming(text: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| String::from_utf8_lossy(&line).contains(text))
        })
        .collect()
}

fn found(program: &str, candidates: &[&str]) -> String {
    candidates
        .iter()
        .find(|c| std::path::Path::new(c).exists())
        .map(|c| c.to_string())
        .unwrap_or_else(|| {
            panic!(
                "{program} is needed for the console's browser tests: run ./scripts/test, which \
                 installs Debian's chromium and chromium-driver, or install them"
            )
        })
}

impl Browser {
    pub(crate) async fn start() -> Self {
        let chromium = found(
            "chromium",
            &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
        );
        let chromedriver = found("chromedriver", &["/usr/bin/chromedriver"]);
        let port = super::support::free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = client.get(format!("{base}/status")).send().await;
            if ready.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-default-apps".into(),
            "--no-first-run".into(),
            "--window-size=1400,1000".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        }}});
        let created: Value = client
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        let shots = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/console-screenshots"
        ));
        std::fs::create_dir_all(&shots).unwrap();
        Self {
            driver,
            base,
            session,
            client,
            _profile: profile,
            shots,
        }
    }

    /// Ends the session (`DELETE /session/{id}`), which quits the browser; blocking, for
    /// `drop`.
    fn quit_session(&self) -> std::io::Result<()> {
        use std::io::{Read, Write};
        let address = self.base.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(address)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "DELETE /session/{} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n",
            self.session
        )?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(())
    }

    /// The browser's profile directory.
    pub(crate) fn profile(&self) -> PathBuf {
        self._profile.path().to_path_buf()
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.client.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        reply["value"].clone()
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The element matching `css`, waited for up to 10 s.
    pub(crate) async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .call(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({ "using": "css selector", "value": css })),
                )
                .await;
            if let Some(id) = found[ELEMENT].as_str() {
                return id.to_string();
            }
            if Instant::now() >= deadline {
                let shot = self.screenshot("failed").await;
                panic!("no element `{css}` (the page: {}): {found}", shot.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn click(&self, css: &str) {
        let id = self.find(css).await;
        let done = self
            .call(
                reqwest::Method::POST,
                &format!("/element/{id}/click"),
                Some(json!({})),
            )
            .await;
        assert!(done.is_null(), "clicking `{css}`: {done}");
    }

    /// Replaces the value of the input `css` with `text`.
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/clear"),
            Some(json!({})),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Types `text` into `css` as keys, after what it holds (`\u{E003}` is backspace).
    pub(crate) async fn keys(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Waits up to `within` until the text of `css` satisfies `ok`; the text.
    pub(crate) async fn wait_text(
        &self,
        css: &str,
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = self
                .script(&format!(
                    "const e = document.querySelector({}); return e ? e.innerText : null;",
                    json!(css)
                ))
                .await;
            if let Some(text) = text.as_str()
                && ok(text)
            {
                return text.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "`{css}` never read as expected: last {text}"
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Runs `script` in the page; what it returns.
    pub(crate) async fn script(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    /// Saves a screenshot of the page as `<name>.png`.
    pub(crate) async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a screenshot"))
            .unwrap();
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}
