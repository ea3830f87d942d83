//! A node that refuses connections for a moment (Apache or PHP-FPM restarting) with
//! node-local sessions: a student bound to it waits and gets their page from it,
//! slowly, instead of a 502, and stays logged in. A node gone for longer than
//! `failover_hold` is treated as before: a down node, whose students move.
//!
//! Why it is safe: a refused connect means nothing reached the node, so the request
//! (a POST too: its body was never read) can be sent again without running twice.

use std::time::Duration;

use http::Method;
use moodle_gateway::demo::standin::{Cluster, StandIn};

use crate::support::{logged_in, TestGateway};

/// Probes every 100 ms that never take a node down (`fall` far above what a 1 s
/// outage counts) and bring it back at once: only the request path is under test.
const PATIENT_HEALTH: &str = "health.interval = \"100ms\"\nhealth.timeout = \"100ms\"\n\
                              health.rise = 1\nhealth.fall = 100\n";

async fn start(cluster: &Cluster, extra: &str) -> TestGateway {
    TestGateway::start(&cluster.config_toml("127.0.0.1:0", None, extra)).await
}

/// Stops `node` and waits until the gateway has noticed that its kept connections
/// to it are closed, so the next request opens a new one (and is refused).
async fn stop(gateway: &TestGateway, node: &StandIn) {
    node.stop();
    for _ in 0..500 {
        if gateway.app.gateway().prune_connections() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gateway still keeps connections to the stopped node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_whose_node_restarts_in_a_second_gets_a_slow_page_from_it_not_a_502() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let extra = format!("{PATIENT_HEALTH}session.failover_hold = \"10s\"\n");
    let gateway = start(&cluster, &extra).await;
    let (student, node) = logged_in(&gateway, 1).await;
    let web = cluster.by_name(&node).unwrap();
    let before = web.requests().len();
    stop(&gateway, web).await;

    let (mut page, mut post) = (student.clone(), student.clone());
    let page = tokio::spawn(async move { page.get("/my/").await.unwrap() });
    let form = "cmi.core.lesson_status=completed";
    let post = tokio::spawn(async move { post.post("/mod/scorm/datamodel.php", form).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    web.restart().unwrap();

    let page = page.await.unwrap();
    assert_eq!(
        (page.status.as_u16(), page.upstream()),
        (200, node.as_str())
    );
    assert_eq!(page.issued, None, "no new session");
    let post = post.await.unwrap().unwrap();
    assert_eq!(
        (post.status.as_u16(), post.text()),
        (200, "true".to_owned())
    );
    assert_eq!(post.upstream(), node, "the POST waited for its node too");
    // The POST reached the node once, whole.
    let posts: Vec<_> = web.requests()[before..]
        .iter()
        .filter(|r| r.method == Method::POST)
        .map(|r| (r.uri.path().to_owned(), r.body_len))
        .collect();
    assert_eq!(posts, [("/mod/scorm/datamodel.php".to_owned(), form.len())]);
    assert_eq!(cluster.lost_sessions(), 0, "the student is still logged in");
    let mut student = student;
    assert_eq!(student.get("/my/").await.unwrap().upstream(), node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stays_closed_past_the_hold_is_down_and_its_student_moves() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    // No probe during the test: the student's own refused tries count towards
    // `fall` and take the node down.
    let extra = "health.interval = \"1h\"\nhealth.fall = 2\nsession.failover_hold = \"1s\"\n";
    let gateway = start(&cluster, extra).await;
    let (mut student, node) = logged_in(&gateway, 1).await;
    stop(&gateway, cluster.by_name(&node).unwrap()).await;

    let reply = student.get("/my/").await.unwrap();
    assert_ne!(reply.upstream(), node, "re-dealt after the hold");
    assert!(
        !reply.upstream().is_empty(),
        "answered by a node: {reply:?}"
    );
    assert!(
        reply.sent_to_login(),
        "a node-local session is gone: log in again"
    );
    let settings = gateway.app.gateway().settings();
    let web = settings.upstreams.by_name(&node).unwrap();
    assert!(!web.health.is_up(), "its refusals took the node down");
}
