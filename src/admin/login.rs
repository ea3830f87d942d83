//! Who may see and use the dashboard: a login form that trades the admin token for
//! a cookie, HTTP Basic or a bearer token as the API takes them, and the CSRF token
//! every dashboard form carries.
//!
//! Why a cookie derived from the token, never the token: the cookie is
//! `expiry.nonce.HMAC(key, expiry, nonce)`, the key itself an HMAC of the token
//! under a random per-process secret. A stolen cookie gives a few hours of dashboard,
//! not the token, and a restart (or a new token) ends every login. It is checked in
//! constant time. `HttpOnly` keeps it from scripts, `SameSite=Strict` keeps other
//! sites' links and forms from carrying it, and logging out revokes it here too.
//!
//! Why a CSRF token on top of `SameSite=Strict`: "site" is not "origin". Every other
//! port and subdomain of the admin host's site is same-site, so a page on the Moodle
//! site itself, another service on the admin host, or an old browser that ignores
//! `SameSite` could still post a form that arrives with the cookie. So each form
//! carries an HMAC of the login's nonce that only a page read from this listener
//! contains, and the `Sec-Fetch-Site`/`Origin` checks of `guard` apply as for the API.
//!
//! Why one brake: a wrong token in the login form counts against the address in
//! `guard` like a wrong bearer token, and is logged the same way.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::FormRejection;
use axum::extract::{FromRequestParts, State};
use axum::http::header::{COOKIE, LOCATION, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::dashboard::Dash;
use super::guard::{self, Guard};
use super::html::{self, html, markup};
use crate::logs::Every;

/// The login cookie's name. Browsers do not keep cookies apart by port, so when
/// the dashboard shares a host name with the Moodle site this cookie rides along
/// with students' requests too: the gateway withholds it from every node.
pub const COOKIE_NAME: &str = "moodle-gateway-admin";
/// How long a login lasts: a working day.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Logged-out logins remembered at most (each until it would have expired).
const MAX_REVOKED: usize = 1024;

type HmacSha256 = Hmac<Sha256>;

/// Refused dashboard forms are logged at most once a minute: a page elsewhere that
/// posts in a loop must not flood the log.
static REFUSED_LOG: Every = Every::new(Duration::from_secs(60));

/// The keys behind login cookies, CSRF tokens and flash messages.
pub(super) struct Keys {
    key: [u8; 32],
    /// Logged-out logins that have not expired yet: (nonce, expiry).
    revoked: Mutex<Vec<([u8; 16], u64)>>,
}

/// How a dashboard request was let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Login {
    /// The login form's cookie.
    Cookie { nonce: [u8; 16], expiry: u64 },
    /// The token itself, as Basic password or bearer token: nothing to log out of.
    Header,
}

impl Keys {
    /// Keys for `token`, under a secret no other process shares.
    pub(super) fn new(token: &str) -> Self {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("the OS random source is available");
        let mut mac = HmacSha256::new_from_slice(&secret).expect("any key length");
        mac.update(token.as_bytes());
        Self {
            key: mac.finalize().into_bytes().into(),
            revoked: Mutex::new(Vec::new()),
        }
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("any key length");
        mac.update(label);
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// A fresh login cookie's value, valid for [`LIFETIME`] from `now` (Unix seconds).
    pub(super) fn issue(&self, now: u64) -> String {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).expect("the OS random source is available");
        let expiry = now + LIFETIME.as_secs();
        let tag = self.mac(b"login", &[&expiry.to_be_bytes(), &nonce]);
        let tag = tag.finalize().into_bytes();
        format!("{expiry:x}.{}.{}", hex(&nonce), hex(&tag))
    }

    /// The login a cookie value stands for, if it is ours, unexpired and not logged out.
    pub(super) fn verify(&self, value: &str, now: u64) -> Option<Login> {
        let mut parts = value.split('.');
        let expiry = u64::from_str_radix(parts.next()?, 16).ok()?;
        let nonce: [u8; 16] = unhex(parts.next()?)?.try_into().ok()?;
        let tag = unhex(parts.next()?)?;
        let mac = self.mac(b"login", &[&expiry.to_be_bytes(), &nonce]);
        // `verify_slice` compares in constant time.
        let genuine = parts.next().is_none() && mac.verify_slice(&tag).is_ok();
        let revoked = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        let revoked = revoked.iter().any(|(n, _)| *n == nonce);
        (genuine && expiry > now && !revoked).then_some(Login::Cookie { nonce, expiry })
    }

