//! The real binary as systemd runs a `Type=notify` unit (debian/moodle-gateway.service):
//! it says READY=1 only once its listeners are bound, RELOADING=1 then READY=1 around
//! a SIGHUP, and STOPPING=1 at SIGTERM. The test plays systemd's part: a datagram
//! socket named by `NOTIFY_SOCKET`.

use std::time::Duration;

use tokio::net::UnixDatagram;

use crate::support::{self, config_for, start_binary_notifying};

/// What the gateway sent next, one datagram. Waited for up to 30 s: a bound on a
/// hang, not a speed (a build at full load once kept a notice past 10 s).
async fn next(socket: &UnixDatagram) -> String {
    let mut buf = vec![0u8; 4096];
    let wait = tokio::time::timeout(Duration::from_secs(30), socket.recv(&mut buf));
    let len = wait.await.expect("a notice within 30 s").unwrap();
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_once_listening_reloading_around_sighup_and_stopping() {
    let dir = std::env::temp_dir().join(format!("mg-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let node = support::named_upstream("web1").await;
    let data = support::named_upstream("data").await;
    let mut gateway = start_binary_notifying(&config_for(&[node], data, ""), &path);

    let ready = next(&socket).await;
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    let status = format!("STATUS=students on {}", gateway.addr);
    assert!(ready.lines().any(|l| l == status), "{ready}");
    // READY means bound: a student is served straight away.
    let page = support::get(&format!("http://{}/login/index.php", gateway.addr)).await;
    assert_eq!((page.status.as_u16(), page.upstream()), (200, Some("web1")));

    gateway.signal("HUP");
    let reloading = next(&socket).await;
    assert!(reloading.starts_with("RELOADING=1\n"), "{reloading}");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    assert_eq!(next(&socket).await, "READY=1\n", "the reload is done");

    gateway.signal("TERM");
    assert_eq!(next(&socket).await, "STOPPING=1\n");
    let exit = gateway.exit_within(Duration::from_secs(10)).await;
    assert!(exit.success(), "exit status {exit}");
    let _ = std::fs::remove_dir_all(&dir);
}
