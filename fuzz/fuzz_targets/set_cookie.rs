//! `Site::issued_session` on arbitrary `Set-Cookie` lines (one per `\n` of the input).
//!
//! Beyond "never panics": an issued id is always a valid session id, and a line that
//! deletes the cookie (`Max-Age=0`) appended last always reads as cleared.
#![no_main]

use http::header::SET_COOKIE;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use moodle_gateway::moodle::{is_valid_session_id, IssuedSession, Site};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(SET_COOKIE, value);
        }
    }
    for site in [
        Site::new("", "MoodleSession", "/"),
        Site::new("/moodle", "MoodleSession", "/moodle/"),
    ] {
        if let Some(IssuedSession::Id(id)) = site.issued_session(&headers) {
            assert!(is_valid_session_id(id), "{id:?}");
        }
    }
    let site = Site::new("", "MoodleSession", "/");
    let deleting = "MoodleSession=deleted; Max-Age=0; Path=/";
    headers.append(SET_COOKIE, HeaderValue::from_static(deleting));
    assert_eq!(site.issued_session(&headers), Some(IssuedSession::Cleared));
});
