//! The rate limits as a botnet and a crowd of students meet them on stand-in
//! nodes: logins past their burst get 429 while a logged-in student on the same
//! address goes on working, one account tried from many addresses is held, and the
//! Moodle app is told in JSON when to come back.

use http::{Method, StatusCode};
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;

use crate::site::metric;
use crate::support::{self, TestGateway};

/// Stand-ins behind a gateway with `top` (top-level keys) and `limits` as its
/// `[rate_limits]` section.
async fn site(top: &str, limits: &str) -> (Cluster, TestGateway) {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let extra = format!("{top}\n[rate_limits]\n{limits}\n");
    let gateway = TestGateway::start(&cluster.config_toml("127.0.0.1:0", None, &extra)).await;
    (cluster, gateway)
}

fn refused(gateway: &TestGateway, kind: &str) -> f64 {
    metric(gateway, &format!("rate_limited_total{{kind=\"{kind}\"}}"))
}

/// A login POST from a fresh browser, through `headers`.
async fn try_login(
    gateway: &TestGateway,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String, String) {
    let mut bot = Browser::new(gateway.addr, "", "MoodleSession");
    let reply = bot.send(Method::POST, "/login/index.php", Some(body), headers);
    let reply = reply.await.unwrap();
    let retry = reply
        .headers
        .get("retry-after")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (reply.status, retry, reply.text())
}

#[tokio::test]
async fn a_burst_of_logins_from_one_address_gets_429_while_a_logged_in_student_there_works_on() {
    let limits = "login_per_address = { per_minute = 1, burst = 4 }\n\
                  pages_per_address = { per_minute = 1, burst = 6 }";
    let (_cluster, gateway) = site("", limits).await;
    // The student logs in from the school's one address: a page and a login.
    let (mut student, _node) = support::logged_in(&gateway, 1).await;
    let mut statuses = Vec::new();
    for n in 0..4 {
        let body = format!("username=victim{n}&password=guess");
        statuses.push(try_login(&gateway, &body, &[]).await);
    }
    let passed = statuses
        .iter()
        .filter(|(s, ..)| *s != StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(
        passed, 3,
        "the burst of 4, less the student's own login: {statuses:?}"
    );
    let (status, retry, page) = statuses.last().unwrap();
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
    assert!(retry.parse::<u64>().unwrap() >= 1, "Retry-After: {retry}");
    assert!(
        page.contains("<h1>Too many login attempts</h1>"),
        "a browser gets a page: {page}"
    );
    assert_eq!(refused(&gateway, "login_per_address"), 1.0);
    // Far more pages than the anonymous burst: the logged-in student is never limited.
    for _ in 0..20 {
        let page = student.get("/course/view.php?id=2").await.unwrap();
        assert_eq!(page.status, StatusCode::OK, "{}", page.text());
    }
    // A visitor without a session from the same address is, past its burst.
    let mut visitor = Browser::new(gateway.addr, "", "MoodleSession");
    let mut last = StatusCode::OK;
    for _ in 0..8 {
        visitor.set_session(None);
        last = visitor.get("/").await.unwrap().status;
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused(&gateway, "pages_per_address") >= 1.0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn one_username_tried_from_many_addresses_is_limited_and_another_is_not() {
    let top = "trusted_proxies = [\"127.0.0.1/32\"]";
    let limits = "login_per_username = { per_minute = 1, burst = 3 }";
    let (_cluster, gateway) = site(top, limits).await;
    let mut statuses = Vec::new();
    // Moodle reads " Admin" and "admin" as one account, and so do the limits.
    for (n, name) in ["admin", "Admin", "+admin+", "ADMIN", "admin"]
        .iter()
        .enumerate()
    {
        let from = format!("198.51.100.{n}");
        let body = format!("username={name}&password=guess{n}");
        let (status, ..) = try_login(&gateway, &body, &[("x-forwarded-for", &from)]).await;
        statuses.push(status);
    }
    let limited = statuses
        .iter()
        .filter(|&&s| s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(limited, 2, "{statuses:?}");
    assert_eq!(
        &statuses[..3],
        &[statuses[0]; 3],
        "the burst of 3 went through: {statuses:?}"
    );
    let (other, ..) = try_login(
        &gateway,
        "username=teacher&password=x",
        &[("x-forwarded-for", "198.51.100.9")],
    )
    .await;
    assert_ne!(
        other,
        StatusCode::TOO_MANY_REQUESTS,
        "another account has its own bucket"
    );
    assert_eq!(refused(&gateway, "login_per_username"), 2.0);
    assert_eq!(
        refused(&gateway, "login_per_address"),
        0.0,
        "off by default"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_moodle_app_past_its_limit_gets_json_with_retry_after() {
    let limits = "login_per_username = { per_minute = 1, burst = 2 }";
    let (_cluster, gateway) = site("", limits).await;
    let mut app = Browser::new(gateway.addr, "", "MoodleSession");
    let agent = [("user-agent", "Mozilla/5.0 MoodleMobile 4.5.0 (45000)")];
    let mut last = None;
    for _ in 0..3 {
        let body = Some("username=student7&password=x&service=moodle_mobile_app");
        let reply = app
            .send(Method::POST, "/login/token.php", body, &agent)
            .await
            .unwrap();
        last = Some(reply);
    }
    let reply = last.unwrap();
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(reply.header("content-type").starts_with("application/json"));
    assert!(reply.header("retry-after").parse::<u64>().unwrap() >= 1);
    let json: serde_json::Value = serde_json::from_str(&reply.text()).unwrap();
    assert_eq!(json["errorcode"], "rate_limited");
    assert!(json["error"].as_str().unwrap().contains("try again in"));
    assert_eq!(refused(&gateway, "login_per_username"), 1.0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn with_the_defaults_a_school_behind_one_address_logs_in_and_browses() {
    let (_cluster, gateway) = site("", "").await;
    for n in 0..40 {
        let (mut student, _) = support::logged_in(&gateway, n).await;
        assert_eq!(student.get("/").await.unwrap().status, StatusCode::OK);
    }
    for kind in [
        "login_per_address",
        "login_per_username",
        "pages_per_address",
    ] {
        assert_eq!(refused(&gateway, kind), 0.0, "{kind}");
    }
    gateway.shutdown().await;
}
