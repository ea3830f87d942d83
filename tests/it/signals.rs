//! Signals to the real binary: SIGTERM stops new connections, lets the request in
//! flight finish (up to `timeouts.shutdown`), writes the state file and exits 0;
//! SIGHUP re-reads the config file.

use std::time::Duration;

use axum::body::Body;
use http::Response;
use http_body_util::BodyExt;

use crate::support::{self, config_for, start_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_writes_the_state_and_exits_zero() {
    let node = support::upstream(|_request| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Response::new(Body::from("slow page, complete"))
    })
    .await;
    let data = support::named_upstream("data").await;
    let mut gateway = start_binary(&config_for(&[node], data, ""));
    let url = format!("http://{}/course/view.php?id=2", gateway.addr);

    let in_flight = tokio::spawn(async move {
        let response = support::client().get(url.parse().unwrap()).await.unwrap();
        let status = response.status();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.signal("TERM");

    let (status, body) = in_flight.await.unwrap();
    assert_eq!(
        (status.as_u16(), &body[..]),
        (200, &b"slow page, complete"[..])
    );
    let exit = gateway.exit_within(Duration::from_secs(10)).await;
    assert!(exit.success(), "exit status {exit}");
    assert!(
        tokio::net::TcpStream::connect(gateway.addr).await.is_err(),
        "nothing listens after shutdown"
    );
    let state = gateway.dir().join("moodle-gateway.state");
    assert!(
        state.exists(),
        "the default state file is in the working directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_slower_than_the_shutdown_grace_does_not_keep_the_gateway_alive() {
    let node = support::upstream(|_request| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Response::new(Body::from("never seen"))
    })
    .await;
    let data = support::named_upstream("data").await;
    let config = config_for(&[node], data, "[timeouts]\nshutdown = \"1s\"\n");
    let mut gateway = start_binary(&config);
    let url = format!("http://{}/course/view.php?id=2", gateway.addr);
    let in_flight = tokio::spawn(async move { support::client().get(url.parse().unwrap()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.signal("TERM");
    let exit = gateway.exit_within(Duration::from_secs(20)).await;
    assert!(exit.success(), "exit status {exit}");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the request was cut at the grace"
    );
}

/// A student's browser keeps its connection open between pages. At SIGTERM such an
/// idle connection is closed at once: it holds no request, so the gateway does not
/// wait the grace for it (the connection is told to stop by a wake of its own, not
/// by polling the listener's state at every request), whether it has just been
/// answered or has been parked while its student reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_sigterm_without_waiting_the_grace() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = support::upstream(|_request| async { Response::new(Body::from("page")) }).await;
    let data = support::named_upstream("data").await;
    let extra = "[timeouts]\nshutdown = \"60s\"\nrequest_headers = \"60s\"\n";
    let mut gateway = start_binary(&config_for(&[node], data, extra));
    let request = b"GET /course/view.php?id=2 HTTP/1.1\r\nHost: moodle.test\r\n\r\n";
    let pages = |mut browser: tokio::net::TcpStream, n| async move {
        for _ in 0..n {
            browser.write_all(request).await.unwrap();
            let mut answer = Vec::new();
            while !answer.ends_with(b"page") {
                let mut chunk = [0; 1024];
                let read = browser.read(&mut chunk).await.unwrap();
                assert!(read > 0, "the gateway closed the connection between pages");
                answer.extend_from_slice(&chunk[..read]);
            }
            assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        }
        browser
    };
    let connect = || tokio::net::TcpStream::connect(gateway.addr);
    // One student has been reading a page for longer than a connection takes to
    // park; the other has just had their third.
    let reading = pages(connect().await.unwrap(), 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let browser = pages(connect().await.unwrap(), 3).await;
    gateway.signal("TERM");
    for (who, mut connection) in [("reading", reading), ("just answered", browser)] {
        let mut rest = [0; 64];
        let closed = tokio::time::timeout(Duration::from_secs(5), connection.read(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "the idle connection ({who}) was closed at once: {closed:?}"
        );
    }
    let exit = gateway.exit_within(Duration::from_secs(5)).await;
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_config_file() {
    let (old, new) = (
        support::named_upstream("old").await,
        support::named_upstream("new").await,
    );
    let data = support::named_upstream("data").await;
    let gateway = start_binary(&config_for(&[old], data, ""));
    let url = format!("http://{}/login/index.php", gateway.addr);
    assert_eq!(support::get(&url).await.upstream(), Some("old"));
    std::fs::write(
        gateway.dir().join("config.toml"),
        config_for(&[new], data, ""),
    )
    .unwrap();
    gateway.signal("HUP");
    for _ in 0..100 {
        if support::get(&url).await.upstream() == Some("new") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway never sent a request to the node of the new config");
}

/// logrotate moves the access log away and sends SIGHUP: the old file keeps what was
/// written before, and the lines after go to a new file at the configured path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reopens_the_access_log_that_logrotate_moved_away() {
    let node = support::named_upstream("web1").await;
    let data = support::named_upstream("data").await;
    let extra = "[access_log]\nto = \"access.log\"\n";
    let gateway = start_binary(&config_for(&[node], data, extra));
    let (log, rotated) = (
        gateway.dir().join("access.log"),
        gateway.dir().join("access.log.1"),
    );
    let addr = gateway.addr;
    let page = |path: &'static str| async move {
        support::get(&format!("http://{addr}{path}")).await.status
    };
    assert_eq!(page("/before-rotation").await, 200);
    support::lines_of(&log, 1).await;

    std::fs::rename(&log, &rotated).unwrap();
    gateway.signal("HUP");
    // The reopen happens on the writer's next turn: a few requests make sure of it.
    let mut attempts = 0;
    while !log.exists() {
        assert!(attempts < 100, "no new access.log after SIGHUP");
        assert_eq!(page("/after-rotation").await, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
        attempts += 1;
    }
    let new = support::lines_of(&log, 1).await;
    assert!(new.iter().all(|l| l.contains("/after-rotation")), "{new:?}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("/before-rotation"), "{old}");
}
