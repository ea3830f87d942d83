//! Slow uploads must not hold PHP workers: a small body is read whole before any node
//! is contacted, and a large one streams only as long as it keeps a minimum pace and
//! a total deadline (issue #14, slowhttptest `-B`).

use std::time::Duration;

use crate::support::{self, config_for, named_upstream, RawConn, Record, TestGateway};

const WAIT: Duration = Duration::from_secs(20);

async fn gateway_for(node: std::net::SocketAddr, extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

fn header<'a>(received: &'a support::Received, name: &str) -> Option<&'a str> {
    received
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Sends `head`, then `body` in 32-byte pieces 20 ms apart (a slowhttptest `-B`
/// client), checking before every piece that the node has seen nothing; then the
/// gateway's answer.
async fn trickle(gateway: &TestGateway, record: &Record, head: &str, body: &[u8]) -> u16 {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(head.as_bytes()).await.unwrap();
    for piece in body.chunks(32) {
        assert!(
            record.lock().unwrap().is_empty(),
            "the node was contacted before the body was complete"
        );
        conn.send(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.response(WAIT, false).await.unwrap().status
}

#[tokio::test]
async fn a_trickled_small_body_reaches_the_node_only_once_complete_and_whole() {
    let form: Vec<u8> = (0..2048).map(|i| b'a' + (i % 26) as u8).collect();
    let mut chunked = Vec::new();
    for part in form.chunks(100) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let framings = [
        ("content-length: 2048", form.clone()),
        ("transfer-encoding: chunked", chunked),
    ];
    for (framing, body) in framings {
        let (node, record) = support::recording_upstream().await;
        let gateway = gateway_for(node, "").await;
        let head = format!(
            "POST /mod/scorm/datamodel.php HTTP/1.1\r\nHost: moodle.example.edu\r\n{framing}\r\n\r\n"
        );
        assert_eq!(
            trickle(&gateway, &record, &head, &body).await,
            200,
            "{framing}"
        );
        let received = record.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "{framing}: one request, sent once");
        let request = &received[0];
        assert_eq!(request.body.clone().unwrap().unwrap(), form, "{framing}");
        assert_eq!(header(request, "content-length"), Some("2048"), "{framing}");
        assert_eq!(header(request, "transfer-encoding"), None, "{framing}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_chunked_body_past_the_buffer_limit_streams_with_what_was_read_in_front() {
    let (node, record) = support::recording_upstream().await;
    let gateway = gateway_for(node, "[limits]\nbuffer_body_bytes = \"1KiB\"\n").await;
    let body: Vec<u8> = (0..5000).map(|i| (i % 251) as u8).collect();
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = "POST /repository/repository_ajax.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
                transfer-encoding: chunked\r\n\r\n";
    conn.send(head.as_bytes()).await.unwrap();
    for part in body.chunks(700) {
        let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
        chunk.extend_from_slice(part);
        chunk.extend_from_slice(b"\r\n");
        conn.send(&chunk).await.unwrap();
    }
    conn.send(b"0\r\n\r\n").await.unwrap();
    assert_eq!(conn.response(WAIT, false).await.unwrap().status, 200);
    let received = record.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body.clone().unwrap().unwrap(), body);
    assert_eq!(header(&received[0], "content-length"), None);
}

/// Sends a 10 MB upload in 1 KiB pieces `gap` apart until the gateway answers.
async fn crawl(gateway: &TestGateway, gap: Duration) -> support::RawResponse {
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = "POST /backup/restorefile.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
                content-length: 10000000\r\n\r\n";
    conn.send(head.as_bytes()).await.unwrap();
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            if conn.send(&[b'x'; 1024]).await.is_err() {
                break;
            }
            // A response (or a close) while sending: read it.
            match tokio::time::timeout(gap, conn.response(gap, false)).await {
                Ok(Ok(response)) => return response,
                Ok(Err(_)) | Err(_) => continue,
            }
        }
        conn.response(WAIT, false).await.unwrap()
    });
    answer.await.expect("the gateway answered the slow upload")
}

#[tokio::test]
async fn a_large_upload_slower_than_the_minimum_rate_is_answered_408() {
    let (node, record) = support::recording_upstream().await;
    let rules = "[timeouts]\nupload_min_rate = \"64KiB\"\nupload_rate_window = \"1s\"\n";
    let gateway = gateway_for(node, rules).await;
    // About 10 KiB/s, a sixth of the floor.
    let response = crawl(&gateway, Duration::from_millis(100)).await;
    assert_eq!(response.status, 408);
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        "request timeout: the upload arrived too slowly\n"
    );
    assert_eq!(response.header("connection"), Some("close"));
    // It streamed (too large to buffer), and the node saw it cut short.
    let received = record.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
}

#[tokio::test]
async fn a_large_upload_past_the_total_deadline_is_answered_408() {
    let (node, _record) = support::recording_upstream().await;
    let rules = "[timeouts]\nupload_min_rate = \"0\"\nupload = \"1s\"\n";
    let gateway = gateway_for(node, rules).await;
    let response = crawl(&gateway, Duration::from_millis(50)).await;
    assert_eq!(response.status, 408);
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        "request timeout: the upload took too long\n"
    );
}
