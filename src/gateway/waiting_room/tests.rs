//! The room's rules: when it opens, who is let in, and what a place cookie keeps.

use super::*;
use http::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use http::StatusCode;
use http_body_util::BodyExt;

const SECRET: [u8; 16] = [3; 16];

fn room() -> RoomConfig {
    RoomConfig {
        opens_at: Duration::from_secs(5),
        place_kept: Duration::from_secs(300),
        cookie: "Place".into(),
        page: Some("place {{place}} wait {{wait_seconds}} refresh {{refresh_seconds}}".into()),
    }
}

/// Nodes that free 10 slots a second with `waiting` requests in their lines.
fn load(waiting: usize) -> Load {
    Load {
        waiting,
        newcomers_waiting: 0,
        per_newcomer: 4.0,
        pace: 10.0,
        newcomers_waited: None,
    }
}

/// 20 s of waiting: the room opens.
const SURGE: usize = 200;
/// 4 s: 2 s under the bound plus the refresh (6 s) that a visitor back from the
/// page is let in by, 20 visitors' worth.
const EASED: usize = 40;

/// A browser: the headers of a page view, with the place cookie it was given.
#[derive(Default)]
struct Visitor {
    cookie: Option<String>,
}

impl Visitor {
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("text/html,*/*;q=0.8"));
        if let Some(cookie) = &self.cookie {
            headers.insert(COOKIE, HeaderValue::from_str(cookie).unwrap());
        }
        headers
    }

    /// Asks once; `Ok(first arrival)` when let in, `Err(page text)` when shown the
    /// waiting page (whose cookie it keeps).
    async fn ask(&mut self, room: &WaitingRoom, load: Load) -> Result<Option<u64>, String> {
        let metrics = Metrics::new();
        let entry = room.enter(
            &self.headers(),
            &self::room(),
            load,
            8,
            ("/", false),
            &metrics,
        );
        match entry {
            Entry::Go(arrived) => Ok(arrived),
            Entry::Wait(page) => {
                assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert!(page.headers().contains_key(RETRY_AFTER));
                let line = page.headers()[SET_COOKIE].to_str().unwrap();
                assert!(
                    line.contains("; Max-Age=300; HttpOnly; SameSite=Lax"),
                    "{line}"
                );
                self.cookie = Some(line.split(';').next().unwrap().to_owned());
                let body = page.into_body().collect().await.unwrap().to_bytes();
                Err(String::from_utf8(body.to_vec()).unwrap())
            }
        }
    }
}

fn place(page: &str) -> usize {
    page.split(' ').nth(1).unwrap().parse().unwrap()
}

