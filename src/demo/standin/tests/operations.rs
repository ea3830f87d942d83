//! Tests of the operations switches: a node that dies and comes back, maintenance, a
//! hung node, and nodes added to the cluster at run time.

use std::time::Duration;

use http::header::SET_COOKIE;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{browser, log_in};
use crate::demo::standin::{Cluster, StandIn};
use crate::demo::Browser;

/// Waits up to a second for `done`, so tests do not race the stand-in's tasks.
async fn eventually(done: impl Fn() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still not done after a second");
}

/// One request on a fresh socket, the raw response read to the end: the status line
/// as sent, reason phrase included.
async fn raw_get(node: &StandIn, path: &str) -> String {
    let mut socket = TcpStream::connect(node.addr()).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: lms\r\nConnection: close\r\n\r\n");
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    socket.read_to_string(&mut raw).await.unwrap();
    raw
}

#[tokio::test]
async fn a_restarted_node_serves_its_old_sessions_on_the_same_port() {
    let cluster = Cluster::spawn(1, "/moodle", "MoodleSession").unwrap();
    let node = &cluster.nodes()[0];
    let addr = node.addr();
    let user = log_in(&mut browser(&cluster, 0)).await.1.issued.unwrap();
    node.stop();
    node.stop();
    assert!(!node.is_running());
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the port is closed"
    );
    node.restart().unwrap();
    node.restart().unwrap();
    assert!(node.is_running());
    assert_eq!(node.addr(), addr);
    let mut back = browser(&cluster, 0);
    back.set_session(Some(user));
    let page = back.get("/my/").await.unwrap();
    assert_eq!(page.text().lines().next(), Some("Hello ann from web1"));
    assert_eq!((page.issued, cluster.lost_sessions()), (None, 0));
    assert_eq!(node.sessions(), 1);
    node.stop();
    node.restart().unwrap();
    // A fresh connection: `back`'s pooled one died with the old run, as with a real node.
    assert!(raw_get(node, "/moodle/").await.starts_with("HTTP/1.1 200 "));
}

#[tokio::test]
async fn maintenance_answers_everything_like_climaintenance() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let node = &cluster.nodes()[0];
    node.set_maintenance(true);
    let mut b = browser(&cluster, 0);
    let scripted = [("x-standin-status", "200")];
    for path in ["/my/", "/login/index.php", "/admin/tool/heartbeat/"] {
        let reply = b.send(Method::GET, path, None, &scripted).await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(reply.header("retry-after"), "300");
        assert!(reply.text().contains("Moodle under maintenance"));
        assert_eq!(reply.upstream(), "web1");
        assert!(reply.headers.get(SET_COOKIE).is_none());
    }
    let raw = raw_get(node, "/").await;
    assert!(
        raw.starts_with("HTTP/1.1 503 Moodle under maintenance\r\n"),
        "{raw}"
    );
    assert_eq!((node.request_count(), node.sessions()), (4, 0));
    node.set_maintenance(false);
    let reply = b.get("/login/index.php").await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.issued.is_some());
}

#[tokio::test]
async fn site_maintenance_covers_every_stand_in() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    cluster.set_maintenance(true);
    for standin in cluster.nodes().iter().chain([cluster.data()]) {
        assert!(raw_get(standin, "/").await.starts_with("HTTP/1.1 503 "));
    }
    cluster.set_maintenance(false);
    assert!(raw_get(&cluster.nodes()[1], "/")
        .await
        .starts_with("HTTP/1.1 200 "));
}

#[tokio::test]
async fn a_hung_node_reads_requests_and_answers_once_released() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let node = &cluster.nodes()[0];
    node.set_hang(true);
    let mut probe = browser(&cluster, 0);
    let answer = tokio::time::timeout(
        Duration::from_millis(300),
        probe.get("/admin/tool/heartbeat/"),
    )
    .await;
    assert!(answer.is_err(), "a hung node answered: {answer:?}");
    assert_eq!(node.request_count(), 1, "the request was read and recorded");
    let mut patient = browser(&cluster, 0);
    let hung = tokio::spawn(async move { patient.get("/course/view.php").await });
    eventually(|| node.request_count() == 2).await;
    assert!(!hung.is_finished());
    node.set_hang(false);
    assert!(hung.await.unwrap().unwrap().sent_to_login(), "released");
    let alive = probe.get("/admin/tool/heartbeat/").await.unwrap();
    assert_eq!(alive.text(), "Server is ALIVE\n");
}

#[tokio::test]
async fn stopping_a_hung_node_cuts_its_requests() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let node = &cluster.nodes()[0];
    node.set_hang(true);
    let mut b = browser(&cluster, 0);
    let hung = tokio::spawn(async move { b.get("/").await });
    eventually(|| node.request_count() == 1).await;
    node.stop();
    assert!(hung.await.unwrap().is_err());
}

#[tokio::test]
async fn an_added_node_joins_the_cluster_and_its_config() {
    let mut cluster = Cluster::spawn(2, "/moodle", "MoodleSession").unwrap();
    let web3 = cluster.add_node("web3").unwrap();
    let (name, addr) = (web3.name().to_owned(), web3.addr());
    assert_eq!(name, "web3");
    let err = cluster.add_node("web1").err().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(cluster.add_node("data").is_err());
    let block = cluster.node_toml("web3").unwrap();
    assert_eq!(
        block,
        format!("[[nodes]]\nname = \"web3\"\nurl = \"http://{addr}\"\n")
    );
    assert_eq!(cluster.node_toml("data"), None);
    assert_eq!(cluster.node_toml("web9"), None);
    let toml = cluster.config_toml("127.0.0.1:0", None, "");
    assert_eq!(node_names(&toml), ["web1", "web2", "web3"]);
    let without_web2 = toml.replace(&cluster.node_toml("web2").unwrap(), "");
    assert_eq!(node_names(&without_web2), ["web1", "web3"]);
    // The new node shares the cluster's sessions table, so misrouting to it counts.
    let mut on_web3 = Browser::new(addr, "/moodle", "MoodleSession");
    let user = log_in(&mut on_web3).await.1.issued.unwrap();
    assert_eq!(cluster.registry().owner(&user).as_deref(), Some("web3"));
    let mut on_web1 = browser(&cluster, 0);
    on_web1.set_session(Some(user));
    assert!(on_web1.get("/my/").await.unwrap().sent_to_login());
    assert_eq!(cluster.lost_sessions(), 1);
}

fn node_names(toml: &str) -> Vec<String> {
    let config = crate::Config::parse(toml, std::path::Path::new("."), Default::default()).unwrap();
    config.nodes.into_iter().map(|n| n.name).collect()
}
