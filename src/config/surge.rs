//! The `[surge]` reader: each node's cap, the line in the gateway, and the waiting
//! room. Apart from `check` because the waiting room's page is a file read and
//! checked here, and because every key here is inert without a cap, which `check`
//! says rather than an error.

use std::fs;
use std::time::Duration;

use super::check::{integer, Checker, Section};
use super::values::cookie_name;
use super::{io_reason, QuizStarts, RoomConfig, SurgeConfig};

const SURGE_KEYS: &str = "max_active max_waiting aging patience post_patience \
                          anonymous_patience newcomer_patience quiz_starts quiz_starts_yield_at \
                          session_max_active \
                          waiting_room room_opens_at place_kept room_cookie room_page";

/// Most requests one node may be given at once: far above any PHP-FPM pool.
pub const MAX_ACTIVE: i64 = 100_000;
/// `surge.max_waiting` default: 10,000 waiting requests hold a few MiB.
pub const DEFAULT_MAX_WAITING: usize = 10_000;
/// `surge.aging` default: within a tier, a student's new page waits at most this
/// behind work in progress that keeps arriving, a newcomer behind sessions on
/// their way to log in.
pub const DEFAULT_AGING: Duration = Duration::from_secs(10);
/// `surge.patience` default: a logged-in student's page, below `response_headers`.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(60);
/// `surge.post_patience` default: a logged-in student's POST (a quiz answer, an
/// upload) is the work that must not be lost: the longest wait of all.
pub const DEFAULT_POST_PATIENCE: Duration = Duration::from_secs(180);
/// `surge.anonymous_patience` default.
pub const DEFAULT_ANONYMOUS_PATIENCE: Duration = Duration::from_secs(45);
/// `surge.newcomer_patience` default.
pub const DEFAULT_NEWCOMER_PATIENCE: Duration = Duration::from_secs(30);
/// `surge.session_max_active` default: a browser's HTTP/1.1 connections to one
/// host, so an ordinary page never waits; a burst past it (a loop, an HTTP/2 page
/// asking for thirty files at once) would hold a PHP worker per request, each
/// waiting for the session's lock.
pub const DEFAULT_SESSION_MAX_ACTIVE: usize = 6;
/// `surge.quiz_starts_yield_at` default: a median page turn at 1.5 × its calm
/// leaves the slower turns of the same second under about twice theirs, where a
/// student starts to feel the class's start; the share recovers under 1.25 ×.
pub const DEFAULT_QUIZ_STARTS_YIELD_AT: f64 = 1.5;
/// `surge.room_opens_at` default: a page that takes longer than this to start
/// feels broken, and a browser left waiting is a connection and a retry.
pub const DEFAULT_ROOM_OPENS_AT: Duration = Duration::from_secs(5);
/// `surge.place_kept` default: Cloudflare's, a few minutes away from the tab.
pub const DEFAULT_PLACE_KEPT: Duration = Duration::from_secs(5 * 60);
/// `surge.room_cookie` default.
pub const DEFAULT_ROOM_COOKIE: &str = "MoodleGatewayPlace";
/// Largest waiting-room page: it is sent to every visitor in line, again and again.
pub const MAX_ROOM_PAGE_BYTES: u64 = 64 * 1024;

