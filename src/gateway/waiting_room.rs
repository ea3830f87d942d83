//! The waiting room: when the nodes' lines are long, a newcomer asking for a page
//! gets the gateway's own waiting page, with a place in line kept in a cookie,
//! instead of joining the queue; places are let in first come, first served at the
//! pace the nodes free slots.
//!
//! Why only newcomers: a session the nodes issued through the gateway is the
//! admission. Moodle starts a session on a visitor's first page, so whoever has
//! one was let in already and is on the way to logging in (or is logged in); the
//! room never stands between a student and the login POST or the quiz. Only a page
//! request (GET or HEAD that accepts HTML) is held: a POST waits in the line, since
//! replaying one is not safe, and a script or an image is not something a person
//! sees, so a waiting page there would only break the page that asked for it.
//!
//! When it opens and lets people in: it opens when a newcomer joining the lines now
//! could expect to wait longer than `room_opens_at` (the waiters over the pace
//! slots free at); it lets the first in line go when their expected wait has come
//! back under that bound, a visitor back from the page one refresh early (see
//! [`QUICKEST_REFRESH`]); and it closes when its line is empty and the wait is
//! back under the bound. Being let in means joining the nodes' line as a newcomer
//! with the first arrival as the place, so the order of the room carries into the
//! line.
//!
//! What it holds: a visitor seen lately (within three refreshes, at most
//! `place_kept`) counts in line; everybody's place itself lives in their cookie, so
//! memory is one small entry per person waiting now.

mod page;
mod ticket;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT};
use http::{HeaderMap, Method, Request, Response};
use http_body_util::Full;

use crate::cluster::slots::Load;
use crate::config::RoomConfig;
use crate::metrics::{Metrics, RoomNow};

use page::Figures;
pub use page::BUILT_IN;
use ticket::{Ticket, Tickets};

/// The quickest the page refreshes itself. The visitors next in line come back in
/// whatever phase of it they happen to, so a visitor back from the page is let in
/// one such refresh before its turn and stands in its node's line, ordered by
/// first arrival, for about that long: the line can then put it back in the
/// order the refresh mixed. (On the test site this gained about a point of
/// newcomer pairs in order on average; the order still lost is lost between
/// nodes, each line keeping its own.)
const QUICKEST_REFRESH: Duration = Duration::from_secs(1);
/// The slowest: a long line is not asked again and again for nothing.
const SLOWEST_REFRESH: Duration = Duration::from_secs(20);
/// A visitor not seen for this many refreshes has left the line (their place stays
/// in their cookie for `place_kept`, should they come back).
const REFRESHES_MISSED: u32 = 3;
/// Admissions are counted over this window for the dashboard.
const MINUTE_MS: u64 = 60_000;

/// What a newcomer's page request is to do.
#[derive(Debug)]
pub enum Entry {
    /// Go on to the nodes; `Some(ms)` is an admitted visitor's first arrival, to
    /// stand in the line by.
    Go(Option<u64>),
    /// Show the waiting page instead.
    Wait(Response<Full<Bytes>>),
}

/// The room: who is in line now, and whether it is open.
#[derive(Debug)]
pub struct WaitingRoom {
    tickets: Tickets,
    open: AtomicBool,
    line: Mutex<Line>,
}

#[derive(Debug, Default)]
struct Line {
    /// Visitors seen lately: (first arrival, id) → last seen, all in milliseconds.
    visitors: BTreeMap<(u64, u64), u64>,
    /// When each of the last minute's admissions happened.
    admitted: VecDeque<u64>,
}

/// Whether a request is a person's page view that a waiting page can stand in for.
pub fn is_page_view<B>(request: &Request<B>) -> bool {
    let method = request.method();
    let accepts = request.headers().get_all(ACCEPT).iter();
    let accepts_html =
        { accepts }.any(|v| memchr::memmem::find(v.as_bytes(), b"text/html").is_some());
    (method == Method::GET || method == Method::HEAD) && accepts_html
}

impl WaitingRoom {
    /// A room whose tickets are signed with `secret` (the table's key secret: the
    /// same on every gateway of a shared store, and across restarts).
    pub fn new(secret: &[u8]) -> Self {
        Self {
            tickets: Tickets::new(secret),
            open: AtomicBool::new(false),
            line: Mutex::default(),
        }
    }

