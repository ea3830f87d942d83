//! The file offload: a PHP node that has checked the student (Moodle's
//! `send_stored_file()` with `$CFG->xsendfile = 'X-Accel-Redirect'`) answers with the
//! file's headers and `X-Accel-Redirect: /dataroot/filedir/xx/yy/<hash>` instead of the
//! bytes; the gateway fetches that path from the data server's plain file export and
//! streams it to the student under the node's headers.
//!
//! Why: with node-local sessions only the student's own node can authorise a file,
//! and only the data server should send SCORM bytes. This way both hold at once, and
//! the PHP worker is free the moment it has named the file.
//!
//! What each side decides, because neither is right alone:
//! - **the export** gives status and framing (`200`/`206`/`416`, `Content-Length`,
//!   `Content-Range`): PHP ignores `Range` and sends no length (its body ends at
//!   close; `font.php` even declares a length it does not send), so only the export
//!   can range and count;
//! - **the node** gives everything else (`Content-Type`, `Content-Disposition`,
//!   caching, `ETag`, `Set-Cookie`, CORS): a plain file server calls every hash-named
//!   file `application/octet-stream`.
//!
//! Nothing can steer it: the header is honoured only from a PHP node, only under the
//! configured prefix, only as a plain path (no `..`, no escapes, no query, no absolute
//! URL); `X-Accel-*` never reaches a student ([`take_accel`]) nor a node (the request
//! hygiene in [`proxy`]); and the export only ever sees paths a node named.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Method, Request, Response, StatusCode};

use crate::error::GatewayError;
use crate::http::body::IdleLimited;
use crate::http::upstream::pool::{Conns, NodeBody, Pool};
use crate::http::upstream::proxy::{self, Bounds, Failed, HopByHop, Peer, Target};
use crate::http::upstream::upload::Upload;

const X_ACCEL_REDIRECT: HeaderName = HeaderName::from_static("x-accel-redirect");

/// The node's headers that describe its own (empty) body, replaced by the export's.
const FRAMING: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::TRANSFER_ENCODING,
    header::CONTENT_ENCODING,
];

/// The data server's file export, as the running config names it.
#[derive(Debug)]
pub struct Offload {
    authority: Authority,
    prefix: String,
    conns: Arc<Conns>,
}

/// What the student asked of the file, kept from the request before it is forwarded:
/// the node ignores it, the export must see it.
#[derive(Debug, Default)]
pub struct Asked {
    head: bool,
    range: Option<HeaderValue>,
    if_range: Option<HeaderValue>,
}

impl Asked {
    /// The method and the ranging headers of `request`; clones nothing on a request
    /// without them.
    pub fn of<B>(request: &Request<B>) -> Self {
        let headers = request.headers();
        Self {
            head: request.method() == Method::HEAD,
            range: headers.get(header::RANGE).cloned(),
            if_range: headers.get(header::IF_RANGE).cloned(),
        }
    }
}

/// Removes every `X-Accel-*` header from a node's answer and returns the value of
/// `X-Accel-Redirect`, if there was one. One pass over the names, nothing hashed or
/// allocated, for the answers (nearly all) that carry none.
pub fn take_accel(headers: &mut HeaderMap) -> Option<HeaderValue> {
    if !headers.keys().any(is_accel) {
        return None;
    }
    let redirect = headers.remove(X_ACCEL_REDIRECT);
    remove_accel(headers);
    redirect
}

/// Removes every `X-Accel-*` header (a student's request: only a node may speak it).
pub fn remove_accel(headers: &mut HeaderMap) {
    while let Some(name) = headers.keys().find(|name| is_accel(name)).cloned() {
        headers.remove(name);
    }
}

/// Whether `name` belongs to the `X-Accel-*` family: nginx's internal protocol
/// between an upstream and its proxy, which never crosses to a student, nor from a
/// student to a node. A map's names are lower case already, so a plain prefix
/// compare does (the raw lines of an answer use [`super::wire::is_accel`]); it runs
/// on every line of every request.
pub fn is_accel(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-accel-")
}

impl Offload {
    /// The export at `authority`; only paths under `prefix` are fetched from it.
    pub fn new(authority: Authority, prefix: String) -> Self {
        Self {
            authority,
            prefix,
            conns: Arc::default(),
        }
    }

    /// The alias only paths under which are fetched (`offload.prefix`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The export's kept connections, for the sweeper.
    pub fn conns(&self) -> &Arc<Conns> {
        &self.conns
    }

