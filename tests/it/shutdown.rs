//! Graceful shutdown of the real binary: SIGTERM stops new connections, lets the
//! request in flight finish, and exits 0 (what systemd and the benchmark send).

use std::time::{Duration, Instant};

use axum::body::Body;
use http::Response;
use http_body_util::BodyExt;

use crate::support::{self, config_for, start_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_and_exits_zero() {
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
    let pid = gateway.child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());

    let (status, body) = in_flight.await.unwrap();
    assert_eq!(
        (status.as_u16(), &body[..]),
        (200, &b"slow page, complete"[..])
    );
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = gateway.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "exit status {exit}");
    assert!(
        tokio::net::TcpStream::connect(gateway.addr).await.is_err(),
        "nothing listens after shutdown"
    );
}
