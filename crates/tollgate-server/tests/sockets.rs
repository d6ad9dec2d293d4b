//! The service's listeners hand out connections with Nagle's algorithm off (see
//! `http::listener` and `grpc::incoming`).

use axum::serve::Listener as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt as _;
use tollgate_server::{grpc, http};

#[tokio::test]
async fn both_listeners_accept_without_nagle() {
    let bound = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = bound.local_addr().unwrap();
    let mut listener = http::listener(bound);
    let _client = TcpStream::connect(addr).await.unwrap();
    let (accepted, _) = listener.accept().await;
    assert!(accepted.nodelay().unwrap(), "HTTP");

    let bound = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = bound.local_addr().unwrap();
    let mut incoming = grpc::incoming(bound);
    let _client = TcpStream::connect(addr).await.unwrap();
    let accepted = incoming.next().await.unwrap().unwrap();
    assert!(accepted.nodelay().unwrap(), "gRPC");
}
