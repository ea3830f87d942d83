//! The signed route cookie: the browser carries which node its session lives on, so a gateway
//! that does not know the session (restarted between snapshots, or a standby that took over)
//! can still send it home instead of dealing it to a node where it does not exist.
//!
//! Why signed, and why bound to the session id: the cookie steers a request, and a wrong node
//! means a node-local session is not found, so the student is logged out. The tag is an HMAC,
//! under a secret all gateways of a deployment share, over the node *and* the session id: a
//! forged cookie, one copied from another student, or one left over from an earlier session
//! never verifies, and the request is treated as a new visitor's. The node name itself is not
//! secret (it is plain text in the cookie); only its binding to the session is authenticated.
//!
//! Why this shape: [`RouteCookie::node`] runs on every request whose session the table does not
//! know, which after a restart is every request. So it reads the `Cookie` headers as bytes
//! without allocating, rejects a malformed value before any hashing, and starts each HMAC from
//! a clone of a state that is already keyed and has absorbed the domain prefix. The cookie has
//! its own name and never touches Moodle's session cookie: PHP never sees a value it could
//! misread, and the gateway never has to rewrite a node's `Set-Cookie`.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use http::header::COOKIE;
use http::{HeaderMap, HeaderValue};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::config::MIN_ROUTE_SECRET;

/// Absorbed first, so a tag can never be mistaken for any other HMAC made with the same secret
/// (bump the version if the message layout ever changes).
const DOMAIN: &[u8] = b"moodle-gateway route v1\0";
/// Between node and session id; a NUL cannot occur in a node name, so the message
/// `node SEP session` reads only one way.
const SEPARATOR: &[u8] = b"\0";
/// 128 bits: forging one needs about 2^128 guesses, each a full request.
const TAG_BYTES: usize = 16;
/// `TAG_BYTES` in base64url without padding.
const TAG_CHARS: usize = 22;
/// Longest node name the gateway issues a cookie for.
const MAX_NODE: usize = 64;
/// Longest value worth looking at: anything longer is rejected before it is scanned.
const MAX_VALUE: usize = MAX_NODE + 1 + TAG_CHARS;
/// The attributes every line shares, after `; Path=<path>`.
const FLAGS: &str = "; HttpOnly; SameSite=Lax";
const SECURE: &str = "; Secure";
/// Deletes the cookie: `Max-Age=0` for current browsers, a past `Expires` for old ones.
const EXPIRED: &str = "; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:00 GMT";

/// Issues and verifies the route cookie. Cheap to share: `&self` everywhere, no interior state.
#[derive(Clone)]
pub struct RouteCookie {
    name: String,
    /// `; Path=<path>; HttpOnly; SameSite=Lax`, the same on every line this module writes.
    attributes: String,
    /// Keyed with the secret and fed [`DOMAIN`]; cloned per tag, never re-keyed.
    mac: Hmac<Sha256>,
    /// The deleting lines without and with `Secure`, built once: logout needs no formatting.
    cleared: [HeaderValue; 2],
}

