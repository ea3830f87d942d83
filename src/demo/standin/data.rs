//! The data server's answers: any `mod_scorm` file, without checking sessions.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode, Uri};
use http_body_util::Full;

use super::{reply, Inner};

/// Size of `.../big.bin` on the data server: enough to cross many body chunks.
pub(super) const BIG_FILE: usize = 1 << 20;

impl Inner {
    /// Any `mod_scorm` file (every URL form) from the data server, and its health
    /// probe paths; the rest is 404.
    pub(super) fn file(&self, uri: &Uri) -> Response<Full<Bytes>> {
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        // It runs Moodle too: its theme scripts and heartbeat answer, so the
        // gateway's health probes find it alive.
        if target.contains("/theme/") || target.contains("/admin/tool/heartbeat/") {
            return reply(StatusCode::OK, format!("alive: {}\n", self.config.name));
        }
        if !(target.contains("mod_scorm") || target.contains("moddata/scorm")) {
            return reply(StatusCode::NOT_FOUND, "not a SCORM file\n");
        }
        if uri.path().ends_with("/big.bin") {
            let bytes: Vec<u8> = (0..BIG_FILE).map(|i| (i % 251) as u8).collect();
            let mut response = reply(StatusCode::OK, bytes);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            return response;
        }
        reply(
            StatusCode::OK,
            format!("SCORM {} from {}\n", uri.path(), self.config.name),
        )
    }
}
