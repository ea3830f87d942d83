//! Several gateways, one truth (`[store] kind = "redis"`), against a real
//! `redis-server` each test starts for itself: a session bound on one gateway is
//! routed the same by the others, their changes reach each other, the deal is
//! shared, and Redis going away never fails a student.
//!
//! Why `#[ignore]`: a plain `cargo test` needs nothing but Rust, and the memory
//! store (the default) is tested there. `tests/store/run.sh` installs
//! redis-server when missing and runs these; without it they fail, never skip.

use std::time::Duration;

use http::{Method, StatusCode};
use moodle_gateway::config::NodeState;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use serde_json::Value;

use crate::site::{eventually, metric, ready, Site, SECRET, TOKEN};
use crate::support::{logged_in, start_quiz, RedisServer, TestGateway};

/// The student's next page, through the gateway at `addr`: from their own node, and
/// no new session (a new one would mean they were logged out).
async fn stays_home(student: &Browser, addr: std::net::SocketAddr, node: &str, who: &str) {
    let mut there = student.at(addr);
    let page = there.get("/my/").await.unwrap();
    assert_eq!(
        (page.status, page.upstream(), page.issued.as_deref()),
        (StatusCode::OK, node, None),
        "{who}"
    );
}

/// The key the gateways' tables hold for a student's session.
fn key_of(
    gateway: &TestGateway,
    student: &Browser,
) -> moodle_gateway::sessions::affinity::SessionKey {
    gateway
        .app
        .gateway()
        .table()
        .key(student.session().unwrap())
}

fn bound_to(
    gateway: &TestGateway,
    key: moodle_gateway::sessions::affinity::SessionKey,
) -> Option<String> {
    let g = gateway.app.gateway();
    let view = g.table().view(key)?;
    Some(g.settings().upstreams.get(view.node)?.name.clone())
}

