//! The session cookie: which id PHP reads from a request's `Cookie` headers, and
//! which one a node's `Set-Cookie` starts, rotates to or clears.

use cookie::time::{Duration, OffsetDateTime};
use cookie::Cookie;
use http::header::{COOKIE, SET_COOKIE};
use http::HeaderMap;

use super::php::{php_name_is, split_pair};
use super::Site;

/// The `;`-separated pairs of a `Cookie` line, each `;` found by `memchr`: every
/// request's cookies are cut here, and a browser's line is often long (a site's
/// analytics and consent cookies ride beside Moodle's), where `split`'s closure,
/// called on each byte, cost more than half of the lookup.
fn cookie_pairs(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let now = rest?;
        match memchr::memchr(b';', now) {
            Some(at) => {
                rest = Some(&now[at + 1..]);
                Some(&now[..at])
            }
            None => {
                rest = None;
                Some(now)
            }
        }
    })
}

/// A session cookie seen in a node's `Set-Cookie`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuedSession<'a> {
    /// The node started or rotated to this (valid) session id.
    Id(&'a str),
    /// The node cleared the cookie (`deleted`, empty, expired).
    Cleared,
}

impl Site {
    /// The session id PHP would read from the request's `Cookie` headers, if it is a valid one.
    /// Borrowed from `headers`: no allocation.
    ///
    /// PHP keeps the first cookie of a name and drops an invalid id rather than looking further,
    /// so a later cookie never decides. Parsed as bytes, as PHP does, so stray non-UTF-8 bytes
    /// elsewhere in a header neither panic nor hide the cookie.
    pub fn session_id<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        let value = headers.get_all(COOKIE).iter().find_map(|line| {
            cookie_pairs(line.as_bytes()).find_map(|pair| {
                let (name, value) = split_pair(pair.trim_ascii_start());
                (!name.is_empty() && php_name_is(name, &self.cookie)).then_some(value)
            })
        })?;
        std::str::from_utf8(value)
            .ok()
            .filter(|v| is_valid_session_id(v))
    }

    /// The session cookie a node's response sets for this site; the last matching line wins.
    ///
    /// The last line wins because the browser applies them in order (PHP sends two when it
    /// regenerates an id); a last line with an invalid value leaves nothing to bind, so `None`.
    pub fn issued_session<'a>(&self, headers: &'a HeaderMap) -> Option<IssuedSession<'a>> {
        self.issued_session_at(headers, OffsetDateTime::now_utc)
    }

    /// Runs on every response: lines for other cookies are skipped before any parsing,
    /// and the clock is read only for a session cookie that carries `Expires`.
    pub(super) fn issued_session_at<'a>(
        &self,
        headers: &'a HeaderMap,
        now: impl FnOnce() -> OffsetDateTime,
    ) -> Option<IssuedSession<'a>> {
        let line = headers
            .get_all(SET_COOKIE)
            .iter()
            .filter(|h| self.names_session_cookie(h.as_bytes()))
            .filter_map(|h| SetCookie::parse(std::str::from_utf8(h.as_bytes()).ok()?))
            .rfind(|c| c.name == self.cookie && c.path.is_none_or(|p| p == self.cookie_path))?;
        // RFC 6265: Max-Age, when present, overrides Expires.
        let expired = match (line.max_age, line.expires) {
            (Some(age), _) => age <= Duration::ZERO,
            (None, true) => (Cookie::parse(line.line).ok())
                .and_then(|cookie| cookie.expires_datetime())
                .is_some_and(|at| at <= now()),
            (None, false) => false,
        };
        let value = line.value;
        if expired || value.is_empty() || value == "deleted" {
            return Some(IssuedSession::Cleared);
        }
        is_valid_session_id(value).then_some(IssuedSession::Id(value))
    }

    /// A cheap first look at a `Set-Cookie` line: does it set a cookie of our name?
    fn names_session_cookie(&self, line: &[u8]) -> bool {
        line.trim_ascii_start()
            .strip_prefix(self.cookie.as_bytes())
            .is_some_and(|rest| rest.trim_ascii_start().first() == Some(&b'='))
    }
}

