//! TLS on the HTTP listener (`server.tls`): checks over HTTPS, mutual TLS refusing clients
//! without a certificate, the HTTP/1 framing follower and the timeouts watching the
//! decrypted stream, and files that cannot serve refused by `validate` at the section.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::{Server, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RULES: &str = "rules:
  - id: api
    match: { path: /api/* }
    key: [text:all]
    tiers: [{ limit: 2, period: 1m }]
";

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in a
/// directory of their own.
struct Certificates {
    dir: tempfile::TempDir,
    ca: String,
    client: (String, String),
}

impl Certificates {
    fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tollgate test CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let signed = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            (
                params.signed_by(&key, &ca).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let (server_cert, server_key) = signed("127.0.0.1");
        let certificates = Self {
            dir,
            ca: ca.pem(),
            client: signed("client"),
        };
        certificates.write("server.crt", &server_cert);
        certificates.write("server.key", &server_key);
        certificates.write("ca.crt", &certificates.ca);
        certificates
    }

    fn write(&self, name: &str, pem: &str) {
        std::fs::write(self.dir.path().join(name), pem).unwrap();
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The `server` section serving HTTPS with these files (and mutual TLS with `mutual`).
    fn section(&self, mutual: bool) -> String {
        let client_ca = if mutual {
            format!(", client_ca: '{}'", self.path("ca.crt"))
        } else {
            String::new()
        };
        format!(
            "server: {{ header_timeout: 1s, tls: {{ cert: '{}', key: '{}'{client_ca} }} }}\n",
            self.path("server.crt"),
            self.path("server.key")
        )
    }

    /// A TLS client trusting the CA, presenting the client certificate with `identify`.
    fn connector(&self, identify: bool) -> tokio_rustls::TlsConnector {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if identify {
            let cert = CertificateDer::from_pem_slice(self.client.0.as_bytes()).unwrap();
            let key = PrivateKeyDer::from_pem_slice(self.client.1.as_bytes()).unwrap();
            builder.with_client_auth_cert(vec![cert], key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// Sends `request` over TLS to `server`; what came back before the server closed or 2 s
/// passed, or the error that ended it.
async fn over_tls(
    server: &Server,
    connector: &tokio_rustls::TlsConnector,
    request: &str,
) -> Result<String, std::io::Error> {
    let addr = server.http.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") && !request.contains("close") {
                    break;
                }
            }
            Ok(Err(e)) if answer.is_empty() => return Err(e),
            Ok(Err(_)) => break,
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

fn check(path: &str) -> String {
    let body = format!(r#"{{"request": {{"method": "GET", "path": "{path}"}}}}"#);
    format!(
        "POST /v1/check HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn checks_over_https() {
    let certificates = Certificates::new();
    let section = certificates.section(false);
    let server = Server::start(&[("rules.yaml", RULES), ("server.yaml", &section)], &[]);
    assert!(server.logged("tls=true").is_some());
    let connector = certificates.connector(false);
    support::clear_of_a_minutes_turn().await;
    for status in ["200", "200", "429"] {
        let answer = over_tls(&server, &connector, &check("/api/items"))
            .await
            .unwrap();
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("x-ratelimit-limit: 2"),
            "{answer}"
        );
    }
    // A request framed both ways is refused on the decrypted stream, as in plain text.
    let smuggled = "POST /v1/check HTTP/1.1\r\nhost: a\r\ncontent-length: 4\r\n\
                    transfer-encoding: chunked\r\nconnection: close\r\n\r\n0\r\n\r\n";
    let answer = over_tls(&server, &connector, smuggled).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // Plain text on the TLS port is not served.
    let addr = server.http.trim_start_matches("http://").to_string();
    let mut plain = tokio::net::TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(check("/api/items").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("HTTP/1.1 200"));
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate() {
    let certificates = Certificates::new();
    let section = certificates.section(true);
    let server = Server::start(&[("rules.yaml", RULES), ("server.yaml", &section)], &[]);
    let anonymous = over_tls(&server, &certificates.connector(false), &check("/api/x")).await;
    assert!(
        anonymous.as_ref().map_or(true, |a| !a.contains("HTTP/1.1")),
        "{anonymous:?}"
    );
    let known = over_tls(&server, &certificates.connector(true), &check("/api/x"))
        .await
        .unwrap();
    assert!(known.starts_with("HTTP/1.1 200"), "{known}");
}

/// A client that connects and never starts its handshake is closed within the header
/// timeout, as one that never sends its request head is.
#[tokio::test]
async fn a_handshake_that_never_comes_is_closed() {
    let certificates = Certificates::new();
    let section = certificates.section(false);
    let server = Server::start(&[("rules.yaml", RULES), ("server.yaml", &section)], &[]);
    let addr = server.http.trim_start_matches("http://").to_string();
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
}

#[test]
fn files_that_cannot_serve_are_refused_at_the_section() {
    let certificates = Certificates::new();
    let dir = tempfile::tempdir().unwrap();
    let missing = format!(
        "rules: []\nserver:\n  tls: {{ cert: '{}', key: /nowhere.key }}\n",
        certificates.path("server.crt")
    );
    let crossed = format!(
        "rules: []\nserver:\n  tls: {{ cert: '{}', key: '{}' }}\n",
        certificates.path("server.crt"),
        {
            certificates.write("other.key", &KeyPair::generate().unwrap().serialize_pem());
            certificates.path("other.key")
        }
    );
    for (text, says) in [
        (missing, "no private key in /nowhere.key"),
        (crossed, "server.tls"),
    ] {
        let path = dir.path().join("server.yaml");
        std::fs::write(&path, text).unwrap();
        let (code, _, err) = run(&["validate", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("server.yaml:3:") && err.contains(says),
            "{err}"
        );
    }
}
