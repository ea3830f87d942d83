//! With `demo --surge`: a crowd at the door, as at an exam's start. Every [`EVERY`],
//! [`CROWD`] newcomers arrive within [`SPREAD`]; each opens the login page as a
//! browser does (accepting HTML), and while the gateway shows the waiting room it
//! keeps its place cookie and comes back when the page says; let in, it logs in
//! and reads its dashboard. The stand-in nodes have few PHP workers and slow pages,
//! so the dashboard shows the line grow, the room open, and the crowd let in at the
//! pace the nodes free workers.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::SET_COOKIE;
use http::{Method, StatusCode};
use tokio::task::JoinSet;

use super::students::logintoken;
use super::Browser;

/// Newcomers in one wave.
pub(super) const CROWD: usize = 120;
/// The time one wave takes to arrive.
const SPREAD: Duration = Duration::from_secs(3);
/// From one wave's start to the next (or the last newcomer's end, if later).
pub(super) const EVERY: Duration = Duration::from_secs(60);
/// What a browser's navigation sends: a page view the waiting room may answer.
const A_PAGE: (&str, &str) = ("accept", "text/html,application/xhtml+xml,*/*;q=0.8");
/// The longest a newcomer waits between two looks at the waiting page.
const LONGEST_PAUSE: u64 = 20;

/// Runs until the task is aborted: the demo's Ctrl-C.
pub(super) async fn arrive(gateway: SocketAddr, site_path: String, cookie: String) {
    loop {
        let next = tokio::time::sleep(EVERY);
        let mut wave = JoinSet::new();
        for _ in 0..CROWD {
            let (site, cookie) = (site_path.clone(), cookie.clone());
            wave.spawn(async move { newcomer(gateway, &site, &cookie).await });
            tokio::time::sleep(SPREAD / CROWD as u32).await;
        }
        while let Some(done) = wave.join_next().await {
            if let Ok(Err(failure)) = done {
                tracing::warn!("demo: a newcomer of the crowd failed: {failure}");
            }
        }
        next.await;
    }
}

/// One newcomer: the login page (through the waiting room), the login, the dashboard.
async fn newcomer(gateway: SocketAddr, site: &str, cookie: &str) -> Result<(), String> {
    let mut browser = Browser::new(gateway, site, cookie);
    let mut place: Option<String> = None;
    let form = loop {
        let mut headers = vec![A_PAGE];
        if let Some(place) = &place {
            headers.push(("cookie", place.as_str()));
        }
        let reply = browser
            .send(Method::GET, "/login/index.php", None, &headers)
            .await?;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            break reply;
        }
        place = place_cookie(&reply.headers, cookie).or(place);
        let pause = reply.header("retry-after").parse().unwrap_or(5);
        tokio::time::sleep(Duration::from_secs(pause.clamp(1, LONGEST_PAUSE))).await;
    };
    let Some(token) = logintoken(&form.text()) else {
        return Err(form.unexpected("GET /login/index.php", "the login form"));
    };
    let login = format!("username=newcomer&password=x&logintoken={token}");
    let reply = browser.post("/login/index.php", &login).await?;
    if reply.status != StatusCode::SEE_OTHER {
        return Err(reply.unexpected("POST /login/index.php", "303"));
    }
    let page = browser.send(Method::GET, "/my/", None, &[A_PAGE]).await?;
    match page.status {
        StatusCode::OK => Ok(()),
        _ => Err(page.unexpected("GET /my/", "200")),
    }
}

/// The waiting room's place cookie (`name=value`): the cookie it sets that is not
/// Moodle's session cookie.
fn place_cookie(headers: &http::HeaderMap, session: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|line| line.to_str().ok()?.split(';').next())
        .find(|pair| pair.split('=').next().is_some_and(|name| name != session))
        .map(str::to_owned)
}
