//! Operations with real sockets and stand-in nodes: nodes that die and come back
//! under each session store, Moodle's maintenance mode, draining, reloads with
//! requests in flight, and restarts that keep every session on its node.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::{Browser, Reply};
use moodle_gateway::Config;
use serde_json::Value;

use crate::support::{self, logged_in, RawConn, TestGateway};

const TOKEN: &str = "operations-admin-token-0123456789";
/// Probes every 100 ms; two failures take a node down, two successes bring it back.
const FAST_HEALTH: &str = "health.interval = \"100ms\"\nhealth.timeout = \"100ms\"\n\
                           health.rise = 2\nhealth.fall = 2\n";

fn config(cluster: &Cluster, extra: &str) -> String {
    let extra = format!("{FAST_HEALTH}{extra}");
    cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), &extra)
}

/// For the tests that look for a returning node among a few newcomers at once:
/// slow start's ramp has its own test (`slow_start.rs`).
const FULL_SHARE_AT_ONCE: &str = "session.slow_start = \"0\"\n";

async fn start(cluster: &Cluster, extra: &str) -> TestGateway {
    TestGateway::start(&config(cluster, extra)).await
}

async fn admin(gateway: &TestGateway, method: &str, path: &str) -> (u16, Value) {
    let url = format!("http://{}{path}", gateway.admin_addr.unwrap());
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, method, &[("authorization", &auth)], "").await;
    let body = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    (seen.status.as_u16(), body)
}

async fn node_row(gateway: &TestGateway, name: &str) -> Value {
    let (_, nodes) = admin(gateway, "GET", "/nodes").await;
    let rows = nodes["nodes"].as_array().unwrap().clone();
    rows.into_iter().find(|n| n["name"] == name).unwrap()
}

