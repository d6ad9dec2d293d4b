//! The listeners' connections (see `connections`): Nagle's algorithm off, and the bounds on
//! them (open at once, idle, request heads) against clients that send nothing or a byte at a
//! time.

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt as _;
use tollgate_server::net::connections::{self, Limits, Registry};

#[tokio::test]
async fn both_listeners_accept_without_nagle() {
    let registry = Registry::new(Limits::default());
    let bound = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = bound.local_addr().unwrap();
    let _client = TcpStream::connect(addr).await.unwrap();
    let accepted = registry.accept(&bound, true).await;
    assert!(accepted.get_ref().nodelay().unwrap(), "HTTP");
    drop(accepted);

    let bound = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = bound.local_addr().unwrap();
    let mut incoming = connections::incoming(registry.clone(), bound);
    let _client = TcpStream::connect(addr).await.unwrap();
    let accepted = incoming.next().await.unwrap().unwrap();
    assert!(accepted.get_ref().nodelay().unwrap(), "gRPC");
    assert_eq!(registry.open(), 1);
}