    /// Ends a cookie login before its expiry.
    pub(super) fn revoke(&self, login: Login, now: u64) {
        let Login::Cookie { nonce, expiry } = login else {
            return;
        };
        let mut revoked = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        revoked.retain(|(_, until)| *until > now);
        if revoked.len() >= MAX_REVOKED {
            revoked.remove(0);
        }
        revoked.push((nonce, expiry));
    }

    /// The CSRF token of `login`'s forms.
    pub(super) fn csrf(&self, login: Login) -> String {
        hex(&self.csrf_mac(login).finalize().into_bytes())
    }

    /// Whether `presented` is `login`'s CSRF token (compared in constant time).
    pub(super) fn csrf_ok(&self, login: Login, presented: &str) -> bool {
        let tag = unhex(presented).unwrap_or_default();
        self.csrf_mac(login).verify_slice(&tag).is_ok()
    }

    fn csrf_mac(&self, login: Login) -> HmacSha256 {
        match login {
            Login::Cookie { nonce, .. } => self.mac(b"csrf", &[&nonce]),
            // Basic or bearer: no login to tie it to, so one per process; still
            // found only in a page read from this listener.
            Login::Header => self.mac(b"csrf-header", &[]),
        }
    }

    /// `text` with a tag, so a flash message is shown only if this process set it.
    pub(super) fn seal(&self, text: &str) -> String {
        let tag = self
            .mac(b"flash", &[text.as_bytes()])
            .finalize()
            .into_bytes();
        let encoded =
            percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC);
        format!("{}.{encoded}", hex(&tag))
    }

    /// The text of a sealed value, if its tag is ours.
    pub(super) fn unseal(&self, sealed: &str) -> Option<String> {
        let (tag, encoded) = sealed.split_once('.')?;
        let text = percent_encoding::percent_decode_str(encoded)
            .decode_utf8()
            .ok()?;
        let mac = self.mac(b"flash", &[text.as_bytes()]);
        mac.verify_slice(&unhex(tag)?)
            .is_ok()
            .then(|| text.into_owned())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let valid = text.len().is_multiple_of(2) && text.bytes().all(|b| b.is_ascii_hexdigit());
    let bytes = text.as_bytes().chunks(2);
    let bytes = bytes.map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok());
    valid.then(|| bytes.collect::<Option<Vec<u8>>>()).flatten()
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The value of cookie `name` in any of the request's `Cookie` headers.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let lines = headers.get_all(COOKIE).into_iter();
    let pairs = lines
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'));
    pairs
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(n, value)| (n == name).then_some(value))
}

/// A cookie only this listener's pages see, and no script; `None` clears it.
pub(super) fn set_cookie(name: &str, value: Option<&str>, lifetime: Duration) -> HeaderValue {
    let (value, max_age) = value.map_or(("", 0), |v| (v, lifetime.as_secs()));
    let line = format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}");
    HeaderValue::from_str(&line).expect("cookie values are ASCII")
}

/// `303 See Other` to `to`, the answer to every dashboard form (Post/Redirect/Get).
pub(super) fn see_other(to: &str) -> Response {
    let location = HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/"));
    (StatusCode::SEE_OTHER, [(LOCATION, location)]).into_response()
}

/// A dashboard request's viewer: how they got in, and their forms' CSRF token.
pub(super) struct Viewer {
    pub(super) login: Login,
    pub(super) csrf: String,
}

impl FromRequestParts<Dash> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, dash: &Dash) -> Result<Self, Response> {
        let login = admit(parts, dash)?;
        let csrf = dash.keys.csrf(login);
        Ok(Viewer { login, csrf })
    }
}