async fn admin(gateway: &TestGateway, method: &str, path: &str) -> (StatusCode, Value) {
    let url = format!("http://{}{path}", gateway.admin_addr.unwrap());
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let response = crate::support::client().request(request).await.unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap();
    let json = serde_json::from_slice(&body.to_bytes()).unwrap_or(Value::Null);
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_session_bound_on_one_gateway_is_routed_the_same_by_the_others_at_once() {
    let site = Site::start(4, &["gw-a", "gw-b", "gw-c"], "").await;
    for n in 0..6 {
        let (student, node) = logged_in(site.gw(n % 3), n).await;
        // The very next request, on each other gateway, with no pause at all.
        for other in 1..3 {
            let to = (n + other) % 3;
            let who = format!("student {n} on gateway {to}");
            stays_home(&student, site.gw(to).addr, &node, &who).await;
        }
    }
    assert_eq!(site.cluster.lost_sessions(), 0, "nobody was logged out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_session_this_gateway_never_heard_of_is_looked_up_in_redis_before_it_is_dealt() {
    let site = Site::start(4, &["gw-a", "gw-b"], "").await;
    let (a, b) = (site.gw(0), site.gw(1));
    for n in 0..4 {
        let (student, node) = logged_in(a, n).await;
        // gw-b missed the news (it was restarting, or the message was lost).
        let key = key_of(b, &student);
        eventually(Duration::from_secs(1), "gw-b hears of it", || {
            bound_to(b, key).is_some()
        })
        .await;
        b.app.gateway().table().forget(key);
        stays_home(&student, b.addr, &node, &format!("student {n}")).await;
        assert_eq!(
            bound_to(b, key).as_deref(),
            Some(node.as_str()),
            "and keeps it"
        );
    }
    assert_eq!(metric(b, "store_lookups_total{result=\"found\"}"), 4.0);
    // A forged id is looked up too, found nowhere, and dealt as a new visitor.
    let mut stranger = Browser::new(b.addr, "", "MoodleSession");
    stranger.set_session(Some("forged0123456789forged0123".into()));
    let page = stranger.get("/login/index.php").await.unwrap();
    assert!(page.issued.is_some(), "a new session");
    assert_eq!(metric(b, "store_lookups_total{result=\"absent\"}"), 1.0);
    assert_eq!(site.cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_login_logout_eviction_and_drain_on_one_gateway_reach_the_others_within_100ms() {
    let site = Site::start(2, &["gw-a", "gw-b", "gw-c"], "").await;
    let limit = Duration::from_millis(100);
    let (a, b, c) = (site.gw(0), site.gw(1), site.gw(2));
    let (mut student, node) = logged_in(a, 1).await;
    let key = key_of(a, &student);
    for other in [b, c] {
        eventually(limit, "the login's new id", || {
            bound_to(other, key).as_deref() == Some(&node)
        })
        .await;
    }

    // Logout rotates the id: the old one goes everywhere, the new one is known.
    let out = student.get("/login/logout.php?sesskey=x").await.unwrap();
    assert!(out.issued.is_some(), "logout issued a new id");
    let new = key_of(a, &student);
    for other in [b, c] {
        eventually(limit, "the logout", || {
            bound_to(other, key).is_none() && bound_to(other, new).as_deref() == Some(&node)
        })
        .await;
    }

    // An admin's eviction on b.
    let (status, _) = admin(b, "DELETE", &format!("/affinity/{new}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for other in [a, c] {
        eventually(limit, "the eviction", || bound_to(other, new).is_none()).await;
    }

    // An admin's drain on c.
    let (status, _) = admin(c, "POST", "/nodes/web1/drain").await;
    assert_eq!(status, StatusCode::OK);
    for other in [a, b] {
        eventually(limit, "the drain", || {
            let settings = other.app.gateway().settings();
            settings.upstreams.by_name("web1").unwrap().state() == NodeState::Draining
        })
        .await;
    }
}

/// The node a new visitor is dealt: the one that answers the login form.
async fn new_visitor(gateway: &TestGateway) -> String {
    let mut visitor = Browser::new(gateway.addr, "", "MoodleSession");
    let form = visitor.get("/login/index.php").await.unwrap();
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.issued.is_some(), "a new visitor gets a session");
    form.upstream().to_owned()
}

fn spread(counts: &std::collections::BTreeMap<String, usize>) -> usize {
    let most = counts.values().max().copied().unwrap_or(0);
    let least = counts.values().min().copied().unwrap_or(0);
    most - least
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn new_students_on_two_gateways_in_turn_are_dealt_as_one_gateway_deals() {
    let site = Site::start(4, &["gw-a", "gw-b"], "").await;
    let mut counts: std::collections::BTreeMap<String, usize> = ["web1", "web2", "web3", "web4"]
        .map(|n| (n.to_owned(), 0))
        .into();
    for n in 0..40 {
        let node = new_visitor(site.gw(n % 2)).await;
        *counts.get_mut(&node).unwrap() += 1;
        assert!(spread(&counts) <= 1, "after {} students: {counts:?}", n + 1);
    }
    assert_eq!(
        counts.values().copied().collect::<Vec<_>>(),
        [10, 10, 10, 10]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn new_students_arriving_at_three_gateways_at_once_are_spread_within_two_percent() {
    let site = Site::start(4, &["gw-a", "gw-b", "gw-c"], "").await;
    let mut arriving = tokio::task::JoinSet::new();
    for lane in 0..6 {
        let gateway = site.gw(lane % 3).addr;
        arriving.spawn(async move {
            let mut nodes = Vec::new();
            for _ in 0..100 {
                let mut visitor = Browser::new(gateway, "", "MoodleSession");
                let form = visitor.get("/login/index.php").await.unwrap();
                assert_eq!(form.status, StatusCode::OK);
                nodes.push(form.upstream().to_owned());
            }
            nodes
        });
    }
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    while let Some(nodes) = arriving.join_next().await {
        for node in nodes.unwrap() {
            *counts.entry(node).or_default() += 1;
        }
    }
    // 600 students on 4 nodes: 150 each, within 2 % (3 students).
    for (node, &count) in &counts {
        assert!(
            (147..=153).contains(&count),
            "{node}: {count} of 600: {counts:?}"
        );
    }
    for gateway in &site.gateways {
        assert_eq!(metric(gateway, "store_fallbacks_total{what=\"deal\"}"), 0.0);
    }
    // Every new student took one turn of the shared deal.
    assert_eq!(
        site.redis.get("moodle-gateway:deal").as_deref(),
        Some("600")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn redis_killed_mid_run_fails_no_student_and_its_return_resynchronises_every_gateway() {
    let mut site = Site::start(4, &["gw-a", "gw-b"], "").await;
    let (a, b) = (site.gw(0).addr, site.gw(1).addr);
    let mut students = Vec::new();
    for n in 0..8 {
        students.push(logged_in(site.gw(n % 2), n).await);
    }
    // Every student browses, alternating gateways, while Redis dies under them.
    let browsing = tokio::spawn(async move {
        let mut pages = 0;
        for round in 0..30 {
            for (n, (student, node)) in students.iter_mut().enumerate() {
                stays_home(
                    student,
                    if (round + n) % 2 == 0 { a } else { b },
                    node,
                    &format!("student {n}, round {round}"),
                )
                .await;
                pages += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pages
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    site.redis.kill();
    // Students who arrive while Redis is away are dealt locally and stay on their gateway.
    let mut late = Vec::new();
    for n in 10..14 {
        late.push(logged_in(site.gw(0), n).await);
    }
    assert_eq!(browsing.await.unwrap(), 8 * 30, "every page came");
    assert!(site.gw(0).app.gateway().store().is_up() == Some(false));
    assert!(metric(site.gw(0), "store_fallbacks_total{what=\"deal\"}") >= 4.0);
    for (student, node) in &mut late {
        let page = student.get("/my/").await.unwrap();
        assert_eq!(
            (page.status, page.upstream()),
            (StatusCode::OK, node.as_str())
        );
    }

    site.redis.restart();
    let limit = Duration::from_secs(10);
    for gateway in &site.gateways {
        eventually(limit, "the gateway reconnects", || {
            metric(gateway, "store_resyncs_total") >= 2.0
        })
        .await;
    }
    // What gw-a bound while Redis was away reached gw-b through the resync.
    for (student, node) in &late {
        let key = key_of(site.gw(0), student);
        eventually(limit, "gw-b learns the late students", || {
            bound_to(site.gw(1), key).as_deref() == Some(node.as_str())
        })
        .await;
        stays_home(student, b, node, "the student").await;
    }
    assert_eq!(site.cluster.lost_sessions(), 0, "nobody was logged out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_restarted_gateway_routes_every_session_where_it_was() {
    let mut site = Site::start(4, &["gw-a", "gw-b"], "").await;
    let mut students = Vec::new();
    for n in 0..8 {
        students.push(logged_in(site.gw(0), n).await);
    }
    // gw-b stops and starts again with an empty table and no state file.
    let b = site.gateways.pop().unwrap();
    b.shutdown().await;
    let b = site.gateway("gw-b", "").await;
    for (n, (student, node)) in students.iter().enumerate() {
        stays_home(student, b.addr, node, &format!("student {n}")).await;
    }
    assert_eq!(site.cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn the_admin_api_shows_every_live_gateway_what_it_served_and_who_bound_a_session() {
    let mut site = Site::start(2, &["gw-a", "gw-b"], "").await;
    let (mut student, node) = logged_in(site.gw(1), 1).await;
    student.get("/my/").await.unwrap();
    let list = |gateways: &Value| -> Vec<String> {
        let each = gateways["gateways"].as_array().unwrap().iter();
        each.map(|g| g["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // A beat a second: wait for one that has seen the student.
    let mut gateways = Value::Null;
    for _ in 0..300 {
        let (status, now) = admin(site.gw(0), "GET", "/gateways").await;
        assert_eq!(status, StatusCode::OK);
        gateways = now;
        if gateways["gateways"][1]["sessions"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        (gateways["this"].as_str(), gateways["connected"].as_bool()),
        (Some("gw-a"), Some(true))
    );
    assert_eq!(list(&gateways), ["gw-a", "gw-b"]);
    let beat_b = &gateways["gateways"][1];
    assert_eq!(beat_b["sessions"], 1, "{beat_b}");
    assert_eq!(beat_b["dealt"][node.as_str()], 1, "{beat_b}");
    assert!(
        beat_b["served"][node.as_str()].as_u64().unwrap() >= 3,
        "{beat_b}"
    );

    // gw-a's table is the cluster's: it shows the session gw-b bound, and by whom.
    let id = student.session().unwrap().to_owned();
    let (status, entry) = admin(site.gw(0), "GET", &format!("/affinity/lookup?session={id}")).await;
    assert_eq!(status, StatusCode::OK, "{entry}");
    assert_eq!(
        (entry["node"].as_str(), entry["bound_by"].as_str()),
        (Some(node.as_str()), Some("gw-b"))
    );

    // A gateway that stops leaves the roll at once.
    site.gateways.pop().unwrap().shutdown().await;
    let (_, gateways) = admin(site.gw(0), "GET", "/gateways").await;
    assert_eq!(list(&gateways), ["gw-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn after_an_outage_the_binding_redis_had_first_wins_and_the_rest_is_written_back() {
    let mut site = Site::start(2, &["gw-a"], "").await;
    site.redis.kill();
    let (first, node) = logged_in(site.gw(0), 1).await;
    let (second, second_node) = logged_in(site.gw(0), 2).await;
    let other = if node == "web1" { "web2" } else { "web1" };
    // Redis comes back, but before gw-a can get in, another gateway's binding of
    // the first student's session is already there.
    site.redis.restart_locked(Some("only-the-test"));
    let first_key = key_of(site.gw(0), &first);
    let redis_key = format!("moodle-gateway:s:{first_key}");
    let theirs = format!("L {other} gw-b");
    site.redis.command(&["SET", &redis_key, &theirs]).unwrap();
    site.redis.unlock();
    eventually(Duration::from_secs(10), "gw-a resynchronises", || {
        metric(site.gw(0), "store_resyncs_total") >= 2.0
    })
    .await;
    assert_eq!(
        bound_to(site.gw(0), first_key).as_deref(),
        Some(other),
        "Redis's binding won"
    );
    assert_eq!(
        site.redis.get(&redis_key),
        Some(theirs),
        "and was not overwritten"
    );
    let second_key = key_of(site.gw(0), &second);
    let written = site.redis.get(&format!("moodle-gateway:s:{second_key}"));
    assert_eq!(
        written,
        Some(format!("L {second_node} gw-a")),
        "gw-a's own binding was written back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_redis_that_stalls_costs_new_students_nothing_but_a_local_deal() {
    let site = Site::start(2, &["gw-a", "gw-b"], "").await;
    let (mut student, node) = logged_in(site.gw(0), 1).await;
    let url = site.redis.url();
    // Redis stops answering anyone for a second (a fork, a slow disk, a big command).
    let stall = std::thread::spawn(move || {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_connection().unwrap();
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query::<()>(&mut conn)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        new_visitor(site.gw(1)).await;
    }
    let page = student.get("/my/").await.unwrap();
    assert_eq!(
        (page.status, page.upstream()),
        (StatusCode::OK, node.as_str())
    );
    stall.join().unwrap().unwrap();
    assert!(metric(site.gw(1), "store_fallbacks_total{what=\"deal\"}") >= 1.0);
    // The binds that waited were written when Redis answered again.
    let sessions = || {
        let keys = site.redis.command(&["KEYS", "moodle-gateway:s:*"]).unwrap();
        redis::from_redis_value::<Vec<String>>(keys).unwrap().len()
    };
    // The student's session and three visitors'.
    eventually(
        Duration::from_secs(5),
        "every session reaches Redis",
        || sessions() == 4,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_site_whose_redis_and_gateway_restart_together_keeps_every_student_by_the_snapshot() {
    let dir =
        std::env::temp_dir().join(format!("moodle-gateway-store-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = crate::support::TempDir(dir.clone());
    let state = format!("state.file = {:?}\n", dir.join("gateway.state"));
    let mut site = Site::start(4, &["gw-a"], &state).await;
    let mut students = Vec::new();
    for n in 0..6 {
        students.push(logged_in(site.gw(0), n).await);
    }
    // A power cut: the gateway stops (and saves its snapshot), Redis loses everything.
    site.gateways.pop().unwrap().shutdown().await;
    site.redis.kill();
    site.redis.restart();
    let gateway = site.gateway("gw-a", &state).await;
    for (n, (student, node)) in students.iter_mut().enumerate() {
        stays_home(student, gateway.addr, node, &format!("student {n}")).await;
        let key = key_of(&gateway, student);
        let stored = site.redis.get(&format!("moodle-gateway:s:{key}"));
        assert_eq!(
            stored,
            Some(format!("L {node} gw-a")),
            "written back to Redis"
        );
    }
    assert_eq!(site.cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_node_state_changed_in_one_gateways_file_and_reloaded_reaches_the_others() {
    let mut site = Site::start(2, &["gw-b"], "").await;
    let dir = std::env::temp_dir().join(format!(
        "moodle-gateway-store-reload-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = crate::support::TempDir(dir.clone());
    let path = dir.join("config.toml");
    std::fs::write(&path, site.config("gw-a", "")).unwrap();
    let config = moodle_gateway::Config::load(&path).unwrap();
    let a = ready(TestGateway::start_with_source(config, &path).await).await;
    // The operator drains web2 in gw-a's file and reloads it.
    let text = std::fs::read_to_string(&path).unwrap();
    let web2 = site.cluster.node_toml("web2").unwrap();
    let text = text.replace(&web2, &format!("{web2}state = \"draining\"\n"));
    std::fs::write(&path, text).unwrap();
    let (status, body) = admin(&a, "POST", "/reload").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let b = site.gateways.pop().unwrap();
    eventually(Duration::from_millis(100), "gw-b drains web2 too", || {
        let settings = b.app.gateway().settings();
        settings.upstreams.by_name("web2").unwrap().state() == NodeState::Draining
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn behind_sentinel_a_failover_to_the_replica_keeps_every_student_on_their_node() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let sentinel = RedisServer::sentinel_of(&primary, "moodle");
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let store = format!(
        "store.kind = \"redis\"\nstore.sentinels = [\"redis://127.0.0.1:{}\"]\n\
         store.master = \"moodle\"\nstore.name = \"gw-a\"\nstore.secret = {SECRET:?}\n",
        sentinel.port()
    );
    let admin = Some(("127.0.0.1:0", TOKEN));
    let gateway =
        ready(TestGateway::start(&cluster.config_toml("127.0.0.1:0", admin, &store)).await).await;
    let mut students = Vec::new();
    for n in 0..3 {
        students.push(logged_in(&gateway, n).await);
    }
    let keys: Vec<String> = (students.iter())
        .map(|(student, _)| format!("moodle-gateway:s:{}", key_of(&gateway, student)))
        .collect();
    eventually(
        Duration::from_secs(5),
        "the replica has every session",
        || keys.iter().all(|key| replica.get(key).is_some()),
    )
    .await;

    primary.kill();
    eventually(
        Duration::from_secs(20),
        "the gateway follows the Sentinel to the replica",
        || metric(&gateway, "store_resyncs_total") >= 2.0,
    )
    .await;
    for (n, (student, node)) in students.iter().enumerate() {
        stays_home(student, gateway.addr, node, &format!("student {n}")).await;
    }
    let (late, node) = logged_in(&gateway, 9).await;
    let key = format!("moodle-gateway:s:{}", key_of(&gateway, &late));
    assert_eq!(
        replica.get(&key),
        Some(format!("L {node} gw-a")),
        "written to the new primary"
    );
    assert_eq!(cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_gateway_given_another_store_secret_says_so_instead_of_sharing_nothing_silently() {
    let site = Site::start(2, &["gw-a"], "").await;
    let other = site
        .config("gw-x", "")
        .replace(SECRET, "another-secret-0123456789abcdef0123456789");
    let x = ready(TestGateway::start(&other).await).await;
    let (_, mine) = admin(site.gw(0), "GET", "/gateways").await;
    let (_, theirs) = admin(&x, "GET", "/gateways").await;
    assert_eq!(mine["secret_matches"], true, "{mine}");
    assert_eq!(theirs["secret_matches"], false, "{theirs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_redis_restarted_empty_while_nobody_is_asking_gets_every_session_back() {
    let mut site = Site::start(4, &["gw-a"], "").await;
    let mut students = Vec::new();
    for n in 0..4 {
        students.push(logged_in(site.gw(0), n).await);
    }
    // A quiet restart: no student request, no bind, while Redis is away.
    site.redis.kill();
    site.redis.restart();
    let limit = Duration::from_secs(10);
    eventually(limit, "gw-a resynchronises", || {
        metric(site.gw(0), "store_resyncs_total") >= 2.0
    })
    .await;
    for (student, node) in &students {
        let key = format!("moodle-gateway:s:{}", key_of(site.gw(0), student));
        assert_eq!(
            site.redis.get(&key),
            Some(format!("L {node} gw-a")),
            "written back"
        );
    }
    // So a gateway that starts now, with nothing of its own, routes them all.
    let b = site.gateway("gw-b", "").await;
    for (n, (student, node)) in students.iter().enumerate() {
        stays_home(student, b.addr, node, &format!("student {n}")).await;
    }
    assert_eq!(site.cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_running_gateway_switched_to_the_shared_store_moves_no_student() {
    let dir = std::env::temp_dir().join(format!(
        "moodle-gateway-store-switch-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = crate::support::TempDir(dir.clone());
    let state = format!("state.file = {:?}\n", dir.join("gateway.state"));
    let mut site = Site::start(4, &[], "").await;
    // Yesterday: one gateway with its own table, and its snapshot file.
    let alone = TestGateway::start(&site.cluster.config_toml("127.0.0.1:0", None, &state)).await;
    let mut students = Vec::new();
    for n in 0..6 {
        students.push(logged_in(&alone, n).await);
    }
    alone.shutdown().await;
    // Today: the same gateway with [store] kind = "redis" and a new secret.
    site.gateways.push(site.gateway("gw-a", &state).await);
    for (n, (student, node)) in students.iter_mut().enumerate() {
        stays_home(student, site.gw(0).addr, node, &format!("student {n}")).await;
        let key = format!("moodle-gateway:s:{}", key_of(site.gw(0), student));
        assert_eq!(
            site.redis.get(&key),
            Some(format!("L {node} gw-a")),
            "now shared"
        );
    }
    assert_eq!(site.cluster.lost_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn least_sessions_counts_every_gateways_sessions() {
    let balance = "session.balance = \"least-sessions\"\n";
    let site = Site::start(2, &["gw-b"], balance).await;
    // gw-a may only deal web1 (web2 is disabled in its own file, not shared).
    let web2 = site.cluster.node_toml("web2").unwrap();
    let a_config = site
        .config("gw-a", balance)
        .replace(&web2, &format!("{web2}state = \"disabled\"\n"));
    let a = ready(TestGateway::start(&a_config).await).await;
    for _ in 0..4 {
        assert_eq!(new_visitor(&a).await, "web1");
    }
    let b = site.gw(0);
    let web1 = b
        .app
        .gateway()
        .settings()
        .upstreams
        .by_name("web1")
        .unwrap()
        .id;
    eventually(
        Duration::from_secs(1),
        "gw-b counts gw-a's sessions",
        || b.app.gateway().table().live(web1) == 4,
    )
    .await;
    // gw-b sees web1 holding four and web2 none: its new students go to web2.
    for n in 0..4 {
        assert_eq!(new_visitor(b).await, "web2", "student {n} at gw-b");
    }
}

/// Whether every gateway of `site` sees every node of `names` as `state`.
fn everywhere(site: &Site, names: &[&str], state: NodeState) -> bool {
    site.gateways.iter().all(|gateway| {
        let settings = gateway.app.gateway().settings();
        (names.iter()).all(|name| settings.upstreams.by_name(name).unwrap().state() == state)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn two_admins_draining_the_last_two_active_nodes_on_two_gateways_at_once_one_is_refused_every_time(
) {
    let site = Site::start(2, &["gw-a", "gw-b"], "").await;
    let (a, b) = (site.gw(0), site.gw(1));
    for attempt in 0..20 {
        // Each admin drains the node the other keeps, at the same instant.
        let (on_a, on_b) = tokio::join!(
            admin(a, "POST", "/nodes/web1/drain"),
            admin(b, "POST", "/nodes/web2/drain"),
        );
        let statuses = [on_a.0, on_b.0];
        let won = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        let refused = statuses.iter().filter(|s| **s == StatusCode::CONFLICT);
        assert_eq!(
            (won, refused.count()),
            (1, 1),
            "attempt {attempt}: exactly one drain passes: {on_a:?} {on_b:?}"
        );
        let (drained, gateway, refusal) = if on_a.0 == StatusCode::OK {
            ("web1", a, &on_b.1)
        } else {
            ("web2", b, &on_a.1)
        };
        let refusal = refusal["error"].as_str().unwrap_or_default();
        assert!(
            refusal.contains("is the last active node") && refusal.contains("?force=true"),
            "the local rail's own message: {refusal}"
        );
        let kept = if drained == "web1" { "web2" } else { "web1" };
        eventually(Duration::from_secs(1), "every gateway agrees", || {
            everywhere(&site, &[drained], NodeState::Draining)
                && everywhere(&site, &[kept], NodeState::Active)
        })
        .await;
        let (status, _) = admin(gateway, "POST", &format!("/nodes/{drained}/undrain")).await;
        assert_eq!(status, StatusCode::OK);
        eventually(Duration::from_secs(1), "both active again", || {
            everywhere(&site, &["web1", "web2"], NodeState::Active)
        })
        .await;
    }
    // Force still takes the last one out, on any gateway, and says so.
    let (status, _) = admin(a, "POST", "/nodes/web1/drain").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = admin(b, "POST", "/nodes/web2/disable").await;
    assert_eq!(status, StatusCode::CONFLICT, "web1 is draining on gw-a");
    let (status, _) = admin(b, "POST", "/nodes/web2/disable?force=true").await;
    assert_eq!(status, StatusCode::OK);
    let states = site
        .redis
        .command(&["HGET", "moodle-gateway:nodes", "web2"]);
    assert_eq!(
        redis::from_redis_value::<String>(states.unwrap()).unwrap(),
        "disabled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn two_gateways_moving_one_session_at_the_same_moment_end_on_one_node() {
    // Redis given all the time it needs: a gateway that finds it slower than
    // `store.timeout` moves the student alone, by design (the store is shared, so
    // either node has the session). This, or a second request late enough to find
    // the id retired (below), split one pair across two nodes on a loaded CI machine.
    let keys = "session.store = \"shared\"\nhealth.interval = \"100ms\"\n\
                health.timeout = \"50ms\"\nhealth.fall = 1\nstore.timeout = \"5s\"\n";
    let site = Site::start(3, &["gw-a", "gw-b"], keys).await;
    let (a, b) = (site.gw(0), site.gw(1));
    let mut on_web1 = Vec::new();
    for n in 0..18 {
        let (student, node) = logged_in(a, n).await;
        let key = key_of(a, &student);
        eventually(Duration::from_secs(1), "gw-b hears of it", || {
            bound_to(b, key).as_deref() == Some(node.as_str())
        })
        .await;
        if node == "web1" {
            on_web1.push(student);
        }
    }
    assert!(on_web1.len() >= 5, "{} on web1", on_web1.len());
    site.cluster.by_name("web1").unwrap().stop();
    // Both gateways know it is down, so both move the student at once, neither
    // waiting for a refused connection first.
    eventually(Duration::from_secs(2), "web1 is down on both", || {
        site.gateways.iter().all(|gateway| {
            let settings = gateway.app.gateway().settings();
            !settings.upstreams.by_name("web1").unwrap().health.is_up()
        })
    })
    .await;
    // gw-a moves one student alone first: its own deal is now a turn ahead of
    // gw-b's, so the two gateways would pick different nodes for the next ones.
    let mut first = on_web1.remove(0);
    let page = first.get("/my/").await.unwrap();
    assert!(!["", "web1"].contains(&page.upstream()), "moved");
    // Each node answers late, so that both gateways have moved the session before
    // either learns the new id its node issues: a request that arrives after that
    // carries an id already retired everywhere, bound to no node to agree on.
    let late = [("x-standin-delay-ms", "300")];
    for (n, student) in on_web1.iter().enumerate() {
        let (mut here, mut there) = (student.at(a.addr), student.at(b.addr));
        let (page_a, page_b) = tokio::join!(
            here.send(Method::GET, "/my/", None, &late),
            there.send(Method::GET, "/my/", None, &late)
        );
        let (page_a, page_b) = (page_a.unwrap(), page_b.unwrap());
        // Answered by a node (the stand-ins keep sessions per node: it asks them
        // to log in again), not by the gateway.
        let node = page_a.upstream().to_owned();
        assert!(!node.is_empty(), "student {n}: {}", page_a.status);
        assert_eq!(page_a.status, page_b.status, "student {n}");
        assert_ne!(node, "web1", "student {n}");
        assert_eq!(
            page_b.upstream(),
            node,
            "student {n}: both requests on one node"
        );
        // The node asked each to log in again under a new id (its sessions are its
        // own): every gateway and Redis bind both ids to the node that issued them.
        for id in [&page_a.issued, &page_b.issued].into_iter().flatten() {
            let key = a.app.gateway().table().key(id);
            let redis_key = format!("moodle-gateway:s:{key}");
            let agreed = || {
                let stored = site.redis.get(&redis_key).unwrap_or_default();
                let stored = stored.split(' ').nth(1).map(str::to_owned);
                [bound_to(a, key), bound_to(b, key), stored]
            };
            let want = Some(node.clone());
            let waited = std::time::Instant::now();
            while agreed() != [want.clone(), want.clone(), want.clone()] {
                let seen = agreed();
                assert!(
                    waited.elapsed() < Duration::from_secs(1),
                    "student {n}: gw-a, gw-b and Redis bind it to {seen:?}, not {node}"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn behind_sentinel_a_primary_with_a_password_is_reached_with_the_primarys_password() {
    let mut primary = RedisServer::start();
    primary.restart_locked(Some("the-primarys-password"));
    let sentinel =
        RedisServer::sentinel_with_passwords(&primary, "moodle", Some("the-sentinels-password"));
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let store = format!(
        "store.kind = \"redis\"\nstore.sentinels = [\"redis://127.0.0.1:{}\"]\n\
         store.master = \"moodle\"\nstore.master_password = \"the-primarys-password\"\n\
         store.sentinel_password = \"the-sentinels-password\"\n\
         store.name = \"gw-a\"\nstore.secret = {SECRET:?}\n",
        sentinel.port()
    );
    let admin = Some(("127.0.0.1:0", TOKEN));
    let gateway =
        ready(TestGateway::start(&cluster.config_toml("127.0.0.1:0", admin, &store)).await).await;
    let (student, node) = logged_in(&gateway, 1).await;
    let key = format!("moodle-gateway:s:{}", key_of(&gateway, &student));
    assert_eq!(
        primary.get(&key),
        Some(format!("L {node} gw-a")),
        "written to the primary, through its password"
    );
    assert_eq!(gateway.app.gateway().store().is_up(), Some(true));
}

/// A student whose address moved to another gateway (keepalived, a restart)
/// resumes their TLS session there: every gateway seals tickets with the site's
/// keys, kept in Redis, over TLS 1.3 and 1.2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_ticket_one_gateway_issued_resumes_the_session_on_another() {
    use crate::tls::{client_config, serve_tls, visit, TestCert};
    use rustls::HandshakeKind::{Full, Resumed};
    let site = Site::start(1, &[], "").await;
    let cert = TestCert::new("shared-tickets");
    let mut https = Vec::new();
    for name in ["gw-a", "gw-b"] {
        let text = site.config(name, "state.file = \"\"");
        https.push(serve_tls(&text, &cert).await.0);
    }
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        // Both gateways read the site's keys from Redis within a second or so of
        // their start: until then each seals with its own.
        let mut tries = 0;
        let resumed = loop {
            let browser = client_config(&cert, b"http/1.1", &[version]);
            assert_eq!(visit(https[0], &browser).await, Full);
            let elsewhere = visit(https[1], &browser).await;
            tries += 1;
            if elsewhere == Resumed || tries == 50 {
                break elsewhere;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(resumed, Resumed, "{version:?}");
    }
    // In Redis: this period's key and the next, made ahead for the turn.
    let keys = site.redis.command(&["KEYS", "*tls-ticket:*"]).unwrap();
    assert!(
        matches!(&keys, redis::Value::Array(k) if k.len() == 2),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn a_class_starting_its_quiz_through_two_gateways_gets_the_nodes_share_of_starts_not_twice_it(
) {
    // One start at a time on the node, for the whole site; its cap leaves room for more.
    let surge = "surge.max_active = 4\nsurge.quiz_starts = 1\nsurge.waiting_room = false";
    let site = Site::start(1, &["gw-a", "gw-b"], surge).await;
    let mut class = Vec::new();
    for n in 0..6 {
        let gateway = site.gw(n % 2);
        class.push(logged_in(gateway, n + 1).await.0);
    }
    let node = &site.cluster.nodes()[0];
    node.set_workers(Some((5, Duration::from_millis(300))));
    node.clear_requests();
    let mut starts = tokio::task::JoinSet::new();
    for (n, mut student) in class.into_iter().enumerate() {
        // The start and then its first page, as a browser follows it, through the
        // same gateway: the page carries the start's place in the site's share.
        let click = format!("click={n}");
        starts.spawn(async move { start_quiz(&mut student, &click).await });
    }
    while let Some(status) = starts.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK, "every first page comes");
    }
    let started = (node.requests().iter())
        .filter(|r| r.uri.path() == "/mod/quiz/startattempt.php")
        .count();
    assert_eq!(started, 6);
    assert_eq!(
        node.busiest(),
        1,
        "each gateway's own gate would let two starts run at once; a first page counts with its start"
    );
}

/// What Redis says of a key's time to live, in milliseconds.
fn pttl(site: &Site, key: &str) -> i64 {
    let value = site.redis.command(&["PTTL", key]).unwrap();
    redis::from_redis_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn one_gateway_at_a_time_orders_the_certificate_and_a_failed_order_holds_the_others_off() {
    use moodle_gateway::store::AcmeTurn::{Ours, Theirs};
    let site = Site::start(1, &["gw-a", "gw-b"], "").await;
    let (a, b) = (
        site.gw(0).app.gateway().store(),
        site.gw(1).app.gateway().store(),
    );
    let lease = "moodle-gateway:acme:lease";
    let minute = Duration::from_secs(60);
    assert_eq!(a.acme_turn(minute).await, Some(Ours));
    let theirs = b.acme_turn(minute).await;
    assert!(
        matches!(&theirs, Some(Theirs(holder)) if holder.starts_with("gw-a/")),
        "{theirs:?}"
    );
    assert_eq!(
        a.acme_turn(minute).await,
        Some(Ours),
        "renewed by its holder"
    );
    b.end_acme_turn().await;
    assert!(
        matches!(b.acme_turn(minute).await, Some(Theirs(_))),
        "only the holder gives the lease back"
    );
    a.end_acme_turn().await;
    assert_eq!(
        b.acme_turn(minute).await,
        Some(Ours),
        "given back: the next may order"
    );
    // A holder that dies while ordering frees the site within the lease.
    assert!((1..=60_000).contains(&pttl(&site, lease)));
    // A failed order keeps the lease for the back-off: the others wait an hour.
    assert_eq!(b.acme_turn(Duration::from_secs(3600)).await, Some(Ours));
    assert!(pttl(&site, lease) > 60_000);
    assert!(matches!(a.acme_turn(minute).await, Some(Theirs(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn an_http01_answer_one_gateway_put_up_is_read_by_another_until_taken_down() {
    let site = Site::start(1, &["gw-a", "gw-b"], "").await;
    let (a, b) = (
        site.gw(0).app.gateway().store(),
        site.gw(1).app.gateway().store(),
    );
    assert_eq!(b.http01("tok3n").await, None);
    assert_eq!(a.open_http01("tok3n", "tok3n.thumbprint").await, Some(()));
    assert_eq!(b.http01("tok3n").await.as_deref(), Some("tok3n.thumbprint"));
    let kept = pttl(&site, "moodle-gateway:acme:http01:tok3n");
    assert!(
        (1..=600_000).contains(&kept),
        "gone if its orderer dies: {kept}"
    );
    a.close_http01("tok3n").await;
    assert_eq!(b.http01("tok3n").await, None);
    // The certificate as the caller sealed it, the same bytes for every gateway.
    assert_eq!(b.acme_certificate().await, Some(None));
    assert_eq!(a.set_acme_certificate(b"sealed".to_vec()).await, Some(()));
    assert_eq!(b.acme_certificate().await, Some(Some(b"sealed".to_vec())));
}