impl RouteCookie {
    /// `secret` is at least 32 bytes (config guarantees it); `path` is Moodle's session cookie
    /// path (e.g. "/" or "/moodle/"), so the route cookie travels with every request that
    /// carries the session cookie.
    ///
    /// # Panics
    /// On a name that is not a cookie token, a path that is not a plain absolute URL path, or a
    /// short secret: the config rejects all three, so this is a bug caught at startup.
    pub fn new(name: &str, secret: &[u8], path: &str) -> Self {
        assert!(is_cookie_name(name), "{name:?} is not a cookie name");
        assert!(is_plain_path(path), "{path:?} is not a cookie path");
        assert!(
            secret.len() >= MIN_ROUTE_SECRET,
            "route cookie secret too short"
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
        mac.update(DOMAIN);
        let attributes = format!("; Path={path}{FLAGS}");
        let deleting = |secure: &str| {
            let line = format!("{name}={attributes}{EXPIRED}{secure}");
            HeaderValue::try_from(line).expect("name and path were checked above")
        };
        RouteCookie {
            name: name.to_owned(),
            cleared: [deleting(""), deleting(SECURE)],
            attributes,
            mac,
        }
    }

    /// The cookie's name: the gateway's own, never Moodle's session cookie (the caller
    /// guarantees that, so setting it can never log a student out).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Set-Cookie line binding `session_id` to `node`:
    /// `NAME=<node>.<tag>; Path=<path>; HttpOnly; SameSite=Lax` plus `; Secure` when `secure`.
    ///
    /// No `Max-Age`: like Moodle's own session cookie it ends with the browser session, and a
    /// rotated session id needs a new route cookie anyway. `node` is a configured node name
    /// (`[A-Za-z0-9._-]`, at most 64 characters). One allocation: the line, sized exactly, so
    /// the header value takes it over without copying.
    pub fn issue(&self, node: &str, session_id: &str, secure: bool) -> HeaderValue {
        debug_assert!(is_node_name(node.as_bytes()), "{node:?} is not a node name");
        let secure = if secure { SECURE } else { "" };
        let value = node.len() + 1 + TAG_CHARS;
        let len = self.name.len() + 1 + value + self.attributes.len() + secure.len();
        let mut line = Vec::with_capacity(len);
        line.extend_from_slice(self.name.as_bytes());
        line.push(b'=');
        line.extend_from_slice(node.as_bytes());
        line.push(b'.');
        line.extend_from_slice(&self.tag(node.as_bytes(), session_id));
        line.extend_from_slice(self.attributes.as_bytes());
        line.extend_from_slice(secure.as_bytes());
        HeaderValue::try_from(line).expect("every part is a visible ASCII token")
    }

    /// A Set-Cookie line that deletes the cookie (same Path; Max-Age=0 and an Expires in the
    /// past), for logout: the next session starts without a stale route.
    pub fn clear(&self, secure: bool) -> HeaderValue {
        self.cleared[usize::from(secure)].clone()
    }

    /// The node named by this request's route cookie, if its tag is valid for `session_id`;
    /// borrowed from the headers. Reads every Cookie header line; the first cookie of our name
    /// decides (like PHP does for its own), so an invalid first one is not skipped over.
    ///
    /// No heap allocation: the headers are scanned as bytes (stray non-UTF-8 bytes anywhere
    /// neither panic nor hide the cookie), the HMAC state is cloned on the stack, and the tags
    /// are compared in base64 form in constant time, which also refuses the non-canonical
    /// spellings of a valid tag.
    pub fn node<'h>(&self, headers: &'h HeaderMap, session_id: &str) -> Option<&'h str> {
        let value = headers
            .get_all(COOKIE)
            .iter()
            .flat_map(|line| line.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| {
                let (name, value) = split_pair(pair.trim_ascii());
                (name == self.name.as_bytes()).then_some(value)
            })?;
        let (node, tag) = split_value(value)?;
        if !bool::from(self.tag(node, session_id).ct_eq(tag)) {
            return None;
        }
        // Only node-name characters are left, so this is always UTF-8.
        std::str::from_utf8(node).ok()
    }

    /// The tag of `node` for `session_id`, base64url encoded.
    fn tag(&self, node: &[u8], session_id: &str) -> [u8; TAG_CHARS] {
        let mut mac = self.mac.clone();
        mac.update(node);
        mac.update(SEPARATOR);
        mac.update(session_id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut tag = [0; TAG_CHARS];
        URL_SAFE_NO_PAD
            .encode_slice(&digest[..TAG_BYTES], &mut tag)
            .expect("16 bytes are exactly 22 base64 characters");
        tag
    }
}

/// Never shows the HMAC state: it is derived from the secret.
impl fmt::Debug for RouteCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteCookie")
            .field("name", &self.name)
            .field("attributes", &self.attributes)
            .finish_non_exhaustive()
    }
}

/// Splits `name=value`; a bare `name` has an empty value.
fn split_pair(pair: &[u8]) -> (&[u8], &[u8]) {
    match pair.iter().position(|&b| b == b'=') {
        Some(i) => (&pair[..i], &pair[i + 1..]),
        None => (pair, b""),
    }
}

/// `<node>.<tag>` split at the last dot (node names may contain dots), if both parts are
/// well formed: the cheap checks that keep garbage away from the HMAC.
fn split_value(value: &[u8]) -> Option<(&[u8], &[u8])> {
    if value.len() > MAX_VALUE {
        return None;
    }
    let dot = value.iter().rposition(|&b| b == b'.')?;
    let (node, tag) = (&value[..dot], &value[dot + 1..]);
    let tag_ok = tag.len() == TAG_CHARS && tag.iter().all(|&b| is_base64url(b));
    (is_node_name(node) && tag_ok).then_some((node, tag))
}