/// Polls the admin API until `name`'s health is `health` (probes run every 100 ms).
async fn wait_health(gateway: &TestGateway, name: &str, health: &str) {
    for _ in 0..100 {
        if node_row(gateway, name).await["health"] == health {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never became {health}");
}

async fn new_visitor(gateway: &TestGateway) -> Reply {
    let mut visitor = Browser::new(gateway.addr, "", "MoodleSession");
    visitor.get("/login/index.php").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_gets_no_new_students_and_its_students_move_at_once_with_shared_sessions() {
    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "session.store = \"shared\"").await;
    let mut students = Vec::new();
    for n in 0..6 {
        students.push(logged_in(&gateway, n).await);
    }
    cluster.nodes()[1].stop();
    // Not one new visitor sees an error: a refused connection is retried on the
    // next node, and after `fall` failures the dead node is out of the deal.
    for _ in 0..9 {
        let reply = new_visitor(&gateway).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_ne!(reply.upstream(), "web2");
    }
    wait_health(&gateway, "web2", "down").await;
    for (student, node) in students.iter_mut().filter(|(_, node)| node == "web2") {
        let reply = student.get("/my/").await.unwrap();
        assert_ne!(reply.upstream(), node.as_str(), "moved to a live node");
        assert!(!reply.upstream().is_empty(), "answered by a node");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_local_sessions_a_student_waits_for_a_node_that_restarts() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "session.failover_hold = \"10s\"").await;
    let (mut student, node) = logged_in(&gateway, 1).await;
    let web = cluster.by_name(&node).unwrap();
    web.stop();
    wait_health(&gateway, &node, "down").await;
    let waiting = tokio::spawn(async move {
        let reply = student.get("/my/").await.unwrap();
        (reply.status, reply.upstream().to_owned())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the request is held, not failed");
    web.restart().unwrap();
    let (status, upstream) = waiting.await.unwrap();
    assert_eq!((status.as_u16(), upstream), (200, node));
    assert_eq!(cluster.lost_sessions(), 0, "the student is still logged in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_local_sessions_a_node_that_stays_down_hands_its_students_over_after_the_hold() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let extra = format!("{FULL_SHARE_AT_ONCE}session.failover_hold = \"1s\"");
    let gateway = start(&cluster, &extra).await;
    let (mut student, node) = logged_in(&gateway, 1).await;
    cluster.by_name(&node).unwrap().stop();
    wait_health(&gateway, &node, "down").await;
    let reply = student.get("/my/").await.unwrap();
    assert_ne!(reply.upstream(), node, "re-dealt after the hold");
    assert!(
        reply.sent_to_login(),
        "a node-local session is gone: log in again"
    );
    // Once the node is back, the student stays where they were re-bound.
    cluster.by_name(&node).unwrap().restart().unwrap();
    wait_health(&gateway, &node, "up").await;
    let moved_to = reply.upstream().to_owned();
    let again = student.get("/login/index.php").await.unwrap();
    assert_eq!(again.upstream(), moved_to);
    let newcomers: Vec<String> = futures_upstreams(&gateway, 4).await;
    assert!(
        newcomers.contains(&node),
        "the node is dealt again: {newcomers:?}"
    );
}

async fn futures_upstreams(gateway: &TestGateway, count: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..count {
        seen.push(new_visitor(gateway).await.upstream().to_owned());
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_node_down_students_get_a_quick_503_not_a_hang() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "").await;
    for node in cluster.nodes() {
        node.stop();
    }
    wait_health(&gateway, "web1", "down").await;
    wait_health(&gateway, "web2", "down").await;
    let answered = tokio::time::timeout(Duration::from_secs(5), new_visitor(&gateway)).await;
    let reply = answered.expect("an answer, not a hang");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), "10");
    // One story: the page tells the student the wait the header tells the browser.
    let page = reply.text();
    assert!(page.contains("please try again in 10 seconds"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moodle_maintenance_mode_is_passed_through_and_ejects_no_node() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "").await;
    cluster.set_maintenance(true);
    tokio::time::sleep(Duration::from_millis(600)).await; // several probe rounds
    for name in ["web1", "web2"] {
        let row = node_row(&gateway, name).await;
        assert_eq!(
            (&row["health"], &row["maintenance"]),
            (&Value::from("up"), &Value::from(true))
        );
    }
    let reply = new_visitor(&gateway).await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.text().contains("Moodle under maintenance"),
        "Moodle's own page"
    );
    cluster.set_maintenance(false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(new_visitor(&gateway).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_keeps_its_students_gets_no_new_ones_and_says_when_it_is_empty_and_disable_moves_them(
) {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, FULL_SHARE_AT_ONCE).await;
    let mut students = Vec::new();
    for n in 0..4 {
        students.push(logged_in(&gateway, n).await);
    }
    let (status, row) = admin(&gateway, "POST", "/nodes/web1/drain").await;
    assert_eq!((status, &row["state"]), (200, &Value::from("draining")));
    assert_eq!(
        (&row["live"], &row["drained"]),
        (&Value::from(2), &Value::from(false))
    );
    for upstream in futures_upstreams(&gateway, 4).await {
        assert_eq!(upstream, "web2", "no new sessions on a draining node");
    }
    for (student, node) in students.iter_mut().filter(|(_, node)| node == "web1") {
        let reply = student.get("/my/").await.unwrap();
        assert_eq!(
            (reply.status.as_u16(), reply.upstream()),
            (200, node.as_str())
        );
        let out = student.get("/login/logout.php").await.unwrap();
        assert_eq!(out.upstream(), "web1");
    }
    assert_eq!(node_row(&gateway, "web1").await["drained"], true);
    assert_eq!(
        cluster.lost_sessions(),
        0,
        "nobody was logged out by the drain"
    );
    let (status, row) = admin(&gateway, "POST", "/nodes/web1/undrain").await;
    assert_eq!((status, &row["state"]), (200, &Value::from("active")));
    assert!(futures_upstreams(&gateway, 2)
        .await
        .contains(&"web1".to_owned()));
    // Disable: a node that must stop now hands its students over at once.
    let (mut student, node) = logged_in(&gateway, 9).await;
    let (status, row) = admin(&gateway, "POST", &format!("/nodes/{node}/disable")).await;
    assert_eq!((status, &row["state"]), (200, &Value::from("disabled")));
    let moved = student.get("/my/").await.unwrap();
    assert_ne!(moved.upstream(), node, "moved at once, no hold");
    assert!(moved.sent_to_login(), "node-local sessions: log in again");
    let (status, _) = admin(&gateway, "POST", "/nodes/data/drain").await;
    assert_eq!(status, 400, "the data server cannot be drained");
    let (status, _) = admin(&gateway, "POST", "/nodes/web9/drain").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_active_node_is_not_taken_out_without_force_and_every_action_is_named() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "").await;
    let (status, _) = admin(&gateway, "POST", "/nodes/web1/disable").await;
    assert_eq!(status, 200, "another node is still active");
    for action in ["disable", "drain"] {
        let (status, body) = admin(&gateway, "POST", &format!("/nodes/web2/{action}")).await;
        assert_eq!(status, 409, "{action}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("web2 is the last active node"), "{error}");
        assert!(error.contains("?force=true"), "{error}");
    }
    assert_eq!(node_row(&gateway, "web2").await["state"], "active");
    assert_eq!(
        new_visitor(&gateway).await.upstream(),
        "web2",
        "still served"
    );
    // A node that is already out may move between draining and disabled.
    let (status, _) = admin(&gateway, "POST", "/nodes/web1/drain").await;
    assert_eq!(status, 200);
    let (status, body) = admin(&gateway, "POST", "/nodes/web2/disable?force=true").await;
    assert_eq!((status, &body["state"]), (200, &Value::from("disabled")));
    assert_eq!(new_visitor(&gateway).await.status, 503, "what force risks");
    let (status, body) = admin(&gateway, "POST", "/nodes/web2/restart").await;
    let every = "no such action: use drain, undrain, enable or disable";
    assert_eq!((status, &body["error"]), (400, &Value::from(every)));
    let (status, _) = admin(&gateway, "POST", "/nodes/web2/enable").await;
    assert_eq!(status, 200);
    assert_eq!(new_visitor(&gateway).await.status, 200);
}

/// A config file in its own directory, for reload tests.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mg-ops-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, text: &str) -> PathBuf {
        let path = self.0.join("config.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `config` with one node's block taken out.
fn without(cluster: &Cluster, config: &str, node: &str) -> String {
    config.replace(&cluster.node_toml(node).unwrap(), "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_add_and_remove_nodes_with_requests_in_flight_and_never_fail_one() {
    let mut cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    cluster.add_node("web3").unwrap();
    let file = ConfigFile::new("reload");
    let full = format!(
        "state.file = \"\"\n{}",
        config(&cluster, FULL_SHARE_AT_ONCE)
    );
    let path = file.write(&without(&cluster, &full, "web3"));
    let config = Config::load(&path).unwrap();
    let gateway = TestGateway::start_with_source(config, &path).await;
    let mut students = Vec::new();
    for n in 0..4 {
        students.push(logged_in(&gateway, n).await);
    }
    // Students keep browsing and newcomers keep arriving through both reloads.
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (mut student, _) in students {
        let (failed, stop) = (failed.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let reply = student.get("/course/view.php?id=2").await;
                if reply.map_or(true, |r| r.status.is_server_error()) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    path_write(&path, &full);
    let (status, body) = admin(&gateway, "POST", "/reload").await;
    assert_eq!(
        (status, &body["reloaded"]),
        (200, &Value::from(true)),
        "{body}"
    );
    let newcomers = futures_upstreams(&gateway, 6).await;
    assert!(newcomers.contains(&"web3".to_owned()), "{newcomers:?}");
    path_write(&path, &without(&cluster, &full, "web1"));
    let (status, _) = admin(&gateway, "POST", "/reload").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
    for upstream in futures_upstreams(&gateway, 6).await {
        assert_ne!(upstream, "web1", "a removed node gets nothing");
    }
    let (_, nodes) = admin(&gateway, "GET", "/nodes").await;
    let names: Vec<&str> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web2", "web3"]);
}

/// A student's connection keeps the settings it last used only until its next
/// request: a reload that removes a node reaches the connections opened before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_open_across_a_reload_takes_the_new_settings_at_its_next_request() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let file = ConfigFile::new("reload-kept-connection");
    let full = format!("state.file = \"\"\n{}", config(&cluster, ""));
    let path = file.write(&full);
    let gateway = TestGateway::start_with_source(Config::load(&path).unwrap(), &path).await;
    let mut connection = RawConn::connect(gateway.addr).await;
    let mut newcomer = async || {
        let request = b"GET /login/index.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\r\n";
        connection.send(request).await.unwrap();
        let answer = connection.response(Duration::from_secs(5), false).await;
        answer.unwrap().header("x-upstream").unwrap().to_owned()
    };
    let mut before = vec![newcomer().await, newcomer().await];
    before.sort();
    assert_eq!(
        before,
        ["web1", "web2"],
        "both nodes deal before the reload"
    );
    path_write(&path, &without(&cluster, &full, "web1"));
    let (status, _) = admin(&gateway, "POST", "/reload").await;
    assert_eq!(status, 200);
    for _ in 0..4 {
        assert_eq!(newcomer().await, "web2", "a removed node gets nothing");
    }
}

fn path_write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_file_is_rejected_with_its_errors_and_the_running_one_kept() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let file = ConfigFile::new("broken");
    let good = format!("state.file = \"\"\n{}", config(&cluster, ""));
    let path = file.write(&good);
    let gateway = TestGateway::start_with_source(Config::load(&path).unwrap(), &path).await;
    path_write(&path, &good.replace("[[nodes]]", "[[nodes]]\nweight = 0"));
    let (status, body) = admin(&gateway, "POST", "/reload").await;
    assert_eq!((status, &body["reloaded"]), (422, &Value::from(false)));
    let errors = body["errors"].to_string();
    assert!(errors.contains("nodes[0].weight"), "{errors}");
    let upstreams = futures_upstreams(&gateway, 4).await;
    assert_eq!(
        upstreams,
        ["web1", "web2", "web1", "web2"],
        "old config still serves"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_that_needs_a_restart_is_reported_on_every_reload_until_then() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let file = ConfigFile::new("restart-note");
    let good = format!("state.file = \"\"\n{}", config(&cluster, ""));
    let path = file.write(&good);
    let gateway = TestGateway::start_with_source(Config::load(&path).unwrap(), &path).await;
    path_write(&path, &format!("session.max_sessions = 5000\n{good}"));
    for reload in ["first", "second"] {
        let (status, body) = admin(&gateway, "POST", "/reload").await;
        assert_eq!(status, 200, "{body}");
        let notes = body["notes"].to_string();
        assert!(
            notes.contains("session.max_sessions"),
            "{reload} reload: {notes}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_ten_thousand_sessions_on_their_nodes() {
    const SESSIONS: usize = 10_000;
    let cluster = Cluster::spawn(4, "", "MoodleSession").unwrap();
    let file = ConfigFile::new("restart");
    let state = file.0.join("affinity.state");
    let text = format!(
        "state.file = {:?}\n{}",
        state.display().to_string(),
        config(&cluster, "")
    );
    let gateway = TestGateway::start(&text).await;
    let sessions = visit_all(&gateway, SESSIONS).await;
    gateway.shutdown().await;
    assert!(state.exists(), "the state file is written at shutdown");
    let gateway = TestGateway::start(&text).await;
    assert_eq!(gateway.app.gateway().table().len(), SESSIONS);
    let after = revisit_all(&gateway, &sessions).await;
    assert_eq!(after, SESSIONS, "every session still on its node");
    assert_eq!(cluster.lost_sessions(), 0);
}

/// `count` new visitors in parallel; returns each one's session id and node.
async fn visit_all(gateway: &TestGateway, count: usize) -> Vec<(String, String)> {
    let client = support::client();
    let url = gateway.url("/login/index.php");
    let mut all = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(64) {
        let batch = chunk.iter().map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let response = client.get(url.parse().unwrap()).await.unwrap();
                let node = response.headers()["x-upstream"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                let cookie = response.headers()["set-cookie"].to_str().unwrap();
                let id = cookie
                    .split(';')
                    .next()
                    .unwrap()
                    .split_once('=')
                    .unwrap()
                    .1
                    .to_owned();
                (id, node)
            })
        });
        for task in batch.collect::<Vec<_>>() {
            all.push(task.await.unwrap());
        }
    }
    all
}

/// Visits again with each id; counts the sessions answered by their own node
/// without a new session being issued.
async fn revisit_all(gateway: &TestGateway, sessions: &[(String, String)]) -> usize {
    let client = support::client();
    let url = gateway.url("/login/index.php");
    let mut kept = 0;
    for chunk in sessions.chunks(64) {
        let batch = chunk.iter().cloned().map(|(id, node)| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let request = http::Request::get(url)
                    .header("cookie", format!("MoodleSession={id}"))
                    .body(axum::body::Body::empty())
                    .unwrap();
                let response = client.request(request).await.unwrap();
                let same = response.headers()["x-upstream"] == node.as_str();
                same && !response.headers().contains_key("set-cookie")
            })
        });
        for task in batch.collect::<Vec<_>>() {
            kept += usize::from(task.await.unwrap());
        }
    }
    kept
}

/// Logs a student in and returns them, their node and the route cookie (`name=value`)
/// the gateway set when the login rotated their session.
async fn logged_in_with_route(gateway: &TestGateway, n: usize) -> (Browser, String, String) {
    let mut student = Browser::new(gateway.addr, "", "MoodleSession");
    let form = student.get("/login/index.php").await.unwrap();
    let token = form.text().split_once("logintoken=").unwrap().1[..32].to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    let done = student.post("/login/index.php", &body).await.unwrap();
    let route = done
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("MoodleGatewayRoute="))
        .expect("the login set a route cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    (student, done.upstream().to_owned(), route)
}

/// The same student (their session cookie) coming back to a restarted gateway.
fn again(gateway: &TestGateway, student: &Browser) -> Browser {
    let mut back = Browser::new(gateway.addr, "", "MoodleSession");
    back.set_session(student.session().map(str::to_owned));
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_file_the_route_cookie_keeps_a_student_on_their_node() {
    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let extra = "route_cookie.secret = \"a-route-secret-of-at-least-32-bytes-long\"";
    let text = config(&cluster, extra);
    let gateway = TestGateway::start(&text).await;
    new_visitor(&gateway).await; // web1
    let (other, other_node, other_route) = logged_in_with_route(&gateway, 1).await;
    let (student, node, route) = logged_in_with_route(&gateway, 2).await;
    assert_eq!((other_node.as_str(), node.as_str()), ("web2", "web3"));
    gateway.shutdown().await;

    let gateway = TestGateway::start(&text).await;
    assert!(gateway.app.gateway().table().is_empty(), "no state file");
    // A fresh deal would say web1: the route cookie says web3, and is right.
    let mut student = again(&gateway, &student);
    let reply = student
        .send(Method::GET, "/my/", None, &[("cookie", &route)])
        .await
        .unwrap();
    assert_eq!((reply.status.as_u16(), reply.upstream()), (200, "web3"));
    assert_eq!(cluster.lost_sessions(), 0);
    // A tampered route cookie is ignored: a new visitor as far as the gateway knows,
    // dealt web1, where the session does not exist.
    let (value_start, tag) = other_route.rsplit_once('.').unwrap();
    let flipped = if tag.starts_with('A') { "B" } else { "A" };
    let tampered = format!("{value_start}.{flipped}{}", &tag[1..]);
    let mut other = again(&gateway, &other);
    let reply = other
        .send(Method::GET, "/my/", None, &[("cookie", &tampered)])
        .await
        .unwrap();
    assert_eq!(reply.upstream(), "web1");
    assert!(reply.sent_to_login());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_state_file_is_ignored_and_replaced_and_a_foreign_one_left_alone() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let file = ConfigFile::new("corrupt");
    let state = file.0.join("affinity.state");
    let text = format!(
        "state.file = {:?}\n{}",
        state.display().to_string(),
        config(&cluster, "")
    );

    std::fs::write(&state, b"MGWSNAP\0\x01\0\0\0 cut short").unwrap();
    let gateway = TestGateway::start(&text).await;
    assert!(gateway.app.gateway().table().is_empty());
    assert_eq!(new_visitor(&gateway).await.status, 200, "it serves anyway");
    gateway.shutdown().await;
    let saved = moodle_gateway::sessions::snapshot::read(&state)
        .unwrap()
        .unwrap();
    assert_eq!(saved.entries.len(), 1, "replaced by a good snapshot");

    std::fs::write(&state, "an admin's notes, not a snapshot\n").unwrap();
    let gateway = TestGateway::start(&text).await;
    assert_eq!(new_visitor(&gateway).await.status, 200);
    gateway.shutdown().await;
    let kept = std::fs::read_to_string(&state).unwrap();
    assert_eq!(
        kept, "an admin's notes, not a snapshot\n",
        "never overwritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_server_is_probed_too_and_scorm_gets_a_quick_503_while_it_is_down() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, "").await;
    let scorm = gateway.url("/pluginfile.php/27/mod_scorm/content/1/index.html");
    tokio::time::sleep(Duration::from_millis(500)).await; // several probe rounds
    assert_eq!(
        support::get(&scorm).await.status,
        200,
        "still up after probes"
    );
    assert!(cluster.data().probes() > 0, "the data server is probed");
    cluster.data().stop();
    for _ in 0..100 {
        let (_, nodes) = admin(&gateway, "GET", "/nodes").await;
        if nodes["data"]["health"] == "down" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = support::get(&scorm).await;
    assert_eq!(seen.status, 503);
    assert!(seen.text().contains("course content"), "{}", seen.text());
    assert_eq!(new_visitor(&gateway).await.status, 200, "pages still work");
}
