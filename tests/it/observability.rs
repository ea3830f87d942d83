//! What an operator sees of a scripted run: `/metrics` counts exactly what
//! happened, the session-loss detector counts each logged-out student once and
//! never a login or a logout, and the access log has one line per request in its
//! format with no session id or token anywhere.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use regex::Regex;

use crate::support::{self, logged_in, TempDir, TestGateway};

const TOKEN: &str = "observability-admin-token-0123456789";

async fn cluster_and_gateway(nodes: usize, extra: &str) -> (Cluster, TestGateway) {
    let cluster = Cluster::spawn(nodes, "", "MoodleSession").unwrap();
    let config = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), extra);
    (cluster, TestGateway::start(&config).await)
}

/// One scrape of `/metrics`, as `name{labels}` → value.
async fn scrape(gateway: &TestGateway) -> HashMap<String, f64> {
    let url = format!("http://{}/metrics", gateway.admin_addr.unwrap());
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, "GET", &[("authorization", &auth)], Body::empty()).await;
    assert_eq!(seen.status, 200, "{}", seen.text());
    assert!(seen.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = seen.text();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty());
    samples
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').expect("a sample is `key value`");
            (key.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

fn value(samples: &HashMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {samples:#?}"))
}

/// Every sample of one family, without its name.
fn family(samples: &HashMap<String, f64>, name: &str) -> Vec<(String, f64)> {
    let mut found: Vec<_> = samples
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(name)?.strip_prefix('{')?.to_owned(), *v)))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_four_logins_counts_each_request_deal_and_refusal_exactly() {
    let (_cluster, gateway) = cluster_and_gateway(4, "").await;
    let mut nodes = Vec::new();
    for n in 0..4 {
        nodes.push(logged_in(&gateway, n).await.1);
    }
    nodes.sort();
    assert_eq!(nodes, ["web1", "web2", "web3", "web4"], "one student each");
    // Two requests the gateway turns away itself.
    let trace = support::send(&gateway.url("/"), "TRACE", &[], Body::empty()).await;
    assert_eq!(trace.status, 405);
    let long = format!("/course/view.php?id={}", "9".repeat(20_000));
    assert_eq!(support::get(&gateway.url(&long)).await.status, 414);

    let samples = scrape(&gateway).await;
    for node in ["web1", "web2", "web3", "web4"] {
        // The login form (200), the login POST (303), the dashboard (200).
        let requests = |class| {
            format!("moodle_gateway_requests_total{{class=\"{class}\",upstream=\"{node}\"}}")
        };
        assert_eq!(value(&samples, &requests("2xx")), 2.0, "{node}");
        assert_eq!(value(&samples, &requests("3xx")), 1.0, "{node}");
        let dealt = format!("moodle_gateway_sessions_dealt_total{{node=\"{node}\"}}");
        assert_eq!(
            value(&samples, &dealt),
            1.0,
            "one deal per new session, not per request"
        );
        let sessions =
            |state| format!("moodle_gateway_sessions{{node=\"{node}\",state=\"{state}\"}}");
        assert_eq!(value(&samples, &sessions("logged_in")), 1.0);
        assert_eq!(value(&samples, &sessions("anonymous")), 0.0);
        let latency =
            format!("moodle_gateway_upstream_response_seconds_count{{upstream=\"{node}\"}}");
        assert_eq!(value(&samples, &latency), 3.0);
        assert_eq!(
            value(
                &samples,
                &format!("moodle_gateway_upstream_up{{upstream=\"{node}\"}}")
            ),
            1.0
        );
        let state =
            format!("moodle_gateway_upstream_admin_state{{state=\"active\",upstream=\"{node}\"}}");
        assert_eq!(value(&samples, &state), 1.0);
    }
    assert_eq!(
        family(&samples, "moodle_gateway_requests_total")
            .into_iter()
            .filter(|(labels, v)| labels.contains("upstream=\"gateway\"") && *v > 0.0)
            .collect::<Vec<_>>(),
        [("class=\"4xx\",upstream=\"gateway\"}".to_owned(), 2.0)],
        "the 405 and the 414, and nothing else answered by the gateway"
    );
    assert_eq!(
        family(&samples, "moodle_gateway_rejections_total"),
        [
            ("limit=\"max_connections\"}".to_owned(), 0.0),
            ("limit=\"max_uri_bytes\"}".to_owned(), 1.0)
        ],
        "a 405 is a refusal, not a limit"
    );
    assert_eq!(
        family(&samples, "moodle_gateway_session_losses_total")
            .iter()
            .map(|s| s.1)
            .sum::<f64>(),
        0.0
    );
    assert_eq!(value(&samples, "moodle_gateway_table_entries"), 4.0);
    assert_eq!(value(&samples, "moodle_gateway_in_flight"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_drops_a_bound_session_is_counted_once_per_event_and_logins_never() {
    let (cluster, gateway) = cluster_and_gateway(2, "").await;
    let (mut ann, ann_node) = logged_in(&gateway, 1).await;
    let (mut bob, _) = logged_in(&gateway, 2).await;
    // Moodle kills Ann's session twice (a session store that lost its rows): each
    // time her next page is the login page with a new guest id, and she logs in again.
    for _ in 0..2 {
        assert!(cluster.registry().kill(ann.session().unwrap()));
        let page = ann.get("/my/").await.unwrap();
        assert!(page.sent_to_login(), "{}", page.text());
        assert_eq!(page.upstream(), ann_node, "still routed to her node");
        log_in_again(&mut ann, 1).await;
    }
    // Bob logs out and in again: rotations by design, never a loss.
    let logout = bob.get("/login/logout.php?sesskey=x").await.unwrap();
    assert!(logout.status.as_u16() < 400, "{}", logout.text());
    log_in_again(&mut bob, 2).await;

    let samples = scrape(&gateway).await;
    let losses = family(&samples, "moodle_gateway_session_losses_total");
    let nonzero: Vec<_> = losses.into_iter().filter(|(_, v)| *v > 0.0).collect();
    assert_eq!(
        nonzero,
        [(format!("cause=\"dropped\",node=\"{ann_node}\"}}"), 2.0)],
        "two events on Ann's node, nothing else"
    );
    assert_eq!(
        cluster.lost_sessions(),
        0,
        "the gateway itself never misrouted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_loss_is_one_count_however_many_requests_were_in_flight() {
    let (cluster, gateway) = cluster_and_gateway(2, "").await;
    let (ann, node) = logged_in(&gateway, 1).await;
    let id = ann.session().unwrap().to_owned();
    assert!(cluster.registry().kill(&id));
    // Her page's frames and AJAX calls, all with the killed id, each answered with a
    // new guest id by the node.
    let tabs = (0..4).map(|_| {
        let mut tab = Browser::new(gateway.addr, "", "MoodleSession");
        tab.set_session(Some(id.clone()));
        async move { tab.get("/my/").await.unwrap().sent_to_login() }
    });
    let answers = futures_join(tabs).await;
    assert!(answers.iter().all(|sent| *sent), "{answers:?}");

    let samples = scrape(&gateway).await;
    let key = format!("moodle_gateway_session_losses_total{{cause=\"dropped\",node=\"{node}\"}}");
    assert_eq!(value(&samples, &key), 1.0);
}

/// Runs `futures` at once; their outputs in order.
async fn futures_join<F: std::future::Future<Output = bool> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<bool> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moodle_timed_out_is_told_apart_from_a_lost_one() {
    let (cluster, gateway) = cluster_and_gateway(2, "session.sessiontimeout = \"2h\"").await;
    let (mut ann, node) = logged_in(&gateway, 1).await;
    // Three hours away: Moodle's sessiontimeout passed, the gateway's 8h30m did not.
    gateway
        .app
        .gateway()
        .table()
        .clock()
        .advance(Duration::from_secs(3 * 3600));
    assert!(cluster.registry().kill(ann.session().unwrap()));
    assert!(ann.get("/my/").await.unwrap().sent_to_login());

    let samples = scrape(&gateway).await;
    let key =
        |cause| format!("moodle_gateway_session_losses_total{{cause=\"{cause}\",node=\"{node}\"}}");
    assert_eq!(value(&samples, &key("timeout")), 1.0);
    assert_eq!(value(&samples, &key("dropped")), 0.0);
}

/// Logs `student{n}` in again from the login form their current session shows.
async fn log_in_again(student: &mut Browser, n: usize) {
    let form = student.get("/login/index.php").await.unwrap();
    let token = form.text().split_once("logintoken=").unwrap().1[..32].to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    assert_eq!(
        student
            .post("/login/index.php", &body)
            .await
            .unwrap()
            .status,
        303
    );
}

/// A student's visit with credentials in URLs: a web-service token in the path and
/// the query, a sesskey, a password.
/// Returns the session ids the student held, the secrets, and the admin API's hash
/// of the logged-in session.
async fn visit_with_secrets(gateway: &TestGateway) -> (Vec<String>, Vec<&'static str>, String) {
    let (mut ann, _) = logged_in(gateway, 1).await;
    let mut ids = vec![ann.session().unwrap().to_owned()];
    let secrets = vec![
        "tok3nInPath77",
        "wst0kenSecret",
        "s3sskeyValue",
        "hunter2pass",
        "rssK3yInPath",
        "calAuthT0ken",
    ];
    for path in [
        "/tokenpluginfile.php/tok3nInPath77/12/user/icon/f1",
        "/webservice/rest/server.php?wstoken=wst0kenSecret&wsfunction=core_webservice_get_site_info",
        "/course/view.php?id=2&sesskey=s3sskeyValue",
        "/login/token.php?username=ann&password=hunter2pass&service=moodle_mobile_app",
        "/rss/file.php/5/rssK3yInPath/mod_forum/2/rss.xml",
        "/calendar/export_execute.php?userid=7&authtoken=calAuthT0ken&preset_what=all",
    ] {
        ann.get(path).await.unwrap();
    }
    let hash = lookup(gateway, &ids[0]).await;
    ann.get("/login/logout.php?sesskey=x").await.unwrap();
    ids.extend(ann.session().map(str::to_owned));
    (ids, secrets, hash)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_combined_line_per_request_and_no_secret() {
    let dir = tempdir("combined");
    let file = dir.0.join("access.log");
    let extra = format!("[access_log]\nto = \"{}\"\n", file.display());
    let (_cluster, gateway) = cluster_and_gateway(2, &extra).await;
    let (ids, secrets, hash) = visit_with_secrets(&gateway).await;
    let lines = support::lines_of(&file, 10).await;
    assert_eq!(
        lines.len(),
        10,
        "login form, login, dashboard, six URLs, logout"
    );
    let combined = Regex::new(
        r#"^127\.0\.0\.1 - - \[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} \+0000\] "(GET|POST) /\S* HTTP/1\.1" \d{3} \d+ "[^"]*" "[^"]*" upstream=web[12] upstream_time=\d+\.\d{3} queue_time=- class=- request_time=\d+\.\d{3} session=[0-9a-f]{16}$"#,
    )
    .unwrap();
    for line in &lines {
        assert!(combined.is_match(line), "not the combined format: {line}");
    }
    // Found by what they say, not by place: the client pools its connections, and a
    // line is written when its answer's last byte is out, which may come after the
    // next request's on another connection.
    let line_with = |text: &str| {
        let found = lines.iter().find(|line| line.contains(text));
        found.unwrap_or_else(|| panic!("no line with {text}: {lines:#?}"))
    };
    line_with("\"POST /login/index.php HTTP/1.1\" 303 ");
    line_with("\"GET /tokenpluginfile.php/***/12/user/icon/f1 HTTP/1.1\"");
    let everything = lines.join("\n");
    for secret in ids.iter().map(String::as_str).chain(secrets) {
        assert!(
            !everything.contains(secret),
            "{secret} is in the access log"
        );
    }
    // The hash is the admin API's handle for the same session.
    let dashboard = line_with("\"GET /my/ HTTP/1.1\"");
    assert!(
        dashboard.ends_with(&format!("session={hash}")),
        "{dashboard}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_access_log_has_every_field_and_no_secret() {
    let dir = tempdir("json");
    let file = dir.0.join("access.json");
    let extra = format!(
        "[access_log]\nto = \"{}\"\nformat = \"json\"\n",
        file.display()
    );
    let (_cluster, gateway) = cluster_and_gateway(2, &extra).await;
    let (ids, secrets, _) = visit_with_secrets(&gateway).await;
    let lines = support::lines_of(&file, 10).await;
    for line in &lines {
        let entry: serde_json::Value = serde_json::from_str(line).expect(line);
        for field in [
            "time",
            "client",
            "request",
            "status",
            "bytes",
            "upstream",
            "upstream_time",
            "queue_time",
            "class",
            "request_time",
            "session",
        ] {
            assert!(entry.get(field).is_some(), "{field} missing: {line}");
        }
        assert!(entry["upstream"].as_str().unwrap().starts_with("web"));
    }
    let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["request"], "GET /login/index.php HTTP/1.1");
    assert_eq!(first["status"], 200);
    let everything = lines.join("\n");
    for secret in ids.iter().map(String::as_str).chain(secrets) {
        assert!(
            !everything.contains(secret),
            "{secret} is in the access log"
        );
    }
}

async fn lookup(gateway: &TestGateway, id: &str) -> String {
    let url = format!(
        "http://{}/affinity/lookup?session={id}",
        gateway.admin_addr.unwrap()
    );
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, "GET", &[("authorization", &auth)], Body::empty()).await;
    let entry: serde_json::Value = serde_json::from_str(&seen.text()).unwrap();
    entry["session"].as_str().expect("a hash").to_owned()
}

fn tempdir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("mg-access-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}
