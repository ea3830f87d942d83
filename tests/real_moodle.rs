//! The real-Moodle suite: Moodle 4.5 (four `php -S` web nodes and a data server on one
//! installed site, a private MariaDB) behind the real `moodle-gateway` binary, driven by
//! scripted students through the gateway only. The golden rule under test: the gateway
//! never logs a student out.
//!
//! Every test needs PHP and MariaDB, so each is `#[ignore]`d for a plain `cargo test`;
//! `tests/moodle/run.sh` installs what is missing and runs them. The first run installs
//! Moodle once into `target/real-moodle-cache/`; later runs restore it in seconds.
//! `REAL_MOODLE_KEEP=1` keeps the scratch directories (node, MariaDB and gateway logs).

#[path = "real_moodle/cluster.rs"]
mod cluster;
#[path = "real_moodle/export.rs"]
mod export;
#[path = "real_moodle/journey.rs"]
mod journey;
#[path = "real_moodle/measure.rs"]
mod measure;
#[path = "real_moodle/processes.rs"]
mod processes;
#[path = "real_moodle/site.rs"]
mod site;
#[path = "real_moodle/student.rs"]
mod student;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cluster::{admin_addr, config_for, Cluster, Gateway, Store, NODES};
use http::StatusCode;
use journey::{journey, Env, Outcome};
use site::Site;
use student::http_client;

/// Students who visit one after another, then all at once, per session mode.
const SEQUENTIAL: usize = 8;
const CONCURRENT: usize = 16;

#[test]
#[ignore = "needs PHP and MariaDB: run tests/moodle/run.sh"]
fn with_a_shared_session_store_no_student_is_ever_logged_out() {
    students_keep_their_sessions(Store::Shared, false);
}

#[test]
#[ignore = "needs PHP and MariaDB: run tests/moodle/run.sh"]
fn with_node_local_sessions_no_student_is_ever_logged_out() {
    students_keep_their_sessions(Store::NodeLocal, false);
}

/// Node-local sessions with every file offloaded: each SCORM file (every URL form) and
/// the file resource is authorised by the student's own node (`X-Accel-Redirect`) and
/// fetched by the gateway from the data server's nginx file export.
#[test]
#[ignore = "needs PHP, MariaDB and nginx: run tests/moodle/run.sh"]
fn with_node_local_sessions_and_offload_no_student_is_ever_logged_out() {
    students_keep_their_sessions(Store::NodeLocal, true);
}

/// With `[offload]`, `check` accepts node-local sessions: SCORM files no longer go to
/// a data server that cannot read them.
#[test]
#[ignore = "needs PHP, MariaDB and nginx: run tests/moodle/run.sh"]
fn check_accepts_node_local_sessions_with_offload() {
    let _one = heavy();
    let site = Site::restore();
    let cluster = Cluster::start_offload(&site);
    let (code, stdout, stderr) = check(&config_for(&cluster, admin_addr()));
    assert_eq!(
        code,
        Some(0),
        "check refuses node-local sessions with [offload]:\n{stdout}{stderr}"
    );
    let export = cluster.offload.as_ref().unwrap().url();
    assert!(
        stdout.contains(&export),
        "check names the export {export}:\n{stdout}"
    );
}

/// Not a test: PHP worker time and gateway CPU per download, served by PHP vs
/// offloaded. `bench/offload.sh` runs it (release build); never part of run.sh.
#[test]
#[ignore = "a measure, not a test: bench/offload.sh"]
fn measure_offload_php_time_and_gateway_cpu() {
    let _one = heavy();
    measure::offload();
}

/// The logout risk, documented: with node-local sessions the data server (a Moodle)
/// cannot read any student's session, so every SCORM file it is sent logs the student
/// out. `check` must refuse such a config.
#[test]
#[ignore = "needs PHP and MariaDB: run tests/moodle/run.sh"]
fn check_refuses_node_local_sessions_with_scorm_on_a_moodle_data_server() {
    let _one = heavy();
    let site = Site::restore();
    let cluster = Cluster::start(&site, Store::NodeLocal);
    let (code, stdout, stderr) = check(&config_for(&cluster, admin_addr()));
    assert_eq!(
        code,
        Some(1),
        "check accepts node-local sessions with SCORM files sent to a Moodle data server:\n{stdout}{stderr}",
    );
    assert!(
        stderr.contains("node-local"),
        "the refusal names the store: {stderr}"
    );
}