    /// Decides for one newcomer's page view. `capacity` is how many requests the
    /// nodes taking newcomers work on at once (their caps added up); `cookie_path`
    /// and `secure` are the place cookie's attributes.
    pub fn enter(
        &self,
        headers: &HeaderMap,
        room: &RoomConfig,
        load: Load,
        capacity: usize,
        cookie: (&str, bool),
        metrics: &Metrics,
    ) -> Entry {
        let now = unix_ms();
        let expected = load.expected_wait();
        let over = expected.is_none_or(|e| e > room.opens_at);
        let mut line = self.lock();
        let linger = linger(room);
        line.visitors
            .retain(|_, seen| now.saturating_sub(*seen) <= linger);
        line.admitted
            .retain(|&at| now.saturating_sub(at) <= MINUTE_MS);
        let held = self.tickets.read(headers, &room.cookie);
        let held = held.filter(|t| now.saturating_sub(t.seen) <= ms(room.place_kept));
        if !self.is_open() {
            if !over {
                return Entry::Go(held.map(|t| t.arrived));
            }
            self.open.store(true, Ordering::Relaxed);
            metrics.room_opened();
            tracing::warn!(
                expected_wait = %shown(expected),
                opens_at = %humantime::format_duration(room.opens_at),
                "waiting room opens: newcomers get the waiting page"
            );
        }
        // The refresh early only for a visitor back from the page: its refresh is
        // what mixed the order. One arriving now is let in at the bound itself, so
        // the room never opens for a visitor it then lets straight in.
        let early = if held.is_some() {
            QUICKEST_REFRESH
        } else {
            Duration::ZERO
        };
        let bound = room.opens_at + early;
        let ticket = held.unwrap_or_else(|| Ticket {
            arrived: now,
            id: next_id(),
            seen: now,
        });
        let key = (ticket.arrived, ticket.id);
        let place = line.visitors.range(..key).count();
        let allowance = allowance(load, bound, capacity);
        if place < allowance {
            line.visitors.remove(&key);
            line.admitted.push_back(now);
            metrics.admitted();
            if line.visitors.is_empty() && !over {
                self.close(line.admitted.len());
            }
            return Entry::Go(Some(ticket.arrived));
        }
        line.visitors.insert(key, now);
        drop(line);
        metrics.waiting_page();
        let figures = figures(load, bound, place, allowance);
        let template = room.page.as_deref().unwrap_or(BUILT_IN);
        let body = page::render(template, figures);
        let ticket = Ticket {
            seen: now,
            ..ticket
        };
        let line = self.cookie_line(room, ticket, cookie);
        Entry::Wait(page::response(body, figures.refresh, line))
    }

