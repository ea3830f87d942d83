//! Tests of the stand-ins' Moodle behaviour, driven over HTTP with the demo's [`Browser`].

use std::time::Duration;

use http::header::SET_COOKIE;
use http::{Method, StatusCode};

use super::files::BIG_FILE;
use super::Cluster;
use crate::demo::{Browser, Reply};

mod operations;

fn browser(cluster: &Cluster, node: usize) -> Browser {
    let addr = cluster.nodes()[node].addr();
    Browser::new(addr, cluster.site_path(), cluster.cookie())
}

/// Opens the form and logs in; returns the form's reply and the login POST's.
async fn log_in(browser: &mut Browser) -> (Reply, Reply) {
    let form = browser.get("/login/index.php").await.unwrap();
    let text = form.text();
    let token = text
        .split_once("logintoken=")
        .unwrap()
        .1
        .split_whitespace()
        .next();
    let body = format!("username=ann&password=x&logintoken={}", token.unwrap());
    (form, browser.post("/login/index.php", &body).await.unwrap())
}

#[tokio::test]
async fn a_first_visit_starts_a_guest_session() {
    let cluster = Cluster::spawn(1, "/moodle", "MoodleSessionlms").unwrap();
    let mut b = browser(&cluster, 0);
    let reply = b.get("/login/index.php").await.unwrap();
    let id = reply.issued.clone().unwrap();
    assert_eq!(id.len(), 26);
    assert!(id
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    let line = format!("MoodleSessionlms={id}; path=/moodle/; HttpOnly");
    assert_eq!(reply.header("set-cookie"), line);
    assert_eq!(reply.upstream(), "web1");
    assert!(reply.text().contains("name=\"logintoken\" value=\""));
    let again = b.get("/").await.unwrap();
    assert_eq!((again.status, again.issued), (StatusCode::OK, None));
    b.set_session(Some("deleted".into()));
    assert!(b.get("/login/").await.unwrap().issued.is_some());
    assert_eq!(cluster.nodes()[0].sessions(), 2);
    assert_eq!(
        b.get("/elsewhere.php").await.unwrap().status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn login_with_the_right_token_rotates_the_id() {
    let cluster = Cluster::spawn(1, "/moodle", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    let (form, login) = log_in(&mut b).await;
    let (guest, user) = (form.issued.unwrap(), login.issued.clone().unwrap());
    let my = format!("http://{}/moodle/my/", cluster.nodes()[0].addr());
    assert_eq!(
        (login.status, login.location()),
        (StatusCode::SEE_OTHER, my.as_str()),
        "Moodle redirects to wwwroot's address"
    );
    assert_ne!(guest, user);
    assert_eq!(cluster.registry().owner(&guest), None);
    assert_eq!(cluster.registry().owner(&user).as_deref(), Some("web1"));
    assert_eq!(
        b.get("/my/").await.unwrap().text().lines().next(),
        Some("Hello ann from web1")
    );
    let saved = b.post("/mod/scorm/datamodel.php", "cmi=1").await.unwrap();
    assert_eq!((saved.text().as_str(), saved.issued), ("true", None));
}

#[tokio::test]
async fn a_wrong_token_keeps_the_id_and_logs_nobody_in() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    b.get("/login/index.php").await.unwrap();
    let reply = b
        .post("/login/index.php", "username=a&password=b&logintoken=nope")
        .await
        .unwrap();
    assert_eq!((reply.status, reply.issued.clone()), (StatusCode::OK, None));
    assert!(reply.text().contains("invalidlogintoken"));
    assert!(b
        .get("/course/view.php?id=2")
        .await
        .unwrap()
        .sent_to_login());
}

#[tokio::test]
async fn logout_starts_a_new_anonymous_session() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    let user = log_in(&mut b).await.1.issued.unwrap();
    let out = b.get("/login/logout.php?sesskey=x").await.unwrap();
    let home = format!("http://{}/", cluster.nodes()[0].addr());
    assert_eq!(
        (out.status, out.location()),
        (StatusCode::SEE_OTHER, home.as_str())
    );
    assert!(out.issued.as_ref().is_some_and(|id| *id != user));
    assert!(b.get("/my/").await.unwrap().sent_to_login());
    let again = b.get("/login/logout.php?sesskey=x").await.unwrap();
    assert_eq!((again.status, again.issued), (StatusCode::SEE_OTHER, None));
}

#[tokio::test]
async fn a_session_from_another_node_is_lost_everywhere() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let (mut on_web1, mut on_web2) = (browser(&cluster, 0), browser(&cluster, 1));
    let user = log_in(&mut on_web1).await.1.issued.unwrap();
    on_web2.set_session(Some(user));
    let misrouted = on_web2.get("/my/").await.unwrap();
    assert!(misrouted.sent_to_login() && misrouted.issued.is_some());
    assert_eq!(cluster.lost_sessions(), 1);
    // Moodle deleted the row: the student is logged out on their own node too.
    assert!(on_web1.get("/my/").await.unwrap().sent_to_login());
    assert_eq!(cluster.lost_sessions(), 1);
}

#[tokio::test]
async fn sessionless_requests_never_touch_a_session() {
    let cluster = Cluster::spawn(1, "/moodle", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    let paths = [
        "/theme/styles.php/boost/1/all",
        "/theme/javascript.php/boost/1/footer",
        "/theme/image.php/boost/core/1/i/loading",
        "/theme/font.php/boost/core/1/x.woff",
        "/theme/yui_combo.php?a.js",
        "/lib/javascript.php/1/lib/x.js",
        "/lib/requirejs.php/1/x.js",
        "/webservice/rest/server.php",
        "/tokenpluginfile.php/t/27/mod_scorm/content/1/a.html",
        "/pix/i/loading.gif",
        "/admin/tool/heartbeat/",
    ];
    for path in paths {
        let reply = b.get(path).await.unwrap();
        assert_eq!(
            (reply.status, reply.issued),
            (StatusCode::OK, None),
            "{path}"
        );
    }
    assert_eq!(
        b.get("/admin/tool/heartbeat/").await.unwrap().text(),
        "Server is ALIVE\n"
    );
    assert_eq!(cluster.registry().owner("x"), None);
    assert_eq!(cluster.nodes()[0].sessions(), 0);
    let mut data = Browser::new(cluster.data().addr(), "/moodle", "MoodleSession");
    let file = data
        .get("/pluginfile.php/27/mod_scorm/content/1/big.bin")
        .await
        .unwrap();
    assert_eq!(
        (file.status, file.body.len(), file.upstream()),
        (StatusCode::OK, BIG_FILE, "data")
    );
    assert!(file.headers.get(SET_COOKIE).is_none());
}

#[tokio::test]
async fn directives_script_the_response() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    let directives = [
        ("x-standin-status", "502"),
        ("x-standin-set-cookie", "MoodleSession=a1; path=/"),
        ("x-standin-set-cookie", "Other=b;  Secure"),
        ("x-standin-header", "Connection: x-foo"),
        ("x-standin-header", "X-Foo: bar"),
        ("x-standin-delay-ms", "60"),
    ];
    let started = std::time::Instant::now();
    let reply = b
        .send(Method::GET, "/my/", None, &directives)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(60));
    assert_eq!(
        (reply.status, reply.upstream()),
        (StatusCode::BAD_GATEWAY, "web1")
    );
    let cookies: Vec<_> = reply.headers.get_all(SET_COOKIE).iter().collect();
    assert_eq!(cookies, ["MoodleSession=a1; path=/", "Other=b;  Secure"]);
    assert_eq!(
        (reply.header("connection"), reply.header("x-foo")),
        ("x-foo", "bar")
    );
    assert_eq!(cluster.nodes()[0].sessions(), 0);
    let seen = cluster.nodes()[0].last_request().unwrap();
    assert_eq!(
        (seen.uri.path(), seen.headers["x-standin-status"].as_bytes()),
        ("/my/", &b"502"[..])
    );
    let bad = b
        .send(Method::GET, "/", None, &[("x-standin-header", "nocolon")])
        .await
        .unwrap();
    assert_eq!(bad.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(cluster.nodes()[0].request_count(), 2);
}

#[tokio::test]
async fn a_stopped_node_refuses_connections() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let mut b = browser(&cluster, 0);
    assert_eq!(b.get("/").await.unwrap().status, StatusCode::OK);
    cluster.nodes()[0].stop();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(b.get("/").await.is_err());
}

