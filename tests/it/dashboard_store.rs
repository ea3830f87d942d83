//! The dashboard of gateways that share their table through a real `redis-server`
//! (`[store] kind = "redis"`): the Gateways panel lists every live gateway with
//! what it served and dealt, the find box says which gateway bound a session, and
//! with Redis killed the page still answers, with the warning where the list was.
//! `#[ignore]`d like `store.rs`: `tests/store/run.sh` runs it.

use std::time::{Duration, Instant};

use crate::dashboard::{csrf, log_in_with, page, post_form};
use crate::site::{Site, TOKEN};
use crate::support::{logged_in, TestGateway};

const UNREACHABLE: &str = "Redis unreachable: this gateway routes from its own table and the \
                           route cookie and deals locally; its changes are written back when \
                           Redis returns.";

/// The dashboard, read until `done` says it shows what the test waits for (a beat
/// comes every second); every reading must answer `200`.
async fn dashboard_until(
    gateway: &TestGateway,
    cookie: &str,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let seen = page(gateway, "/", cookie).await;
        assert_eq!(seen.status, 200, "the page always answers");
        let html = seen.text();
        if done(&html) {
            return html;
        }
        let limit = Duration::from_secs(5);
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?}: {html}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `<tr>` of one gateway in the panel.
fn gateway_row<'a>(html: &'a str, name: &str) -> Option<&'a str> {
    let row = html
        .split(&format!("<tr data-gateway=\"{name}\">"))
        .nth(1)?;
    row.split("</tr>").next()
}

/// What a gateway's row says it (served, dealt) for `node`; `None` while unknown.
fn served_dealt(html: &str, gateway: &str, node: &str) -> Option<(u64, u64)> {
    let row = gateway_row(html, gateway)?;
    let cell = row.split(&format!("data-node=\"{node}\">")).nth(1)?;
    let (served, dealt) = cell.split('<').next()?.split_once(" / ")?;
    Some((served.parse().ok()?, dealt.parse().ok()?))
}

/// The sessions in a gateway's table, as its row says.
fn sessions(html: &str, gateway: &str) -> Option<u64> {
    let row = gateway_row(html, gateway)?;
    let cell = row.split("data-figure=\"sessions\">").nth(1)?;
    cell.split('<').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: tests/store/run.sh installs and runs it"]
async fn the_dashboard_shows_every_gateway_and_what_it_served_and_warns_when_redis_dies() {
    let mut site = Site::start(2, &["gw-a", "gw-b"], "").await;
    let (student, on_b) = logged_in(site.gw(1), 1).await;
    let (_other, on_a) = logged_in(site.gw(0), 2).await;
    let cookie = log_in_with(site.gw(0), TOKEN).await;
    let html = dashboard_until(site.gw(0), &cookie, "both beats", |html| {
        let served = |gw, node| served_dealt(html, gw, node).map_or(0, |(s, _)| s);
        // The login form, the login and the home page; and one table for both.
        served("gw-b", &on_b) >= 3
            && served("gw-a", &on_a) >= 3
            && [sessions(html, "gw-a"), sessions(html, "gw-b")] == [Some(2), Some(2)]
    })
    .await;
    assert!(html.contains("data-store=\"connected\""), "{html}");
    let a = gateway_row(&html, "gw-a").unwrap();
    assert!(a.contains("<td>gw-a<span class=\"badge\">this gateway</span>"));
    assert!(!gateway_row(&html, "gw-b").unwrap().contains("this gateway"));
    assert_eq!(
        served_dealt(&html, "gw-b", &on_b).unwrap().1,
        1,
        "it dealt its student"
    );
    assert_eq!(served_dealt(&html, "gw-a", &on_a).unwrap().1, 1);
    assert!(!html.contains(UNREACHABLE));

    // gw-a's table is the cluster's: it finds gw-b's student, and says who bound it.
    let id = student.session().unwrap().to_owned();
    let body = format!("csrf={}&session={id}", csrf(&html));
    let found = post_form(site.gw(0), "/ui/find", &cookie, &body).await;
    assert_eq!(found.status, 303);
    let location = found.headers["location"].to_str().unwrap().to_owned();
    let shown = page(site.gw(0), &location, &cookie).await.text();
    assert!(
        shown.contains(&format!("data-found=\"node\">{on_b}<"))
            && shown.contains("bound by <b data-found=\"bound-by\">gw-b</b>"),
        "{shown}"
    );

    // Redis dies: the page still answers, says what this gateway does meanwhile,
    // and counts it.
    site.redis.kill();
    let html = dashboard_until(site.gw(0), &cookie, "the warning", |html| {
        html.contains(UNREACHABLE)
    })
    .await;
    assert!(
        html.contains("id=\"node-web1\""),
        "the cards are still there"
    );
    assert!(!html.contains("data-gateway="), "no list without Redis");
    assert!(html.contains("data-figure=\"outages\">1<"), "{html}");
    logged_in(site.gw(0), 3).await;
    dashboard_until(site.gw(0), &cookie, "the local deal counted", |html| {
        !html.contains("data-figure=\"fallback-deal\">0<")
    })
    .await;
}