    /// Answers the student with the file `node`'s `X-Accel-Redirect` named, fetched
    /// from the export. The node's body is dropped (its connection is kept only when
    /// that body was already complete). Every failure is the export's or the node's,
    /// and never a mark against a node's health. An export's failure is left to the
    /// caller to count and log (at debug here): it knows whether the export is
    /// already marked down, which says it once instead of once per file.
    pub async fn serve(
        &self,
        pool: &Pool,
        redirect: &HeaderValue,
        node: Response<IdleLimited<NodeBody>>,
        asked: Asked,
        peer: Peer<'_>,
        bounds: Bounds,
    ) -> Result<Response<IdleLimited<NodeBody>>, GatewayError> {
        let path = self.target(redirect)?;
        let (mut parts, node_body) = node.into_parts();
        // Its (empty or unended) body now: the node's connection goes back only if
        // that body was complete, and a PHP worker's socket is not held meanwhile.
        drop(node_body);
        let request = self.fetch_request(path, &asked, &parts.headers);
        let export = Target {
            name: "file export",
            authority: &self.authority,
            conns: &self.conns,
        };
        let fetched = proxy::forward(
            pool,
            export,
            request,
            HopByHop::Due(peer),
            bounds,
            peer.reuse(),
        );
        let file = fetched.await.map_err(|Failed { error, .. }| {
            let error = match error {
                GatewayError::UpstreamTimeout => GatewayError::FileExportTimeout,
                GatewayError::UpstreamUnreachable | GatewayError::UpstreamBroken => {
                    GatewayError::FileExportUnreachable
                }
                other => other,
            };
            tracing::debug!(export = %self.authority, path, "file offload failed: {error}");
            error
        })?;
        // The node's head speaks for the file, as it always did: of the export's,
        // only the lines that describe the bytes sent go on.
        let (file, body) = file.into_parts();
        match file.status {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT | StatusCode::RANGE_NOT_SATISFIABLE => {}
            StatusCode::NOT_FOUND => {
                tracing::debug!(export = %self.authority, path, "the file export has no such file");
                return Err(GatewayError::FileNotOnDataServer);
            }
            status => {
                tracing::debug!(export = %self.authority, path, %status, "the file export failed");
                return Err(GatewayError::FileExportFailed);
            }
        }
        for name in FRAMING {
            parts.headers.remove(&name);
        }
        for name in [header::CONTENT_LENGTH, header::CONTENT_RANGE] {
            if let Some(value) = file.headers.get(&name) {
                parts.headers.insert(name, value.clone());
            }
        }
        parts
            .headers
            .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        parts.status = file.status;
        Ok(Response::from_parts(parts, body))
    }

    /// The path `redirect` names, if the gateway may fetch it: under the prefix, in
    /// plain path characters, with no empty, `.` or `..` segment. Moodle's own paths
    /// (`/dataroot/filedir/ab/cd/<sha1>`, `/dataroot/localcache/…`) are all of that
    /// form, so anything else is a node that misbehaves, and is answered 502.
    fn target<'a>(&self, redirect: &'a HeaderValue) -> Result<&'a str, GatewayError> {
        let unusable = |why: &str| {
            tracing::warn!(
                value = redirect.to_str().unwrap_or("(not text)"),
                prefix = %self.prefix,
                "a node's X-Accel-Redirect was not honoured: {why}"
            );
            GatewayError::UnusableAccelRedirect
        };
        let path = redirect.to_str().map_err(|_| unusable("not text"))?;
        if !path.starts_with(&self.prefix) {
            return Err(unusable("outside offload.prefix"));
        }
        let plain = path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
        if !plain {
            return Err(unusable("not a plain path (an escape, a query, a space)"));
        }
        let segments = path[1..].split('/');
        if segments.clone().any(|s| matches!(s, "." | "..")) || path.contains("//") {
            return Err(unusable("a '.', '..' or empty segment"));
        }
        Ok(path)
    }

    /// The export's request: the path, the export's own `Host`, and the student's
    /// `Range` unless an `If-Range` no longer matches the node's validator. No
    /// conditional header: the node has judged those (PHP answers a 304 itself).
    fn fetch_request(&self, path: &str, asked: &Asked, node: &HeaderMap) -> Request<Upload> {
        let mut request = Request::new(Upload::empty());
        *request.method_mut() = if asked.head {
            Method::HEAD
        } else {
            Method::GET
        };
        *request.uri_mut() = PathAndQuery::try_from(path)
            .expect("a plain path is a valid target")
            .into();
        let headers = request.headers_mut();
        if let Ok(host) = HeaderValue::from_str(self.authority.as_str()) {
            headers.insert(header::HOST, host);
        }
        if let Some(range) = &asked.range {
            if asked
                .if_range
                .as_ref()
                .is_none_or(|v| still_current(v, node))
            {
                headers.insert(header::RANGE, range.clone());
            }
        }
        request
    }
}

