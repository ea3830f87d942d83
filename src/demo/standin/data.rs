//! The data server's answers: any `mod_scorm` file, without checking sessions; the
//! rest as the Moodle it also runs (its own sessions, its login page, the probes).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body_util::Full;

use super::files::stored;
use super::Inner;

impl Inner {
    /// Any `mod_scorm` file (every URL form) from the data server; anything else is
    /// a page of its Moodle.
    pub(super) fn file(&self, parts: &Parts, body: &[u8]) -> Response<Full<Bytes>> {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        if !(target.contains("mod_scorm") || target.contains("moddata/scorm")) {
            return self.node(parts, body);
        }
        let mut response = Response::new(Full::new(stored(parts.uri.path())));
        let kind = match parts.uri.path().ends_with("/big.bin") {
            true => "application/octet-stream",
            false => "text/html; charset=utf-8",
        };
        let kind = HeaderValue::from_static(kind);
        response.headers_mut().insert(CONTENT_TYPE, kind);
        *response.status_mut() = StatusCode::OK;
        response
    }
}