/// `moodle-gateway check` of `config` (with a token file): exit code, stdout, stderr.
fn check(config: &str) -> (Option<i32>, String, String) {
    let dir = processes::Scratch::new("check");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    std::fs::write(
        dir.path().join("admin.token"),
        "a-token-for-check-0123456789abcdef
",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .current_dir(dir.path())
        .args(["check", "--config"])
        .arg(&path)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

/// The shipped config.toml with only its addresses changed must work on real Moodle:
/// every node and the data server stay up through the first rounds of probes.
#[test]
#[ignore = "needs PHP and MariaDB: run tests/moodle/run.sh"]
fn the_shipped_config_with_only_addresses_changed_keeps_real_moodle_up() {
    let _one = heavy();
    let site = Site::restore();
    let cluster = Cluster::start(&site, Store::Shared);
    let admin = admin_addr();
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
    let mut config = shipped.clone();
    let mut swap = |from: &str, to: String| {
        assert_eq!(
            config.matches(from).count(),
            1,
            "config.toml has one {from}"
        );
        config = config.replace(from, &to);
    };
    swap(
        "listen = \"0.0.0.0:8080\"",
        format!("listen = \"{}\"", cluster.public),
    );
    swap(
        "listen = \"127.0.0.1:9090\"",
        format!("listen = \"{admin}\""),
    );
    swap(
        "wwwroot = \"https://moodle.example.edu\"",
        format!("wwwroot = \"http://{}\"", cluster.public),
    );
    swap(
        "file = \"moodle-gateway.state\"",
        "file = \"gateway.state\"".into(),
    );
    for (i, node) in cluster.nodes.iter().enumerate() {
        swap(
            &format!("url = \"http://192.168.1.{}\"\n", i + 1),
            format!("url = \"http://{}\"\n", node.addr),
        );
    }
    swap(
        "url = \"http://192.168.1.5\"",
        format!("url = \"http://{}\"", cluster.data.addr),
    );
    assert!(
        config.contains("token_file = \"admin.token\""),
        "the token stays in admin.token"
    );
    // The shipped file leaves the probe at its default, under the site's path (here "").
    assert!(
        !shipped.contains("\npath = "),
        "config.toml sets no [site] or [health] path"
    );
    let probe = moodle_gateway::config::DEFAULT_HEALTH_PATH;

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = http_client();
        cluster.warm(&client).await;
        let gateway = Gateway::start(&config, cluster.public, admin, &client);
        // Upstreams start up; `fall` (3) failed probes every `interval` (2 s) after the
        // first round mark one down: 10 s see at least four rounds.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            for (name, health) in gateway.health().await {
                assert_eq!(
                    health,
                    "up",
                    "{name} is down after {:.1?} with the shipped probe {probe}",
                    started.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        for node in cluster.all() {
            let log = std::fs::read_to_string(&node.log).unwrap();
            let probes = log
                .lines()
                .filter(|l| l.contains(&format!("GET {probe}")))
                .count();
            assert!(probes >= 3, "{} saw {probes} probes of {probe}", node.name);
        }
    });
}

/// Every mode: 8 students one after another, then 16 at once, each through a whole
/// visit; then the figures, the deal, every gateway's table and counts, the stored
/// tracking data and (offload) what the export served.
fn students_keep_their_sessions(store: Store, offload: bool) {
    let _one = heavy();
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = Arc::new(start(store, offload).await);
        let visits = visit(&env).await;
        let all: Vec<&Outcome> = visits.sequential.iter().chain(&visits.concurrent).collect();
        let lost: Vec<&String> = all.iter().flat_map(|o| &o.lost).collect();
        let deal = per_node(&all);
        eprintln!(
            "real-moodle [{}]: {} students ({SEQUENTIAL} sequential in {:.1?}, {CONCURRENT} concurrent in {:.1?}), \
             {} requests, {} lost sessions, deal {:?} (sequential {:?}, concurrent {:?}), wall {:.1?}",
            env.cluster.mode(),
            all.len(),
            visits.sequential_time,
            visits.concurrent_time,
            all.iter().map(|o| o.requests).sum::<usize>(),
            lost.len(),
            deal,
            per_node(&visits.sequential.iter().collect::<Vec<_>>()),
            per_node(&visits.concurrent.iter().collect::<Vec<_>>()),
            started.elapsed(),
        );
        assert!(lost.is_empty(), "lost sessions: {lost:#?}");
        deal_goes_round(&visits.sequential);
        for outcomes in [&visits.sequential, &visits.concurrent] {
            let counts = per_node(&outcomes.iter().collect::<Vec<_>>());
            let (min, max) = (counts.values().min().unwrap(), counts.values().max().unwrap());
            assert!(max - min <= 1, "an uneven deal: {counts:?}");
        }
        for gateway in &env.gateways {
            table_matches(gateway, &all, &deal).await;
        }
        tracking_stored(&env, &all);
        if env.cluster.offload.is_some() {
            export_served(&env, &all).await;
        }
        gateways_agree(&env, &deal).await;
    });
}

