//! HTTP/1 half-close: a client that sends a whole request and then shuts down its
//! write side (`socat -t`, HTTP/1.0-style tools) still gets its answer. Without it a
//! POST sent that way ran on the node and its answer was lost.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, config_for, named_upstream, TestGateway};

/// Generous: the machine is shared. Not a timing assertion, only a bound on a hang.
const WITHIN: Duration = Duration::from_secs(10);

/// Sends `request`, shuts down the write half (a FIN), and reads until the gateway
/// closes: everything it answered.
async fn after_fin(gateway: &TestGateway, request: &str) -> String {
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(WITHIN, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the gateway neither answered nor closed");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_get_followed_by_fin_is_answered() {
    let (node, record) = support::recording_upstream().await;
    let gateway = TestGateway::start(&config_for(&[node], named_upstream("data").await, "")).await;
    let request = "GET /course/view.php?id=2 HTTP/1.1\r\nHost: moodle.example.edu\r\n\r\n";
    let answer = after_fin(&gateway, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.ends_with("ok"), "{answer:?}");
    assert_eq!(record.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_post_followed_by_fin_runs_once_and_is_answered() {
    let (node, record) = support::recording_upstream().await;
    let gateway = TestGateway::start(&config_for(&[node], named_upstream("data").await, "")).await;
    let request = "POST /mod/forum/post.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
        Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 11\r\n\r\nsubject=hi!";
    let answer = after_fin(&gateway, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    let seen = record.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].body, Some(Ok(b"subject=hi!".to_vec())));
}
