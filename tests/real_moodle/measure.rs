//! The measures (not tests: nothing here is asserted about time).
//!
//! The offload measure: one student downloads the same 50 MiB file resource through
//! the gateway, first served by PHP (no offload), then offloaded (`X-Accel-Redirect`,
//! the bytes from the nginx export). For each: how long the node's PHP worker was
//! busy per download (prepend.php's request log) and the gateway's CPU per MiB
//! (`/proc/<pid>/stat` utime + stime).
//!
//! The surge measure: the same surge (`surge::EXAM_MORNING`) three times on one site
//! and one set of nodes with two PHP workers each, behind the gateway capping them
//! at two, the gateway without a cap, and HAProxy with `maxconn 2` per node and a
//! plain queue; what the students saw, side by side.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

use crate::cluster::{
    admin_addr, config_for, surge_section, with_low_pools, Cluster, Gateway, Store,
};
use crate::haproxy::Haproxy;
use crate::quiz;
use crate::site::{script, Site, StoredFile, PHP_INI};
use crate::student::{between, http_client, Browser};
use crate::surge::{self, percentiles, Plan, Record, Stage, BIG_MORNING, EXAM_MORNING, SMALL_POOL};

/// The file's size, and how many timed downloads each way (after one untimed).
const MIB: u64 = 50;
const DOWNLOADS: usize = 8;

/// One way of serving the file, measured.
struct Figures {
    /// The node's request time of each timed download, in microseconds.
    node_us: Vec<u64>,
    /// The gateway's CPU over the timed downloads, in seconds.
    gateway_cpu: f64,
    /// Wall time of the timed downloads.
    wall: Duration,
    /// Fetches the export logged.
    fetches: usize,
}

