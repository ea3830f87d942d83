//! The admin dashboard over real sockets, in front of stand-in nodes: the login and
//! its brake, the cookie's attributes, the CSRF token on every button, the find box
//! that never echoes a session id, and escaping of what nodes say; with a `[surge]`
//! cap, each node's slots and line and the waiting-room panel, beside `/nodes` and
//! `/surge`; the asset cache's panel and its Purge button, beside `/cache` and
//! `/cache/purge`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use moodle_gateway::demo::standin::Cluster;
use serde_json::json;

use crate::support::{self, logged_in, Seen, TestGateway};

const TOKEN: &str = "dashboard-admin-token-0123456789";
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

async fn start(cluster: &Cluster) -> TestGateway {
    start_with(cluster, "").await
}

/// The gateway in front of `cluster` with quick probes and `extra` config lines
/// (dotted keys, as [`Cluster::config_toml`] takes them).
async fn start_with(cluster: &Cluster, extra: &str) -> TestGateway {
    let extra = format!("health.interval = \"100ms\"\nhealth.timeout = \"100ms\"\n{extra}");
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), &extra);
    TestGateway::start(&config).await
}

fn admin_url(gateway: &TestGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.admin_addr.unwrap())
}

fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers.get(name).map_or("", |v| v.to_str().unwrap())
}

/// `POST` of a form body, as a browser on the dashboard's own page sends it.
pub(crate) async fn post_form(gateway: &TestGateway, path: &str, cookie: &str, body: &str) -> Seen {
    let host = gateway.admin_addr.unwrap().to_string();
    let origin = format!("http://{host}");
    let headers = [
        FORM,
        ("cookie", cookie),
        ("host", &host),
        ("origin", &origin),
        ("sec-fetch-site", "same-origin"),
    ];
    support::send(&admin_url(gateway, path), "POST", &headers, body.to_owned()).await
}

/// Logs in through the form; the `Cookie` line that carries the login.
async fn log_in(gateway: &TestGateway) -> String {
    log_in_with(gateway, TOKEN).await
}

/// Logs in through the form of a gateway whose admin token is `token`.
pub(crate) async fn log_in_with(gateway: &TestGateway, token: &str) -> String {
    let seen = post_form(gateway, "/login", "", &format!("token={token}")).await;
    assert_eq!(seen.status, 303, "{}", seen.text());
    let set = header(&seen, "set-cookie");
    set.split(';').next().unwrap().to_owned()
}

pub(crate) async fn page(gateway: &TestGateway, path: &str, cookie: &str) -> Seen {
    let headers = [("cookie", cookie)];
    support::send(&admin_url(gateway, path), "GET", &headers, Body::empty()).await
}

/// The dashboard as the browser shows it after a form's redirect: with the
/// one-line flash the answer set.
async fn page_after(gateway: &TestGateway, cookie: &str, answer: &Seen) -> String {
    let flash = header(answer, "set-cookie").split(';').next().unwrap();
    page(gateway, "/", &format!("{cookie}; {flash}"))
        .await
        .text()
}