/// The students' visits: the sequential ones and the concurrent ones, and how long
/// each part took.
struct Visits {
    sequential: Vec<Outcome>,
    sequential_time: Duration,
    concurrent: Vec<Outcome>,
    concurrent_time: Duration,
}

/// 8 students one after another, then 16 at once.
async fn visit(env: &Arc<Env>) -> Visits {
    let students = &env.site.data.students;
    assert!(students.len() >= SEQUENTIAL + CONCURRENT);

    let sequential_started = Instant::now();
    let mut sequential = Vec::new();
    for account in &students[..SEQUENTIAL] {
        sequential.push(journey(env, account).await);
    }
    let sequential_time = sequential_started.elapsed();

    let concurrent_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for account in &students[SEQUENTIAL..SEQUENTIAL + CONCURRENT] {
        let (env, account) = (env.clone(), account.clone());
        tasks.spawn(async move { journey(&env, &account).await });
    }
    let mut concurrent = Vec::new();
    while let Some(done) = tasks.join_next().await {
        concurrent.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
    }
    Visits {
        sequential,
        sequential_time,
        concurrent,
        concurrent_time: concurrent_started.elapsed(),
    }
}

/// What every gateway's own counts say after the visits: no node marked down, no
/// loss detected, and the sessions each dealt adding up to the students' deal.
async fn gateways_agree(env: &Env, deal: &BTreeMap<String, usize>) {
    let mut dealt: BTreeMap<String, f64> = BTreeMap::new();
    for gateway in &env.gateways {
        for (name, health) in gateway.health().await {
            assert_eq!(health, "up", "{name} was marked down during the run");
        }
        // Every login and logout rotated an id: none of them is a loss.
        assert_eq!(gateway.losses().await, [], "the detector counted a loss");
        let metrics = gateway.metrics().await;
        for node in NODES {
            let key = format!("moodle_gateway_sessions_dealt_total{{node=\"{node}\"}}");
            let count = metrics.get(&key).copied().unwrap_or(0.0);
            *dealt.entry(node.to_string()).or_default() += count;
        }
    }
    let want: BTreeMap<String, f64> = deal.iter().map(|(n, c)| (n.clone(), *c as f64)).collect();
    assert_eq!(
        dealt, want,
        "sessions_dealt_total, summed over the gateways"
    );
}

/// The detector on real Moodle: a logged-in student whose session file vanishes (a
/// store failure, a cleanup job, NFS) gets Moodle's login page with a new id, and the
/// gateway counts exactly one loss on that node, with the cause `dropped`. Logging
/// in again is never one.
#[test]
#[ignore = "needs PHP and MariaDB: run tests/moodle/run.sh"]
fn a_student_whose_session_file_vanishes_is_counted_as_one_loss() {
    let _one = heavy();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let env = start(Store::NodeLocal, false).await;
        let account = &env.site.data.students[0];
        let mut b = env.browser();
        let first = journey::log_in(&env, &mut b, account).await;
        let node = env
            .cluster
            .nodes
            .iter()
            .find(|n| n.name == first.node)
            .unwrap();
        let file = node
            .sessions
            .as_ref()
            .unwrap()
            .join(format!("sess_{}", first.session));
        std::fs::remove_file(&file).unwrap();

        b.logged_in = false;
        let hops = b.get("/my/").await;
        let issued = hops[0].sets_session().expect("Moodle issues a new id");
        assert_ne!(issued, first.session);
        assert!(
            hops.last()
                .unwrap()
                .request
                .starts_with("GET /login/index.php"),
            "Moodle sends the student to log in: {:?}",
            student::requests(&hops)
        );
        let loss = format!(
            "moodle_gateway_session_losses_total{{cause=\"dropped\",node=\"{}\"}}",
            first.node
        );
        assert_eq!(env.gateway().losses().await, [(loss.clone(), 1.0)]);

        // She logs in again from a fresh browser: a login is never a loss.
        let mut again = env.browser();
        journey::log_in(&env, &mut again, account).await;
        assert_eq!(env.gateway().losses().await, [(loss, 1.0)]);
    });
}

