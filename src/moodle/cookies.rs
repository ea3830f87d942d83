//! The session cookie: which id PHP reads from a request's `Cookie` headers, and
//! which one a node's `Set-Cookie` starts, rotates to or clears.

use cookie::time::{Duration, OffsetDateTime};
use cookie::Cookie;
use http::header::{COOKIE, SET_COOKIE};
use http::HeaderMap;

use super::php::{php_name_is, split_pair};
use super::Site;

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
        let value = headers
            .get_all(COOKIE)
            .iter()
            .flat_map(|h| h.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| {
                let (name, value) = split_pair(pair.trim_ascii_start());
                (!name.is_empty() && php_name_is(name, &self.cookie)).then_some(value)
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
            .filter_map(|h| Cookie::parse(std::str::from_utf8(h.as_bytes()).ok()?).ok())
            .rfind(|c| c.name() == self.cookie && c.path().is_none_or(|p| p == self.cookie_path))?;
        // RFC 6265: Max-Age, when present, overrides Expires.
        let expired = match (line.max_age(), line.expires_datetime()) {
            (Some(age), _) => age <= Duration::ZERO,
            (None, Some(at)) => at <= now(),
            (None, None) => false,
        };
        let value = line.value_raw()?;
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

/// Whether `s` is an id PHP would accept (`session.sid_length` 22–256, `[A-Za-z0-9,-]`):
/// anything else is never a key the gateway can route on.
pub fn is_valid_session_id(s: &str) -> bool {
    (22..=256).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b',' || b == b'-')
}
