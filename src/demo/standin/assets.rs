//! A node's theme and JavaScript answers, as Moodle sends them: at the site's current
//! revision the same bytes from every node, marked `public` with a year's `max-age`
//! and `immutable` (Moodle's `css_send_cached_css()` and `js_send_cached()`), so the
//! gateway's asset cache keeps them; at any other revision an uncached answer naming
//! the node, as Moodle serves a stale or designer-mode revision without caching it.
//!
//! Why the stand-in has a revision at all: the demo's pages link these URLs, the
//! dashboard's asset-cache panel fills from them, and `doctor` compares the
//! JavaScript each node sends for the same URL (the same Moodle code gives the same
//! bytes).

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_TYPE, ETAG};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::reply;

/// The stand-in site's theme and JavaScript revision (`themerev`, `jsrev`): a
/// Unix time in the past, as Moodle's are.
pub const REVISION: u64 = 1_764_000_000;

/// The scripts whose slash argument carries the revision, and what they send.
const REVISIONED: [(&str, &str); 6] = [
    ("/theme/styles.php/", "text/css; charset=utf-8"),
    (
        "/theme/javascript.php/",
        "application/javascript; charset=utf-8",
    ),
    ("/theme/image.php/", "image/svg+xml"),
    ("/theme/font.php/", "font/woff2"),
    (
        "/lib/javascript.php/",
        "application/javascript; charset=utf-8",
    ),
    (
        "/lib/requirejs.php/",
        "application/javascript; charset=utf-8",
    ),
];

/// A sessionless script's answer; `rest` is the path below the site.
pub(super) fn asset(rest: &str, node: &str) -> Response<Full<Bytes>> {
    let Some(content_type) = current(rest) else {
        return reply(StatusCode::OK, format!("/* {rest} from {node} */\n"));
    };
    let mut response = Response::new(Full::new(Bytes::from(body(rest))));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    let forever = HeaderValue::from_static("public, max-age=31536000, immutable");
    headers.insert(CACHE_CONTROL, forever);
    headers.insert(ACCEPT_RANGES, HeaderValue::from_static("none"));
    let etag = HeaderValue::try_from(format!("\"{REVISION}\"")).expect("digits");
    headers.insert(ETAG, etag);
    response
}

/// The content type of `rest` when it is a revisioned script at [`REVISION`]
/// (`{REVISION}` or `{REVISION}_{subrevision}` as one segment of its slash argument).
fn current(rest: &str) -> Option<&'static str> {
    let (script, content_type) = REVISIONED.iter().find(|(s, _)| rest.starts_with(s))?;
    let revision = REVISION.to_string();
    let at_revision = rest[script.len()..].split('/').any(|segment| {
        segment == revision
            || segment
                .strip_prefix(revision.as_str())
                .is_some_and(|sub| sub.starts_with('_'))
    });
    at_revision.then_some(*content_type)
}

/// The same bytes on every node: what the URL names, and nothing of the node.
fn body(rest: &str) -> String {
    if rest.starts_with("/theme/image.php/") {
        return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"16\" height=\"16\">\
                <circle cx=\"8\" cy=\"8\" r=\"6\" fill=\"#0f6cbf\"/></svg>\n"
            .to_owned();
    }
    if rest.starts_with("/theme/styles.php/") {
        return format!("/* {rest} */\nbody {{ font-family: sans-serif; margin: 2em; }}\n");
    }
    format!("/* {rest} */\nvar M = M || {{}};\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_revision_is_marked_cacheable() {
        let rev = REVISION;
        assert!(current(&format!("/theme/styles.php/boost/{rev}_1/all")).is_some());
        assert!(current(&format!("/lib/javascript.php/{rev}/lib/a.js")).is_some());
        assert!(current(&format!("/theme/image.php/boost/core/{rev}/i/loading")).is_some());
        assert_eq!(current("/theme/styles.php/boost/1/all"), None);
        assert_eq!(current("/theme/styles.php/boost/-1/all"), None);
        assert_eq!(current(&format!("/theme/yui_combo.php?m/{rev}/a.js")), None);
    }
}
