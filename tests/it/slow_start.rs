//! Slow start over real sockets: a node an admin brings back from a drain gets a
//! share of new visitors that grows over `[session] slow_start`, while a student
//! already bound to it stays on it throughout.
//!
//! The deals are counted in stretches of time after the undrain: the assertion is on
//! their order (fewer early, more later, half once the window is over), with bounds
//! wide enough that a slow machine, which deals fewer visitors per stretch, still
//! passes. Nothing is asserted about how fast anything was.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use serde_json::Value;

use crate::support::{self, logged_in, TestGateway};

const TOKEN: &str = "slow-start-admin-token-0123456789abc";
const WINDOW: Duration = Duration::from_secs(2);

async fn admin(addr: SocketAddr, method: &str, path: &str) -> support::Seen {
    let url = format!("http://{addr}{path}");
    let auth = format!("Bearer {TOKEN}");
    support::send(&url, method, &[("authorization", &auth)], Body::empty()).await
}

/// web1's slow-start share as `/metrics` shows it.
async fn scraped_share(addr: SocketAddr) -> f64 {
    let text = admin(addr, "GET", "/metrics").await.text();
    let line = text
        .lines()
        .find(|l| l.starts_with(r#"moodle_gateway_node_slow_start_share{node="web1"}"#))
        .unwrap_or_else(|| panic!("no share for web1 in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The node a new visitor is dealt.
async fn new_visitor(addr: SocketAddr) -> String {
    let mut visitor = Browser::new(addr, "", "MoodleSession");
    let reply = visitor.get("/login/index.php").await.unwrap();
    assert_eq!(reply.status, 200);
    reply.upstream().to_owned()
}

/// web1's part of the visitors dealt in one stretch of time.
#[derive(Debug, Default)]
struct Stretch {
    web1: usize,
    all: usize,
}

impl Stretch {
    fn share(&self) -> f64 {
        self.web1 as f64 / self.all.max(1) as f64
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_a_drain_gets_a_growing_share_of_newcomers_and_keeps_its_students() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let extra = format!("session.slow_start = \"{}s\"", WINDOW.as_secs());
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), &extra);
    let gateway = TestGateway::start(&config).await;
    let admin_addr = gateway.admin_addr.unwrap();

    // A student logged in on web1 before the drain.
    let mut student = loop {
        let (student, node) = logged_in(&gateway, 1).await;
        if node == "web1" {
            break student;
        }
    };
    let drained = admin(admin_addr, "POST", "/nodes/web1/drain").await;
    assert_eq!(drained.status, 200);
    for _ in 0..4 {
        assert_eq!(new_visitor(gateway.addr).await, "web2", "web1 is draining");
    }
    assert_eq!(
        scraped_share(admin_addr).await,
        1.0,
        "a drained node is not warming"
    );

    let back = Instant::now();
    let undrained = admin(admin_addr, "POST", "/nodes/web1/undrain").await;
    assert_eq!(undrained.status, 200);
    let row: Value = serde_json::from_slice(&undrained.body).unwrap();
    let warming = row["warming"].as_f64().expect("the row says it is warming");
    assert!((0.1..1.0).contains(&warming), "{row}");
    assert!(scraped_share(admin_addr).await < 1.0);

    // Newcomers in three stretches: the window's first half, its second half, and
    // a stretch after it. The student goes on working on web1 all along.
    let half = WINDOW / 2;
    let mut stretches: [Stretch; 3] = Default::default();
    loop {
        let at = back.elapsed();
        let index = match at {
            at if at < half => 0,
            at if at < WINDOW => 1,
            // A margin for the gateway's coarse clock and the undrain's own time.
            at if at < WINDOW + Duration::from_millis(200) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            at if at < WINDOW * 2 => 2,
            _ => break,
        };
        let node = new_visitor(gateway.addr).await;
        stretches[index].all += 1;
        stretches[index].web1 += usize::from(node == "web1");
        let page = student.get("/my/").await.unwrap();
        assert_eq!(page.upstream(), "web1", "the student stays on web1");
    }

    let [first, second, after] = &stretches;
    assert!(
        first.web1 > 0,
        "some newcomers from the start: {stretches:?}"
    );
    assert!(
        first.share() < second.share() && first.share() < after.share(),
        "web1's share grows: {stretches:?}"
    );
    assert!(
        first.share() < 0.4,
        "at most a third in the first half (its share is at most half): {stretches:?}"
    );
    assert!(
        (0.4..=0.6).contains(&after.share()),
        "half once the window is over: {stretches:?}"
    );
    assert_eq!(scraped_share(admin_addr).await, 1.0);
    let nodes: Value = serde_json::from_slice(&admin(admin_addr, "GET", "/nodes").await.body)
        .expect("GET /nodes is JSON");
    assert!(nodes["nodes"][0].get("warming").is_none(), "{nodes}");
}