/// Runs both rounds on one restored site and prints the table.
pub fn offload() {
    let site = Site::restore();
    let big = big_file(&site);
    let stored = site.stored(&big.contenthash);
    assert_eq!(stored.len() as u64, MIB * 1024 * 1024);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (php, offloaded) = runtime.block_on(async {
        let php = round(&site, &big, &stored, false).await;
        let offloaded = round(&site, &big, &stored, true).await;
        (php, offloaded)
    });
    assert_eq!(php.fetches, 0, "PHP served the file: nothing fetched");
    assert_eq!(offloaded.fetches, DOWNLOADS + 1, "every download offloaded");

    let mib = (MIB as usize * DOWNLOADS) as f64;
    let median = |f: &Figures| {
        let mut v = f.node_us.clone();
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1000.0
    };
    let mean = |f: &Figures| f.node_us.iter().sum::<u64>() as f64 / f.node_us.len() as f64 / 1000.0;
    let cpu_per_mib = |f: &Figures| f.gateway_cpu * 1000.0 / mib;
    let per_download = |f: &Figures| f.wall.as_secs_f64() * 1000.0 / DOWNLOADS as f64;
    eprintln!(
        "\nmeasure_offload: {DOWNLOADS} downloads of a {MIB} MiB mod_resource file per row, one student, through the gateway"
    );
    eprintln!(
        "{:<12} {:>16} {:>16} {:>20} {:>18}",
        "served by", "node ms median", "node ms mean", "gateway CPU ms/MiB", "wall ms/download"
    );
    for (name, f) in [("PHP", &php), ("offload", &offloaded)] {
        eprintln!(
            "{name:<12} {:>16.2} {:>16.2} {:>20.3} {:>18.1}",
            median(f),
            mean(f),
            cpu_per_mib(f),
            per_download(f)
        );
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    eprintln!(
        "{:<12} {:>16.4} {:>16.4} {:>20.3} {:>18.3}\n",
        "offload/PHP",
        ratio(median(&offloaded), median(&php)),
        ratio(mean(&offloaded), mean(&php)),
        ratio(cpu_per_mib(&offloaded), cpu_per_mib(&php)),
        ratio(per_download(&offloaded), per_download(&php)),
    );
}

/// A cluster (node-local sessions, offloaded or not) and a gateway; one student logs
/// in and downloads the file `DOWNLOADS + 1` times, the first untimed.
async fn round(site: &Site, big: &StoredFile, stored: &[u8], offload: bool) -> Figures {
    let cluster = if offload {
        Cluster::start_offload(site)
    } else {
        Cluster::start(site, Store::NodeLocal)
    };
    let client = http_client();
    cluster.warm(&client).await;
    let admin = admin_addr();
    let gateway = Gateway::start(&config_for(&cluster, admin), cluster.public, admin, &client);
    let mut b = Browser::new(client, &cluster.wwwroot());
    let node = log_in(&mut b, &site.data.students[0]).await;
    download(&mut b, big, stored, &node).await;
    let cpu_before = cpu_seconds(gateway.pid());
    let started = Instant::now();
    for _ in 0..DOWNLOADS {
        download(&mut b, big, stored, &node).await;
    }
    let wall = started.elapsed();
    let gateway_cpu = cpu_seconds(gateway.pid()) - cpu_before;
    assert!(b.lost.is_empty(), "lost sessions: {:?}", b.lost);

    let log = cluster.nodes.iter().find(|n| n.name == node).unwrap();
    // The shutdown function writes after the answer has gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let times: Vec<u64> = std::fs::read_to_string(&log.requests)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, uri)| *uri == big.url)
        .map(|(us, _)| us.parse().unwrap())
        .collect();
    assert_eq!(times.len(), DOWNLOADS + 1, "{node}'s request log");
    let fetches = cluster.offload.as_ref().map_or(0, |e| {
        e.fetches()
            .iter()
            .filter(|f| f.uri == crate::export::pool_path(&big.contenthash))
            .count()
    });
    Figures {
        node_us: times[1..].to_vec(),
        gateway_cpu,
        wall,
        fetches,
    }
}

/// One download of the file, checked: every byte, from the student's node.
async fn download(b: &mut Browser, big: &StoredFile, stored: &[u8], node: &str) {
    let url = &big.url;
    let page = b.send(Method::GET, url, &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{url}: {}", page.text());
    assert!(page.body == stored, "{url}: the bytes Moodle stored");
    assert_eq!(page.node(), Some(node), "{url}");
}

/// Logs `account` in through the gateway; the node it was dealt.
async fn log_in(b: &mut Browser, account: &crate::site::StudentAccount) -> String {
    let form = b.get("/login/index.php").await.pop().unwrap();
    let token = between(&form.text(), "name=\"logintoken\" value=\"", "\"")
        .expect("the form has a logintoken")
        .to_string();
    let fields = [
        ("anchor", ""),
        ("logintoken", token.as_str()),
        ("username", account.username.as_str()),
        ("password", account.password.as_str()),
    ];
    let hops = b.post("/login/index.php", &fields).await;
    let dashboard = hops.last().unwrap();
    assert!(dashboard.request.starts_with("GET /my/"), "logged in");
    b.logged_in = true;
    dashboard.node().expect("Moodle names its node").to_string()
}

/// Adds the big file resource to the restored site (tests/moodle/bigfile.php).
fn big_file(site: &Site) -> StoredFile {
    let out = crate::processes::run(
        "tests/moodle/bigfile.php",
        Command::new("php")
            .args(PHP_INI)
            .arg(script("bigfile.php"))
            .arg(format!("--mib={MIB}"))
            .envs(site.env("http://127.0.0.1:9")),
    );
    serde_json::from_str(&out).expect("bigfile.php prints the file")
}

/// utime + stime of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    let out = crate::processes::run("getconf CLK_TCK", Command::new("getconf").arg("CLK_TCK"));
    out.trim().parse().unwrap()
}

/// What stands in front of the nodes in one round of the surge measure.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// `GATEWAY_BEFORE`'s build with `[surge] max_active` = the workers: a "before"
    /// beside [`Side::Capped`] in one run.
    CappedBefore,
    /// The gateway with `[surge] max_active` = the workers, every other key at its
    /// default.
    Capped,
    /// The gateway without `[surge]`: every request goes straight to its node.
    Uncapped,
    /// HAProxy, `maxconn` = the workers per node, `timeout queue 60s`.
    Haproxy,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::CappedBefore => "before, max_active 2",
            Side::Capped => "gateway, max_active 2",
            Side::Uncapped => "gateway, no cap",
            Side::Haproxy => "HAProxy, maxconn 2",
        }
    }
}

/// One round: the side, what the surge left, and the waiting pages the newcomers
/// were shown.
struct Round {
    side: Side,
    record: Record,
    waiting_pages: usize,
}