/// `If-Range` (RFC 9110 §13.1.5): an entity tag matches the node's `ETag` by strong
/// comparison (a weak one never does); a date matches `Last-Modified` exactly.
fn still_current(if_range: &HeaderValue, node: &HeaderMap) -> bool {
    let value = if_range.as_bytes();
    let validator = match value.first() {
        Some(b'"') | Some(b'W') => header::ETAG,
        _ => header::LAST_MODIFIED,
    };
    let strong = !value.starts_with(b"W/");
    strong
        && node
            .get(validator)
            .is_some_and(|v| v.as_bytes() == value && !v.as_bytes().starts_with(b"W/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offload() -> Offload {
        Offload::new("127.0.0.1:9".parse().unwrap(), "/dataroot/".into())
    }

    fn target(value: &'static str) -> Result<&'static str, GatewayError> {
        let value: &'static HeaderValue = Box::leak(Box::new(HeaderValue::from_static(value)));
        offload().target(value)
    }

    #[test]
    fn moodles_own_paths_are_fetched_as_named() {
        for path in [
            "/dataroot/filedir/3b/8f/3b8f0c1e9d2a7f4b5c6d7e8f9a0b1c2d3e4f5a6b",
            "/dataroot/localcache/theme/1700000000/boost/pix/favicon.ico",
        ] {
            assert_eq!(target(path), Ok(path));
        }
    }

    #[test]
    fn a_node_cannot_make_the_gateway_fetch_anything_else() {
        for hostile in [
            "/dataroot/../etc/passwd",
            "/dataroot/filedir/../../etc/passwd",
            "/dataroot/./filedir/x",
            "/dataroot//etc/passwd",
            "/dataroot/%2e%2e/etc/passwd",
            "/dataroot/filedir%2Fx",
            "/dataroot/filedir/x?y=1",
            "/dataroot/filedir/x#y",
            "/dataroot/file dir",
            "/etc/passwd",
            "/dataroo/filedir/x",
            "http://evil.example/dataroot/x",
            "//evil.example/dataroot/x",
            "dataroot/filedir/x",
            "",
        ] {
            assert_eq!(
                target(hostile),
                Err(GatewayError::UnusableAccelRedirect),
                "{hostile:?}"
            );
        }
    }

    #[test]
    fn no_x_accel_header_crosses_and_the_redirect_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/html"));
        assert_eq!(take_accel(&mut headers), None);
        headers.insert("x-accel-redirect", HeaderValue::from_static("/dataroot/a"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        headers.insert("x-accel-limit-rate", HeaderValue::from_static("1"));
        assert_eq!(
            take_accel(&mut headers),
            Some(HeaderValue::from_static("/dataroot/a"))
        );
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("content-type"));
    }

    #[test]
    fn if_range_keeps_the_range_only_while_the_nodes_validator_matches() {
        let mut node = HeaderMap::new();
        node.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        node.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Dec 2026 09:00:00 GMT"),
        );
        let yes = |v| still_current(&HeaderValue::from_static(v), &node);
        assert!(yes("\"abc\""));
        assert!(yes("Tue, 01 Dec 2026 09:00:00 GMT"));
        assert!(!yes("\"abd\""));
        assert!(!yes("W/\"abc\""));
        assert!(!yes("Tue, 01 Dec 2026 09:00:01 GMT"));
        node.insert(header::ETAG, HeaderValue::from_static("W/\"abc\""));
        let weak = HeaderValue::from_static("W/\"abc\"");
        assert!(
            !still_current(&weak, &node),
            "weak tags never match for a range"
        );
    }

    #[test]
    fn the_fetch_carries_the_range_but_no_condition() {
        let mut node = HeaderMap::new();
        node.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        let asked = Asked {
            head: false,
            range: Some(HeaderValue::from_static("bytes=0-99")),
            if_range: Some(HeaderValue::from_static("\"abc\"")),
        };
        let request = offload().fetch_request("/dataroot/filedir/x", &asked, &node);
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "/dataroot/filedir/x");
        assert_eq!(request.headers()[header::RANGE], "bytes=0-99");
        assert_eq!(request.headers()[header::HOST], "127.0.0.1:9");
        assert_eq!(request.headers().len(), 2, "{:?}", request.headers());
        let stale = Asked {
            if_range: Some(HeaderValue::from_static("\"old\"")),
            ..asked
        };
        let request = offload().fetch_request("/dataroot/filedir/x", &stale, &node);
        assert!(!request.headers().contains_key(header::RANGE));
    }
}
