//! Outages short of a dead node, switched on and off by tests: a node that hangs
//! (accepts and reads requests, never answers) and Moodle's site maintenance.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::ext::ReasonPhrase;

use super::{reply, Inner};

impl Inner {
    /// Waits while the node hangs. A request that arrived during the hang is released
    /// when it ends, like a PHP worker stuck on a lock that finally gets it; it is
    /// cut instead if the stand-in stops first (its connection is dropped).
    pub(super) async fn unless_hung(&self) {
        let mut hang = self.hang.subscribe();
        // The sender lives in `self`, so this cannot fail while we borrow it.
        let _ = hang.wait_for(|&hung| !hung).await;
    }
}

/// What `lib/setup.php` answers to every web request while `climaintenance.html`
/// exists: `503 Moodle under maintenance` (the reason phrase is Moodle's own),
/// `Retry-After: 300`, uncacheable, and the maintenance page. The site is down on
/// purpose, not the node: a gateway should tell the two apart.
pub(super) fn maintenance_page() -> Response<Full<Bytes>> {
    let body = "<!DOCTYPE html>\n<html><head><title>Moodle under maintenance</title></head>\n\
                <body><p>Moodle under maintenance: this site is being upgraded \
                and is not available right now.</p></body></html>\n";
    let mut response = reply(StatusCode::SERVICE_UNAVAILABLE, body);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("300"));
    let uncacheable = HeaderValue::from_static("no-store, no-cache, must-revalidate");
    headers.insert(CACHE_CONTROL, uncacheable);
    let reason = ReasonPhrase::from_static(b"Moodle under maintenance");
    response.extensions_mut().insert(reason);
    response
}
