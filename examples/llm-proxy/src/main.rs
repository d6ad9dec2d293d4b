//! `llm-proxy [--listen ADDR] [--tollgate URL] [--model URL]`: the proxy, in front of the
//! model at `--model`, or, without one, of a stand-in model it serves itself.

use std::net::SocketAddr;

/// What the command line says: three options, read by hand.
struct Args {
    listen: String,
    tollgate: String,
    model: Option<String>,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Self {
            listen: "127.0.0.1:8090".into(),
            tollgate: "http://127.0.0.1:8080".into(),
            model: None,
        };
        let mut given = std::env::args().skip(1);
        while let Some(flag) = given.next() {
            let value = given.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--listen" => args.listen = value,
                "--tollgate" => args.tollgate = value,
                "--model" => args.model = Some(value),
                _ => {
                    return Err(format!(
                        "unknown option {flag}: --listen, --tollgate, --model"
                    ));
                }
            }
        }
        Ok(args)
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = match Args::parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("llm-proxy: {message}");
            std::process::exit(2);
        }
    };
    let model = match args.model {
        Some(model) => model,
        None => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let at: SocketAddr = listener.local_addr().expect("an address");
            tokio::spawn(async move { axum::serve(listener, llm_proxy::model()).await });
            eprintln!("llm-proxy: a stand-in model on http://{at}");
            format!("http://{at}")
        }
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("llm-proxy: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    eprintln!(
        "llm-proxy: on http://{}{}, budgets kept by {}",
        args.listen,
        llm_proxy::PATH,
        args.tollgate
    );
    let app = llm_proxy::Proxy::new(args.tollgate, model).router();
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("llm-proxy: {e}");
        std::process::exit(1);
    }
}
