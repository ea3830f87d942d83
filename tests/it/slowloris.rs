//! Clients that hold connections instead of using them: hundreds trickling a request
//! head a byte at a time, an idle keep-alive connection (kept for `keep_alive`, its
//! next head then held to `request_headers`), and more connections than
//! `limits.max_connections` allows. None of them may keep a student's request from
//! being answered, and each is closed by the gateway, not left to the client.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, config_for, named_upstream, AfterwardsRaw, RawConn, TestGateway};

const SLOW_CLIENTS: usize = 300;
/// A normal student's patience; no other timing is asserted for them.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

async fn gateway(extra: &str) -> TestGateway {
    let node = named_upstream("web1").await;
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

/// Sends a request head one header byte every 300 ms; returns how long the gateway
/// let it do so before closing, or `None` if it was still open after `give_up`.
async fn trickle(addr: std::net::SocketAddr, give_up: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
    let mut header = b"X-Slow: ".iter().chain(std::iter::repeat(&b'a'));
    let mut buf = [0u8; 1024];
    while started.elapsed() < give_up {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                // A 408 before closing is fine; keep reading until the close.
                Ok(n) if n > 0 => continue,
                _ => return Some(started.elapsed()),
            },
            () = tokio::time::sleep(Duration::from_millis(300)) => {
                let byte = [*header.next().unwrap()];
                if stream.write_all(&byte).await.is_err() {
                    return Some(started.elapsed());
                }
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_heads_are_cut_off_while_students_are_served() {
    let gateway = gateway("timeouts.request_headers = \"1s\"").await;
    let slow: Vec<_> = (0..SLOW_CLIENTS)
        .map(|_| tokio::spawn(trickle(gateway.addr, Duration::from_secs(4))))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        let seen = tokio::time::timeout(
            CLIENT_TIMEOUT,
            support::get(&gateway.url("/course/view.php")),
        )
        .await
        .unwrap_or_else(|_| panic!("request {i} was not answered within {CLIENT_TIMEOUT:?}"));
        assert_eq!(seen.status, 200, "request {i}");
    }
    let mut still_open = 0;
    for task in slow {
        if task.await.unwrap().is_none() {
            still_open += 1;
        }
    }
    assert_eq!(
        still_open, 0,
        "slow connections the gateway left open after 4 s"
    );
}

/// A connection that has been answered a request, and the instant the answer was in.
async fn answered(gateway: &TestGateway) -> (RawConn, Instant) {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(b"GET /course/view.php HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let response = conn.response(CLIENT_TIMEOUT, false).await.unwrap();
    assert_eq!(response.status, 200);
    (conn, Instant::now())
}

/// How long after `since` the gateway closed `conn`, which sends nothing meanwhile;
/// panics if it is still open `limit` after `since`.
async fn closed_after(conn: &mut RawConn, since: Instant, limit: Duration) -> Duration {
    let left = limit.saturating_sub(since.elapsed());
    match conn.afterwards(left).await {
        AfterwardsRaw::Closed => since.elapsed(),
        other => panic!("after {:?}: {other:?}, not closed", since.elapsed()),
    }
}

#[tokio::test]
async fn a_connection_idle_for_less_than_keep_alive_is_reused_and_one_idle_past_it_is_closed() {
    let gateway = gateway("timeouts.request_headers = \"1s\"\ntimeouts.keep_alive = \"3s\"").await;
    let (mut conn, _) = answered(&gateway).await;
    // Idle past request_headers, as a student reading a page: still open, and it
    // carries the next click.
    assert_eq!(
        conn.afterwards(Duration::from_millis(1800)).await,
        AfterwardsRaw::Open
    );
    conn.send(b"GET /course/view.php HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let again = conn.response(CLIENT_TIMEOUT, false).await.unwrap();
    assert_eq!(again.status, 200);
    // Idle past keep_alive (3 s) after that: closed, not before, with room to spare
    // both ways.
    let closed = closed_after(&mut conn, Instant::now(), Duration::from_secs(10)).await;
    assert!(
        closed >= Duration::from_millis(2500),
        "closed after {closed:?}"
    );
}

#[tokio::test]
async fn a_head_trickled_on_a_kept_connection_is_cut_at_request_headers_from_its_first_byte() {
    let gateway = gateway("timeouts.request_headers = \"1s\"\ntimeouts.keep_alive = \"20s\"").await;
    let (mut conn, _) = answered(&gateway).await;
    // Idle first, longer than request_headers: that time does not count against
    // the head.
    assert_eq!(
        conn.afterwards(Duration::from_millis(1500)).await,
        AfterwardsRaw::Open
    );
    let first_byte = Instant::now();
    let trickled = async {
        for byte in b"GET /course/view.php HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if conn.send(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // The writes go on until one fails after the close; at most keep_alive's 20 s.
    let _ = tokio::time::timeout(Duration::from_secs(15), trickled).await;
    let cut = first_byte.elapsed();
    // Cut about request_headers (1 s) after the first byte: neither at once nor
    // as late as keep_alive. A write fails a round trip or two after the close.
    assert!(cut >= Duration::from_millis(800), "cut after {cut:?}");
    assert!(cut < Duration::from_secs(10), "cut after {cut:?}");
}

#[tokio::test]
async fn a_new_connection_that_sends_nothing_gets_request_headers_not_keep_alive() {
    let gateway = gateway("timeouts.request_headers = \"1s\"\ntimeouts.keep_alive = \"20s\"").await;
    let opened = Instant::now();
    let mut conn = RawConn::connect(gateway.addr).await;
    let closed = closed_after(&mut conn, opened, Duration::from_secs(10)).await;
    assert!(
        closed >= Duration::from_millis(800),
        "closed after {closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_over_max_connections_gets_503_with_retry_after() {
    let gateway = gateway("limits.max_connections = 50").await;
    let request = b"GET /course/view.php HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = Vec::new();
    for i in 0..50 {
        let mut conn = RawConn::connect(gateway.addr).await;
        conn.send(request).await.unwrap();
        let status = conn.response(CLIENT_TIMEOUT, false).await.unwrap().status;
        assert_eq!(status, 200, "connection {i}");
        held.push(conn);
    }
    let mut over = RawConn::connect(gateway.addr).await;
    let _ = over.send(request).await;
    let refused = over
        .response(CLIENT_TIMEOUT, false)
        .await
        .expect("a 503, not a bare close");
    assert_eq!(refused.status, 503);
    // One story: the page says what Retry-After says.
    let wait = refused.header("retry-after").expect("Retry-After");
    let page = String::from_utf8_lossy(&refused.body);
    assert!(page.contains(&format!("in {wait} seconds")), "{page}");
    assert_eq!(
        over.afterwards(Duration::from_secs(1)).await,
        AfterwardsRaw::Closed
    );
    // The 50 held connections were neither dropped nor starved.
    for (i, conn) in held.iter_mut().enumerate() {
        conn.send(request).await.unwrap();
        let status = conn.response(CLIENT_TIMEOUT, false).await.unwrap().status;
        assert_eq!(status, 200, "held connection {i}");
    }
}