/// `n` visitors arriving a few milliseconds apart in a surge, each shown the
/// waiting page (returned with them) and holding its place cookie.
async fn lined_up(room: &WaitingRoom, n: usize) -> (Vec<Visitor>, Vec<String>) {
    let mut visitors: Vec<Visitor> = (0..n).map(|_| Visitor::default()).collect();
    let mut pages = Vec::new();
    for visitor in &mut visitors {
        pages.push(visitor.ask(room, load(SURGE)).await.unwrap_err());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (visitors, pages)
}

#[tokio::test]
async fn a_newcomer_goes_straight_in_while_the_lines_are_short() {
    let room = WaitingRoom::new(&SECRET);
    let mut visitor = Visitor::default();
    assert_eq!(visitor.ask(&room, load(10)).await, Ok(None));
    assert!(!room.now(Some(&self::room()), load(10)).open);
}

#[tokio::test]
async fn in_a_surge_newcomers_get_places_in_order_and_a_refresh_keeps_its_place() {
    let room = WaitingRoom::new(&SECRET);
    let mut first = Visitor::default();
    let mut second = Visitor::default();
    assert_eq!(place(&first.ask(&room, load(SURGE)).await.unwrap_err()), 1);
    assert_eq!(place(&second.ask(&room, load(SURGE)).await.unwrap_err()), 2);
    assert_eq!(
        place(&first.ask(&room, load(SURGE)).await.unwrap_err()),
        1,
        "a refresh keeps the place"
    );
    let now = room.now(Some(&self::room()), load(SURGE));
    assert!(now.open);
    assert_eq!(now.in_line, 2);
}

#[tokio::test]
async fn as_the_lines_ease_the_first_in_line_go_first_at_the_nodes_pace() {
    let room = WaitingRoom::new(&SECRET);
    let (mut visitors, _) = lined_up(&room, 25).await;
    // The last ones refresh first: they are still behind the first twenty.
    let last = visitors.last_mut().unwrap();
    assert_eq!(place(&last.ask(&room, load(EASED)).await.unwrap_err()), 25);
    let mut arrivals = Vec::new();
    for visitor in &mut visitors[..20] {
        let arrived = visitor.ask(&room, load(EASED)).await;
        arrivals.push(
            arrived
                .expect("within the allowance")
                .expect("with its arrival"),
        );
    }
    assert!(
        arrivals.is_sorted(),
        "let in with their first arrival, in order"
    );
    let fifth = &mut visitors[20];
    assert_eq!(place(&fifth.ask(&room, load(SURGE)).await.unwrap_err()), 1);
}

/// The first in line come back in the phase of their own refresh; let in a
/// refresh before their turn, they stand in their node's line long enough for it
/// to put them back in arrival order. A visitor arriving now gets no such second.
#[tokio::test]
async fn the_first_in_line_are_let_in_one_refresh_before_their_turn() {
    let room = WaitingRoom::new(&SECRET);
    let (mut visitors, _) = lined_up(&room, 8).await;
    // 6.1 s of waiting: more than a refresh over the bound, nobody's turn is near.
    let far = visitors[0].ask(&room, load(61)).await.unwrap_err();
    assert_eq!(place(&far), 1);
    // 5.5 s: half a second over the bound, so the first five visitors' turns come
    // within the next second. They come back in any order; each goes in with its
    // own first arrival, for the node's line to order them by.
    let almost = load(55);
    let sixth = visitors[5].ask(&room, almost).await.unwrap_err();
    assert_eq!(place(&sixth), 6, "its turn is more than a refresh away");
    let mut arrivals = Vec::new();
    for visitor in visitors[..5].iter_mut().rev() {
        let arrived = visitor.ask(&room, almost).await;
        arrivals.push(arrived.expect("within a refresh of the turn").unwrap());
    }
    assert!(
        arrivals.windows(2).all(|w| w[0] > w[1]),
        "each with its own first arrival: {arrivals:?}"
    );
    // A newcomer arriving now is let in only under the bound itself: behind one
    // visitor at 5.5 s, it waits.
    let room = WaitingRoom::new(&SECRET);
    assert!(Visitor::default().ask(&room, load(SURGE)).await.is_err());
    let newcomer = Visitor::default().ask(&room, almost).await;
    assert_eq!(place(&newcomer.unwrap_err()), 2);
}

#[tokio::test]
async fn a_forged_cookie_or_a_place_left_too_long_is_a_place_at_the_end() {
    let room = WaitingRoom::new(&SECRET);
    let mut first = Visitor::default();
    let mut second = Visitor::default();
    first.ask(&room, load(SURGE)).await.unwrap_err();
    second.ask(&room, load(SURGE)).await.unwrap_err();
    let tickets = Tickets::new(&SECRET);
    let mut forger = Visitor {
        cookie: Some(format!("Place=1.1.{}.AAAAAAAAAAAAAAAAAAAAAA", unix_ms())),
    };
    assert_eq!(place(&forger.ask(&room, load(SURGE)).await.unwrap_err()), 3);
    let long_gone = Ticket {
        arrived: 1,
        id: 1,
        seen: unix_ms() - 301_000,
    };
    let mut returning = Visitor {
        cookie: Some(format!("Place={}", tickets.value(long_gone))),
    };
    assert_eq!(
        place(&returning.ask(&room, load(SURGE)).await.unwrap_err()),
        4
    );
    let other = Tickets::new(&[4; 16]).value(Ticket {
        seen: unix_ms(),
        ..long_gone
    });
    let mut stranger = Visitor {
        cookie: Some(format!("Place={other}")),
    };
    assert_eq!(
        place(&stranger.ask(&room, load(SURGE)).await.unwrap_err()),
        5
    );
}

#[tokio::test]
async fn another_gateway_or_the_next_process_honours_the_place() {
    let before = WaitingRoom::new(&SECRET);
    let mut early = Visitor::default();
    early.ask(&before, load(SURGE)).await.unwrap_err();
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The same secret (the store's, or the table's from the snapshot), an empty line.
    let after = WaitingRoom::new(&SECRET);
    let mut late = Visitor::default();
    late.ask(&after, load(SURGE)).await.unwrap_err();
    assert_eq!(
        place(&early.ask(&after, load(SURGE)).await.unwrap_err()),
        1,
        "the earlier arrival goes ahead of the one this gateway saw first"
    );
}

#[tokio::test]
async fn the_room_closes_once_its_line_is_empty_and_the_wait_is_short() {
    let room = WaitingRoom::new(&SECRET);
    let mut visitor = Visitor::default();
    visitor.ask(&room, load(SURGE)).await.unwrap_err();
    assert!(visitor.ask(&room, load(0)).await.is_ok());
    assert!(!room.now(Some(&self::room()), load(0)).open);
    let mut next = Visitor::default();
    assert_eq!(
        next.ask(&room, load(10)).await,
        Ok(None),
        "closed: straight in"
    );
}

#[tokio::test]
async fn stuck_nodes_open_the_room() {
    let room = WaitingRoom::new(&SECRET);
    let stuck = Load {
        waiting: 3,
        newcomers_waiting: 0,
        per_newcomer: 4.0,
        pace: 0.0,
        newcomers_waited: None,
    };
    assert!(Visitor::default().ask(&room, stuck).await.is_err());
}

#[test]
fn only_a_page_view_can_be_held() {
    let asking = |method: Method, accept: Option<&'static str>| {
        let mut request = Request::builder().method(method);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        request.body(()).unwrap()
    };
    let html = Some("text/html,application/xhtml+xml,*/*;q=0.8");
    assert!(is_page_view(&asking(Method::GET, html)));
    assert!(is_page_view(&asking(Method::HEAD, html)));
    assert!(
        !is_page_view(&asking(Method::POST, html)),
        "a POST is never replayed"
    );
    assert!(!is_page_view(&asking(
        Method::GET,
        Some("application/json")
    )));
    assert!(!is_page_view(&asking(Method::GET, None)));
}

