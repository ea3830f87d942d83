//! `Site::session_id` on arbitrary `Cookie` header lines (one per `\n` of the input).
//!
//! Beyond "never panics": whatever it returns is a valid session id taken from the headers.
#![no_main]

use http::header::COOKIE;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use moodle_gateway::moodle::{is_valid_session_id, Site};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(COOKIE, value);
        }
    }
    let site = Site::new("", "MoodleSession", "/");
    if let Some(id) = site.session_id(&headers) {
        assert!(is_valid_session_id(id), "{id:?}");
        let found = headers
            .get_all(COOKIE)
            .iter()
            .any(|h| h.as_bytes().windows(id.len()).any(|w| w == id.as_bytes()));
        assert!(found, "{id:?} is not in the headers");
    }
});