/// The three rounds on one restored site and one cluster (four with
/// `GATEWAY_BEFORE`, whose build goes first, capped), then the table.
///
/// Sessions are node-local and nothing is offloaded: HAProxy cannot serve
/// `X-Accel-Redirect`, and the surge's load has no SCORM file in it (logins,
/// dashboards, course pages and SCORM tracking POSTs, every one a PHP script), so
/// no side needs the offload or the data server.
pub fn surge() {
    let plan = surge_plan();
    let site = Arc::new(Site::restore());
    let cluster = Cluster::start_with(&site, Store::NodeLocal, false, SMALL_POOL);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rounds = runtime.block_on(async {
        let client = http_client();
        cluster.warm(&client).await;
        let stage = Stage {
            origin: cluster.wwwroot(),
            site: site.clone(),
            client: client.clone(),
        };
        warm_up(&cluster, &stage).await;
        let mut rounds = Vec::new();
        let before = before_binary().map(|_| Side::CappedBefore);
        let sides = before
            .into_iter()
            .chain([Side::Capped, Side::Uncapped, Side::Haproxy]);
        for side in sides {
            rounds.push(surge_round(&cluster, &stage, side, plan).await);
            // The nodes finish what the last side left them (sessions written).
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        rounds
    });
    print_surge(&rounds, plan);
}

/// `GATEWAY_BEFORE`: another gateway build a measure runs first, as its "before".
fn before_binary() -> Option<PathBuf> {
    std::env::var_os("GATEWAY_BEFORE").map(PathBuf::from)
}

/// The surge to measure: `SURGE_NEWCOMERS=280` for the big morning (280 newcomers
/// within 3 s), else the exam morning's 120.
fn surge_plan() -> Plan {
    match std::env::var("SURGE_NEWCOMERS").as_deref() {
        Ok("280") => BIG_MORNING,
        Ok("120" | "") | Err(_) => EXAM_MORNING,
        Ok(other) => panic!("SURGE_NEWCOMERS: 120 or 280, not {other}"),
    }
}

/// A small surge behind the uncapped gateway, not measured: every script of the
/// surge compiled into each node's opcache and Moodle's caches filled, so that the
/// first side measured pays no more of that than the others.
async fn warm_up(cluster: &Cluster, stage: &Stage) {
    let started = Instant::now();
    let admin = admin_addr();
    let gateway = Gateway::start(
        &config_for(cluster, admin),
        cluster.public,
        admin,
        &stage.client,
    );
    let small = Plan {
        students: 8,
        newcomers: 16,
        arrivals: Duration::from_secs(1),
        before: Duration::from_secs(3),
        ..EXAM_MORNING
    };
    let record = surge::run(stage, small).await;
    drop(gateway);
    let errors = record.errors();
    assert!(errors.is_empty(), "the warm-up: {errors:#?}");
    eprintln!("measure_surge: warmed up in {:.1?}", started.elapsed());
}

/// One side in front of the cluster on wwwroot's address, the surge, the side gone.
async fn surge_round(cluster: &Cluster, stage: &Stage, side: Side, plan: Plan) -> Round {
    let client = &stage.client;
    let admin = admin_addr();
    let config = config_for(cluster, admin);
    let (gateway, haproxy) = match side {
        Side::CappedBefore | Side::Capped => {
            let config = config + &surge_section(SMALL_POOL);
            let gateway = match (side, before_binary()) {
                (Side::CappedBefore, Some(binary)) => {
                    Gateway::start_binary(&binary, &config, cluster.public, admin, client)
                }
                _ => Gateway::start(&config, cluster.public, admin, client),
            };
            (Some(gateway), None)
        }
        Side::Uncapped => {
            let gateway = Gateway::start(&config, cluster.public, admin, client);
            (Some(gateway), None)
        }
        Side::Haproxy => (None, Some(Haproxy::start(cluster, SMALL_POOL))),
    };
    let (record, gateway_lines) = match &gateway {
        Some(gateway) => {
            let (record, seen) = surge::run_watched(stage, plan, gateway).await;
            (record, surge::gateway_figures(gateway, seen).await)
        }
        None => (surge::run(stage, plan).await, Vec::new()),
    };
    let waiting_pages = record.waiting_pages();
    for line in surge::figures(&record).iter().chain(&gateway_lines) {
        eprintln!("measure_surge [{}]: {line}", side.name());
    }
    drop((gateway, haproxy));
    Round {
        side,
        record,
        waiting_pages,
    }
}

/// The side-by-side table.
fn print_surge(rounds: &[Round], plan: Plan) {
    eprintln!(
        "\nmeasure_surge: {} logged-in students (a request, then {:?}), then {} newcomers within {:?}; \
         4 nodes with {SMALL_POOL} PHP workers each; node-local sessions, no offload (no SCORM file in the load)",
        plan.students, plan.think, plan.newcomers, plan.arrivals
    );
    let trio = |(p50, p95, max): (f64, f64, f64)| format!("{p50:.0}/{p95:.0}/{max:.0}");
    eprintln!(
        "{:<22} {:>16} {:>16} {:>10} {:>20} {:>9} {:>7} {:>10} {:>12} {:>8}",
        "side",
        "before ms",
        "during ms",
        "p95 ratio",
        "newcomer login ms",
        "logged in",
        "errors",
        "logged out",
        "out of order",
        "wait pgs",
    );
    eprintln!(
        "{:<22} {:>16} {:>16} {:>10} {:>20}",
        "", "p50/p95/max", "p50/p95/max", "during/bef", "p50/p95/max"
    );
    for round in rounds {
        let record = &round.record;
        let (before, during) = record.logged_in_times();
        let (before, during) = (percentiles(&before), percentiles(&during));
        let ratio = if before.1 > 0.0 {
            during.1 / before.1
        } else {
            f64::NAN
        };
        let logins = record.login_times();
        let (pairs, swapped) = record.admission_order();
        let out_of_order = swapped as f64 / pairs.max(1) as f64;
        let logged_out = (record.students.iter())
            .filter(|s| !s.lost.is_empty())
            .count();
        eprintln!(
            "{:<22} {:>16} {:>16} {:>10.2} {:>20} {:>9} {:>7} {:>10} {:>11.1}% {:>8}",
            round.side.name(),
            trio(before),
            trio(during),
            ratio,
            trio(percentiles(&logins)),
            format!("{}/{}", logins.len(), record.newcomers.len()),
            record.errors().len(),
            logged_out,
            out_of_order * 100.0,
            round.waiting_pages,
        );
    }
    for round in rounds {
        let errors = round.record.errors();
        if !errors.is_empty() {
            eprintln!(
                "\n{}: {} errors, the first:",
                round.side.name(),
                errors.len()
            );
            for error in errors.iter().take(5) {
                eprintln!("  {error}");
            }
        }
    }
    eprintln!();
}

/// What stands in front of the nodes in one round of the quiz measure.
enum Front {
    /// A gateway build (this one, or `GATEWAY_BEFORE`'s), with these `[surge]`
    /// lines (none: no cap).
    Gateway {
        name: String,
        binary: Option<PathBuf>,
        surge: Option<String>,
        /// Each node's `low_priority_url` set to its low-priority pool.
        low_pools: bool,
    },
    /// HAProxy, `maxconn` = the workers per node, an attempt in progress first.
    Haproxy,
}

impl Front {
    fn name(&self) -> &str {
        match self {
            Front::Gateway { name, .. } => name,
            Front::Haproxy => "HAProxy, maxconn 2, quiz first",
        }
    }
}

/// One round of the quiz measure: the front, what the students saw, what Moodle
/// stored.
struct QuizRound {
    name: String,
    record: quiz::Record,
    attempts: BTreeMap<u64, quiz::Attempt>,
}

/// `MEASURE_FRONTS` keeps only the rows it names: items split by `|`, each a
/// row's whole name (that row alone) or a part of names (every row with it).
fn retain_asked(fronts: &mut Vec<Front>) {
    let Ok(asked) = std::env::var("MEASURE_FRONTS") else {
        return;
    };
    let items: Vec<&str> = asked.split('|').map(str::trim).collect();
    let whole = |item: &str| fronts.iter().any(|f| f.name() == item);
    let whole: Vec<bool> = items.iter().map(|item| whole(item)).collect();
    fronts.retain(|front| {
        let name = front.name();
        (items.iter().zip(&whole)).any(|(item, whole)| {
            if *whole {
                name == *item
            } else {
                name.contains(item)
            }
        })
    });
}

/// `MEASURE_SURGE_EXTRA`: TOML lines added to the `[surge]` of this build's
/// capped rows of the quiz measure, for an experiment (`\n` splits lines).
fn surge_extra() -> String {
    match std::env::var("MEASURE_SURGE_EXTRA") {
        Ok(extra) if !extra.is_empty() => extra.replace("\\n", "\n") + "\n",
        _ => String::new(),
    }
}

/// The quiz's start (`quiz::EXAM_READING`) behind each front in turn on one restored
/// site and one cluster (two PHP workers a node, node-local sessions, no offload),
/// then the table. `GATEWAY_BEFORE` names another gateway binary to run first, with
/// the cap, without and with the pools: a "before" beside this build's "after".
pub fn quiz() {
    let site = Arc::new(Site::restore());
    // Each node with a second, low-priority pool, which only the rows that say so use.
    let cluster = Cluster::start_with_low_pools(&site, SMALL_POOL);
    let mut fronts = Vec::new();
    if let Some(before) = before_binary() {
        for low_pools in [false, true] {
            let pools = if low_pools {
                ", low-priority pools"
            } else {
                ""
            };
            fronts.push(Front::Gateway {
                name: format!("before, max_active 2{pools}"),
                binary: Some(before.clone()),
                surge: Some(surge_section(SMALL_POOL)),
                low_pools,
            });
        }
    }
    fronts.push(Front::Gateway {
        name: "gateway, max_active 2".into(),
        binary: None,
        surge: Some(surge_section(SMALL_POOL)),
        low_pools: false,
    });
    // Work in progress on each node's own pool, everything else on its pool at
    // nice 10: the node's CPU goes to the page turns first. Each pool capped at
    // its own workers.
    fronts.push(Front::Gateway {
        name: "gateway, max_active 2, low-priority pools".into(),
        binary: None,
        surge: Some(surge_section(SMALL_POOL)),
        low_pools: true,
    });
    // Each node's gate alone: the site's starts do not give way to the turns.
    fronts.push(Front::Gateway {
        name: "gateway, max_active 2, the nodes' gates alone".into(),
        binary: None,
        surge: Some(surge_section(SMALL_POOL) + "quiz_starts_yield_at = 0\n"),
        low_pools: false,
    });
    // The gate as wide as the cap: starts then wait only in the line, as work in
    // progress, so this row shows what the gates themselves buy.
    fronts.push(Front::Gateway {
        name: "gateway, max_active 2, no gate".into(),
        binary: None,
        surge: Some(
            surge_section(SMALL_POOL)
                + &format!("quiz_starts = {SMALL_POOL}\nquiz_starts_yield_at = 0\n"),
        ),
        low_pools: false,
    });
    fronts.push(Front::Gateway {
        name: "gateway, no cap".into(),
        binary: None,
        surge: None,
        low_pools: false,
    });
    fronts.push(Front::Haproxy);
    retain_asked(&mut fronts);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rounds = runtime.block_on(async {
        let client = http_client();
        cluster.warm(&client).await;
        let stage = Stage {
            origin: cluster.wwwroot(),
            site: site.clone(),
            client: client.clone(),
        };
        quiz_warm_up(&cluster, &stage).await;
        let mut rounds = Vec::new();
        for front in &fronts {
            rounds.push(quiz_round(&cluster, &stage, front).await);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        rounds
    });
    print_quiz(&rounds);
}

/// A small exam start behind the uncapped gateway, not measured: the quiz's scripts
/// compiled and Moodle's caches filled before the first front measured.
async fn quiz_warm_up(cluster: &Cluster, stage: &Stage) {
    let started = Instant::now();
    let admin = admin_addr();
    let config = config_for(cluster, admin);
    let gateway = Gateway::start(&config, cluster.public, admin, &stage.client);
    let record = quiz::run(stage, quiz::SMALL_START).await;
    drop(gateway);
    let errors = record.errors();
    assert!(errors.is_empty(), "the warm-up: {errors:#?}");
    eprintln!("measure_quiz: warmed up in {:.1?}", started.elapsed());
}

/// One front on wwwroot's address, the exam start, the front gone.
async fn quiz_round(cluster: &Cluster, stage: &Stage, front: &Front) -> QuizRound {
    let client = &stage.client;
    let admin = admin_addr();
    let after = quiz::last_attempt_id(&stage.site);
    let (gateway, haproxy) = match front {
        Front::Gateway {
            binary,
            surge,
            low_pools,
            ..
        } => {
            let mut config = config_for(cluster, admin);
            if *low_pools {
                config = with_low_pools(&config, cluster);
            }
            if let Some(surge) = surge {
                config += surge;
                // Not a "before" build's: it may not know the keys.
                if binary.is_none() {
                    config += &surge_extra();
                }
            }
            let gateway = match binary {
                Some(binary) => {
                    Gateway::start_binary(binary, &config, cluster.public, admin, client)
                }
                None => Gateway::start(&config, cluster.public, admin, client),
            };
            (Some(gateway), None)
        }
        Front::Haproxy => (None, Some(Haproxy::start_with(cluster, SMALL_POOL, true))),
    };
    let (record, seen) = match &gateway {
        Some(gateway) => surge::watched(gateway, quiz::run(stage, quiz::EXAM_READING)).await,
        None => (
            quiz::run(stage, quiz::EXAM_READING).await,
            Default::default(),
        ),
    };
    let attempts = quiz::attempts(&stage.site, after);
    for line in quiz::figures(&record) {
        eprintln!("measure_quiz [{}]: {line}", front.name());
    }
    if let Some(gateway) = &gateway {
        for line in surge::gateway_figures(gateway, seen).await {
            eprintln!("measure_quiz [{}]: {line}", front.name());
        }
        let losses = gateway.losses().await;
        if !losses.is_empty() {
            eprintln!(
                "measure_quiz [{}]: the gateway counted losses {losses:?}",
                front.name()
            );
        }
    }
    drop((gateway, haproxy));
    QuizRound {
        name: front.name().to_string(),
        record,
        attempts,
    }
}

/// The side-by-side table of the quiz measure.
fn print_quiz(rounds: &[QuizRound]) {
    let plan = quiz::EXAM_READING;
    eprintln!(
        "\nmeasure_quiz: {} students answering (a page turn every {:?}-{:?}, an autosave every {} turns), \
         then a class of {} clicking \"Start attempt\" within {:?}, five pages each (read for {:?}-{:?}) \
         and submit; 4 nodes with {SMALL_POOL} PHP workers each; node-local sessions, no offload",
        plan.early,
        plan.think.0,
        plan.think.1,
        plan.autosave_every,
        plan.class,
        plan.clicks,
        plan.class_think.0,
        plan.class_think.1
    );
    let trio = |(p50, p95, max): (f64, f64, f64)| format!("{p50:.0}/{p95:.0}/{max:.0}");
    let duo = |(p50, p95, _): (f64, f64, f64)| format!("{p50:.0}/{p95:.0}");
    eprintln!(
        "{:<32} {:>11} {:>11} {:>11} {:>16} {:>8} {:>9} {:>6} {:>5} {:>12} {:>9}",
        "side",
        "turn before",
        "turn during",
        "turn after",
        "first page ms",
        "wave s",
        "autosaves",
        "errors",
        "lost",
        "out of order",
        "finished",
    );
    eprintln!(
        "{:<32} {:>11} {:>11} {:>11} {:>16} {:>8} {:>9} {:>6} {:>5} {:>12}",
        "",
        "p50/p95 ms",
        "p50/p95 ms",
        "p50/p95 ms",
        "p50/p95/max",
        "",
        "failed",
        "",
        "",
        "all/per node"
    );
    for round in rounds {
        let record = &round.record;
        let [before, during, after] = record.turn_times();
        let first = record.first_page_times();
        let (pairs, swapped) = record.start_order(&round.attempts);
        let (node_pairs, node_swapped) = record.start_order_per_node(&round.attempts);
        let order = format!(
            "{:.1}/{:.1}%",
            swapped as f64 * 100.0 / pairs.max(1) as f64,
            node_swapped as f64 * 100.0 / node_pairs.max(1) as f64
        );
        let finished = (record.early.iter().chain(&record.class))
            .filter(|t| {
                t.finished
                    && (round.attempts.get(&t.user_id)).is_some_and(|a| a.state == "finished")
            })
            .count();
        let (start, end) = record.wave;
        eprintln!(
            "{:<32} {:>11} {:>11} {:>11} {:>16} {:>8.1} {:>9} {:>6} {:>5} {:>12} {:>9}",
            round.name,
            duo(percentiles(&before)),
            duo(percentiles(&during)),
            duo(percentiles(&after)),
            trio(percentiles(&first)),
            (end - start).as_secs_f64(),
            record.autosave_failures(),
            record.errors().len(),
            record.lost().len(),
            order,
            format!("{finished}/{}", record.early.len() + record.class.len()),
        );
    }
    for round in rounds {
        let errors = round.record.errors();
        if !errors.is_empty() {
            eprintln!("\n{}: {} errors, the first:", round.name, errors.len());
            for error in errors.iter().take(5) {
                eprintln!("  {error}");
            }
        }
    }
    eprintln!();
}
