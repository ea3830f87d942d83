//! Sessions across many students: the even deal, expiry, the table's bound, cookie
//! floods, and the admin API over its own socket.

use std::time::Duration;

use axum::body::Body;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::{simulate_students, Browser};

use crate::support::{self, TestGateway};

const TOKEN: &str = "integration-admin-token-0123456789";

async fn cluster_and_gateway(extra: &str) -> (Cluster, TestGateway) {
    let cluster = Cluster::spawn(4, "", "MoodleSession").unwrap();
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    let gateway = TestGateway::start(&config).await;
    (cluster, gateway)
}

/// Drives `count` simulated students (at most `concurrency` at once) through login,
/// browsing, SCORM and logout; checks nobody lost a session; returns how many logged
/// in on each node.
async fn students_per_node(count: usize, concurrency: usize) -> Vec<usize> {
    let (cluster, gateway) = cluster_and_gateway("").await;
    let report = simulate_students(gateway.addr, "", "MoodleSession", count, concurrency).await;
    let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    assert!(report.ok(), "failures: {failures:?}");
    assert_eq!(
        cluster.lost_sessions(),
        0,
        "a request reached a node without its session"
    );
    let per_node: Vec<usize> = report.logged_in.values().copied().collect();
    assert_eq!(per_node.iter().sum::<usize>(), count);
    per_node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_students_one_after_another_are_dealt_evenly_and_none_loses_a_session() {
    let per_node = students_per_node(40, 1).await;
    let (min, max) = (
        per_node.iter().min().unwrap(),
        per_node.iter().max().unwrap(),
    );
    assert!(max - min <= 1, "logged-in per node: {per_node:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_students_arriving_together_are_dealt_within_fifteen_percent() {
    // The target is ±15 % of the mean; an atomic deal gives every node exactly 8
    // (each student is dealt once, at the first visit, however arrivals interleave).
    let per_node = students_per_node(32, 32).await;
    assert_eq!(per_node, [8, 8, 8, 8], "logged-in per node");
}

#[tokio::test]
async fn an_idle_anonymous_session_expires_and_its_visitor_is_dealt_again() {
    let (cluster, gateway) = cluster_and_gateway("session.anonymous_idle = \"30m\"").await;
    let mut student = Browser::new(gateway.addr, "", "MoodleSession");
    let first = student.get("/login/index.php").await.unwrap();
    assert_eq!(first.upstream(), "web1");
    let table = gateway.app.gateway().table();
    assert_eq!(table.len(), 1);

    table.clock().advance(Duration::from_secs(29 * 60));
    assert_eq!(
        student.get("/login/index.php").await.unwrap().upstream(),
        "web1",
        "29 min idle: still bound"
    );
    table.clock().advance(Duration::from_secs(31 * 60));
    assert_eq!(table.sweep(), 1, "31 min idle: the sweeper removes it");
    assert!(table.is_empty());
    // Moodle's node would have expired the guest session too; the visitor starts over.
    assert_eq!(
        student.get("/login/index.php").await.unwrap().upstream(),
        "web2"
    );
    drop(cluster);
}

#[tokio::test]
async fn a_logged_in_session_outlives_the_anonymous_limit() {
    let (_cluster, gateway) = cluster_and_gateway("session.anonymous_idle = \"30m\"").await;
    let mut student = Browser::new(gateway.addr, "", "MoodleSession");
    let form = student.get("/login/index.php").await.unwrap();
    let token = form.text().split("logintoken=").nth(1).unwrap()[..32].to_owned();
    let login = student
        .post(
            "/login/index.php",
            &format!("username=ana&password=x&logintoken={token}"),
        )
        .await
        .unwrap();
    assert_eq!(login.status, 303);
    let table = gateway.app.gateway().table();
    table.clock().advance(Duration::from_secs(4 * 3600));
    assert_eq!(table.sweep(), 0);
    let page = student.get("/my/").await.unwrap();
    assert_eq!((page.status.as_u16(), page.upstream()), (200, "web1"));
    assert!(page.text().contains("Hello ana"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_stays_within_max_sessions_and_sheds_guests_before_students() {
    let (cluster, gateway) = cluster_and_gateway("session.max_sessions = 100").await;
    let students = simulate_students(gateway.addr, "", "MoodleSession", 20, 4).await;
    assert!(students.ok());
    // Those 20 logged out: their sessions are anonymous now. Log 10 more in and keep them.
    let mut kept = Vec::new();
    for _ in 0..10 {
        let mut browser = Browser::new(gateway.addr, "", "MoodleSession");
        let form = browser.get("/login/index.php").await.unwrap();
        let token = form.text().split("logintoken=").nth(1).unwrap()[..32].to_owned();
        browser
            .post(
                "/login/index.php",
                &format!("username=u&password=x&logintoken={token}"),
            )
            .await
            .unwrap();
        kept.push(browser);
    }
    for _ in 0..300 {
        support::get(&gateway.url("/")).await;
    }
    let table = gateway.app.gateway().table();
    // The sweeper sheds in the background as soon as a bind crosses the bound.
    for _ in 0..100 {
        if table.len() <= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(table.len() <= 100, "table holds {}", table.len());
    for browser in &mut kept {
        let page = browser.get("/my/").await.unwrap();
        assert!(
            page.text().contains("Hello u"),
            "a logged-in student was shed: {}",
            page.text()
        );
    }
    assert_eq!(cluster.lost_sessions(), 0);
}

#[tokio::test]
async fn a_flood_of_random_cookies_teaches_the_table_nothing() {
    let (_cluster, gateway) = cluster_and_gateway("").await;
    let table = gateway.app.gateway().table();
    let mut ids = Vec::new();
    for i in 0..300 {
        let id = format!("flood{i:021}abcdefghij");
        // The node refuses these requests without starting a session (as an error page
        // or a sessionless script would), so whatever the table learns came from the client.
        let cookie = format!("MoodleSession={id}");
        let seen = support::send(
            &gateway.url("/course/view.php?id=2"),
            "GET",
            &[("cookie", &cookie), ("x-standin-status", "403")],
            Body::empty(),
        )
        .await;
        assert_eq!(seen.status, 403);
        ids.push(id);
    }
    assert_eq!(
        table.len(),
        0,
        "no entry was learned from a client's cookie"
    );
    assert!(ids.iter().all(|id| table.view(table.key(id)).is_none()));
}

#[tokio::test]
async fn no_admin_response_ever_contains_a_raw_session_id() {
    let (_cluster, gateway) = cluster_and_gateway("").await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        let mut browser = Browser::new(gateway.addr, "", "MoodleSession");
        browser.get("/login/index.php").await.unwrap();
        ids.push(browser.session().unwrap().to_owned());
    }
    let admin = format!("http://{}", gateway.admin_addr.unwrap());
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let mut bodies = Vec::new();
    for path in [
        "/affinity",
        "/affinity?limit=5",
        "/nodes",
        "/healthz",
        "/affinity?node=web2",
    ] {
        let seen = support::send(&format!("{admin}{path}"), "GET", &auth, Body::empty()).await;
        assert_eq!(seen.status, 200, "{path}");
        bodies.push(seen);
    }
    for id in &ids {
        let seen = support::send(
            &format!("{admin}/affinity/lookup?session={id}"),
            "GET",
            &auth,
            Body::empty(),
        )
        .await;
        assert_eq!(seen.status, 200);
        bodies.push(seen);
    }
    let unauthorized = support::get(&format!("{admin}/affinity")).await;
    assert_eq!(unauthorized.status, 401);
    bodies.push(unauthorized);
    for seen in &bodies {
        let mut everything = seen.text();
        for (name, value) in &seen.headers {
            everything.push_str(&format!("{name}: {value:?}\n"));
        }
        for id in &ids {
            assert!(
                !everything.contains(id.as_str()),
                "an admin response leaked a session id"
            );
        }
    }
    let listing: serde_json::Value = serde_json::from_slice(&bodies[0].body).unwrap();
    assert_eq!(listing["total"]["live"], 12);
    assert_eq!(listing["entries"].as_array().unwrap().len(), 12);
}
