//! A tiny HTML writer for the dashboard: escaping, the page shell (inline CSS and
//! the auto-refresh script), and the headers every page carries.
//!
//! Why no template engine: the dashboard is two pages of a few dozen elements.
//! `write!` with [`Esc`] around every dynamic value keeps each page readable in one
//! function, adds no dependency, and makes "is this escaped?" a question with one
//! answer: text from anywhere (node names, probe answers, URLs) goes through
//! [`Esc`]; only `&'static str` markup is written raw.
//!
//! Why hashes in the Content-Security-Policy: the style sheet and the script are
//! constants, so their SHA-256 is known; the policy allows exactly those two and
//! nothing else (no other script, no inline `style=` attribute, no image, no frame,
//! no form posting elsewhere). An injected `<script>` would not run even if an
//! escape were missed. No external asset: the admin network may have no internet.

use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use axum::http::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Text made safe for element content and quoted attribute values.
pub(super) struct Esc<'a>(pub(super) &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// Mobile first: one column of cards, two or more from 40em; system fonts; colour
/// only where it means something (up, down, draining, disabled, an open waiting room).
const STYLE: &str = "\
:root{color-scheme:light dark;--ok:#1a7f37;--bad:#c62828;--warn:#9a6700;--line:#8884}
*{box-sizing:border-box}
body{margin:0;font:16px/1.4 system-ui,sans-serif;padding:.75rem;max-width:80rem;margin:auto}
header{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:baseline;justify-content:space-between}
h1{font-size:1.3rem;margin:.25rem 0}h2{font-size:1.1rem;margin:0}
.totals{margin:0;color:#666}
.flash{border:1px solid var(--line);border-left:.35rem solid var(--warn);padding:.5rem .75rem;margin:.75rem 0}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(16rem,1fr));gap:.75rem;margin:.75rem 0}
.card{border:1px solid var(--line);border-radius:.5rem;padding:.75rem;border-top:.35rem solid var(--ok)}
.card.is-down{border-top-color:var(--bad)}.card.is-draining{border-top-color:var(--warn)}.card.is-disabled{border-top-color:#777}
.badge{display:inline-block;font-size:.8rem;padding:0 .4rem;border-radius:1rem;border:1px solid currentColor;margin-left:.3rem}
.badge.up{color:var(--ok)}.badge.down{color:var(--bad)}.badge.open{color:var(--warn)}.state-draining{color:var(--warn)}.state-disabled{color:#777}
.why{font-size:.85rem;color:#666;margin:.3rem 0;overflow-wrap:anywhere}
dl{display:grid;grid-template-columns:auto auto;gap:.1rem 1rem;margin:.5rem 0}dt{color:#666}dd{margin:0;text-align:right;font-variant-numeric:tabular-nums}
dl.narrow{max-width:24rem}
.actions{display:flex;gap:.5rem;flex-wrap:wrap}
button,input,select{font:inherit;padding:.35rem .7rem;border-radius:.3rem;border:1px solid var(--line)}
button{cursor:pointer;background:#8882}
input,select{max-width:100%}
form.inline{display:inline}
.search{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end;margin:.5rem 0}
.search label{display:flex;flex-direction:column;font-size:.85rem}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid var(--line);white-space:nowrap}
code{font-size:.9rem}
.found{border:1px solid var(--line);border-left:.35rem solid var(--ok);padding:.5rem .75rem}
.login{max-width:24rem;margin:3rem auto}.login input{width:100%;margin:.5rem 0}
footer{color:#666;font-size:.85rem;margin:1rem 0}
";

/// Reloads the page every 5 s, unless a form field has the focus (someone typing a
/// search or a session id must not lose it).
const SCRIPT: &str = "setInterval(function(){var a=document.activeElement;\
if(!a||!a.form)location.reload()},5000);";

/// `'sha256-…'` of a constant, as CSP names it.
fn hash_source(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
    format!("'sha256-{b64}'")
}

/// The policy of every dashboard page: only our own style sheet and script, forms
/// only to this listener, never inside a frame.
fn policy() -> &'static HeaderValue {
    static POLICY: OnceLock<HeaderValue> = OnceLock::new();
    POLICY.get_or_init(|| {
        let text = format!(
            "default-src 'none'; style-src {}; script-src {}; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
            hash_source(STYLE),
            hash_source(SCRIPT)
        );
        HeaderValue::from_str(&text).expect("a policy is plain ASCII")
    })
}

/// The document around `body`; `refresh` adds the auto-refresh script.
pub(super) fn document(title: &str, body: &str, refresh: bool) -> String {
    let mut out = String::with_capacity(body.len() + STYLE.len() + 512);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>{body}",
        Esc(title)
    );
    if refresh {
        let _ = write!(out, "<script>{SCRIPT}</script>");
    }
    out.push_str("</body></html>");
    out
}

/// A page with its security headers (`no-store` is added to every admin answer).
pub(super) fn page(status: StatusCode, html: String) -> Response {
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    let text_html = HeaderValue::from_static("text/html; charset=utf-8");
    headers.insert(CONTENT_TYPE, text_html);
    headers.insert(CONTENT_SECURITY_POLICY, policy().clone());
    let fixed = [
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with the
        // page's own forms, and `guard` rightly refuses those.
        ("referrer-policy", "same-origin"),
    ];
    for (name, value) in fixed {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    response
}

/// "3s", "5m", "2h 10m", "3d 4h": how long ago, to the unit that matters.
pub(super) fn duration(seconds: u64) -> String {
    let (m, h, d) = (60, 3600, 86400);
    match seconds {
        s if s < m => format!("{s}s"),
        s if s < h => format!("{}m", s / m),
        s if s < d => format!("{}h {}m", s / h, s % h / m),
        s => format!("{}d {}h", s / d, s % d / h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_character_that_could_leave_text_or_an_attribute_is_escaped() {
        let hostile = r#"web1"><script>alert('x')</script>&amp;"#;
        assert_eq!(
            Esc(hostile).to_string(),
            "web1&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;amp;"
        );
        assert_eq!(Esc("plain text").to_string(), "plain text");
    }

    #[test]
    fn the_policy_allows_exactly_the_page_s_own_style_and_script() {
        let policy = policy().to_str().unwrap();
        assert!(policy.contains(&hash_source(STYLE)));
        assert!(policy.contains(&hash_source(SCRIPT)));
        assert!(policy.starts_with("default-src 'none';"));
        assert!(!policy.contains("unsafe"));
        let html = document("t", "<p>x</p>", true);
        assert!(html.contains(&format!("<style>{STYLE}</style>")));
        assert!(html.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(!document("t", "", false).contains("<script>"));
    }

    #[test]
    fn durations_read_to_the_unit_that_matters() {
        let shown: Vec<_> = [0, 59, 60, 3599, 3600, 7800, 86400 + 4 * 3600]
            .into_iter()
            .map(duration)
            .collect();
        assert_eq!(
            shown,
            ["0s", "59s", "1m", "59m", "1h 0m", "2h 10m", "1d 4h"]
        );
    }
}