/// The CSRF token in a page's forms.
pub(crate) fn csrf(html: &str) -> String {
    let field = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .expect("a form with a csrf field");
    field.split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_without_a_login_is_sent_to_the_form_and_basic_opens_the_page() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let bare = support::get(&admin_url(&gateway, "/")).await;
    assert_eq!(
        (bare.status.as_u16(), header(&bare, "location")),
        (303, "/login")
    );
    let form = support::get(&admin_url(&gateway, "/login")).await;
    assert_eq!(form.status, 200);
    assert!(form.text().contains("type=\"password\" name=\"token\""));
    assert_eq!(header(&form, "cache-control"), "no-store");
    // Basic, as a browser sends it after a challenge: any user, the token as password.
    let basic = format!("Basic {}", b64(&format!("ops:{TOKEN}")));
    let url = admin_url(&gateway, "/");
    let seen = support::send(&url, "GET", &[("authorization", &basic)], Body::empty()).await;
    assert_eq!(seen.status, 200);
    assert!(seen.text().contains("id=\"node-web1\""));
    let wrong = format!("Basic {}", b64("ops:not-the-token"));
    let seen = support::send(&url, "GET", &[("authorization", &wrong)], Body::empty()).await;
    assert_eq!(seen.status, 401);
    assert!(header(&seen, "www-authenticate").starts_with("Basic realm="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_in_the_form_are_refused_and_earn_the_address_a_wait() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    for _ in 0..5 {
        let seen = post_form(&gateway, "/login", "", "token=not-the-token").await;
        assert_eq!(seen.status, 401);
        assert!(seen.text().contains("not the admin token"));
        assert_eq!(
            header(&seen, "set-cookie"),
            "",
            "no cookie for a wrong token"
        );
    }
    // The same brake as the API's: now even the right token waits.
    let held = post_form(&gateway, "/login", "", &format!("token={TOKEN}")).await;
    assert_eq!(held.status, 429);
    assert_eq!(header(&held, "retry-after"), "1");
    let bearer = format!("Bearer {TOKEN}");
    let api = admin_url(&gateway, "/nodes");
    let seen = support::send(&api, "GET", &[("authorization", &bearer)], Body::empty()).await;
    assert_eq!(seen.status, 429, "one count for the form and the API");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(log_in(&gateway).await.starts_with("moodle-gateway-admin="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_cookie_is_http_only_same_site_strict_and_opens_cards_with_the_right_counts() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let mut students = Vec::new();
    for n in 0..5 {
        students.push(logged_in(&gateway, n).await);
    }
    let seen = post_form(&gateway, "/login", "", &format!("token={TOKEN}")).await;
    let set = header(&seen, "set-cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(
            set.split("; ").any(|a| a == attribute),
            "{attribute} in {set}"
        );
    }
    assert!(!set.contains(TOKEN), "the cookie is not the token");
    let cookie = set.split(';').next().unwrap();
    let home = page(&gateway, "/", cookie).await;
    assert_eq!(home.status, 200);
    assert_eq!(header(&home, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&home, "x-frame-options"), "DENY");
    let policy = header(&home, "content-security-policy");
    assert!(policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'sha256-"));
    let html = home.text();
    for node in ["web1", "web2"] {
        let live = students.iter().filter(|(_, at)| at == node).count();
        let card = html.split(&format!("id=\"node-{node}\"")).nth(1).unwrap();
        let card = card.split("</article>").next().unwrap();
        let figure = |key: &str| {
            let value = card
                .split(&format!("data-figure=\"{key}\">"))
                .nth(1)
                .unwrap();
            value.split('<').next().unwrap().to_owned()
        };
        assert_eq!(figure("live"), live.to_string(), "{node}");
        assert_eq!(figure("logged-in"), live.to_string(), "{node}");
        assert_eq!(figure("anonymous"), "0", "{node}");
    }
    assert!(html.contains("5 live sessions · 5 logged in"), "{html}");
    // Logging out ends that cookie here, not only in the browser.
    let body = format!("csrf={}", csrf(&html));
    let out = post_form(&gateway, "/logout", cookie, &body).await;
    assert_eq!(
        (out.status.as_u16(), header(&out, "location")),
        (303, "/login")
    );
    assert!(header(&out, "set-cookie").contains("Max-Age=0"));
    assert_eq!(page(&gateway, "/", cookie).await.status, 303);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_button_drains_only_with_the_pages_csrf_token_and_says_what_it_did() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let cookie = log_in(&gateway).await;
    let token = csrf(&page(&gateway, "/", &cookie).await.text());
    let drain = "/ui/nodes/web1/drain";
    for body in [String::new(), "csrf=00ff".into(), format!("csrf={token}x")] {
        let refused = post_form(&gateway, drain, &cookie, &body).await;
        assert_eq!(refused.status, 403, "{body}");
    }
    // Another origin's page that somehow knew the token: still refused.
    let url = admin_url(&gateway, drain);
    let body = format!("csrf={token}");
    let forged = [
        FORM,
        ("cookie", cookie.as_str()),
        ("origin", "http://127.0.0.1:1"),
    ];
    let seen = support::send(&url, "POST", &forged, body.clone()).await;
    assert_eq!(seen.status, 403);
    assert_eq!(node_state(&gateway).await, "active", "nothing changed yet");
    let done = post_form(&gateway, drain, &cookie, &body).await;
    assert_eq!(
        (done.status.as_u16(), header(&done, "location")),
        (303, "/")
    );
    assert_eq!(node_state(&gateway).await, "draining");
    let after = page_after(&gateway, &cookie, &done).await;
    assert!(after.contains("web1 is now draining."), "{after}");
    assert!(after.contains("state-draining\">draining"));
    // The API's own rules answer through the flash.
    let data = post_form(&gateway, "/ui/nodes/data/disable", &cookie, &body).await;
    let after = page_after(&gateway, &cookie, &data).await;
    assert!(after.contains("data: not changed: the data server cannot be drained"));
}

async fn node_state(gateway: &TestGateway) -> String {
    let bearer = format!("Bearer {TOKEN}");
    let url = admin_url(gateway, "/nodes");
    let seen = support::send(&url, "GET", &[("authorization", &bearer)], Body::empty()).await;
    let nodes: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    nodes["nodes"][0]["state"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_find_box_shows_a_students_node_and_never_the_id() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let (student, node) = logged_in(&gateway, 7).await;
    let id = student.session().unwrap().to_owned();
    let cookie = log_in(&gateway).await;
    let token = csrf(&page(&gateway, "/", &cookie).await.text());
    let body = format!("csrf={token}&session={id}");
    let found = post_form(&gateway, "/ui/find", &cookie, &body).await;
    assert_eq!(found.status, 303);
    let location = header(&found, "location").to_owned();
    assert!(
        location.starts_with("/?found=") && !location.contains(&id),
        "{location}"
    );
    let shown = page(&gateway, &location, &cookie).await.text();
    assert!(
        shown.contains(&format!("data-found=\"node\">{node}<")),
        "{shown}"
    );
    let unknown = "not-a-session-this-gateway-has-seen";
    let body = format!("csrf={token}&session={unknown}");
    let missing = post_form(&gateway, "/ui/find", &cookie, &body).await;
    let shown_missing = page_after(&gateway, &cookie, &missing).await;
    assert!(shown_missing.contains("No bound session has that id"));
    let everything = format!(
        "{location}{shown}{shown_missing}{:?}{:?}",
        found.headers, missing.headers
    );
    assert!(!everything.contains(&id) && !everything.contains(unknown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_hostile_node_answers_its_probes_is_shown_escaped() {
    let hostile = support::upstream(|_request| async {
        Response::builder()
            .status(303)
            .header("location", "https://x/\"><script>alert(1)</script><b>")
            .body(Body::empty())
            .unwrap()
    })
    .await;
    let data = support::named_upstream("data").await;
    let extra = format!(
        "health.interval = \"100ms\"\nhealth.timeout = \"100ms\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\""
    );
    let gateway = TestGateway::start(&support::config_for(&[hostile], data, &extra)).await;
    let cookie = log_in(&gateway).await;
    let mut html = String::new();
    for _ in 0..50 {
        html = page(&gateway, "/", &cookie).await.text();
        if html.contains("answered 303") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert") && !html.contains("\"><b>"));
}

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The session rows of a dashboard page: (hash, node, state).
fn rows(html: &str) -> Vec<(String, String, String)> {
    let body = html
        .split("<tbody>")
        .nth(1)
        .map_or("", |b| b.split("</tbody>").next().unwrap());
    let cells = |row: &str| -> Vec<String> {
        let cells = row.split("<td>").skip(1);
        cells
            .map(|c| {
                c.split("</td>")
                    .next()
                    .unwrap()
                    .replace("<code>", "")
                    .replace("</code>", "")
            })
            .collect()
    };
    let rows = body.split("<tr>").skip(1).map(cells);
    rows.map(|c| (c[0].clone(), c[1].clone(), c[2].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_table_filters_by_node_state_and_hash_prefix() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let mut students = Vec::new();
    for n in 0..4 {
        students.push(logged_in(&gateway, n).await);
    }
    let mut visitor = moodle_gateway::demo::Browser::new(gateway.addr, "", "MoodleSession");
    let visited = visitor
        .get("/login/index.php")
        .await
        .unwrap()
        .upstream()
        .to_owned();
    let cookie = log_in(&gateway).await;
    let all = rows(&page(&gateway, "/", &cookie).await.text());
    assert_eq!(all.len(), 5);
    let anonymous = rows(&page(&gateway, "/?state=anonymous", &cookie).await.text());
    assert_eq!(anonymous.len(), 1);
    assert_eq!(
        (anonymous[0].1.as_str(), anonymous[0].2.as_str()),
        (visited.as_str(), "anonymous")
    );
    let web2 = rows(
        &page(&gateway, "/?node=web2&state=logged-in", &cookie)
            .await
            .text(),
    );
    let on_web2 = students.iter().filter(|(_, node)| node == "web2").count();
    assert_eq!(web2.len(), on_web2);
    assert!(web2
        .iter()
        .all(|(_, node, state)| node == "web2" && state == "logged in"));
    let hash = &all[2].0;
    let found = rows(
        &page(&gateway, &format!("/?q={}", &hash[..6]), &cookie)
            .await
            .text(),
    );
    assert_eq!(found.iter().map(|r| &r.0).collect::<Vec<_>>(), [hash]);
    let nonsense = page(&gateway, "/?q=not-hex&node=nobody&state=%3Cb%3E", &cookie).await;
    assert_eq!(
        rows(&nonsense.text()).len(),
        5,
        "filters that mean nothing are ignored"
    );
}

/// Browsers do not keep cookies apart by port: with the dashboard on the site's own
/// host name, its login cookie rides along with a student's requests. It is the
/// admin listener's credential, and no node ever sees it.
#[tokio::test]
async fn the_dashboard_login_cookie_never_reaches_a_node() {
    let (node, record) = support::recording_upstream().await;
    let data = support::named_upstream("data").await;
    let gateway = TestGateway::start(&support::config_for(&[node], data, "")).await;
    let cookie = format!(
        "MoodleSession=abc; {}=signed-login; theme=boost",
        moodle_gateway::admin::LOGIN_COOKIE
    );
    let seen = support::send(
        &gateway.url("/course/view.php?id=2"),
        "GET",
        &[("cookie", &cookie)],
        "",
    )
    .await;
    assert_eq!(seen.status, 200);
    let received = record.lock().unwrap().clone();
    let cookies: Vec<&str> = received[0]
        .headers
        .iter()
        .filter(|(name, _)| name == "cookie")
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(cookies, ["MoodleSession=abc; theme=boost"]);
}

/// Disable moves every logged-in student of the node at once (with node-local
/// sessions, each must log in again): from the dashboard it needs its box ticked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_a_node_with_logged_in_students_needs_the_box_ticked() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let (_ann, node) = logged_in(&gateway, 1).await;
    assert_eq!(node, "web1", "the first student is dealt web1");
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(
        html.contains("moves 1 logged-in"),
        "the card asks before disabling"
    );
    let token = csrf(&html);
    let disable = "/ui/nodes/web1/disable";
    let unticked = post_form(&gateway, disable, &cookie, &format!("csrf={token}")).await;
    assert_eq!(unticked.status, 303);
    assert_eq!(node_state(&gateway).await, "active", "nothing changed");
    let after = page_after(&gateway, &cookie, &unticked).await;
    assert!(
        after.contains("moves its logged-in students (1) at once"),
        "{after}"
    );
    let ticked = format!("csrf={token}&confirm=yes");
    assert_eq!(
        post_form(&gateway, disable, &cookie, &ticked).await.status,
        303
    );
    assert_eq!(node_state(&gateway).await, "disabled");
}

/// What an XHR or an asset sends: never a page the waiting room could stand in for.
const NOT_A_PAGE: (&str, &str) = ("accept", "application/json");
/// What a browser's navigation sends.
const A_PAGE: (&str, &str) = ("accept", "text/html,application/xhtml+xml,*/*;q=0.8");
/// How long the stand-in takes over the request that holds web1's only slot.
const SLOW_PAGE_MS: &str = "3000";

/// One node with `[surge] max_active = 1` (and `surge` lines more).
async fn capped(surge: &str) -> (Cluster, TestGateway) {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let gateway = start_with(&cluster, &format!("surge.max_active = 1\n{surge}")).await;
    (cluster, gateway)
}

/// A newcomer's slow request (not a page view) that takes web1's only slot for
/// [`SLOW_PAGE_MS`]; its status when it ends.
fn hold_the_slot(gateway: &TestGateway) -> tokio::task::JoinHandle<u16> {
    let url = gateway.url("/course/view.php?id=2");
    tokio::spawn(async move {
        let headers = [("x-standin-delay-ms", SLOW_PAGE_MS), NOT_A_PAGE];
        let seen = support::send(&url, "GET", &headers, Body::empty()).await;
        seen.status.as_u16()
    })
}

/// `GET {path}` of the JSON API with the token.
async fn api(gateway: &TestGateway, path: &str) -> serde_json::Value {
    let bearer = format!("Bearer {TOKEN}");
    let url = admin_url(gateway, path);
    let seen = support::send(&url, "GET", &[("authorization", &bearer)], Body::empty()).await;
    assert_eq!(seen.status, 200, "{path}: {}", seen.text());
    serde_json::from_slice(&seen.body).unwrap()
}

/// `GET /nodes` again and again until web1's row satisfies `done` (5 s at most).
async fn web1_until(
    gateway: &TestGateway,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let web1 = api(gateway, "/nodes").await["nodes"][0].take();
        if done(&web1) {
            return web1;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{what}: {web1}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of `data-figure="{key}"` inside the element with id `id`.
fn figure(html: &str, id: &str, key: &str) -> String {
    let within = html.split(&format!("id=\"{id}\"")).nth(1).expect(id);
    let within = within.split("</section>").next().unwrap();
    let within = within.split("</article>").next().unwrap();
    let value = within.split(&format!("data-figure=\"{key}\">")).nth(1);
    let value = value.unwrap_or_else(|| panic!("no {key} in #{id}: {within}"));
    value.split("</dd>").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cap_the_page_shows_no_slots_and_no_waiting_room() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster).await;
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(html.contains("id=\"node-web1\""));
    assert!(!html.contains("data-figure=\"slots\"") && !html.contains("id=\"room\""));
    let web1 = &api(&gateway, "/nodes").await["nodes"][0];
    assert_eq!(
        (&web1["max_active"], &web1["active"]),
        (&json!(null), &json!(null))
    );
    assert_eq!(api(&gateway, "/surge").await["capped_nodes"], 0);
}

/// A logged-in student, a visitor on the login form and a newcomer wait behind a
/// slow page on a node with one slot: the admin sees the cap, the one in flight and
/// each class's line, on the card and in `/nodes`, and the line empty once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_cap_the_card_and_nodes_show_in_flight_and_each_class_waiting() {
    let (_cluster, gateway) = capped("").await;
    let (mut student, _) = logged_in(&gateway, 1).await;
    let mut visitor = moodle_gateway::demo::Browser::new(gateway.addr, "", "MoodleSession");
    assert_eq!(visitor.get("/login/index.php").await.unwrap().status, 200);
    let holder = hold_the_slot(&gateway);
    web1_until(&gateway, "the slow page holds the slot", |n| {
        n["active"] == 1
    })
    .await;
    let mut waiting = tokio::task::JoinSet::new();
    waiting.spawn(async move { student.get("/my/").await.unwrap().status.as_u16() });
    waiting.spawn(async move {
        visitor
            .get("/login/index.php")
            .await
            .unwrap()
            .status
            .as_u16()
    });
    let url = gateway.url("/lib/ajax/service.php");
    waiting.spawn(async move {
        let seen = support::send(&url, "GET", &[NOT_A_PAGE], Body::empty()).await;
        seen.status.as_u16()
    });
    let queued = json!({"working": 0, "logged_in": 1, "anonymous": 1, "newcomer": 1});
    let web1 = web1_until(&gateway, "one of each class waits", |n| {
        n["queued"] == queued
    })
    .await;
    assert_eq!(
        (&web1["max_active"], &web1["active"]),
        (&json!(1), &json!(1))
    );
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert_eq!(
        figure(&html, "node-web1", "slots"),
        "1 / 1 <small>full</small>"
    );
    for class in ["logged-in", "anonymous", "newcomer"] {
        assert_eq!(
            figure(&html, "node-web1", &format!("queued-{class}")),
            "1",
            "{class}"
        );
    }
    assert!(!figure(&html, "node-data", "rate").is_empty());
    assert!(!html
        .split("id=\"node-data\"")
        .nth(1)
        .unwrap()
        .contains("data-figure=\"slots\""));
    assert_eq!(
        figure(&html, "room", "waiting"),
        "3 <small>of at most 10000</small>"
    );
    assert_eq!(
        figure(&html, "room", "room"),
        "closed",
        "no newcomer asked for a page"
    );
    let surge = api(&gateway, "/surge").await;
    assert_eq!(
        (&surge["capped_nodes"], &surge["waiting"]),
        (&json!(1), &json!(3))
    );
    // The slow page ends: each waiter gets the slot in turn, and the line empties.
    assert_eq!(holder.await.unwrap(), 200);
    let statuses = waiting.join_all().await;
    assert_eq!(statuses, [200; 3], "every waiter was served");
    let idle = json!({"working": 0, "logged_in": 0, "anonymous": 0, "newcomer": 0});
    web1_until(&gateway, "the line empties", |n| {
        n["active"] == 0 && n["queued"] == idle
    })
    .await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert_eq!(figure(&html, "node-web1", "slots"), "0 / 1");
    assert_eq!(
        figure(&html, "room", "waiting"),
        "0 <small>of at most 10000</small>"
    );
}

/// A newcomer asking for a page while requests wait and none has finished gets the
/// waiting page: the panel says the room is open, one in line, the wait unknown;
/// when the slow page ends and they come back with their place, they are let in,
/// the room closes and the panel counts the admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_room_panel_shows_it_open_with_its_line_then_closed_with_who_it_let_in() {
    let (_cluster, gateway) = capped("").await;
    let holder = hold_the_slot(&gateway);
    web1_until(&gateway, "the slow page holds the slot", |n| {
        n["active"] == 1
    })
    .await;
    let url = gateway.url("/lib/ajax/service.php");
    let waiter = tokio::spawn(async move {
        support::send(&url, "GET", &[NOT_A_PAGE], Body::empty())
            .await
            .status
            .as_u16()
    });
    web1_until(&gateway, "a request waits", |n| {
        n["queued"]["newcomer"] == 1
    })
    .await;
    let first = support::send(&gateway.url("/"), "GET", &[A_PAGE], Body::empty()).await;
    assert_eq!(first.status, 503, "the waiting page: {}", first.text());
    let place = header(&first, "set-cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(html.contains("data-room=\"open\"><h2>Waiting room<span class=\"badge open\">open"));
    assert_eq!(figure(&html, "room", "in-line"), "1");
    assert!(
        figure(&html, "room", "expected-wait").starts_with("unknown"),
        "{html}"
    );
    assert_eq!(figure(&html, "room", "admitted"), "0");
    assert!(
        html.contains("expect to wait over 5s"),
        "the default room_opens_at"
    );
    let surge = api(&gateway, "/surge").await;
    let room = json!({"open": true, "in_line": 1, "admitted_last_minute": 0, "opens_at_ms": 5000});
    assert_eq!(
        (&surge["room"], &surge["expected_wait_ms"]),
        (&room, &json!(null))
    );
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(waiter.await.unwrap(), 200);
    // Back with their place, the line empty: let in, and the room closes.
    let headers = [A_PAGE, ("cookie", place.as_str())];
    let again = support::send(&gateway.url("/"), "GET", &headers, Body::empty()).await;
    assert_eq!(again.status, 200, "{}", again.text());
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(html.contains("data-room=\"closed\""), "{html}");
    assert_eq!(figure(&html, "room", "in-line"), "0");
    assert_eq!(figure(&html, "room", "admitted"), "1");
    let room = &api(&gateway, "/surge").await["room"];
    assert_eq!(
        (&room["open"], &room["admitted_last_minute"]),
        (&json!(false), &json!(1))
    );
}

/// With `waiting_room = false` the panel says so and shows only the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_turned_off_is_shown_off() {
    let (_cluster, gateway) = capped("surge.waiting_room = false\n").await;
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(html.contains("data-room=\"off\"") && html.contains("waiting_room = false"));
    assert!(!html.contains("data-figure=\"in-line\""));
    assert_eq!(
        figure(&html, "room", "waiting"),
        "0 <small>of at most 10000</small>"
    );
    assert_eq!(api(&gateway, "/surge").await["room"], json!(null));
}

/// Boost's compiled CSS at a real past theme revision (Moodle keeps no revision
/// from the future).
const STYLES: &str = "/theme/styles.php/boost/1700000000/all";
const CSS: &str = "body { color: #0f6cbf }";

/// A node that answers the theme's CSS as Moodle marks it (public, for 90 days,
/// immutable) and counts the requests for it; anything else (its probes) is a
/// plain 200.
async fn theme_node(asked: Arc<AtomicUsize>) -> SocketAddr {
    support::upstream(move |request: Request<Incoming>| {
        let asked = asked.clone();
        async move {
            if request.uri().path() != STYLES {
                return Response::new(Body::from("ok"));
            }
            asked.fetch_add(1, Ordering::SeqCst);
            Response::builder()
                .header("cache-control", "public, max-age=7776000, immutable")
                .header("content-type", "text/css")
                .header("etag", "\"boost-1700000000\"")
                .body(Body::from(CSS))
                .unwrap()
        }
    })
    .await
}

/// The gateway with its admin listener in front of a [`theme_node`].
async fn caching(asked: Arc<AtomicUsize>) -> TestGateway {
    let node = theme_node(asked).await;
    let data = support::named_upstream("data").await;
    let extra = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"");
    TestGateway::start(&support::config_for(&[node], data, &extra)).await
}

/// The theme's CSS through the gateway, as a student's browser asks for it.
async fn styles(gateway: &TestGateway) -> Seen {
    let seen = support::get(&gateway.url(STYLES)).await;
    assert_eq!(
        (seen.status.as_u16(), seen.text().as_str()),
        (200, CSS),
        "{:?}",
        seen.headers
    );
    seen
}

/// `POST /cache/purge` with the token and `extra` header lines.
async fn purge(gateway: &TestGateway, extra: &[(&str, &str)]) -> Seen {
    let bearer = format!("Bearer {TOKEN}");
    let mut headers = vec![("authorization", bearer.as_str())];
    headers.extend_from_slice(extra);
    let url = admin_url(gateway, "/cache/purge");
    support::send(&url, "POST", &headers, Body::empty()).await
}

/// The second request for the theme's CSS never reaches the node: `/cache` counts
/// the entry, the miss and the hit; a purge forgets the entry, and the next request
/// asks the node again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_counts_a_hit_from_memory_and_purge_sends_the_next_request_to_the_node() {
    let asked = Arc::new(AtomicUsize::new(0));
    let gateway = caching(asked.clone()).await;
    styles(&gateway).await;
    let again = styles(&gateway).await;
    assert_eq!(asked.load(Ordering::SeqCst), 1, "the second from memory");
    assert!(again.headers.contains_key("age"), "{:?}", again.headers);
    let cache = api(&gateway, "/cache").await;
    let figures = ["entries", "bytes", "hits", "misses", "fills", "evictions"];
    let figures = figures.map(|f| cache[f].as_u64().unwrap());
    assert_eq!(figures, [1, CSS.len() as u64, 1, 1, 1, 0], "{cache}");
    assert_eq!(cache["hit_rate"], json!(0.5));
    assert_eq!(
        (&cache["enabled"], &cache["max_bytes"]),
        (&json!(true), &json!(64 << 20))
    );
    // A page on another site cannot purge it, even knowing the token.
    let forged = purge(&gateway, &[("origin", "http://evil.example")]).await;
    assert_eq!(forged.status, 403);
    assert_eq!(api(&gateway, "/cache").await["entries"], 1);
    let purged = purge(&gateway, &[]).await;
    assert_eq!(purged.status, 200);
    let purged: serde_json::Value = serde_json::from_slice(&purged.body).unwrap();
    assert_eq!(purged, json!({"purged": 1}));
    let cache = api(&gateway, "/cache").await;
    assert_eq!((&cache["entries"], &cache["bytes"]), (&json!(0), &json!(0)));
    assert_eq!(cache["fills"], 1, "the counters keep counting");
    styles(&gateway).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2, "asked of the node again");
    assert_eq!(
        api(&gateway, "/cache").await["entries"],
        1,
        "and kept again"
    );
}

/// The dashboard's Asset cache panel shows the same figures, and its Purge button
/// empties the cache only with the page's CSRF token, saying what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_panel_shows_its_figures_and_its_purge_button_empties_the_cache() {
    let asked = Arc::new(AtomicUsize::new(0));
    let gateway = caching(asked.clone()).await;
    let cookie = log_in(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert_eq!(figure(&html, "cache", "hit-rate"), "none asked yet");
    styles(&gateway).await;
    styles(&gateway).await;
    let html = page(&gateway, "/", &cookie).await.text();
    assert!(html.contains("<section id=\"cache\"><h2>Asset cache</h2>"));
    for (key, value) in [
        ("entries", "1"),
        ("hit-rate", "50.0 % <small>1 of 2</small>"),
        ("fills", "1"),
        ("evictions", "0"),
    ] {
        assert_eq!(figure(&html, "cache", key), value, "{key}");
    }
    assert!(figure(&html, "cache", "bytes").starts_with("23 B"));
    let token = csrf(&html);
    let button = "/ui/cache/purge";
    for body in [String::new(), "csrf=00ff".into(), format!("csrf={token}x")] {
        let refused = post_form(&gateway, button, &cookie, &body).await;
        assert_eq!(refused.status, 403, "{body}");
    }
    assert_eq!(
        api(&gateway, "/cache").await["entries"],
        1,
        "nothing purged yet"
    );
    let done = post_form(&gateway, button, &cookie, &format!("csrf={token}")).await;
    assert_eq!(
        (done.status.as_u16(), header(&done, "location")),
        (303, "/")
    );
    let after = page_after(&gateway, &cookie, &done).await;
    assert!(
        after.contains("Asset cache purged: 1 entry forgotten"),
        "{after}"
    );
    assert_eq!(figure(&after, "cache", "entries"), "0");
    styles(&gateway).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2, "asked of the node again");
}