impl Checker<'_> {
    /// `[surge]`; every default when absent (no cap: today's behaviour).
    pub(super) fn surge(&mut self, root: &Section, session_cookie: &str) -> SurgeConfig {
        let s = self.open("surge".into(), root.get("surge"), SURGE_KEYS);
        let count = |c: &mut Self, name, range, default: usize| {
            (c.int_in(&s, name, range)).map_or(default, |n| usize::try_from(n).unwrap_or(default))
        };
        let max_active = count(self, "max_active", 0..=MAX_ACTIVE, 0);
        let max_waiting = count(self, "max_waiting", 1..=1_000_000, DEFAULT_MAX_WAITING);
        let minute = Duration::from_secs(60);
        let patience = |c: &mut Self, name, default| {
            c.bounded(&s, name, default, Duration::from_secs(1)..=60 * minute)
        };
        let room = (self.typed(&s, "waiting_room", "true or false", |v| v.as_bool()))
            .is_none_or(|(on, _)| on);
        let room = room.then(|| RoomConfig {
            opens_at: self.bounded(
                &s,
                "room_opens_at",
                DEFAULT_ROOM_OPENS_AT,
                Duration::from_secs(1)..=10 * minute,
            ),
            place_kept: self.bounded(
                &s,
                "place_kept",
                DEFAULT_PLACE_KEPT,
                Duration::from_secs(10)..=60 * minute,
            ),
            cookie: self.room_cookie(&s, session_cookie),
            page: self.room_page(&s),
        });
        let quiz_starts = self.quiz_starts(&s);
        let quiz_starts_yield_at = self.quiz_starts_yield_at(&s);
        let session_max_active = count(
            self,
            "session_max_active",
            0..=MAX_ACTIVE,
            DEFAULT_SESSION_MAX_ACTIVE,
        );
        SurgeConfig {
            max_active,
            quiz_starts,
            quiz_starts_yield_at,
            session_max_active,
            max_waiting,
            aging: self.bounded(
                &s,
                "aging",
                DEFAULT_AGING,
                Duration::from_secs(1)..=10 * minute,
            ),
            patience: patience(self, "patience", DEFAULT_PATIENCE),
            post_patience: patience(self, "post_patience", DEFAULT_POST_PATIENCE),
            anonymous_patience: patience(self, "anonymous_patience", DEFAULT_ANONYMOUS_PATIENCE),
            newcomer_patience: patience(self, "newcomer_patience", DEFAULT_NEWCOMER_PATIENCE),
            waiting_room: room,
        }
    }

    /// `quiz_starts`: `"auto"` (the default) or a number of starts per node.
    fn quiz_starts(&mut self, s: &Section) -> QuizStarts {
        let want = "\"auto\" or an integer";
        let read = self.typed(s, "quiz_starts", want, |v| match v.as_str() {
            Some("auto") => Some(None),
            Some(_) => None,
            None => integer(v).map(Some),
        });
        match read {
            None | Some((None, _)) => QuizStarts::Auto,
            Some((Some(n), _)) if (0..=MAX_ACTIVE).contains(&n) => {
                QuizStarts::PerNode(usize::try_from(n).unwrap_or(0))
            }
            Some((Some(n), span)) => {
                let message = format!("must be \"auto\" or between 0 and {MAX_ACTIVE}, got {n}");
                self.error(s.key("quiz_starts"), Some(span), message);
                QuizStarts::Auto
            }
        }
    }

    /// `quiz_starts_yield_at`: 0 (off), or how many times their calm time the
    /// students' page turns may take before the site's starts give way. Under
    /// 1.1 the share would follow the turns' ordinary spread, not the starts.
    fn quiz_starts_yield_at(&mut self, s: &Section) -> f64 {
        let name = "quiz_starts_yield_at";
        let read = self.typed(s, name, "a number", |v| {
            let float = v
                .as_float()
                .and_then(|f| f.as_str().replace('_', "").parse().ok());
            float.or_else(|| integer(v).map(|i| i as f64))
        });
        match read {
            None => DEFAULT_QUIZ_STARTS_YIELD_AT,
            Some((ratio, _)) if ratio == 0.0 || (1.1..=100.0).contains(&ratio) => ratio,
            Some((ratio, span)) => {
                let message = format!("must be 0 (off) or between 1.1 and 100, got {ratio}");
                self.error(s.key(name), Some(span), message);
                DEFAULT_QUIZ_STARTS_YIELD_AT
            }
        }
    }

    fn room_cookie(&mut self, s: &Section, session_cookie: &str) -> String {
        let Some((name, span)) = self.parsed(s, "room_cookie", cookie_name) else {
            return DEFAULT_ROOM_COOKIE.to_owned();
        };
        if name == session_cookie {
            let message = "must not be the session cookie: the browser would lose its session";
            self.error(s.key("room_cookie"), Some(span), message);
        }
        name
    }

    /// The waiting page's template, read once here (and again on every reload), so
    /// a missing or oversized file is an error with its key, never a blank page.
    fn room_page(&mut self, s: &Section) -> Option<String> {
        let (rel, span) = self.string(s, "room_page")?;
        let path = self.base_dir.join(rel);
        let read = fs::metadata(&path).and_then(|meta| match meta.len() {
            len if len > MAX_ROOM_PAGE_BYTES => Ok(Err(format!(
                "{} is {len} bytes: at most {MAX_ROOM_PAGE_BYTES} (every visitor in line gets it \
                 at each refresh)",
                path.display()
            ))),
            _ => fs::read(&path).map(Ok),
        });
        let text = match read {
            Ok(Ok(bytes)) => String::from_utf8(bytes)
                .map_err(|_| format!("{} is not UTF-8: save it as UTF-8", path.display())),
            Ok(Err(message)) => Err(message),
            Err(e) => Err(format!("cannot read {}: {}", path.display(), io_reason(&e))),
        };
        text.map_err(|message| self.error(s.key("room_page"), Some(span), message))
            .ok()
    }
}
