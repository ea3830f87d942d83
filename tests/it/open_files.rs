//! The gateway at its own open-file limit: the real binary under `prlimit`, every
//! descriptor it may hold taken by idle students. A request that needs a node
//! connection then gets the gateway's own 503, and no node, nor the data server, is
//! blamed for it: once the students leave, every upstream is still up and serves.
//!
//! Why: at the limit `connect` fails with `EMFILE` for every upstream at once.
//! Counting that against the nodes takes a healthy cluster down, which with
//! node-local sessions moves (logs out) every student.

use std::time::{Duration, Instant};

use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::error::GatewayError;
use serde_json::Value;

use crate::support::{self, GatewayProcess, RawConn};

const TOKEN: &str = "open-files-admin-token-0123456789";
/// Soft and hard limit alike: the gateway cannot raise it. Far above what it holds
/// idle (stdio, listeners, runtime), far below what the test process may open.
const LIMIT: usize = 64;
const WITHIN: Duration = Duration::from_secs(10);

/// Descriptors the process holds now below `LIMIT`: the limit bounds descriptor
/// *numbers*, and one inherited above it (a pipe of the test harness) takes no slot.
fn open_fds(gateway: &GatewayProcess) -> usize {
    let dir = format!("/proc/{}/fd", gateway.child.id());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<usize>().ok())
        .filter(|&fd| fd < LIMIT)
        .count()
}

/// Polls until `done` holds, for at most `WITHIN`.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WITHIN, "{what} not within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Idle student connections, each one accepted, until the gateway holds exactly
/// `LIMIT` descriptors: it has none left for a node connection.
async fn exhaust(gateway: &GatewayProcess) -> Vec<RawConn> {
    let mut idle = Vec::new();
    while open_fds(gateway) < LIMIT {
        assert!(
            idle.len() < LIMIT,
            "{} connections and still free fds",
            idle.len()
        );
        let before = open_fds(gateway);
        idle.push(RawConn::connect(gateway.addr).await);
        until("the connection accepted", || open_fds(gateway) > before).await;
    }
    assert_eq!(open_fds(gateway), LIMIT);
    idle
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: moodle.example.edu\r\n\r\n").into_bytes()
}

async fn health(gateway: &GatewayProcess) -> Vec<(String, String)> {
    let url = format!("http://{}/nodes", gateway.admin_addr.unwrap());
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, "GET", &[("authorization", &auth)], "").await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    let body: Value = serde_json::from_slice(&seen.body).unwrap();
    let rows = body["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .chain([&body["data"]]);
    rows.map(|row| (row["name"].to_string(), row["health"].to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_open_file_limit_the_gateway_answers_503_itself_and_blames_no_node() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    // One failure would take an upstream down; no probe runs during the test; idle
    // connections stay open; no state file is written.
    let extra = "health.interval = \"1h\"\nhealth.fall = 1\n\
                 timeouts.request_headers = \"120s\"\nstate.file = \"\"\n";
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    let gateway = support::start_binary_with_open_files(&config, LIMIT);

    let mut idle = exhaust(&gateway).await;
    let own = GatewayError::OutOfConnections.message();
    for (conn, path) in idle.iter_mut().zip([
        "/course/view.php?id=2",
        // A SCORM file: the data server's connection fails the same way.
        "/pluginfile.php/27/mod_scorm/content/1/index.html",
    ]) {
        conn.send(&get(path)).await.unwrap();
        let answer = conn.response(WITHIN, false).await.unwrap();
        assert_eq!(answer.status, 503, "{path}: {answer:?}");
        assert_eq!(String::from_utf8_lossy(&answer.body), own, "{path}");
    }

    drop(idle);
    until("the idle connections closed", || {
        open_fds(&gateway) < LIMIT / 2
    })
    .await;
    for (name, health) in health(&gateway).await {
        assert_eq!(
            health, "\"up\"",
            "{name} was blamed for the gateway's limit"
        );
    }
    let page = support::get(&format!("http://{}/login/index.php", gateway.addr)).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let scorm = format!(
        "http://{}/pluginfile.php/27/mod_scorm/content/1/index.html",
        gateway.addr
    );
    assert_eq!(support::get(&scorm).await.upstream(), Some("data"));
}

/// At the limit, connections wait in the listener's queue and `accept` fails with
/// `EMFILE` every 50 ms for as long as they do: the log says so once per interval,
/// not twenty times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_failing_at_the_limit_is_logged_once_per_interval_not_per_try() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let extra =
        "health.interval = \"1h\"\ntimeouts.request_headers = \"120s\"\nstate.file = \"\"\n";
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    let gateway = support::start_binary_with_open_files(&config, LIMIT);
    let idle = exhaust(&gateway).await;
    // Queued, never accepted while the others stay: each try fails.
    let mut queued = Vec::new();
    for _ in 0..4 {
        queued.push(tokio::net::TcpStream::connect(gateway.addr).await.unwrap());
    }
    until("accept fails", || {
        !gateway.logged("accept failed").is_empty()
    })
    .await;
    // Some thirty failed tries.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lines = gateway.logged("accept failed");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    drop((idle, queued));
}

/// A reload that adds nodes needs more descriptors (each upstream keeps up to 256
/// idle connections): the gateway raises its soft limit again then, as at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_nodes_raises_the_open_file_limit_again() {
    let mut cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let extra = "limits.max_connections = 100\nhealth.interval = \"1h\"\nstate.file = \"\"\n";
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    let gateway = support::start_binary_with_nofile(&config, 512, 8192);
    let soft = || {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", gateway.child.id()));
        let limits = limits.unwrap_or_default();
        let line = limits.lines().find(|l| l.starts_with("Max open files"));
        let soft = line.and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok());
        soft.unwrap_or(0)
    };
    // 2 × 100 connections + 257 × (1 node + the data server) + 2 × 1024 pipes + 64.
    assert_eq!(soft(), 2826, "raised at start");
    cluster.add_node("web2").unwrap();
    cluster.add_node("web3").unwrap();
    let bigger = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    std::fs::write(gateway.dir().join("config.toml"), bigger).unwrap();
    gateway.signal("HUP");
    until("the limit raised for four upstreams", || soft() == 3340).await;
}
