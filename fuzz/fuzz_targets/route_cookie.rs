//! `RouteCookie::node` on arbitrary `Cookie` header lines (one per `\n` of the input; the
//! first line is the session id the cookie must be bound to).
//!
//! Beyond "never panics": a forged value never verifies. The fuzzer cannot know the secret,
//! so any node it gets back is a bug, unless it is the one cookie this target issued itself
//! (appended after the fuzzed lines, so it only counts when no fuzzed cookie came first).
#![no_main]

use http::header::COOKIE;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use moodle_gateway::sessions::route_cookie::RouteCookie;

const SECRET: &[u8] = b"fuzzing-secret-of-at-least-32-bytes!";

fuzz_target!(|data: &[u8]| {
    let route = RouteCookie::new("MoodleGatewayRoute", SECRET, "/");
    let mut lines = data.split(|&b| b == b'\n');
    let session = String::from_utf8_lossy(lines.next().unwrap_or_default());
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(COOKIE, value);
        }
    }
    assert_eq!(
        route.node(&headers, &session),
        None,
        "a forged cookie verified"
    );
    let issued = route.issue("php1", &session, false);
    let sent_back = issued.as_bytes().split(|&b| b == b';').next().unwrap();
    headers.append(COOKIE, HeaderValue::from_bytes(sent_back).unwrap());
    let node = route.node(&headers, &session);
    assert!(node.is_none() || node == Some("php1"), "{node:?}");
});
