//! A TCP proxy on loopback that a test controls: a delay on each way, a cut (every
//! connection closed, new ones refused), a heal. It stands for the link between two regions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// A proxy to one address; dropped, it stops.
pub struct Proxy {
    port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    /// Microseconds each chunk waits before it is passed on, each way.
    delay: AtomicU64,
    cut: AtomicBool,
    /// Bumped by each cut: connections of an older generation close.
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// A proxy to `target` (`host:port`), listening on a free port of 127.0.0.1.
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            delay: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            generation: watch::channel(0).0,
        });
        let target = target.to_string();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if shared.cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let state = shared.clone();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pump(client_read, server_write, state.clone());
                    let down = pump(server_read, client_write, state.clone());
                    tokio::join!(up, down);
                });
            }
        });
        Self { port, state, task }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk by `delay`, each way.
    pub fn delay(&self, delay: Duration) {
        self.state
            .delay
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// Closes every connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk after the delay, until `from` closes or a cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
) {
    let mut cuts = state.generation.subscribe();
    let born = *cuts.borrow_and_update();
    let mut writer_cuts = cuts.clone();
    let (send, mut receive) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    // The writer drains what was read (after its delay) unless a cut comes first.
    let writer = async move {
        loop {
            tokio::select! {
                next = receive.recv() => {
                    let Some((due, chunk)) = next else { return };
                    tokio::time::sleep_until(due.into()).await;
                    if to.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                _ = writer_cuts.changed() => if *writer_cuts.borrow() != born { return; },
            }
        }
    };
    let reader = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                read = from.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let delay = Duration::from_micros(state.delay.load(Ordering::SeqCst));
                        if send.send((Instant::now() + delay, buffer[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                },
                _ = cuts.changed() => if *cuts.borrow() != born { return; },
            }
        }
    };
    tokio::join!(reader, writer);
}