fn is_node_name(node: &[u8]) -> bool {
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    !node.is_empty() && node.len() <= MAX_NODE && node.iter().all(allowed)
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// An RFC 6265 cookie-name token, as the config accepts it.
fn is_cookie_name(name: &str) -> bool {
    let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
    !name.is_empty() && name.bytes().all(token)
}

/// Absolute, visible ASCII, and no `;` that would end the attribute.
fn is_plain_path(path: &str) -> bool {
    path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic() && b != b';')
}

#[cfg(test)]
mod tests {
    use base64::alphabet::URL_SAFE;
    use base64::engine::general_purpose::NO_PAD;
    use base64::engine::GeneralPurpose;
    use cookie::time::{Duration, OffsetDateTime};
    use cookie::{Cookie, SameSite};

    use super::*;
    use crate::moodle::Site;

    const SECRET: &[u8] = b"route-secret-shared-by-every-gateway";
    const SESSION: &str = "q1w2e3r4t5y6u7i8o9p0a1s2d3";

    fn route() -> RouteCookie {
        RouteCookie::new("MoodleGatewayRoute", SECRET, "/")
    }

    /// A request carrying these `Cookie` header lines, as raw bytes.
    fn request(lines: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(COOKIE, HeaderValue::from_bytes(line).unwrap());
        }
        headers
    }

    /// The `NAME=value` a browser sends back for an issued line.
    fn sent_back(line: &HeaderValue) -> Vec<u8> {
        let line = line.as_bytes();
        line[..line.iter().position(|&b| b == b';').unwrap()].to_vec()
    }

    fn value(node: &str, tag: &[u8]) -> Vec<u8> {
        [b"MoodleGatewayRoute=", node.as_bytes(), b".", tag].concat()
    }

    fn tag_of(node: &str, session: &str) -> [u8; TAG_CHARS] {
        route().tag(node.as_bytes(), session)
    }

    #[test]
    fn an_issued_cookie_leads_its_session_back_to_its_node() {
        let route = route();
        let line = route.issue("php2", SESSION, false);
        let headers = request(&[&sent_back(&line)]);
        assert_eq!(route.node(&headers, SESSION), Some("php2"));
    }

    #[test]
    fn a_node_name_with_dots_splits_at_the_last_dot() {
        let route = route();
        let line = route.issue("php-2.lab.example", SESSION, false);
        let headers = request(&[&sent_back(&line)]);
        assert_eq!(route.node(&headers, SESSION), Some("php-2.lab.example"));
    }

    #[test]
    fn the_tag_is_a_pinned_wire_format() {
        // Gateways of different versions share one secret: this must never change silently.
        // Cross-checked with Python: urlsafe_b64encode(hmac.new(b"\x07" * 32,
        // b"moodle-gateway route v1\0php1\0abc", sha256).digest()[:16]) without padding.
        let line = RouteCookie::new("R", &[7; 32], "/").issue("php1", "abc", false);
        assert_eq!(
            line,
            "R=php1.Qgja-f20shsjIj9_3_hZjg; Path=/; HttpOnly; SameSite=Lax"
        );
    }

    #[test]
    fn a_cookie_from_another_session_never_steers() {
        // Copied from another student, or left over from before a login rotated the id.
        let route = route();
        let headers = request(&[&sent_back(&route.issue("php2", SESSION, false))]);
        assert_eq!(route.node(&headers, "a-different-session-id-000"), None);
        assert_eq!(route.node(&headers, &SESSION[1..]), None);
    }

    #[test]
    fn a_tag_moved_to_another_node_name_is_ignored() {
        let tag = tag_of("php2", SESSION);
        for node in ["php1", "php2.", "php", "php22", "Php2"] {
            let headers = request(&[&value(node, &tag)]);
            assert_eq!(route().node(&headers, SESSION), None, "{node}");
        }
    }

    #[test]
    fn every_tag_character_counts_even_the_spare_bits_of_the_last() {
        let tag = tag_of("php2", SESSION);
        for i in 0..TAG_CHARS {
            let mut flipped = tag;
            flipped[i] = if tag[i] == b'A' { b'B' } else { b'A' };
            let headers = request(&[&value("php2", &flipped)]);
            assert_eq!(route().node(&headers, SESSION), None, "character {i}");
        }
        // The last character carries 2 bits and 4 zero bits; setting one of those spells the
        // same 16 bytes non-canonically, and that spelling is refused too.
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut spare = tag;
        let last = ALPHABET
            .iter()
            .position(|&c| c == tag[TAG_CHARS - 1])
            .unwrap();
        spare[TAG_CHARS - 1] = ALPHABET[last + 1];
        let lax = GeneralPurpose::new(&URL_SAFE, NO_PAD.with_decode_allow_trailing_bits(true));
        assert_eq!(lax.decode(spare).unwrap(), lax.decode(tag).unwrap());
        let headers = request(&[&value("php2", &spare)]);
        assert_eq!(route().node(&headers, SESSION), None);
    }

    #[test]
    fn a_cookie_signed_with_another_secret_is_ignored() {
        let foreign = RouteCookie::new("MoodleGatewayRoute", &[1; 32], "/");
        let headers = request(&[&sent_back(&foreign.issue("php2", SESSION, false))]);
        assert_eq!(route().node(&headers, SESSION), None);
    }

    #[test]
    fn malformed_values_are_ignored_without_panicking() {
        let tag = tag_of("php2", SESSION);
        let tag = std::str::from_utf8(&tag).unwrap();
        let long_node = "n".repeat(MAX_NODE + 1);
        let long_tag = tag_of(&long_node, SESSION);
        let huge = format!("MoodleGatewayRoute={}.{tag}", "x".repeat(100_000));
        let cases: Vec<Vec<u8>> = vec![
            b"MoodleGatewayRoute".to_vec(),
            b"MoodleGatewayRoute=".to_vec(),
            format!("MoodleGatewayRoute={tag}").into_bytes(), // no dot
            format!("MoodleGatewayRoute=php2{tag}").into_bytes(),
            format!("MoodleGatewayRoute=.{tag}").into_bytes(), // empty node
            format!("MoodleGatewayRoute=php/2.{tag}").into_bytes(),
            format!("MoodleGatewayRoute=php 2.{tag}").into_bytes(),
            format!("MoodleGatewayRoute=\"php2.{tag}\"").into_bytes(),
            format!("MoodleGatewayRoute=php2.{}", &tag[..21]).into_bytes(),
            format!("MoodleGatewayRoute=php2.{tag}A").into_bytes(),
            format!("MoodleGatewayRoute=php2.{tag}=").into_bytes(),
            format!("MoodleGatewayRoute=php2.{}+", &tag[..21]).into_bytes(),
            format!("MoodleGatewayRoute=php2.{}/", &tag[..21]).into_bytes(),
            format!("MoodleGatewayRoute=php2.{tag}.").into_bytes(),
            [b"MoodleGatewayRoute=ph\xffp2.", tag.as_bytes()].concat(),
            [b"MoodleGatewayRoute=php2.", &tag.as_bytes()[..21], b"\xff"].concat(),
            value(&long_node, &long_tag), // above the length bound, even with its own tag
            huge.into_bytes(),
        ];
        for case in cases {
            let headers = request(&[&case]);
            assert_eq!(
                route().node(&headers, SESSION),
                None,
                "{:?}",
                case.escape_ascii()
            );
        }
    }

    #[test]
    fn the_cookie_is_found_among_several_lines_and_cookies() {
        let ours = sent_back(&route().issue("php3", SESSION, false));
        let headers = request(&[
            b"MOODLEID1_=%25F1; _ga=GA1.2.3",
            b"x=\xff\xfe; lang=en",
            &[
                b"MoodleSession=",
                SESSION.as_bytes(),
                b";  ",
                &ours,
                b"; theme=boost",
            ]
            .concat(),
        ]);
        assert_eq!(route().node(&headers, SESSION), Some("php3"));
    }

    #[test]
    fn the_first_cookie_of_our_name_decides() {
        let good = sent_back(&route().issue("php1", SESSION, false));
        let other = sent_back(&route().issue("php2", "another-session", false));
        let both = |a: &[u8], b: &[u8]| request(&[&[a, b"; ", b].concat()]);
        assert_eq!(route().node(&both(&good, &other), SESSION), Some("php1"));
        assert_eq!(route().node(&both(&other, &good), SESSION), None);
        assert_eq!(
            route().node(&request(&[&good, &other]), SESSION),
            Some("php1")
        );
        assert_eq!(
            route().node(&request(&[b"x=1", &other, &good]), SESSION),
            None
        );
    }

    #[test]
    fn names_must_match_exactly() {
        let tag = tag_of("php2", SESSION);
        let renamed = [b"moodlegatewayroute=php2.", &tag[..]].concat();
        let prefixed = [b"XMoodleGatewayRoute=php2.", &tag[..]].concat();
        assert_eq!(
            route().node(&request(&[&renamed, &prefixed]), SESSION),
            None
        );
    }

    #[test]
    fn issue_writes_exactly_the_documented_attributes() {
        let route = RouteCookie::new("MoodleGatewayRoute", SECRET, "/moodle/");
        for secure in [false, true] {
            let line = route.issue("php.1", SESSION, secure);
            let text = line.to_str().unwrap();
            let tag = tag_of("php.1", SESSION);
            let tag = std::str::from_utf8(&tag).unwrap();
            let expected = format!(
                "MoodleGatewayRoute=php.1.{tag}; Path=/moodle/; HttpOnly; SameSite=Lax{}",
                if secure { "; Secure" } else { "" }
            );
            assert_eq!(text, expected);
            let cookie = Cookie::parse(text).unwrap();
            assert_eq!(cookie.name(), "MoodleGatewayRoute");
            assert_eq!(cookie.value(), format!("php.1.{tag}"));
            assert_eq!(cookie.path(), Some("/moodle/"));
            assert_eq!(cookie.http_only(), Some(true));
            assert_eq!(cookie.same_site(), Some(SameSite::Lax));
            assert_eq!(cookie.secure(), secure.then_some(true));
            assert_eq!((cookie.domain(), cookie.max_age()), (None, None));
            assert_eq!(cookie.expires(), None);
        }
    }

    #[test]
    fn clear_deletes_the_cookie_on_the_same_path() {
        let route = RouteCookie::new("MoodleGatewayRoute", SECRET, "/moodle/");
        for secure in [false, true] {
            let line = route.clear(secure);
            let cookie = Cookie::parse(line.to_str().unwrap()).unwrap();
            assert_eq!((cookie.name(), cookie.value()), ("MoodleGatewayRoute", ""));
            assert_eq!(cookie.path(), Some("/moodle/"));
            assert_eq!(cookie.max_age(), Some(Duration::ZERO));
            assert!(cookie.expires_datetime().unwrap() < OffsetDateTime::now_utc());
            assert_eq!(cookie.http_only(), Some(true));
            assert_eq!(cookie.same_site(), Some(SameSite::Lax));
            assert_eq!(cookie.secure(), secure.then_some(true));
        }
    }

    #[test]
    fn the_route_cookie_and_the_session_cookie_never_read_each_other() {
        let route = route();
        let site = Site::new("", "MoodleSession", "/");
        let line = route.issue("php2", SESSION, false);
        assert_eq!(
            Cookie::parse(line.to_str().unwrap()).unwrap().name(),
            route.name()
        );
        assert_ne!(route.name(), "MoodleSession");
        let moodle = [b"MoodleSession=", SESSION.as_bytes()].concat();
        let headers = request(&[&sent_back(&line), &moodle]);
        assert_eq!(site.session_id(&headers), Some(SESSION));
        assert_eq!(route.node(&headers, SESSION), Some("php2"));
        // A session cookie holding a route-shaped value is not a route cookie.
        let disguised = [b"MoodleSession=", &sent_back(&line)[19..]].concat();
        assert_eq!(route.node(&request(&[&disguised]), SESSION), None);
    }

    #[test]
    fn debug_never_shows_the_secret_or_its_state() {
        let shown = format!("{:?}", route());
        assert!(shown.contains("MoodleGatewayRoute"));
        assert!(!shown.contains("route-secret") && !shown.contains("mac"));
    }

    #[test]
    #[should_panic(expected = "not a cookie path")]
    fn a_path_that_would_inject_attributes_is_a_startup_bug() {
        RouteCookie::new("R", SECRET, "/; Domain=evil.example");
    }
}