    /// The room for the dashboard and `/metrics`; closes it if its line emptied
    /// and the wait is back under the bound while nobody asked.
    pub fn now(&self, room: Option<&RoomConfig>, load: Load) -> RoomNow {
        let now = unix_ms();
        let expected = load.expected_wait();
        let mut line = self.lock();
        if let Some(room) = room {
            let linger = linger(room);
            line.visitors
                .retain(|_, seen| now.saturating_sub(*seen) <= linger);
            let under = expected.is_some_and(|e| e <= room.opens_at);
            if self.is_open() && line.visitors.is_empty() && under {
                self.close(line.admitted.len());
            }
        } else if self.is_open() {
            // The room was turned off by a reload.
            line.visitors.clear();
            self.close(line.admitted.len());
        }
        line.admitted
            .retain(|&at| now.saturating_sub(at) <= MINUTE_MS);
        RoomNow {
            open: self.is_open(),
            in_line: line.visitors.len(),
            expected_wait: expected,
            admitted_last_minute: line.admitted.len() as u64,
        }
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn close(&self, admitted_last_minute: usize) {
        self.open.store(false, Ordering::Relaxed);
        tracing::warn!(
            admitted_last_minute,
            "waiting room closes: newcomers go straight to the nodes again"
        );
    }

    /// `Set-Cookie` for a visitor's place, kept for `place_kept`.
    fn cookie_line(&self, room: &RoomConfig, ticket: Ticket, cookie: (&str, bool)) -> HeaderValue {
        let (path, secure) = cookie;
        let line = format!(
            "{}={}; Path={path}; Max-Age={}; HttpOnly; SameSite=Lax{}",
            room.cookie,
            self.tickets.value(ticket),
            room.place_kept.as_secs(),
            if secure { "; Secure" } else { "" },
        );
        HeaderValue::try_from(line).expect("a cookie name, digits, base64url and a plain path")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How many of the first in line may go now: with nobody waiting for a slot, as
/// many as the nodes work on at once; else as many as the line can take before
/// the waiters ahead, at the pace slots free, would pass `bound`. (What
/// newcomers were just seen to wait opens the room; it does not pace it: it lags
/// the line by a whole wait, and would hold everyone until the line is empty.)
fn allowance(load: Load, bound: Duration, capacity: usize) -> usize {
    if load.waiting == 0 {
        return capacity.max(1);
    }
    match load.reckoned_wait() {
        Some(e) if e < bound => ((bound - e).as_secs_f64() * load.pace) as usize,
        _ => 0,
    }
}

/// What a visitor at `place` (0-based) is told: the time for the lines to come
/// back under `bound` (the one it is let in at), plus the visitors ahead at the
/// pace slots free.
///
/// The refresh is half the time until the visitor's place comes within the
/// `allowance`, not a share of the whole wait: each is asked back sooner the closer
/// it is to its turn, so the first in line come back first and get in first. With
/// the refresh a share of the wait, visitors of a few seconds apart refreshed in
/// the phase of their arrival, and whoever happened to ask first once the line
/// eased went in before those ahead of them.
fn figures(load: Load, bound: Duration, place: usize, allowance: usize) -> Figures {
    let pace = load.pace.max(0.1);
    let ahead = Duration::from_secs_f64((place + 1) as f64 / pace);
    let backlog = (load.expected_wait()).map_or(bound, |e| e.saturating_sub(bound));
    let wait = backlog
        .saturating_add(ahead)
        .min(Duration::from_secs(24 * 3600));
    let until_turn = if allowance == 0 {
        wait
    } else {
        Duration::from_secs_f64((place + 1).saturating_sub(allowance) as f64 / pace)
    };
    Figures {
        place: place + 1,
        wait,
        refresh: (until_turn / 2).clamp(QUICKEST_REFRESH, SLOWEST_REFRESH),
    }
}

/// How long a visitor who stopped refreshing still counts in line.
fn linger(room: &RoomConfig) -> u64 {
    ms((SLOWEST_REFRESH * REFRESHES_MISSED).min(room.place_kept))
}

fn shown(expected: Option<Duration>) -> String {
    expected.map_or_else(
        || "unknown (nothing finished lately)".to_owned(),
        |e| humantime::format_duration(Duration::from_millis(e.as_millis() as u64)).to_string(),
    )
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms)
}

/// Orders the visitors of one millisecond: in the order this process saw them,
/// from a random start, so two gateways' visitors of the same millisecond
/// interleave rather than one gateway's always going first.
fn next_id() -> u64 {
    static NEXT: std::sync::OnceLock<AtomicU64> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let mut bytes = [0u8; 4];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        AtomicU64::new(u64::from(u32::from_le_bytes(bytes)) << 16)
    });
    next.fetch_add(1, Ordering::Relaxed)
}

/// `room`'s page as a visitor 42nd in line would see it, for an admin to check a
/// template (`GET /surge/page`) without waiting for a surge.
pub fn preview(room: &RoomConfig) -> String {
    let figures = Figures {
        place: 42,
        wait: Duration::from_secs(180),
        refresh: SLOWEST_REFRESH,
    };
    page::render(room.page.as_deref().unwrap_or(BUILT_IN), figures)
}

/// The `Instant` a wall-clock arrival in milliseconds stands for (a place from
/// before this process, or from another gateway, lies in the past).
pub fn instant_of(arrived_ms: u64) -> tokio::time::Instant {
    let ago = Duration::from_millis(unix_ms().saturating_sub(arrived_ms));
    let now = tokio::time::Instant::now();
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests;
