//! Exam day on stand-in nodes with few PHP workers and slow pages: the gateway holds
//! the surge in its own line, a logged-in student goes first, a bound student waits
//! for their own node, newcomers meet the waiting room, and every wait has an end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use moodle_gateway::cluster::slots::Slots;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use tokio::task::JoinSet;

use crate::site::{eventually, metric};
use crate::support::{self, TestGateway};

/// What an XHR or an asset sends: never a page a waiting room could stand in for.
const NOT_A_PAGE: (&str, &str) = ("accept", "application/json");
/// What a browser's navigation sends.
const A_PAGE: (&str, &str) = ("accept", "text/html,application/xhtml+xml,*/*;q=0.8");

/// `nodes` stand-ins behind a gateway with `surge` as its `[surge]` section.
async fn site(nodes: usize, surge: &str) -> (Cluster, TestGateway) {
    site_with(nodes, "", surge).await
}

/// [`site`], with `keys` (dotted keys of other sections) in the config too.
async fn site_with(nodes: usize, keys: &str, surge: &str) -> (Cluster, TestGateway) {
    let cluster = Cluster::spawn(nodes, "", "MoodleSession").unwrap();
    let gateway = TestGateway::start(&config(&cluster, keys, surge)).await;
    (cluster, gateway)
}

fn config(cluster: &Cluster, keys: &str, surge: &str) -> String {
    let extra = format!("{keys}\n[surge]\n{surge}\n");
    cluster.config_toml("127.0.0.1:0", None, &extra)
}

/// Gives every node of `cluster` PHP workers taking `page` each: one more than the
/// gateway's cap `cap`, as a site should size it, so a health probe finds a worker.
fn slow(cluster: &Cluster, cap: usize, page: Duration) {
    for node in cluster.nodes() {
        node.set_workers(Some((cap + 1, page)));
    }
}

/// `count` newcomers' requests at once, each from a fresh browser.
fn newcomers(
    gateway: &TestGateway,
    count: usize,
    header: (&'static str, &'static str),
) -> JoinSet<StatusCode> {
    let mut set = JoinSet::new();
    for _ in 0..count {
        let addr = gateway.addr;
        set.spawn(async move {
            let mut browser = Browser::new(addr, "", "MoodleSession");
            let headers = [header];
            let reply = browser.send(Method::GET, "/", None, &headers);
            reply.await.unwrap().status
        });
    }
    set
}

/// Every request of `set` answered 200: waiting is not an error.
async fn all_ok(set: &mut JoinSet<StatusCode>) {
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK, "waiting is not an error");
    }
}

/// The slots of node `name` (`web1`…) as the gateway has them now.
fn slots_of(gateway: &TestGateway, name: &str) -> Arc<Slots> {
    let settings = gateway.app.gateway().settings();
    settings.upstreams.by_name(name).unwrap().slots.clone()
}

/// The requests waiting in the gateway for the first node, per class.
fn queued(gateway: &TestGateway) -> [usize; 4] {
    slots_of(gateway, "web1").now().queued
}