/// The cookie, else the token in `Authorization`; without either, a page view goes
/// to the login form. A wrong token counts as a guess; a stale cookie does not (a
/// restart makes every cookie stale).
// The refusal is the answer itself, as an axum extractor's rejection is.
#[allow(clippy::result_large_err)]
fn admit(parts: &Parts, dash: &Dash) -> Result<Login, Response> {
    let peer = guard::peer_in(&parts.extensions);
    if let Some(wait) = dash.guard.held_back(peer) {
        return Err(wait);
    }
    if parts.method != Method::GET && parts.method != Method::HEAD {
        if let Some(refusal) = guard::from_elsewhere(&parts.headers) {
            if let Some(held_back) = REFUSED_LOG.allow() {
                tracing::warn!(%peer, held_back, "admin dashboard: cross-site form refused");
            }
            return Err(refusal.into_response());
        }
    }
    let from_cookie = cookie(&parts.headers, COOKIE_NAME);
    if let Some(login) = from_cookie.and_then(|v| dash.keys.verify(v, unix_now())) {
        return Ok(login);
    }
    match Guard::presented(&parts.headers) {
        Ok(None) if parts.method == Method::GET => Err(see_other("/login")),
        Ok(None) => Err(message(
            StatusCode::FORBIDDEN,
            "Your login has ended: log in again.",
        )),
        Ok(Some(secret)) if dash.guard.try_token(peer, Some(secret.as_slice())) => {
            Ok(Login::Header)
        }
        Ok(Some(_)) => Err(guard::unauthorized()),
        Err(()) => {
            dash.guard.try_token(peer, None);
            Err(guard::unauthorized())
        }
    }
}

/// A one-line page: a refusal or a stale form, with the way back.
pub(super) fn message(status: StatusCode, text: &str) -> Response {
    let body = markup!(
        "<main class=\"login\"><h1>moodle-gateway</h1><p class=\"flash\">",
        text,
        "</p><p><a href=\"/\">Back to the dashboard</a></p></main>"
    );
    html::page(status, html::document("moodle-gateway", &body, false))
}

fn login_page(status: StatusCode, note: Option<&str>) -> Response {
    let mut body = markup!(
        "<main class=\"login\"><h1>moodle-gateway</h1>\
         <p>Admin dashboard. Log in with the admin token (<code>[admin] token</code> or \
         <code>token_file</code>; the demo prints one).</p>"
    );
    if let Some(note) = note {
        html!(body, "<p class=\"flash\">", note, "</p>");
    }
    html!(
        body,
        "<form method=\"post\" action=\"/login\">\
         <input type=\"hidden\" name=\"username\" value=\"admin\" autocomplete=\"username\">\
         <label for=\"token\">Admin token</label>\
         <input id=\"token\" type=\"password\" name=\"token\" autocomplete=\"current-password\" \
         required autofocus><button type=\"submit\">Log in</button></form>\
         <p class=\"why\">Scripts use the same token as a bearer token; HTTP Basic (any \
         user name, the token as password) opens this page too.</p></main>"
    );
    html::page(
        status,
        html::document("Log in: moodle-gateway", &body, false),
    )
}

