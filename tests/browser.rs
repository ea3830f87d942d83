//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) driven
//! through Debian's `chromedriver` over WebDriver, against the real gateway in front
//! of the stand-in cluster. An admin logs in with the token, reads the node cards,
//! drains a node with its button, finds a student's session by its id, and the page
//! is photographed at desktop and phone width (`target/screenshots/`). Then the last
//! hour's charts: students browse, the page redraws itself, and the screenshot of
//! the requests chart is read back pixel by pixel for its lines.
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

/// One test at a time: each runs a chromium (two at once would starve a small CI
/// machine), and the charts' test sets an environment variable the gateway reads.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
/// where the browser was and what it showed. The dashboard reloads itself every 5 s,
/// and a search or a click navigates: an element found during a navigation is gone
/// before its text is read (chromedriver: "aborted by navigation", a stale element),
/// so such an error is a reason to look again, not an answer.
async fn text(browser: &Client, css: &str) -> String {
    let started = Instant::now();
    loop {
        let error = match browser.find(Locator::Css(css)).await {
            Ok(element) => match element.text().await {
                Ok(text) => return text,
                Err(error) => error,
            },
            Err(error) => error,
        };
        if started.elapsed() > Duration::from_secs(10) {
            let url = browser.current_url().await.map(|u| u.to_string());
            let source = browser.source().await.unwrap_or_default();
            panic!("{css}: {error} at {url:?}; the page:\n{source}")
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the element `css` names, looking again (up to 10 s) when the page was
/// between two loads as it was looked for, as `text` does.
async fn click(browser: &Client, css: &str) {
    let started = Instant::now();
    let element = loop {
        match browser.find(Locator::Css(css)).await {
            Ok(element) => break element,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("{css}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    element.click().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: tests/browser/run.sh installs and runs it"]
async fn an_admin_logs_in_sees_the_nodes_drains_one_and_finds_a_student() {
    let _one = ONE_AT_A_TIME.lock().await;
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

/// Logs in to the dashboard at `dashboard` with the admin token.
async fn log_in(browser: &Client, dashboard: &str) {
    browser.goto(dashboard).await.unwrap();
    let field = browser
        .find(Locator::Css("input[name=token]"))
        .await
        .unwrap();
    field.send_keys(TOKEN).await.unwrap();
    click(browser, "form button[type=submit]").await;
}

/// The text of `css` once `done` holds for it, read again as the page reloads
/// itself (the element is found anew each time); panics with the last text after
/// 30 s.
async fn text_once(browser: &Client, css: &str, done: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(element) = browser.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if done(&text) {
                    return text;
                }
                last = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{css} never got there; last shown: {last:?}")
}

/// The pixels of a PNG screenshot, as RGB, and its width.
fn pixels(png: &[u8]) -> (Vec<[u8; 3]>, usize) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buffer = vec![0; reader.output_buffer_size().expect("a sane size")];
    let frame = reader.next_frame(&mut buffer).expect("its pixels");
    assert_eq!(frame.bit_depth, png::BitDepth::Eight, "8-bit channels");
    let samples = frame.color_type.samples();
    assert!(samples >= 3, "a colour screenshot: {:?}", frame.color_type);
    let bytes = &buffer[..frame.buffer_size()];
    let rgb = bytes.chunks_exact(samples).map(|p| [p[0], p[1], p[2]]);
    (rgb.collect(), frame.width as usize)
}

/// The pixels inside the box of the element `css`, from a screenshot of the page
/// scrolled to it (the page's own rectangle, not WebDriver's element screenshot,
/// so exactly the drawing and nothing beside it). Saved as
/// `dashboard-requests-chart.png`'s source: the whole page as shot.
async fn chart_screenshot(browser: &Client, css: &str) -> Vec<[u8; 3]> {
    let find = format!(
        "var e=document.querySelector('{css}');e.scrollIntoView({{block:'center'}});\
         var r=e.getBoundingClientRect();\
         return [r.left,r.top,r.width,r.height,devicePixelRatio,innerWidth]"
    );
    let rect = browser.execute(&find, vec![]).await.unwrap();
    let at = |i: usize| rect[i].as_f64().unwrap();
    let scale = at(4);
    let page = browser.screenshot().await.unwrap();
    std::fs::write(screenshot_dir().join("dashboard-requests-chart.png"), &page).unwrap();
    let (all, width) = pixels(&page);
    assert_eq!(
        width,
        (at(5) * scale).round() as usize,
        "a shot of the whole width"
    );
    let (left, top) = (
        (at(0) * scale).ceil() as usize,
        (at(1) * scale).ceil() as usize,
    );
    let (right, bottom) = (
        ((at(0) + at(2)) * scale).floor() as usize,
        ((at(1) + at(3)) * scale).floor() as usize,
    );
    assert!(
        right > left && bottom > top,
        "the chart has a size: {rect:?}"
    );
    let rows = all.chunks_exact(width).skip(top).take(bottom - top);
    rows.flat_map(|row| row[left..right.min(width)].iter().copied())
        .collect()
}

/// Pixels of `hex` (`#rrggbb`) itself, not a blend: each channel within a few
/// steps, so the edge where a line fades into the page does not count.
fn count_of(pixels: &[[u8; 3]], hex: &str) -> usize {
    let channel = |i: usize| u8::from_str_radix(&hex[1 + 2 * i..3 + 2 * i], 16).unwrap();
    let colour = [channel(0), channel(1), channel(2)];
    let near = |p: &&[u8; 3]| (0..3).all(|i| p[i].abs_diff(colour[i]) <= 12);
    pixels.iter().filter(near).count()
}

/// The history's pace for this test, through the variable the gateway reads for
/// tests only (`MOODLE_GATEWAY_HISTORY_EVERY_MS`, not a setting): a point every
/// 100 ms, so a chart has its line within a second instead of a minute. The time
/// axis follows it ("−36s" … "now").
const TEST_PACE_MS: &str = "100";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: tests/browser/run.sh installs and runs it"]
async fn the_dashboard_draws_the_students_traffic_as_a_line_per_node() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (_, _) = (program("chromium"), program("chromedriver"));
    // Before the gateway starts, which reads it once as it begins serving (in a task
    // of its own, so the variable stays until the end); no other test runs meanwhile.
    std::env::set_var("MOODLE_GATEWAY_HISTORY_EVERY_MS", TEST_PACE_MS);
    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let admin = Some(("127.0.0.1:0", TOKEN));
    let gateway = TestGateway::start(&cluster.config_toml("127.0.0.1:0", admin, "")).await;
    let driver = start_driver().await;
    let profile = std::env::temp_dir().join(format!(
        "moodle-gateway-chromium-plots-{}",
        std::process::id()
    ));
    let browser = browser(&driver, &profile).await;
    viewport(&browser, 1280, 900).await;
    let dashboard = format!("http://{}/", gateway.admin_addr.unwrap());
    log_in(&browser, &dashboard).await;
    let title = text(&browser, "#history h2").await;
    assert_eq!(title, "Last 36 seconds", "360 points, one every 100 ms");
    std::env::remove_var("MOODLE_GATEWAY_HISTORY_EVERY_MS");

    // Six students browse their course pages until the chart shows them: those on
    // web1 three pages a turn, web2's two, web3's one, so that the lines lie apart.
    let mut students = Vec::new();
    for n in 0..6 {
        let (student, node) = logged_in(&gateway, n).await;
        let pages = match node.as_str() {
            "web1" => 3,
            "web2" => 2,
            _ => 1,
        };
        students.push((student, pages));
    }
    let browsing = tokio::spawn(async move {
        loop {
            for (student, pages) in &mut students {
                for _ in 0..*pages {
                    let page = student.get("/course/view.php?id=2").await.unwrap();
                    assert_eq!(page.status, 200);
                }
            }
        }
    });
    // The page is not reloaded by the test: its own refresh (every 5 s) redraws.
    let busy = |text: &str| text != "–" && text != "0/s";
    for node in ["web1", "web2", "web3"] {
        let css = format!("#plot-requests [data-current=\"{node}\"]");
        let shown = text_once(&browser, &css, busy).await;
        assert!(shown.ends_with("/s"), "{node}: {shown}");
    }
    let quiet = text(&browser, "#plot-requests [data-current=\"data\"]").await;
    assert!(
        quiet == "0/s" || quiet == "–",
        "no file asked of the data server: {quiet}"
    );
    let axis = text(&browser, "#plot-requests figcaption").await;
    assert_eq!(axis, "Requests per second");
    // A field with the focus holds the page still for its photograph.
    for _ in 0..2 {
        let focus = "document.querySelector('#find input[name=session]').focus()";
        browser.execute(focus, vec![]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    browsing.abort();

    // The chart's own pixels: web1's line in the first colour, web2's in the second,
    // and no pixel of the fifth colour, which no line has (three nodes, the data
    // server). The page's screenshot is cut to the drawing's box, so the legend's
    // swatches below it (the same colours) do not count.
    let shot = chart_screenshot(&browser, "#plot-requests > svg").await;
    let (web1, web2, unused) = (
        count_of(&shot, "#0072b2"),
        count_of(&shot, "#e69f00"),
        count_of(&shot, "#56b4e9"),
    );
    assert!(web1 >= 20, "web1's line: {web1} pixels of its colour");
    assert!(web2 >= 20, "web2's line: {web2} pixels of its colour");
    assert_eq!(unused, 0, "a colour no line has is nowhere");
    eprintln!("requests chart: {web1} pixels of web1's colour, {web2} of web2's");
    let top = "document.getElementById('history').scrollIntoView()";
    browser.execute(top, vec![]).await.unwrap();
    let whole = browser.screenshot().await.unwrap();
    std::fs::write(screenshot_dir().join("dashboard-history.png"), whole).unwrap();

    browser.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    gateway.shutdown().await;
}
