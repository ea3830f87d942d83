//! The waiting page: the admin's template (or the built-in one) with the visitor's
//! figures filled in, sent as a 503 that refreshes itself.
//!
//! Why 503 and not Cloudflare's 200: the waiting page is not the site. A monitor
//! that fetches the front page during a surge must see that students are being
//! held, and a search engine must not index the waiting page in place of the site;
//! both treat 503 with `Retry-After` as "temporarily unavailable, come back", and
//! browsers show its page and follow its refresh like any other.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

/// The built-in page, in English; `surge.room_page` replaces it.
// One file for both: the page the gateway shows, and the template the package ships
// for an admin to start a `room_page` from.
pub const BUILT_IN: &str = include_str!("../../../docs/waiting-room/waiting-room.en.html");

/// What a visitor in line is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Their place, 1 for the first in line.
    pub place: usize,
    /// The wait they can expect.
    pub wait: Duration,
    /// When the page asks again.
    pub refresh: Duration,
}

/// `template` with its placeholders replaced: `{{place}}`, `{{wait_minutes}}`
/// (rounded up, at least 1), `{{wait_seconds}}` and `{{refresh_seconds}}`. Numbers
/// only, so the admin's text needs no escaping and any language reads them.
pub fn render(template: &str, figures: Figures) -> String {
    let seconds = figures.wait.as_secs();
    let minutes = seconds.div_ceil(60).max(1);
    template
        .replace("{{place}}", &figures.place.to_string())
        .replace("{{wait_minutes}}", &minutes.to_string())
        .replace("{{wait_seconds}}", &seconds.to_string())
        .replace(
            "{{refresh_seconds}}",
            &figures.refresh.as_secs().to_string(),
        )
}

/// The page as a response: 503, `Retry-After` and `Refresh` (so the page comes
/// back even from a template without its meta refresh), never cached, with the
/// visitor's place cookie.
pub fn response(body: String, refresh: Duration, cookie: HeaderValue) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    let seconds = HeaderValue::from(refresh.as_secs());
    headers.insert(header::RETRY_AFTER, seconds.clone());
    headers.insert(header::REFRESH, seconds);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::SET_COOKIE, cookie);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_fill_every_placeholder_of_any_language() {
        let thai = "<p>ลำดับของคุณ {{place}} · รอประมาณ {{wait_minutes}} นาที ({{wait_seconds}} วินาที) · {{refresh_seconds}}</p>";
        let figures = Figures {
            place: 42,
            wait: Duration::from_secs(61),
            refresh: Duration::from_secs(10),
        };
        assert_eq!(
            render(thai, figures),
            "<p>ลำดับของคุณ 42 · รอประมาณ 2 นาที (61 วินาที) · 10</p>"
        );
    }

    #[test]
    fn the_built_in_page_refreshes_itself_and_shows_the_place() {
        let figures = Figures {
            place: 7,
            wait: Duration::from_secs(5),
            refresh: Duration::from_secs(3),
        };
        let page = render(BUILT_IN, figures);
        assert!(page.contains(r#"<meta http-equiv="refresh" content="3">"#));
        assert!(page.contains("<strong>7</strong>"));
        assert!(page.contains("about <strong>1</strong> min"), "never 0");
        assert!(!page.contains("{{"), "no placeholder left");
        assert!(
            !page.contains("src=") && !page.contains("href="),
            "no external asset"
        );
    }
}
