//! Who may use the admin API: the token, the refusal of what a browser can be made
//! to send from another site, and a brake on guessing the token.
//!
//! Why the token is hashed before comparing: both sides become fixed-size keyed
//! digests compared with [`subtle`], so neither the bytes nor the length of the
//! token leak through timing. Basic auth (any username, the token as password) is
//! accepted so a browser can open the JSON directly.
//!
//! Why the cross-site rules: a browser that holds cached Basic credentials attaches
//! them by itself, also to a form another site posts to the admin listener
//! (cross-site request forgery; a page on `evil.example` disabled a node and ran
//! `/reload` that way). So a request that changes state is refused when
//! `Sec-Fetch-Site` or `Origin` says it came from elsewhere, when it has a content
//! type an HTML form can send without asking, or when it rides on Basic credentials
//! without a header only a script can add (`X-Requested-By`). A bearer token is
//! never attached by a browser on its own, so the book's curl lines (docs/src/admin-api.md) keep working.
//! These checks come before the token: a forged request never counts as a guess.
//!
//! Why the brake: a token can be guessed at thousands of tries a second. After
//! [`FREE_FAILURES`] wrong tokens from one address, that address waits a delay that
//! doubles with each further failure (up to [`MAX_DELAY`]) and gets `429` with
//! `Retry-After` meanwhile, even with the right token. Only a request that presents
//! a credential counts, so a page that makes a browser send credential-less
//! requests cannot lock its administrator out. Each failure is logged with the
//! peer address, never with what was presented.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{
    AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use siphasher::sip128::SipHasher13;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::ApiError;
use crate::logs::Every;

/// The challenge that makes a browser ask for the token.
pub(super) const CHALLENGE: &str = r#"Basic realm="moodle-gateway admin""#;
/// The header a script adds to make Basic credentials count for a change.
pub(super) const REQUESTED_BY: HeaderName = HeaderName::from_static("x-requested-by");
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Wrong tokens an address may present before it has to wait.
pub(super) const FREE_FAILURES: u32 = 5;
/// The first wait; each further failure doubles it.
const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest wait.
const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// Addresses tracked at most: a guesser with many addresses cannot grow memory.
const MAX_TRACKED: usize = 4096;
/// A record this long without a failure is the first to go when the table is full.
const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);

/// The token and the failure records, shared by every admin request.
pub(super) struct Guard {
    token: Token,
    failures: Failures,
}

impl Guard {
    pub(super) fn new(token: &str) -> Self {
        Self {
            token: Token::new(token),
            failures: Failures::default(),
        }
    }
}

/// The admin token, kept only as a keyed digest under a per-process key.
struct Token {
    hasher: SipHasher13,
    digest: [u8; 16],
}

impl Token {
    fn new(token: &str) -> Self {
        let mut key = [0u8; 16];
        getrandom::fill(&mut key).expect("the OS random source is available");
        let hasher = SipHasher13::new_with_key(&key);
        let digest = hasher.hash(token.as_bytes()).as_bytes();
        Self { hasher, digest }
    }

    fn matches(&self, presented: &[u8]) -> bool {
        let digest = self.hasher.hash(presented).as_bytes();
        digest.ct_eq(&self.digest).into()
    }
}

/// What a request presents in `Authorization`.
#[derive(Debug, PartialEq, Eq)]
enum Credential {
    /// No `Authorization` header: not a guess.
    Absent,
    /// `Bearer <secret>`: only a script sends it.
    Bearer(Vec<u8>),
    /// `Basic` with the secret as password: a browser may resend it on its own.
    Basic(Vec<u8>),
    /// Something else, or a malformed value: a wrong credential.
    Unusable,
}

impl Credential {
    fn of(headers: &HeaderMap) -> Self {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return Self::Absent;
        };
        let Some((scheme, credentials)) =
            value.to_str().ok().and_then(|v| v.trim().split_once(' '))
        else {
            return Self::Unusable;
        };
        let credentials = credentials.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return Self::Bearer(credentials.as_bytes().to_vec());
        }
        if !scheme.eq_ignore_ascii_case("basic") {
            return Self::Unusable;
        }
        let password = base64_decode(credentials).and_then(|mut decoded| {
            let colon = decoded.iter().position(|&b| b == b':')?;
            decoded.drain(..=colon);
            Some(decoded)
        });
        password.map_or(Self::Unusable, Self::Basic)
    }
}