/// Restores the site, starts the cluster, warms it, and starts the gateway.
async fn start(store: Store, offload: bool) -> Env {
    let site = Site::restore();
    let cluster = match offload {
        false => Cluster::start(&site, store),
        true => Cluster::start_offload(&site),
    };
    let client = http_client();
    let warming = Instant::now();
    let assets = cluster.warm(&client).await;
    eprintln!("real-moodle: nodes warmed in {:.1?}", warming.elapsed());
    let admin = admin_addr();
    let config = config_for(&cluster, admin);
    let gateways = vec![Gateway::start(&config, cluster.public, admin, &client)];
    Env {
        gateways,
        cluster,
        site,
        client,
        assets,
    }
}

/// New sessions, one after another, go round the nodes in order: nothing else (the
/// theme and JavaScript requests between them included) moved the deal.
fn deal_goes_round(outcomes: &[Outcome]) {
    let index = |o: &Outcome| {
        NODES
            .iter()
            .position(|n| *n == o.dealt)
            .expect("a web node")
    };
    for pair in outcomes.windows(2) {
        assert_eq!(
            index(&pair[1]),
            (index(&pair[0]) + 1) % NODES.len(),
            "{} on {} then {} on {}",
            pair[0].username,
            pair[0].dealt,
            pair[1].username,
            pair[1].dealt
        );
    }
}

fn per_node(outcomes: &[&Outcome]) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = NODES.iter().map(|n| (n.to_string(), 0)).collect();
    for outcome in outcomes {
        *counts.get_mut(&outcome.dealt).expect("a web node") += 1;
    }
    counts
}

/// After every visit, `gateway`'s admin table holds exactly each student's
/// post-logout session, anonymous, on the node the student was dealt.
async fn table_matches(gateway: &Gateway, all: &[&Outcome], deal: &BTreeMap<String, usize>) {
    let (status, table) = gateway.admin_get("/affinity?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{table}");
    let on = gateway.public;
    assert_eq!(
        table["total"]["live"],
        all.len(),
        "{on}: {}",
        table["total"]
    );
    assert_eq!(table["total"]["logged_in"], 0, "{on}: {}", table["total"]);
    for row in table["nodes"].as_array().unwrap() {
        let name = row["name"].as_str().unwrap();
        assert_eq!(row["live"], deal[name], "{on}: {name}: {row}");
    }
    for outcome in all {
        let entry = gateway
            .lookup(&outcome.after_logout)
            .await
            .expect("still bound");
        let student = &outcome.username;
        assert_eq!(entry["node"], outcome.dealt.as_str(), "{on}: {student}");
    }
}

/// What each student's SCORM POST saved is in `scorm_scoes_value`, for that student.
fn tracking_stored(env: &Env, all: &[&Outcome]) {
    let rows = env.site.sql(&format!(
        "SELECT u.username, e.element, v.value FROM mdl_scorm_scoes_value v \
         JOIN mdl_scorm_attempt a ON a.id = v.attemptid JOIN mdl_scorm_element e ON e.id = v.elementid \
         JOIN mdl_user u ON u.id = a.userid WHERE a.scormid = {} \
         AND e.element IN ('cmi.core.lesson_status', 'cmi.core.score.raw', 'cmi.suspend_data')",
        env.site.data.scorm.id
    ));
    let mut stored: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for row in rows.lines() {
        let cols: Vec<&str> = row.splitn(3, '\t').collect();
        stored
            .entry(cols[0].to_string())
            .or_default()
            .push((cols[1].to_string(), cols[2].to_string()));
    }
    for outcome in all {
        let mut want = outcome.tracked.clone();
        want.sort();
        let mut got = stored.remove(&outcome.username).unwrap_or_default();
        got.sort();
        assert_eq!(got, want, "{}'s SCORM tracking", outcome.username);
    }
    assert!(stored.is_empty(), "tracking nobody sent: {stored:?}");
}

/// Offload mode: the export's access log holds exactly the fetches the students'
/// files needed: every offloaded file came from there, none twice, nothing else.
async fn export_served(env: &Env, all: &[&Outcome]) {
    let export = env.cluster.offload.as_ref().unwrap();
    let mut want: BTreeMap<(String, u16), usize> = BTreeMap::new();
    for (path, status) in all.iter().flat_map(|o| &o.fetched) {
        *want.entry((path.clone(), *status)).or_default() += 1;
    }
    assert!(!want.is_empty(), "no file was offloaded");
    // nginx logs a request as it finishes, which may be just after the gateway's last
    // byte reached the student.
    let mut got = export.counts();
    for _ in 0..40 {
        if got == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        got = export.counts();
    }
    assert_eq!(got, want, "the export's fetches (path, status) -> count");
    for fetch in export.fetches() {
        assert!(
            fetch.uri.starts_with("/dataroot/filedir/"),
            "the gateway fetched {fetch:?}"
        );
    }
}

/// One heavy test at a time: they share two cores.
fn heavy() -> MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}