#[tokio::test]
async fn the_next_in_line_are_asked_back_sooner_than_those_far_behind() {
    fn refresh(page: &str) -> u64 {
        page.split(' ').nth(5).unwrap().parse().unwrap()
    }
    let room = WaitingRoom::new(&SECRET);
    let (mut visitors, pages) = lined_up(&room, 60).await;
    // In the surge nobody's turn is near: the line is past the bound for everyone.
    assert!(refresh(&pages[0]) >= 5, "{}", pages[0]);
    // The line eases: 20 may go. The 21st is next and comes back within a second;
    // the 60th, 40 visitors (4 s at the nodes' pace) behind, waits longer.
    let next = visitors[20].ask(&room, load(EASED)).await.unwrap_err();
    let last = visitors[59].ask(&room, load(EASED)).await.unwrap_err();
    assert_eq!(place(&next), 21);
    assert_eq!(refresh(&next), 1, "{next}");
    assert!(refresh(&last) > refresh(&next), "{last} / {next}");
}

/// The templates shipped for admins to start from (in the package's doc folder):
/// the English one is the built-in page itself (one file), and each fills in every figure and
/// keeps search engines away from the page.
#[test]
fn the_shipped_templates_are_the_built_in_page_and_a_thai_one_with_every_figure() {
    let thai = include_str!("../../../docs/waiting-room/waiting-room.th.html");
    for template in [BUILT_IN, thai] {
        assert!(template.contains(r#"<meta name="robots" content="noindex">"#));
        let room = RoomConfig {
            page: Some(template.to_owned()),
            ..room()
        };
        let shown = preview(&room);
        assert!(!shown.contains("{{"), "a placeholder left: {shown}");
        assert!(shown.contains("<strong>42</strong>") && shown.contains("<strong>3</strong>"));
        assert!(shown.contains(r#"content="20""#));
    }
}