#[tokio::test]
async fn config_toml_is_a_valid_gateway_config() {
    let cluster = Cluster::spawn(3, "/moodle", "MoodleSessionlms").unwrap();
    let extra = "session.balance = \"least-sessions\"\n[timeouts]\nconnect = \"1s\"";
    let toml = cluster.config_toml(
        "127.0.0.1:0",
        Some(("127.0.0.1:0", "s3cret-0123456789abcdef0123456789")),
        extra,
    );
    let config =
        crate::Config::parse(&toml, std::path::Path::new("."), Default::default()).unwrap();
    let names: Vec<_> = config.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["web1", "web2", "web3"]);
    assert_eq!(
        config.nodes[1].authority.as_str(),
        cluster.nodes()[1].addr().to_string()
    );
    assert_eq!(
        config.data.authority.as_str(),
        cluster.data().addr().to_string()
    );
    assert_eq!(
        (config.site.path.as_str(), config.session.cookie.as_str()),
        ("/moodle", "MoodleSessionlms")
    );
    assert_eq!(
        config.admin.unwrap().token,
        "s3cret-0123456789abcdef0123456789"
    );
    assert_eq!(
        config.session.balance,
        crate::config::Balance::LeastSessions
    );
    assert_eq!(config.timeouts.connect, Duration::from_secs(1));
}
