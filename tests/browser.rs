//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) driven
//! through Debian's `chromedriver` over WebDriver, against the real gateway in front
//! of the stand-in cluster. An admin logs in with the token, reads the node cards,
//! drains a node with its button, finds a student's session by its id, and the page
//! is photographed at desktop and phone width (`target/screenshots/`).
//!
//! Why `#[ignore]`: not every developer has a browser, and a plain `cargo test`
//! needs nothing but Rust. `tests/browser/run.sh` installs `chromium` and
//! `chromium-driver` when they are missing and runs this; CI does that. Without a
//! browser the test fails with how to install one: it never skips.
//!
//! Why WebDriver (`fantoccini`): it is the W3C protocol, Debian ships the driver
//! built for its own chromium, and the client is small and async on the hyper and
//! tokio this crate already uses; the CDP crates compile the whole generated
//! DevTools protocol.

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use serde_json::json;

use support::{logged_in, TestGateway};

const TOKEN: &str = "browser-admin-token-0123456789abcdef";
const INSTALL: &str = "run tests/browser/run.sh (it installs them), or: \
                       apt-get install -y chromium chromium-driver";

/// `name` on `PATH`, or a failure that says how to get it.
fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("{name} is missing: the browser test needs it; {INSTALL}"))
}

/// chromedriver on a free loopback port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(program("chromedriver"))
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "chromedriver never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
}

/// A headless chromium with a fresh profile and nothing that reaches out to the
/// internet (the machine has none).
async fn browser(driver: &Driver, profile: &Path) -> Client {
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        &format!("--user-data-dir={}", profile.display()),
    ];
    let binary = program("chromium");
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {"binary": binary, "args": args},
    });
    let capabilities = capabilities.as_object().unwrap().clone();
    let mut builder = ClientBuilder::new(HttpConnector::new());
    builder.capabilities(capabilities);
    builder
        .connect(&driver.url)
        .await
        .expect("a chromium session")
}

/// Sizes the window so that the page itself (what a screenshot shows) is
/// `width`×`height`: headless Chromium still subtracts room for a window frame.
async fn viewport(browser: &Client, width: u32, height: u32) {
    browser.set_window_size(width, height).await.unwrap();
    let inner = browser
        .execute("return [innerWidth, innerHeight]", vec![])
        .await
        .unwrap();
    let inner = |i: usize| inner[i].as_u64().unwrap() as u32;
    let (frame_w, frame_h) = (
        width.saturating_sub(inner(0)),
        height.saturating_sub(inner(1)),
    );
    browser
        .set_window_size(width + frame_w, height + frame_h)
        .await
        .unwrap();
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    let target = target.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The text of the element `css` names, waiting up to 10 s for it; on failure, says
/// where the browser was and what it showed.
async fn text(browser: &Client, css: &str) -> String {
    let wait = browser.wait().at_most(Duration::from_secs(10));
    match wait.for_element(Locator::Css(css)).await {
        Ok(element) => element.text().await.unwrap(),
        Err(error) => {
            let url = browser.current_url().await.map(|u| u.to_string());
            let source = browser.source().await.unwrap_or_default();
            panic!("{css}: {error} at {url:?}; the page:\n{source}")
        }
    }
}

async fn click(browser: &Client, css: &str) {
    let element = browser.find(Locator::Css(css)).await;
    element
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: tests/browser/run.sh installs and runs it"]
async fn an_admin_logs_in_sees_the_nodes_drains_one_and_finds_a_student() {
    let (_, _) = (program("chromium"), program("chromedriver"));
    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let admin = Some(("127.0.0.1:0", TOKEN));
    let gateway = TestGateway::start(&cluster.config_toml("127.0.0.1:0", admin, "")).await;
    let mut students = Vec::new();
    for n in 0..7 {
        students.push(logged_in(&gateway, n).await);
    }
    // Two visitors on the login form: anonymous sessions.
    let mut visitors = Vec::new();
    for _ in 0..2 {
        let mut visitor = Browser::new(gateway.addr, "", "MoodleSession");
        let form = visitor.get("/login/index.php").await.unwrap();
        visitors.push((visitor, form.upstream().to_owned()));
    }
    let driver = start_driver().await;
    let profile =
        std::env::temp_dir().join(format!("moodle-gateway-chromium-{}", std::process::id()));
    let browser = browser(&driver, &profile).await;
    viewport(&browser, 1280, 900).await;
    let dashboard = format!("http://{}/", gateway.admin_addr.unwrap());

    // Without a login the dashboard sends the browser to the form.
    browser.goto(&dashboard).await.unwrap();
    assert_eq!(browser.current_url().await.unwrap().path(), "/login");
    let field = browser
        .find(Locator::Css("input[name=token]"))
        .await
        .unwrap();
    field.send_keys(TOKEN).await.unwrap();
    click(&browser, "form button[type=submit]").await;

    // A card per node with the counts the students made, and one for the data server.
    for node in ["web1", "web2", "web3"] {
        let logged_in = students.iter().filter(|(_, at)| at == node).count();
        let anonymous = visitors.iter().filter(|(_, at)| at == node).count();
        let figure = |key: &str| format!("#node-{node} [data-figure={key}]");
        let shown = (
            text(&browser, &figure("live")).await,
            text(&browser, &figure("logged-in")).await,
            text(&browser, &figure("anonymous")).await,
        );
        let counts = (logged_in + anonymous, logged_in, anonymous);
        let counts = (
            counts.0.to_string(),
            counts.1.to_string(),
            counts.2.to_string(),
        );
        assert_eq!(shown, counts, "{node}: live, logged in, anonymous");
    }
    assert!(text(&browser, "#node-data h2")
        .await
        .contains("data server"));
    let totals = text(&browser, "#totals").await;
    assert_eq!(totals, "9 live sessions · 7 logged in · 2 anonymous");

    // Drain web2 with its button: the page comes back saying so.
    click(&browser, "#node-web2 button[data-action=drain]").await;
    assert_eq!(text(&browser, "#flash").await, "web2 is now draining.");
    assert_eq!(text(&browser, "#node-web2 .state").await, "draining");
    let settings = gateway.app.gateway().settings();
    let web2 = settings.upstreams.by_name("web2").unwrap().state();
    assert_eq!(web2, moodle_gateway::config::NodeState::Draining);
    let shots = screenshot_dir();
    let desktop = browser.screenshot().await.unwrap();
    std::fs::write(shots.join("dashboard-desktop.png"), desktop).unwrap();

    // Find a student by the raw id from their browser: the node, never the id.
    let (student, node) = &students[4];
    let id = student.session().unwrap();
    let find = browser
        .find(Locator::Css("#find input[name=session]"))
        .await
        .unwrap();
    find.send_keys(id).await.unwrap();
    click(&browser, "#find button[type=submit]").await;
    assert_eq!(text(&browser, "#found [data-found=node]").await, *node);
    let source = browser.source().await.unwrap();
    assert!(!source.contains(id), "the page never shows the raw id");
    assert!(!browser.current_url().await.unwrap().as_str().contains(id));

    browser.goto(&dashboard).await.unwrap();
    viewport(&browser, 390, 844).await;
    text(&browser, "#node-web1 h2").await;
    let phone = browser.screenshot().await.unwrap();
    std::fs::write(shots.join("dashboard-phone.png"), phone).unwrap();
    browser.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    gateway.shutdown().await;
}