/// `GET /login`: the form, or the dashboard for someone already logged in.
pub(super) async fn form(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let from_cookie = cookie(&headers, COOKIE_NAME);
    match from_cookie.and_then(|v| dash.keys.verify(v, unix_now())) {
        Some(_) => see_other("/"),
        None => login_page(StatusCode::OK, None),
    }
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// `POST /login`: the right token sets the cookie and opens the dashboard.
pub(super) async fn submit(
    State(dash): State<Dash>,
    parts: Parts,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let peer = guard::peer_in(&parts.extensions);
    if let Some(mut wait) = dash.guard.held_back(peer) {
        let retry = wait.headers_mut().remove(RETRY_AFTER);
        let note = "Too many wrong tokens from your address: wait a little and try again.";
        let mut page = login_page(StatusCode::TOO_MANY_REQUESTS, Some(note));
        if let Some(retry) = retry {
            page.headers_mut().insert(RETRY_AFTER, retry);
        }
        return page;
    }
    if let Some(refusal) = guard::from_elsewhere(&parts.headers) {
        return message(refusal.0, &refusal.1);
    }
    let token = form.map(|Form(f)| f.token).unwrap_or_default();
    if token.is_empty() {
        return login_page(StatusCode::BAD_REQUEST, Some("Enter the admin token."));
    }
    if !dash.guard.try_token(peer, Some(token.as_bytes())) {
        let note = "That is not the admin token.";
        return login_page(StatusCode::UNAUTHORIZED, Some(note));
    }
    let value = dash.keys.issue(unix_now());
    let mut response = see_other("/");
    let set = set_cookie(COOKIE_NAME, Some(&value), LIFETIME);
    response.headers_mut().insert(SET_COOKIE, set);
    response
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

/// `POST /logout`: ends the cookie's login here and in the browser.
pub(super) async fn logout(
    State(dash): State<Dash>,
    viewer: Viewer,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if !form.is_ok_and(|Form(f)| dash.keys.csrf_ok(viewer.login, &f.csrf)) {
        return stale_form();
    }
    dash.keys.revoke(viewer.login, unix_now());
    let mut response = see_other("/login");
    let clear = set_cookie(COOKIE_NAME, None, LIFETIME);
    response.headers_mut().insert(SET_COOKIE, clear);
    response
}

/// A form without this login's CSRF token: forged, or from before a restart.
pub(super) fn stale_form() -> Response {
    if let Some(held_back) = REFUSED_LOG.allow() {
        tracing::warn!(
            held_back,
            "admin dashboard: a form without a valid CSRF token refused"
        );
    }
    let text = "This form was not sent by this dashboard page (or the page is older than \
                your login): reload the dashboard and try again.";
    message(StatusCode::FORBIDDEN, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_valid_until_its_expiry_or_logout_and_cannot_be_forged() {
        let keys = Keys::new("the-token");
        let now = 1_700_000_000;
        let value = keys.issue(now);
        assert!(!value.contains("the-token"));
        let login = keys.verify(&value, now + 60).unwrap();
        assert_eq!(
            keys.verify(&value, now + LIFETIME.as_secs()),
            None,
            "expired"
        );
        let (expiry, rest) = value.split_once('.').unwrap();
        let later = u64::from_str_radix(expiry, 16).unwrap() + 3600;
        assert_eq!(
            keys.verify(&format!("{later:x}.{rest}"), now),
            None,
            "stretched"
        );
        assert_eq!(
            Keys::new("the-token").verify(&value, now),
            None,
            "other process"
        );
        keys.revoke(login, now);
        assert_eq!(keys.verify(&value, now + 60), None, "logged out");
    }

    #[test]
    fn csrf_tokens_belong_to_one_login() {
        let keys = Keys::new("the-token");
        let now = 1_700_000_000;
        let one = keys.verify(&keys.issue(now), now).unwrap();
        let two = keys.verify(&keys.issue(now), now).unwrap();
        assert!(keys.csrf_ok(one, &keys.csrf(one)));
        assert!(!keys.csrf_ok(two, &keys.csrf(one)));
        assert!(!keys.csrf_ok(Login::Header, &keys.csrf(one)));
        assert!(!keys.csrf_ok(one, ""));
        assert!(keys.csrf_ok(Login::Header, &keys.csrf(Login::Header)));
    }

    #[test]
    fn flash_messages_are_shown_only_when_this_process_sealed_them() {
        let keys = Keys::new("the-token");
        let sealed = keys.seal("web2 is now draining; <b>ok</b>");
        assert_eq!(
            keys.unseal(&sealed).unwrap(),
            "web2 is now draining; <b>ok</b>"
        );
        let forged = format!("{}x", &sealed[..sealed.len() - 1]);
        assert_eq!(keys.unseal(&forged), None);
        assert_eq!(Keys::new("the-token").unseal(&sealed), None);
    }

    #[test]
    fn cookies_are_read_from_every_cookie_line() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("a=1; MoodleSession=x"));
        headers.append(COOKIE, HeaderValue::from_static("moodle-gateway-admin=v"));
        assert_eq!(cookie(&headers, COOKIE_NAME), Some("v"));
        assert_eq!(cookie(&headers, "a"), Some("1"));
        assert_eq!(cookie(&headers, "b"), None);
        let line = set_cookie("n", Some("v"), LIFETIME);
        assert_eq!(
            line,
            "n=v; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"
        );
    }
}