/// Standard base64 (padding optional), enough for a Basic credential.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in text.trim_end_matches('=').bytes() {
        let sextet = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Whether a request of this method may change something.
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Why a state-changing request looks like one a browser sent for another site.
fn cross_site(headers: &HeaderMap, credential: &Credential) -> Option<ApiError> {
    let forbidden = |why: &str| Some(ApiError(StatusCode::FORBIDDEN, why.into()));
    if let Some(refusal) = from_elsewhere(headers) {
        return Some(refusal);
    }
    if headers.get(CONTENT_TYPE).is_some_and(is_form) {
        let why = "form content types are refused: send json or no body";
        return Some(ApiError(StatusCode::UNSUPPORTED_MEDIA_TYPE, why.into()));
    }
    let scripted = headers.get(REQUESTED_BY).is_some_and(|v| !v.is_empty());
    if matches!(credential, Credential::Basic(_)) && !scripted {
        return forbidden("basic credentials change nothing without an x-requested-by header");
    }
    None
}

/// Why a request was sent by a page of another origin, if `Sec-Fetch-Site` or
/// `Origin` says so. Also the first check of the dashboard's own forms, which are
/// same-origin by construction.
pub(super) fn from_elsewhere(headers: &HeaderMap) -> Option<ApiError> {
    let forbidden = |why: &str| Some(ApiError(StatusCode::FORBIDDEN, why.into()));
    // `none`: typed or bookmarked by the user, not sent by a page.
    let site = headers.get(SEC_FETCH_SITE).map(HeaderValue::as_bytes);
    if site.is_some_and(|s| !s.eq_ignore_ascii_case(b"same-origin") && s != b"none") {
        return forbidden("cross-site request refused");
    }
    let origin = headers.get(ORIGIN)?;
    let host = headers.get(HOST).map(HeaderValue::as_bytes);
    (!same_origin(origin.as_bytes(), host))
        .then(|| ApiError(StatusCode::FORBIDDEN, "cross-origin request refused".into()))
}

/// Whether `origin` (`http://host:port`) names the admin listener as the request's
/// `Host` does. `null` (a sandboxed or redirected page) names nothing.
fn same_origin(origin: &[u8], host: Option<&[u8]>) -> bool {
    let authority = origin
        .strip_prefix(b"http://")
        .or_else(|| origin.strip_prefix(b"https://"));
    match (authority, host) {
        (Some(authority), Some(host)) => authority.eq_ignore_ascii_case(host.trim_ascii()),
        _ => false,
    }
}

/// The content types an HTML form (or a `no-cors` fetch) sends without a preflight.
fn is_form(value: &HeaderValue) -> bool {
    let essence = value
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    let essence = essence.trim_ascii();
    [
        &b"application/x-www-form-urlencoded"[..],
        b"multipart/form-data",
        b"text/plain",
    ]
    .iter()
    .any(|form| essence.eq_ignore_ascii_case(form))
}

/// Failed authentications by client address (an IPv6 address by its /64, which one
/// host usually holds whole).
///
/// A `std` mutex over a map, never held across an `.await`: the admin API serves
/// a handful of operators, so one lock per request costs nothing, and the map is
/// bounded by [`MAX_TRACKED`].
#[derive(Default)]
struct Failures {
    by_peer: Mutex<HashMap<IpAddr, Record>>,
    /// Every failure since start, for the log.
    total: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    /// When the address may try again, once it used up its free failures.
    until: Option<Instant>,
    last: Instant,
}

impl Failures {
    /// How long `peer` must still wait, if it must.
    fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let map = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        let until = map.get(&bucket(peer))?.until?;
        (until > now).then(|| until - now)
    }

    /// Counts a wrong credential from `peer`: its failures so far, and the wait it
    /// earned with this one.
    fn fail(&self, peer: IpAddr, now: Instant) -> (u32, Option<Duration>) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        let key = bucket(peer);
        if !map.contains_key(&key) && map.len() >= MAX_TRACKED {
            make_room(&mut map, now);
        }
        let record = map.entry(key).or_insert(Record {
            failures: 0,
            until: None,
            last: now,
        });
        record.failures = record.failures.saturating_add(1);
        record.last = now;
        let delay = delay_after(record.failures);
        record.until = delay.map(|delay| now + delay);
        (record.failures, delay)
    }

    /// The right token: the address starts afresh.
    fn forgive(&self, peer: IpAddr) {
        let mut map = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&bucket(peer));
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.by_peer.lock().unwrap().len()
    }
}

/// The wait after `failures` wrong credentials: none for the first few, then
/// [`FIRST_DELAY`] doubling up to [`MAX_DELAY`].
fn delay_after(failures: u32) -> Option<Duration> {
    let beyond = failures.checked_sub(FREE_FAILURES)?;
    let delay = FIRST_DELAY.saturating_mul(1u32 << beyond.min(20));
    Some(delay.min(MAX_DELAY))
}