/// What a `Set-Cookie` line says of the cookie it sets, as far as the gateway reads
/// it: read as the `cookie` crate's `Cookie::parse` reads it (the same pieces, the
/// same trimming, the last of an attribute wins), which stays the reader of a date.
///
/// Why not `Cookie::parse` itself: with it, reading a new session's line took some
/// 2,800 instructions, a tenth of a new visitor's whole request (a `String` for each
/// attribute's name, and the attributes no route depends on); this way about 1,600.
struct SetCookie<'a> {
    line: &'a str,
    name: &'a str,
    /// As sent, quotes and all.
    value: &'a str,
    path: Option<&'a str>,
    max_age: Option<Duration>,
    /// It has an `Expires` attribute (read with `Cookie::parse` when it counts).
    expires: bool,
}

impl<'a> SetCookie<'a> {
    /// `None` where `Cookie::parse` fails: no `=` before the first `;`, or no name.
    fn parse(line: &'a str) -> Option<Self> {
        let mut attributes = super::split_at(line, b';');
        let (name, value) = split_at_eq(attributes.next()?)?;
        let (name, value) = (trim(name), trim(value));
        if name.is_empty() {
            return None;
        }
        let mut cookie = SetCookie {
            line,
            name,
            value,
            path: None,
            max_age: None,
            expires: false,
        };
        for attribute in attributes {
            // `Secure`, `HttpOnly` and the others without a value route nothing.
            let Some((key, value)) = split_at_eq(attribute) else {
                continue;
            };
            let (key, value) = (trim(key), trim(value));
            if key.eq_ignore_ascii_case("path") {
                cookie.path = Some(value);
            } else if key.eq_ignore_ascii_case("max-age") {
                cookie.max_age = max_age(value).or(cookie.max_age);
            } else if key.eq_ignore_ascii_case("expires") {
                cookie.expires = true;
            }
        }
        Some(cookie)
    }
}

/// `str::split_once('=')`, a byte at a time: the pieces are a few bytes long, too
/// short for the search `split_once` sets up.
fn split_at_eq(s: &str) -> Option<(&str, &str)> {
    let at = s.bytes().position(|b| b == b'=')?;
    Some((&s[..at], &s[at + 1..]))
}

/// `str::trim`, which `Cookie::parse` uses (Unicode's white space), without
/// decoding characters when both ends are ASCII.
fn trim(s: &str) -> &str {
    let ascii = s.trim_ascii();
    match (ascii.as_bytes().first(), ascii.as_bytes().last()) {
        (Some(&first), Some(&last)) if !first.is_ascii() || !last.is_ascii() => s.trim(),
        _ => ascii,
    }
}

/// A `Max-Age` value as `Cookie::parse` reads it: digits, perhaps after a `-` (any
/// negative age is none, RFC 6265 5.2.2), too many of them the longest age; anything
/// else is ignored.
fn max_age(value: &str) -> Option<Duration> {
    let (negative, digits) = match value.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, value),
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(match negative {
        true => Duration::ZERO,
        false => digits
            .parse()
            .map_or(Duration::seconds(i64::MAX), Duration::seconds),
    })
}

/// Whether `s` is an id PHP would accept (`session.sid_length` 22–256, `[A-Za-z0-9,-]`):
/// anything else is never a key the gateway can route on.
///
/// Every request's cookie and every new session's `Set-Cookie` are checked, and a
/// random id's mix of letters and digits defeated the branch predictor of a range
/// test per byte (about 0.7 % of a request's CPU, `perf`): a table, read for every byte.
pub fn is_valid_session_id(s: &str) -> bool {
    (22..=256).contains(&s.len()) && s.bytes().fold(true, |ok, b| ok & SID_BYTES[usize::from(b)])
}

/// `[A-Za-z0-9,-]`, the bytes of a PHP session id.
static SID_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || byte == b',' || byte == b'-';
        b += 1;
    }
    table
};
