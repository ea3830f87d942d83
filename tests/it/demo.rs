//! The demo shows the set-up the book recommends, and shows it working: its config
//! passes `check`, `doctor` finds nothing wrong with its stand-ins, a student clicks
//! from the login to a SCORM file that the data server's export sends through the
//! offload, Moodle's theme comes from the gateway's memory the second time, and with
//! `--surge` the waiting room opens. The demo runs in this process on port 0; `check`
//! and `doctor` are the real binary, as an admin runs them.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use http::StatusCode;
use moodle_gateway::demo::standin::SCORM_LAUNCH;
use moodle_gateway::demo::{Browser, Demo, DemoOptions, Reply};
use moodle_gateway::moodle::linked;

use crate::support::{self, TempDir};

fn options(surge: bool, write_config: Option<&Path>) -> DemoOptions {
    DemoOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        surge,
        write_config: write_config.map(Path::to_owned),
        ..DemoOptions::default()
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("mg-demo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// The site's address as Moodle writes it in the demo's pages.
fn wwwroot(demo: &Demo) -> String {
    format!("http://{}", demo.public_addr())
}

/// An admin API answer's body, with the demo's token.
async fn admin(demo: &Demo, path: &str) -> String {
    let url = format!("http://{}{path}", demo.admin_addr());
    let bearer = format!("Bearer {}", demo.token());
    let seen = support::send(&url, "GET", &[("authorization", &bearer)], "").await;
    assert_eq!(seen.status, StatusCode::OK, "{path}: {}", seen.text());
    seen.text()
}

/// One sample of the demo's `/metrics`, like `asset_cache_hits_total`.
async fn metric(demo: &Demo, series: &str) -> f64 {
    let text = admin(demo, "/metrics").await;
    let series = format!("moodle_gateway_{series} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

/// A student's browser that has opened the login form and logged in.
async fn logged_in(demo: &Demo) -> (Browser, Reply) {
    let mut browser = Browser::new(demo.public_addr(), "", "MoodleSession");
    let form = browser.get("/login/index.php").await.unwrap();
    let text = form.text();
    let token = text.split_once("logintoken=").unwrap().1;
    let token: String = token
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    let login = format!("username=ann&password=x&logintoken={token}");
    let reply = browser.post("/login/index.php", &login).await.unwrap();
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text());
    (browser, form)
}

/// The link on `page` to `script` (`/mod/scorm/player.php`…), below the site.
fn link(demo: &Demo, page: &Reply, script: &str) -> String {
    linked(&page.text(), &wwwroot(demo), script)
        .unwrap_or_else(|| panic!("no link to {script} in {}", page.text()))
}

#[tokio::test]
async fn the_config_the_demo_writes_is_one_check_accepts() {
    let dir = temp_dir("check");
    let path = dir.0.join("demo.toml");
    let demo = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .args(["demo", "--students", "2", "--concurrency", "1"])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--write-config")
        .arg(&path)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(demo.status.success(), "{demo:?}");
    let check = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("MOODLE_GATEWAY_ADMIN_TOKEN")
        .env_remove("MOODLE_GATEWAY_ROUTE_SECRET")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    let warned = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(0), "{said}\n{warned}");
    assert!(said.contains("node-local"), "{said}");
    assert!(!warned.contains("warning"), "no warning either: {warned}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_clicks_from_the_login_to_a_scorm_file_the_export_sends_through_their_node() {
    let demo = Demo::start(&options(false, None)).await.unwrap();
    let (mut student, _) = logged_in(&demo).await;
    let course = student.get("/course/view.php?id=2").await.unwrap();
    let node = course.upstream().to_owned();
    let player = student
        .get(&link(&demo, &course, "/mod/scorm/player.php"))
        .await
        .unwrap();
    let file = link(&demo, &player, "/pluginfile.php/");
    assert_eq!(file, SCORM_LAUNCH);
    let scorm = student.get(&file).await.unwrap();
    assert_eq!(scorm.status, StatusCode::OK);
    assert_eq!(scorm.text(), format!("SCORM {SCORM_LAUNCH} from data\n"));
    assert_eq!(
        scorm.upstream(),
        node,
        "the student's own node named the file"
    );
    assert_eq!(
        scorm.header("x-accel-redirect"),
        "",
        "never shown to a student"
    );
    let cluster = demo.cluster();
    let export = cluster.export().unwrap().last_request().unwrap();
    assert!(
        export.uri.path().starts_with("/dataroot/filedir/"),
        "{}",
        export.uri
    );
    assert_eq!(
        cluster.data().request_count(),
        0,
        "the data server's PHP sent nothing"
    );
    assert_eq!(demo.stop().await.unwrap(), 0, "no session lost");
}

#[tokio::test]
async fn the_theme_comes_from_the_gateway_s_memory_the_second_time() {
    let demo = Demo::start(&options(false, None)).await.unwrap();
    let (mut student, form) = logged_in(&demo).await;
    let styles = link(&demo, &form, "/theme/styles.php/");
    let first = student.get(&styles).await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(metric(&demo, "asset_cache_hits_total").await, 0.0);
    let second = student.get(&styles).await.unwrap();
    assert_eq!(
        (second.status, second.body.clone()),
        (first.status, first.body)
    );
    assert_eq!(metric(&demo, "asset_cache_hits_total").await, 1.0);
    demo.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_no_problem_with_the_demo_even_logged_in() {
    let dir = temp_dir("doctor");
    let path = dir.0.join("demo.toml");
    let demo = Demo::start(&options(false, Some(&path))).await.unwrap();
    let asked = path.clone();
    // The binary blocks its thread; the demo keeps serving on the others.
    let doctor = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
            .args(["doctor", "--config"])
            .arg(&asked)
            .args(["--login", "doctor-test"])
            .env("MOODLE_GATEWAY_DOCTOR_PASSWORD", "any")
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(0), "{said}");
    assert!(said.contains("no problem found"), "{said}");
    assert!(
        !said.contains("not checked"),
        "everything was checked: {said}"
    );
    demo.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_surge_the_crowd_meets_the_waiting_room_on_the_dashboard() {
    let mut demo = Demo::start(&options(true, None)).await.unwrap();
    demo.welcome_visitors();
    // A generous bound on a wait, not a timing: the first wave arrives at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while metric(&demo, "waiting_room_pages_total").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the room never opened"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let surge = admin(&demo, "/surge").await;
    assert!(surge.contains("\"capped_nodes\":4"), "{surge}");
    let dashboard = admin(&demo, "/").await;
    assert!(
        dashboard.contains("<section id=\"room\""),
        "the panel is there"
    );
    demo.stop().await.unwrap();
}