async fn until_queued(gateway: &TestGateway, at_least: usize) {
    eventually(
        Duration::from_secs(10),
        "requests wait in the gateway",
        || queued(gateway).iter().sum::<usize>() >= at_least,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_never_works_on_more_than_its_cap_and_the_rest_wait_in_the_gateway() {
    let (cluster, gateway) = site(1, "max_active = 2\nwaiting_room = false").await;
    // The node could take six at once: the cap, not the node, keeps it at two.
    cluster.nodes()[0].set_workers(Some((6, Duration::from_millis(100))));
    let mut crowd = newcomers(&gateway, 12, NOT_A_PAGE);
    until_queued(&gateway, 1).await;
    all_ok(&mut crowd).await;
    assert_eq!(cluster.nodes()[0].busiest(), 2);
    assert_eq!(
        metric(&gateway, r#"queue_wait_seconds_count{class="newcomer"}"#),
        12.0
    );
    let slots = slots_of(&gateway, "web1").now();
    assert_eq!(
        (slots.active, slots.queued),
        (0, [0, 0, 0, 0]),
        "every slot back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_in_students_request_goes_before_the_newcomers_who_came_first() {
    let (cluster, gateway) = site(1, "max_active = 1\nwaiting_room = false").await;
    let (mut student, _) = support::logged_in(&gateway, 1).await;
    slow(&cluster, 1, Duration::from_millis(150));
    cluster.nodes()[0].clear_requests();
    let mut crowd = newcomers(&gateway, 8, NOT_A_PAGE);
    until_queued(&gateway, 7).await;
    let page = student.send(Method::GET, "/mod/quiz/attempt.php", None, &[NOT_A_PAGE]);
    let page = page.await.unwrap();
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.sent_to_login(), "still logged in");
    let order: Vec<bool> = (cluster.nodes()[0].requests().iter())
        .map(|r| r.uri.path() == "/mod/quiz/attempt.php")
        .collect();
    assert_eq!(
        order.iter().position(|&quiz| quiz),
        Some(1),
        "the student's page came right after the one already on the node: {order:?}"
    );
    all_ok(&mut crowd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_student_waits_for_their_own_busy_node_while_another_is_idle() {
    let (cluster, gateway) = site(2, "max_active = 1\nwaiting_room = false").await;
    let (mut student, home) = support::logged_in(&gateway, 1).await;
    let busy = cluster.by_name(&home).unwrap();
    busy.set_workers(Some((2, Duration::from_millis(300))));
    // Hold the student's node: two slow requests of the student's own.
    let mut holders = JoinSet::new();
    for _ in 0..2 {
        let mut same = student.at(gateway.addr);
        holders.spawn(async move { same.get("/course/view.php?id=2").await.unwrap().status });
    }
    until_queued_on(&gateway, &home).await;
    let page = student.get("/my/").await.unwrap();
    assert_eq!(page.upstream(), home, "never moved to the idle node");
    assert!(!page.sent_to_login());
    assert_eq!(cluster.lost_sessions(), 0);
    all_ok(&mut holders).await;
}

async fn until_queued_on(gateway: &TestGateway, node: &str) {
    let slots = slots_of(gateway, node);
    eventually(
        Duration::from_secs(10),
        "a request waits for the node",
        || slots.queued() >= 1,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_in_a_surge_gets_the_waiting_page_keeps_a_place_and_is_let_in() {
    let (cluster, gateway) = site(1, "max_active = 1\nroom_opens_at = \"1s\"").await;
    let (mut student, _) = support::logged_in(&gateway, 1).await;
    slow(&cluster, 1, Duration::from_millis(100));
    // Forty requests ahead, a tenth of a second each: four seconds to wait.
    let mut crowd = newcomers(&gateway, 40, NOT_A_PAGE);
    until_queued(&gateway, 35).await;
    // The gateway must have seen the pace slots free at before it can expect a wait.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut newcomer = Browser::new(gateway.addr, "", "MoodleSession");
    let page = newcomer
        .send(Method::GET, "/", None, &[A_PAGE])
        .await
        .unwrap();
    assert_eq!(
        page.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        page.text()
    );
    assert!(page.text().contains("place in line"), "{}", page.text());
    assert!(page.header("retry-after").parse::<u64>().unwrap() >= 2);
    assert_eq!(page.header("refresh"), page.header("retry-after"));
    assert_eq!(page.header("cache-control"), "no-store");
    let place = page
        .header("set-cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert!(place.starts_with("MoodleGatewayPlace="), "{place}");
    assert_eq!(newcomer.session(), None, "no node saw the newcomer");
    // A logged-in student never sees it, and a newcomer's POST waits in line instead.
    let quiz = student
        .send(Method::GET, "/my/", None, &[A_PAGE])
        .await
        .unwrap();
    assert_eq!(quiz.status, StatusCode::OK);
    let mut poster = Browser::new(gateway.addr, "", "MoodleSession");
    let post = poster.post("/login/index.php", "username=x").await.unwrap();
    assert_ne!(post.status, StatusCode::SERVICE_UNAVAILABLE);
    all_ok(&mut crowd).await;
    // The lines have drained: the refresh with the place cookie goes in.
    let cookie = [A_PAGE, ("cookie", place.as_str())];
    let home = newcomer
        .send(Method::GET, "/", None, &cookie)
        .await
        .unwrap();
    assert_eq!(home.status, StatusCode::OK, "{}", home.text());
    assert!(
        newcomer.session().is_some(),
        "let in: the node gave a session"
    );
    assert!(metric(&gateway, "waiting_room_pages_total") >= 1.0);
    assert_eq!(metric(&gateway, "waiting_room_admitted_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waited_its_patience_gets_a_503_that_says_when_to_come_back() {
    let surge = "max_active = 1\nwaiting_room = false\nnewcomer_patience = \"1s\"";
    let (cluster, gateway) = site(1, surge).await;
    slow(&cluster, 1, Duration::from_millis(2500));
    let mut first = newcomers(&gateway, 1, NOT_A_PAGE);
    until_busy(&cluster).await;
    let started = Instant::now();
    let mut late = Browser::new(gateway.addr, "", "MoodleSession");
    let reply = late
        .send(Method::GET, "/", None, &[NOT_A_PAGE])
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), "10");
    assert!(reply.text().contains("very busy"), "{}", reply.text());
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(2400),
        "after its patience, not before and not when the node freed: {waited:?}"
    );
    let timeouts = r#"queue_turned_away_total{class="newcomer",reason="waited_too_long"}"#;
    assert_eq!(metric(&gateway, timeouts), 1.0);
    assert_eq!(first.join_next().await.unwrap().unwrap(), StatusCode::OK);
    let settings = gateway.app.gateway().settings();
    let node = &settings.upstreams.nodes()[0];
    assert!(
        node.health.is_up(),
        "a 503 of the line is never a health mark"
    );
}

async fn until_busy(cluster: &Cluster) {
    eventually(Duration::from_secs(10), "the node works", || {
        cluster.nodes()[0].busiest() >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_line_turns_a_newcomer_away_but_gives_a_student_a_newcomers_place() {
    let surge = "max_active = 1\nwaiting_room = false\nmax_waiting = 2";
    let (cluster, gateway) = site(1, surge).await;
    let (mut student, _) = support::logged_in(&gateway, 1).await;
    slow(&cluster, 1, Duration::from_millis(400));
    let mut crowd = newcomers(&gateway, 3, NOT_A_PAGE);
    until_queued(&gateway, 2).await;
    let mut late = Browser::new(gateway.addr, "", "MoodleSession");
    let turned = late
        .send(Method::GET, "/", None, &[NOT_A_PAGE])
        .await
        .unwrap();
    assert_eq!(
        turned.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "nobody to displace"
    );
    let page = student
        .send(Method::GET, "/my/", None, &[NOT_A_PAGE])
        .await
        .unwrap();
    assert_eq!(
        page.status,
        StatusCode::OK,
        "the student took a newcomer's place"
    );
    let mut statuses = Vec::new();
    while let Some(status) = crowd.join_next().await {
        statuses.push(status.unwrap());
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE
        ]
    );
    let full = r#"queue_turned_away_total{class="newcomer",reason="line_full"}"#;
    assert_eq!(metric(&gateway, full), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deal_passes_over_a_node_whose_line_is_long() {
    let (cluster, gateway) = site(2, "max_active = 1\nwaiting_room = false").await;
    let mut bound = Vec::new();
    while bound.len() < 3 {
        let (student, node) = support::logged_in(&gateway, bound.len()).await;
        if node == "web1" {
            bound.push(student);
        }
    }
    // web1's students keep it busy: a line longer than its cap.
    let web1 = cluster.by_name("web1").unwrap();
    web1.set_workers(Some((2, Duration::from_millis(300))));
    let mut holders = JoinSet::new();
    for mut student in bound {
        holders.spawn(async move { student.get("/my/").await.unwrap().status });
    }
    until_queued_on(&gateway, "web1").await;
    let web1_line = slots_of(&gateway, "web1");
    eventually(Duration::from_secs(5), "web1's line is long", || {
        web1_line.crowded()
    })
    .await;
    let dealt: Vec<String> = {
        let mut dealt = Vec::new();
        for _ in 0..4 {
            let mut newcomer = Browser::new(gateway.addr, "", "MoodleSession");
            dealt.push(newcomer.get("/").await.unwrap().upstream().to_owned());
        }
        dealt
    };
    assert_eq!(dealt, ["web2"; 4], "new sessions go where there is room");
    assert!(web1_line.now().passed_over >= 1, "and says so");
    all_ok(&mut holders).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_raises_the_cap_drops_no_waiting_request() {
    let (cluster, gateway) = site(1, "max_active = 1\nwaiting_room = false").await;
    cluster.nodes()[0].set_workers(Some((4, Duration::from_millis(200))));
    let mut crowd = newcomers(&gateway, 8, NOT_A_PAGE);
    until_queued(&gateway, 6).await;
    let raised = config(&cluster, "", "max_active = 3\nwaiting_room = false");
    let raised =
        moodle_gateway::Config::parse(&raised, std::path::Path::new("."), Default::default());
    gateway.app.gateway().apply(&raised.unwrap()).unwrap();
    all_ok(&mut crowd).await;
    assert_eq!(cluster.nodes()[0].busiest(), 3, "the new cap, and no more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_shared_store_a_request_waiting_for_a_node_that_dies_moves_to_another() {
    let keys = "session.store = \"shared\"\nhealth.interval = \"100ms\"\nhealth.timeout = \"50ms\"\nhealth.fall = 1";
    let (cluster, gateway) = site_with(2, keys, "max_active = 1\nwaiting_room = false").await;
    let (mut student, home) = support::logged_in(&gateway, 1).await;
    let node = cluster.by_name(&home).unwrap();
    node.set_workers(Some((2, Duration::from_secs(2))));
    let mut holder = student.at(gateway.addr);
    let held = tokio::spawn(async move { holder.get("/my/").await.map(|r| r.status) });
    until_busy_on(node).await;
    let waiting = tokio::spawn(async move { student.get("/my/").await.unwrap() });
    until_queued_on(&gateway, &home).await;
    node.stop();
    // The stand-ins keep node-local sessions whatever the gateway is told, so the
    // live node's answer is its login page: what matters is who gave it.
    let page = waiting.await.unwrap();
    assert!(!page.status.is_server_error(), "{}", page.text());
    assert_ne!(page.upstream(), home, "moved, as a shared session may be");
    assert!(!page.upstream().is_empty(), "answered by a node");
    let _ = held.await;
}

async fn until_busy_on(node: &moodle_gateway::demo::standin::StandIn) {
    eventually(Duration::from_secs(10), "the node works", || {
        node.busiest() >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_says_how_long_each_request_waited_for_its_node() {
    let dir = std::env::temp_dir().join(format!("mg-surge-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = support::TempDir(dir);
    let file = dir.0.join("access.log");
    let keys = format!("access_log.to = {:?}", file.display().to_string());
    let (cluster, gateway) = site_with(1, &keys, "max_active = 1\nwaiting_room = false").await;
    cluster.nodes()[0].set_workers(Some((2, Duration::from_millis(200))));
    let mut crowd = newcomers(&gateway, 3, NOT_A_PAGE);
    all_ok(&mut crowd).await;
    let lines = support::lines_of(&file, 3).await;
    let mut waits: Vec<f64> = (lines.iter())
        .map(|line| {
            let field = line.split(" queue_time=").nth(1).expect(line);
            field.split(' ').next().unwrap().parse().expect(line)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    assert!(waits[0] < 0.15, "the first went at once: {waits:?}");
    assert!(waits[2] >= 0.35, "the last waited for two pages: {waits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_quiz_start_a_page_turn_passes_the_class_starts_which_run_one_at_a_time_in_click_order(
) {
    // Cap 2, so the node runs one start at once ("auto": half its cap).
    let (cluster, gateway) = site(1, "max_active = 2\nwaiting_room = false").await;
    let (mut answering, _) = support::logged_in(&gateway, 1).await;
    let mut class = Vec::new();
    for n in 2..=6 {
        class.push(support::logged_in(&gateway, n).await.0);
    }
    slow(&cluster, 2, Duration::from_millis(300));
    cluster.nodes()[0].clear_requests();
    let mut starts = JoinSet::new();
    for (n, mut student) in class.into_iter().enumerate() {
        starts.spawn(async move { support::start_quiz(&mut student, &format!("click={n}")).await });
        // Each click a moment after the last, so the click order is known.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let web1 = slots_of(&gateway, "web1");
    eventually(Duration::from_secs(10), "starts wait at the gate", || {
        web1.now().starts_waiting >= 3
    })
    .await;
    let turn = answering
        .post(
            "/mod/quiz/processattempt.php",
            "attempt=12&thispage=0&nextpage=1",
        )
        .await
        .unwrap();
    assert_eq!(turn.status, StatusCode::OK);
    all_ok(&mut starts).await;
    let seen: Vec<String> = (cluster.nodes()[0].requests().iter())
        .map(|r| r.uri.path().trim_start_matches("/mod/quiz/").to_owned())
        .collect();
    assert_eq!(
        seen.iter().position(|p| p == "processattempt.php"),
        Some(1),
        "the page turn went right after the start already running: {seen:?}"
    );
    assert_eq!(cluster.nodes()[0].busiest(), 2, "the cap holds");
    let started: Vec<String> = (cluster.nodes()[0].requests().into_iter())
        .filter(|r| r.uri.path() == "/mod/quiz/startattempt.php")
        .map(|r| r.uri.query().unwrap_or_default().to_owned())
        .collect();
    let clicks: Vec<String> = (0..5).map(|n| format!("click={n}")).collect();
    assert_eq!(started, clicks, "starts in click order");
    assert_eq!(metric(&gateway, "quiz_start_wait_seconds_count"), 5.0);
    // Once through its gate a start stands in line as work in progress, and so
    // does its first page: the page turn, five starts, five first pages.
    let working = r#"queue_wait_seconds_count{class="working"}"#;
    assert_eq!(metric(&gateway, working), 11.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_page_turns_are_slow_beside_the_class_starts_the_site_lets_one_start_in_at_a_time_in_click_order(
) {
    // Cap 4: the node's gate lets two starts in at once ("auto": half its cap).
    let (cluster, gateway) = site(1, "max_active = 4\nwaiting_room = false").await;
    let mut answering = Vec::new();
    for n in 1..=2 {
        answering.push(support::logged_in(&gateway, n).await.0);
    }
    let mut class = Vec::new();
    for n in 3..=12 {
        class.push(support::logged_in(&gateway, n).await.0);
    }
    // Two students turn pages all along; quick ones while no start runs are the calm.
    slow(&cluster, 4, Duration::from_millis(10));
    let turning = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut turns = JoinSet::new();
    for mut student in answering {
        let turning = turning.clone();
        turns.spawn(async move {
            while turning.load(std::sync::atomic::Ordering::Relaxed) {
                let body = "attempt=12&thispage=0&nextpage=1";
                let turn = student.post("/mod/quiz/processattempt.php", body).await;
                assert_eq!(turn.unwrap().status, StatusCode::OK);
            }
        });
    }
    let site_starts = || gateway.app.gateway().site_starts_now();
    eventually(Duration::from_secs(10), "the turns' calm is seen", || {
        site_starts().calm.is_some()
    })
    .await;
    assert_eq!(site_starts().limit, Some(1), "a wave begins with one start");
    // The class starts, and the node slows down under it: the turns take some
    // twenty times their calm while starts run, and the share never grows.
    slow(&cluster, 4, Duration::from_millis(250));
    let mut starts = JoinSet::new();
    for (n, mut student) in class.into_iter().enumerate() {
        starts.spawn(async move { support::start_quiz(&mut student, &format!("click={n}")).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut widest = None;
    while !starts.is_empty() {
        let now = site_starts();
        widest = widest.max(now.limit);
        if let Ok(Some(status)) =
            tokio::time::timeout(Duration::from_millis(20), starts.join_next()).await
        {
            // Paced, never refused.
            assert_eq!(status.unwrap(), StatusCode::OK, "waiting is not an error");
        }
    }
    assert_eq!(
        widest,
        Some(1),
        "one start at a time while the turns are slow"
    );
    let started: Vec<String> = (cluster.nodes()[0].requests().into_iter())
        .filter(|r| r.uri.path() == "/mod/quiz/startattempt.php")
        .map(|r| r.uri.query().unwrap_or_default().to_owned())
        .collect();
    let clicks: Vec<String> = (0..10).map(|n| format!("click={n}")).collect();
    assert_eq!(started, clicks, "starts in click order");
    turning.store(false, std::sync::atomic::Ordering::Relaxed);
    while let Some(turned) = turns.join_next().await {
        turned.expect("every page turn was answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_holds_its_gate_until_its_first_page_is_answered_and_that_page_never_waits_there() {
    // One start at a time, and room on the node for more: only the gate orders them.
    let surge = "max_active = 4\nquiz_starts = 1\nwaiting_room = false";
    let (cluster, gateway) = site(1, surge).await;
    let mut class = Vec::new();
    for n in 1..=3 {
        class.push(support::logged_in(&gateway, n).await.0);
    }
    slow(&cluster, 4, Duration::from_millis(200));
    let node = &cluster.nodes()[0];
    node.clear_requests();
    let mut starts = JoinSet::new();
    for (n, mut student) in class.into_iter().enumerate() {
        starts.spawn(async move { support::start_quiz(&mut student, &format!("click={n}")).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    all_ok(&mut starts).await;
    // Each start reached the node only after the previous student's first page was
    // answered: a start and its first page, then the next.
    let seen: Vec<String> = (node.requests().iter())
        .map(|r| r.uri.path().trim_start_matches("/mod/quiz/").to_owned())
        .collect();
    let pairs = ["startattempt.php", "attempt.php"].repeat(3);
    assert_eq!(seen, pairs, "a start with its first page at a time");
    assert_eq!(node.busiest(), 1, "never a start beside a first page");
    let started: Vec<String> = (node.requests().into_iter())
        .filter(|r| r.uri.path() == "/mod/quiz/startattempt.php")
        .map(|r| r.uri.query().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(started, ["click=0", "click=1", "click=2"], "in click order");
    // Each first page took its start's place (none waited for the place to lapse),
    // and only the starts passed the gate.
    assert_eq!(metric(&gateway, "quiz_first_pages_total"), 3.0);
    assert_eq!(metric(&gateway, "quiz_start_wait_seconds_count"), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_who_clicks_start_twice_is_not_held_behind_their_own_first_start() {
    let surge = "max_active = 4\nquiz_starts = 1\nwaiting_room = false";
    let (_cluster, gateway) = site(1, surge).await;
    let (mut student, _) = support::logged_in(&gateway, 1).await;
    let start = "/mod/quiz/startattempt.php";
    for click in ["first", "second"] {
        let reply = student.post(start, "cmid=7&sesskey=s").await.unwrap();
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "the {click} click");
    }
    // The second took the place the first kept for its first page, instead of
    // waiting at the gate until that place lapsed.
    assert_eq!(metric(&gateway, "quiz_start_wait_seconds_count"), 1.0);
    let page = student.get("/mod/quiz/attempt.php?attempt=1&cmid=7").await;
    assert_eq!(page.unwrap().status, StatusCode::OK);
    assert_eq!(metric(&gateway, "quiz_first_pages_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_first_page_never_comes_gives_its_place_back_to_the_next_start() {
    let surge = "max_active = 4\nquiz_starts = 1\nwaiting_room = false";
    let (_cluster, gateway) = site(1, surge).await;
    let (mut gone, _) = support::logged_in(&gateway, 1).await;
    let (mut next, _) = support::logged_in(&gateway, 2).await;
    let start = "/mod/quiz/startattempt.php";
    let reply = gone.post(start, "cmid=7&sesskey=s").await.unwrap();
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    let answered = Instant::now();
    // Its tab closes: the first page is never asked for. The next start waits for
    // the place kept for that page, then gets it once it lapses.
    let web1 = slots_of(&gateway, "web1");
    let waits = tokio::spawn(async move { next.post(start, "cmid=7&sesskey=s").await });
    let at_gate = || web1.now().starts_waiting == 1;
    let four = Duration::from_secs(4);
    eventually(four, "the next start waits at the gate", at_gate).await;
    let lapsed = tokio::time::timeout(Duration::from_secs(8), waits).await;
    let reply = lapsed.expect("the kept place never lapsed").unwrap();
    let reply = reply.unwrap();
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "the next start got in");
    // Not before the place lapsed: a bound the gate sets, not a speed.
    let kept = answered.elapsed();
    assert!(
        kept >= Duration::from_secs(4),
        "the place was kept only {kept:?}"
    );
    assert_eq!(web1.now().starts_waiting, 0);
    assert_eq!(metric(&gateway, "quiz_first_pages_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_students_burst_takes_at_most_session_max_active_of_a_node_and_the_rest_wait() {
    let surge = "max_active = 8\nsession_max_active = 2\nwaiting_room = false";
    let (cluster, gateway) = site(1, surge).await;
    let (student, _) = support::logged_in(&gateway, 1).await;
    slow(&cluster, 8, Duration::from_millis(200));
    let mut burst = JoinSet::new();
    for _ in 0..6 {
        let mut same = student.at(gateway.addr);
        burst.spawn(async move { same.get("/course/view.php?id=2").await.unwrap().status });
    }
    all_ok(&mut burst).await;
    assert_eq!(
        cluster.nodes()[0].busiest(),
        2,
        "two of the session at once, though the node had room"
    );
    assert_eq!(metric(&gateway, "session_turn_waits_total"), 4.0);
    // Another student is not held by the first one's burst.
    let (mut other, _) = support::logged_in(&gateway, 2).await;
    assert_eq!(other.get("/my/").await.unwrap().status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_moodle_app_turned_away_by_the_line_gets_json_and_retry_after() {
    let surge = "max_active = 1\nwaiting_room = false\nnewcomer_patience = \"1s\"";
    let (cluster, gateway) = site(1, surge).await;
    slow(&cluster, 1, Duration::from_millis(2500));
    let mut first = newcomers(&gateway, 1, NOT_A_PAGE);
    until_busy(&cluster).await;
    let mut app = Browser::new(gateway.addr, "", "MoodleSession");
    let agent = (
        "user-agent",
        "Mozilla/5.0 (Linux; Android 14) MoodleMobile 4.4.0",
    );
    let reply = app
        .send(
            Method::POST,
            "/login/token.php",
            Some("username=a&password=b"),
            &[agent],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), "10");
    assert_eq!(
        reply.header("content-type"),
        "application/json; charset=utf-8"
    );
    let json: serde_json::Value = serde_json::from_str(&reply.text()).unwrap();
    assert_eq!(json["errorcode"], "waited_too_long");
    assert!(
        json["error"].as_str().unwrap().contains("very busy"),
        "{json}"
    );
    assert_eq!(json["message"], json["error"]);
    assert_eq!(first.join_next().await.unwrap().unwrap(), StatusCode::OK);
}

/// A node with a second PHP pool at a lower CPU priority (`low_priority_url`): a
/// logged-in student's work in progress (a page turn, an attempt's page) goes to
/// the node's own pool, everything else (a quiz start, a course page) to the low
/// one, in one session. A low pool that is down sends its requests to the node's
/// own, which is not taken for down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_work_goes_to_a_nodes_low_priority_pool_and_work_in_progress_to_its_own() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let low = cluster.low_pool("web1").unwrap();
    let own = &cluster.nodes()[0];
    let url = format!("url = \"http://{}\"\n", own.addr());
    let config = config(&cluster, "", "max_active = 2");
    assert!(config.contains(&url), "{config}");
    let both = format!("{url}low_priority_url = \"http://{}\"\n", low.addr());
    let gateway = TestGateway::start(&config.replace(&url, &both)).await;
    let (mut student, _) = support::logged_in(&gateway, 1).await;
    own.clear_requests();
    low.clear_requests();

    let turn = "/mod/quiz/processattempt.php";
    let ok = student.post(turn, "attempt=12&thispage=0&nextpage=1");
    assert_eq!(ok.await.unwrap().status, StatusCode::OK);
    let start = student.post("/mod/quiz/startattempt.php", "cmid=7&sesskey=s");
    assert_eq!(start.await.unwrap().status, StatusCode::SEE_OTHER);
    let ok = student.get("/course/view.php?id=2").await.unwrap();
    assert_eq!(ok.status, StatusCode::OK);
    let ok = student
        .get("/mod/quiz/attempt.php?attempt=12")
        .await
        .unwrap();
    assert_eq!(ok.status, StatusCode::OK);
    let paths = |node: &moodle_gateway::demo::standin::StandIn| -> Vec<String> {
        (node.requests().iter())
            .map(|r| r.uri.path().to_owned())
            .collect()
    };
    assert_eq!(
        paths(own),
        ["/mod/quiz/processattempt.php", "/mod/quiz/attempt.php"]
    );
    assert_eq!(
        paths(&low),
        ["/mod/quiz/startattempt.php", "/course/view.php"]
    );

    low.stop();
    for _ in 0..3 {
        let page = student.get("/course/view.php?id=2").await.unwrap();
        assert_eq!(page.status, StatusCode::OK, "sent to the node's own pool");
    }
    let settings = gateway.app.gateway().settings();
    let web1 = settings.upstreams.by_name("web1").unwrap();
    assert!(web1.health.is_up(), "a low pool down is not its node down");
    assert_eq!(cluster.lost_sessions(), 0, "nobody was logged out");
}

/// A node's low-priority pool has its own workers, so it has its own cap: with the
/// pool's workers all taken by slow new work (course pages here, a class's starts
/// on exam day), a student's page turn finds the node's own pool free and never
/// waits in the gateway, while new work beyond the pool's cap still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_turn_never_waits_for_the_low_priority_pools_workers() {
    const TOKEN: &str = "surge-admin-token-0123456789-abcdef";
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let low = cluster.low_pool("web1").unwrap();
    let url = format!("url = \"http://{}\"\n", cluster.nodes()[0].addr());
    let surge = "\n[surge]\nmax_active = 2\nwaiting_room = false\n";
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), surge);
    let both = format!("{url}low_priority_url = \"http://{}\"\n", low.addr());
    let gateway = TestGateway::start(&config.replace(&url, &both)).await;
    let (mut answering, _) = support::logged_in(&gateway, 1).await;
    let mut reading = Vec::new();
    for n in 2..=4 {
        reading.push(support::logged_in(&gateway, n).await.0);
    }
    // The pool's pages take long enough that a turn waiting for one of its
    // workers would wait for all of this.
    low.set_workers(Some((3, Duration::from_secs(3))));
    let mut pages = JoinSet::new();
    for mut student in reading {
        pages.spawn(async move { student.get("/course/view.php?id=2").await.unwrap().status });
    }
    let settings = gateway.app.gateway().settings();
    let web1 = settings.upstreams.by_name("web1").unwrap();
    let pool = web1.low_priority.as_ref().unwrap().slots.clone();
    eventually(Duration::from_secs(10), "the pool is at its cap", || {
        pool.now().active == 2 && pool.now().queued.iter().sum::<usize>() == 1
    })
    .await;

    let turn = "/mod/quiz/processattempt.php";
    let turn = answering.post(turn, "attempt=12&thispage=0&nextpage=1");
    assert_eq!(turn.await.unwrap().status, StatusCode::OK);
    let (waits, waited) = (
        r#"queue_wait_seconds_count{class="working"}"#,
        r#"queue_wait_seconds_sum{class="working"}"#,
    );
    assert_eq!(
        metric(&gateway, waits),
        1.0,
        "the turn took a slot as work in progress"
    );
    assert_eq!(metric(&gateway, waited), 0.0, "and found a worker at once");
    assert_eq!(pool.now().active, 2, "the pool's pages were still running");
    // An admin sees both pools, each with its own cap.
    let nodes = format!("http://{}/nodes", gateway.admin_addr.unwrap());
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let seen = support::send(&nodes, "GET", &auth, axum::body::Body::empty()).await;
    let nodes: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    let web1 = &nodes["nodes"][0];
    assert_eq!(
        (&web1["max_active"], &web1["active"]),
        (&2.into(), &0.into())
    );
    let pool_row = &web1["low_priority"];
    assert_eq!(pool_row["url"], format!("http://{}", low.addr()));
    assert_eq!(
        (&pool_row["max_active"], &pool_row["active"]),
        (&2.into(), &2.into())
    );
    assert_eq!(pool_row["queued"]["logged_in"], 1, "{web1}");
    all_ok(&mut pages).await;
    assert_eq!(low.busiest(), 2, "the pool's cap held");
    assert_eq!(cluster.lost_sessions(), 0, "nobody was logged out");
}

/// A newcomer whose node cannot be reached at all (neither its low-priority pool
/// nor its own) moves to the next node, and there goes to that node's
/// low-priority pool, as new work does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_work_that_moves_to_another_node_goes_to_that_nodes_low_priority_pool() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let mut config = config(&cluster, "", "max_active = 2\nwaiting_room = false");
    let mut pools = Vec::new();
    for (n, node) in cluster.nodes().iter().enumerate() {
        let low = cluster.low_pool(&format!("web{}", n + 1)).unwrap();
        let url = format!("url = \"http://{}\"\n", node.addr());
        let both = format!("{url}low_priority_url = \"http://{}\"\n", low.addr());
        config = config.replace(&url, &both);
        pools.push(low);
    }
    let gateway = TestGateway::start(&config).await;
    // web1 is gone, both of its pools, before the gateway's probes notice.
    cluster.nodes()[0].stop();
    pools[0].stop();
    for _ in 0..4 {
        let mut newcomer = Browser::new(gateway.addr, "", "MoodleSession");
        let page = newcomer.get("/login/index.php").await.unwrap();
        assert_eq!(page.status, StatusCode::OK, "moved, not refused");
    }
    let seen = |node: &moodle_gateway::demo::standin::StandIn| node.requests().len();
    assert_eq!(
        seen(&cluster.nodes()[1]),
        0,
        "web2's own pool kept for work in progress"
    );
    assert_eq!(
        seen(&pools[1]),
        4,
        "every login page on web2's low-priority pool"
    );
}