/// Drops records quiet for [`FORGET_AFTER`]; if none is, the least recent one.
fn make_room(map: &mut HashMap<IpAddr, Record>, now: Instant) {
    map.retain(|_, r| now.duration_since(r.last) < FORGET_AFTER);
    if map.len() >= MAX_TRACKED {
        let oldest = map.iter().min_by_key(|(_, r)| r.last).map(|(ip, _)| *ip);
        if let Some(ip) = oldest {
            map.remove(&ip);
        }
    }
}

/// The key an address is counted under: IPv4 as is, IPv6 by its /64.
fn bucket(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
    }
}

/// The client address the admin listener saw (none in tests that call the router
/// directly: they count as one unspecified address).
pub(super) fn peer_of(request: &Request) -> IpAddr {
    peer_in(request.extensions())
}

/// [`peer_of`] for an extractor, which sees the request's extensions only.
pub(super) fn peer_in(extensions: &axum::http::Extensions) -> IpAddr {
    let info = extensions.get::<ConnectInfo<SocketAddr>>();
    info.map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

/// Lets a request through only with the token, and a state-changing one only if
/// nothing says a browser sent it for another site; says nothing about why a token
/// was not accepted.
pub(super) async fn require_token(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = peer_of(&request);
    let now = Instant::now();
    if let Some(wait) = guard.failures.wait(peer, now) {
        return too_many(wait);
    }
    let credential = Credential::of(request.headers());
    if changes_state(request.method()) {
        if let Some(refusal) = cross_site(request.headers(), &credential) {
            tracing::warn!(%peer, method = %request.method(), "admin: cross-site request refused");
            return refusal.into_response();
        }
    }
    let presented = match &credential {
        Credential::Absent => return unauthorized(),
        Credential::Bearer(secret) | Credential::Basic(secret) => Some(secret.as_slice()),
        Credential::Unusable => None,
    };
    if guard.try_token(peer, presented) {
        return next.run(request).await;
    }
    unauthorized()
}

// What the dashboard's login (`login.rs`) shares with the API: one brake, one count
// of failures and one log line for every way of presenting the token.

/// Failed admin logins are logged at most once a minute, with the count held back:
/// a guesser must not be able to flood the log.
static WRONG_TOKEN_LOG: Every = Every::new(Duration::from_secs(60));

impl Guard {
    /// `429` while `peer` must still wait after its wrong tokens.
    pub(super) fn held_back(&self, peer: IpAddr) -> Option<Response> {
        self.failures.wait(peer, Instant::now()).map(too_many)
    }

    /// Whether `presented` (`None`: an unusable credential) is the token. The right
    /// token forgives `peer`; anything else counts as a guess and is logged (at most
    /// once a minute), never with what was presented.
    pub(super) fn try_token(&self, peer: IpAddr, presented: Option<&[u8]>) -> bool {
        if presented.is_some_and(|secret| self.token.matches(secret)) {
            self.failures.forgive(peer);
            return true;
        }
        let (failures, delay) = self.failures.fail(peer, Instant::now());
        let total = self.failures.total.load(Ordering::Relaxed);
        let Some(held_back) = WRONG_TOKEN_LOG.allow() else {
            return false;
        };
        let wait = delay.map_or_else(|| "none".into(), |d| format!("{}s", d.as_secs()));
        tracing::warn!(
            %peer, failures, total, %wait, held_back,
            "admin: wrong token (this line at most once a minute)"
        );
        false
    }

    /// The token a request's `Authorization` presents: `Ok(None)` for none at all,
    /// `Err(())` for an unusable one (which counts as a wrong token).
    pub(super) fn presented(headers: &HeaderMap) -> Result<Option<Vec<u8>>, ()> {
        match Credential::of(headers) {
            Credential::Absent => Ok(None),
            Credential::Bearer(secret) | Credential::Basic(secret) => Ok(Some(secret)),
            Credential::Unusable => Err(()),
        }
    }
}

pub(super) fn unauthorized() -> Response {
    let mut response = ApiError(StatusCode::UNAUTHORIZED, "unauthorized".into()).into_response();
    let challenge = HeaderValue::from_static(CHALLENGE);
    response.headers_mut().insert(WWW_AUTHENTICATE, challenge);
    response
}

/// `429` with the whole seconds left to wait (at least one).
fn too_many(wait: Duration) -> Response {
    let why = "too many failed attempts: try again later";
    let mut response = ApiError(StatusCode::TOO_MANY_REQUESTS, why.into()).into_response();
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            map.append(name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn verdict(pairs: &[(&str, &str)]) -> Option<StatusCode> {
        let map = headers(pairs);
        cross_site(&map, &Credential::of(&map)).map(|e| e.0)
    }

    const BEARER: (&str, &str) = ("authorization", "Bearer x");
    const BASIC: (&str, &str) = ("authorization", "Basic OnM="); // :s
    const HOST_LINE: (&str, &str) = ("host", "127.0.0.1:9090");

    #[test]
    fn a_script_with_a_bearer_token_passes() {
        assert_eq!(verdict(&[BEARER, HOST_LINE]), None);
        let json = ("content-type", "application/json");
        assert_eq!(verdict(&[BEARER, HOST_LINE, json]), None);
        let same = ("origin", "http://127.0.0.1:9090");
        let fetch = ("sec-fetch-site", "same-origin");
        assert_eq!(verdict(&[BEARER, HOST_LINE, same, fetch]), None);
    }

    #[test]
    fn what_a_page_on_another_site_can_make_a_browser_send_is_refused() {
        let forbidden = Some(StatusCode::FORBIDDEN);
        for site in ["cross-site", "same-site"] {
            let fetch = ("sec-fetch-site", site);
            assert_eq!(verdict(&[BEARER, HOST_LINE, fetch]), forbidden, "{site}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:9091",
            "127.0.0.1:9090",
        ] {
            let line = ("origin", origin);
            assert_eq!(verdict(&[BEARER, HOST_LINE, line]), forbidden, "{origin}");
        }
        let origin = ("origin", "http://127.0.0.1:9090");
        assert_eq!(verdict(&[BEARER, origin]), forbidden, "no Host to compare");
        for form in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "Text/Plain;charset=utf-8",
        ] {
            let line = ("content-type", form);
            let refused = Some(StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(verdict(&[BEARER, HOST_LINE, line]), refused, "{form}");
        }
        assert_eq!(verdict(&[BASIC, HOST_LINE]), forbidden, "basic alone");
        let scripted = ("x-requested-by", "ops-script");
        assert_eq!(verdict(&[BASIC, HOST_LINE, scripted]), None);
    }

    #[test]
    fn only_methods_that_can_change_something_are_held_to_the_rules() {
        assert!(changes_state(&Method::POST));
        assert!(changes_state(&Method::PUT));
        assert!(changes_state(&Method::DELETE));
        assert!(changes_state(&Method::PATCH));
        assert!(!changes_state(&Method::GET));
        assert!(!changes_state(&Method::HEAD));
    }

    #[test]
    fn the_wait_starts_after_the_free_failures_and_doubles_to_a_cap() {
        let waits: Vec<_> = (1..=8).map(delay_after).collect();
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            waits,
            [None, None, None, None, secs(1), secs(2), secs(4), secs(8)]
        );
        assert_eq!(delay_after(40), Some(MAX_DELAY));
        assert_eq!(delay_after(u32::MAX), Some(MAX_DELAY));
    }

    #[test]
    fn failures_are_counted_per_address_and_forgiven_by_the_right_token() {
        let failures = Failures::default();
        let now = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for n in 1..FREE_FAILURES {
            assert_eq!(failures.fail(a, now), (n, None));
        }
        assert_eq!(failures.wait(a, now), None);
        assert_eq!(failures.fail(a, now), (FREE_FAILURES, Some(FIRST_DELAY)));
        assert_eq!(failures.wait(a, now), Some(FIRST_DELAY));
        assert_eq!(failures.wait(a, now + FIRST_DELAY), None, "the wait ends");
        assert_eq!(failures.wait(b, now), None, "another address is not held");
        failures.forgive(a);
        assert_eq!(failures.fail(a, now), (1, None));
        assert_eq!(failures.total.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_memory_stays_bounded() {
        let failures = Failures::default();
        let now = Instant::now();
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        failures.fail(one, now);
        assert_eq!(failures.fail(other, now).0, 2);
        for i in 0..(MAX_TRACKED as u32 + 100) {
            failures.fail(IpAddr::V4(std::net::Ipv4Addr::from(i)), now);
        }
        assert_eq!(failures.tracked(), MAX_TRACKED);
    }

    #[test]
    fn credentials_are_read_as_bearer_basic_or_unusable() {
        let of = |v: &str| Credential::of(&headers(&[("authorization", v)]));
        assert_eq!(of("Bearer abc"), Credential::Bearer(b"abc".to_vec()));
        assert_eq!(of("basic b3BzOmFiYw=="), Credential::Basic(b"abc".to_vec()));
        assert_eq!(of("Basic !!"), Credential::Unusable);
        assert_eq!(of("Token abc"), Credential::Unusable);
        assert_eq!(Credential::of(&HeaderMap::new()), Credential::Absent);
    }
}
