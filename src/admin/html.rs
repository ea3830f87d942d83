//! A tiny HTML writer for the dashboard: escaping by type, the page shell (inline
//! CSS and the auto-refresh script), and the headers every page carries.
//!
//! Why no template engine: the dashboard is two pages of a few dozen elements.
//! [`html!`] keeps each page readable in one function and adds no dependency.
//!
//! Why escaping by type: "is this escaped?" must not depend on remembering to wrap
//! a value. Every page writes into a [`Markup`], and the only raw text a `Markup`
//! takes is a `&'static str` (markup written in the source code: a string literal
//! in [`html!`], or [`Raw`]) or another `Markup`. Anything else (a `String`, a
//! `&str`, a number, a `format_args!`) goes through [`Render`], which escapes
//! it. Text from anywhere (node names, probe answers, URLs, heartbeats) can only
//! ever arrive as one of those, so a page cannot write it raw by accident.
//! `Markup` has no `From<String>` and implements neither `fmt::Write` nor
//! `Display`: a format string with captures (`"<b>{name}</b>"`) cannot be written
//! into it, since nothing could tell its markup from its text.
//!
//! Why hashes in the Content-Security-Policy: the style sheet and the script are
//! constants, so their SHA-256 is known; the policy allows exactly those two and
//! nothing else (no other script, no inline `style=` attribute, no image, no frame,
//! no form posting elsewhere). An injected `<script>` would not run even if an
//! escape were missed. No external asset: the admin network may have no internet.

use std::fmt::{self, Write as _};
use std::ops::Deref;
use std::sync::OnceLock;

use axum::http::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// HTML this crate wrote: markup from the source code, and text escaped on the way
/// in. Reading it is free (it derefs to `str`); there is no way in but
/// [`Markup::push`] and [`Markup::push_raw`], so no `String` becomes markup.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Markup(String);

impl Markup {
    pub(super) fn new() -> Self {
        Self::default()
    }

    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self(String::with_capacity(capacity))
    }

    /// Appends `value` as [`Render`] has it: escaped, unless it is markup already.
    pub(super) fn push<R: Render + ?Sized>(&mut self, value: &R) {
        value.render(self);
    }

    /// Appends markup from the source code as it is. `&'static str` because that
    /// is what a literal is; text read at run time is never `'static`.
    pub(super) fn push_raw(&mut self, markup: &'static str) {
        self.0.push_str(markup);
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// The HTML, for the response body.
    pub(super) fn into_string(self) -> String {
        self.0
    }
}

impl Deref for Markup {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// Markup written in the source code, where it is not a literal in [`html!`]: a
/// constant, or one of a few fixed snippets chosen at run time (a badge or none).
#[derive(Debug, Clone, Copy)]
pub(super) struct Raw(pub(super) &'static str);

/// How a value goes into [`Markup`]: text (`str`, `String`, numbers, `char`,
/// `format_args!`) escaped, through its `Display`; [`Markup`] and [`Raw`] as they
/// are; a reference as what it points to.
///
/// Why a list of types rather than every `Display`: a reference to markup
/// (`&Markup`) must stay markup, and a blanket impl over `Display` would overlap
/// with the one over references. A new kind of text joins the list and is escaped
/// like the others; nothing else in the crate writes raw.
pub(super) trait Render {
    fn render(&self, out: &mut Markup);
}

impl<T: Render + ?Sized> Render for &T {
    fn render(&self, out: &mut Markup) {
        (**self).render(out);
    }
}

/// Text: written through its `Display`, escaped.
macro_rules! render_as_text {
    ($($text:ty),*) => {$(
        impl Render for $text {
            fn render(&self, out: &mut Markup) {
                let _ = write!(Escaping(&mut out.0), "{self}");
            }
        }
    )*};
}
render_as_text!(str, String, char, fmt::Arguments<'_>);
render_as_text!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);

impl Render for Markup {
    fn render(&self, out: &mut Markup) {
        out.0.push_str(&self.0);
    }
}

impl Render for Raw {
    fn render(&self, out: &mut Markup) {
        out.push_raw(self.0);
    }
}

/// A `fmt::Write` that escapes everything written to it, for element content and
/// quoted attribute values. Private: it is the inside of [`Render`], never a way
/// to write markup.
struct Escaping<'a>(&'a mut String);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            self.0.push_str(&rest[..at]);
            self.0.push_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            });
            rest = &rest[at + 1..];
        }
        self.0.push_str(rest);
        Ok(())
    }
}

/// Writes parts into a [`Markup`] (`out`, or `&mut` one): each string literal as
/// markup, every other argument through [`Render`] (escaped unless it is
/// `Markup` or [`Raw`]).
///
/// ```ignore
/// html!(out, "<dt>", label, "</dt><dd data-figure=\"", key, "\">", value, "</dd>");
/// ```
///
/// Why literals and not `&'static str` in general: a macro sees tokens, not types,
/// and a literal is the one thing it can tell is markup someone wrote here. A
/// constant of markup goes in as [`Raw`]; a constant of text is escaped like any
/// other value. A number literal is taken for markup too, and refused (it is not a
/// `&str`): write a fixed number inside the string, a computed one as a value.
macro_rules! html {
    ($out:expr $(,)?) => {{}};
    ($out:expr, $markup:literal $(, $($rest:tt)*)?) => {{
        $out.push_raw($markup);
        $crate::admin::html::html!($out $(, $($rest)*)?)
    }};
    ($out:expr, $value:expr $(, $($rest:tt)*)?) => {{
        $out.push(&$value);
        $crate::admin::html::html!($out $(, $($rest)*)?)
    }};
}
pub(super) use html;

/// A new [`Markup`] of parts, as [`html!`] writes them: for a value that is a
/// fragment (a figure with a `<small>` note, a label).
macro_rules! markup {
    ($($part:tt)*) => {{
        let mut out = $crate::admin::html::Markup::new();
        $crate::admin::html::html!(out, $($part)*);
        out
    }};
}
pub(super) use markup;

/// One figure of a card or a panel: `<dt>label</dt><dd data-figure="key">value</dd>`.
pub(super) fn figure<R: Render + ?Sized>(out: &mut Markup, label: &str, key: &str, value: &R) {
    html!(
        out,
        "<dt>",
        label,
        "</dt><dd data-figure=\"",
        key,
        "\">",
        value,
        "</dd>"
    );
}

/// A number with one decimal (`1.5`): text, escaped like any other on the way in.
pub(super) fn tenths(value: f64) -> String {
    format!("{value:.1}")
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
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(20rem,100%),1fr));gap:.75rem;margin:.5rem 0}
.plot{margin:0;border:1px solid var(--line);border-radius:.5rem;padding:.5rem}.plot figcaption{font-size:.9rem;font-weight:600}.plot>svg{display:block;height:auto}
.legend{list-style:none;padding:0;margin:.25rem 0 0;display:flex;flex-wrap:wrap;gap:0 .8rem;font-size:.85rem}.legend b{font-variant-numeric:tabular-nums}
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
pub(super) fn document(title: &str, body: &Markup, refresh: bool) -> Markup {
    let mut out = Markup::with_capacity(body.len() + STYLE.len() + 512);
    html!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>",
        title,
        "</title><style>",
        Raw(STYLE),
        "</style></head><body>",
        body
    );
    if refresh {
        html!(out, "<script>", Raw(SCRIPT), "</script>");
    }
    html!(out, "</body></html>");
    out
}

/// A page with its security headers (`no-store` is added to every admin answer).
pub(super) fn page(status: StatusCode, html: Markup) -> Response {
    let mut response = (status, html.into_string()).into_response();
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
        let escaped = "web1&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;amp;";
        assert_eq!(&*markup!(hostile), escaped);
        assert_eq!(&*markup!(hostile.to_owned()), escaped, "a String too");
        assert_eq!(&*markup!("plain", " text"), "plain text");
    }

    #[test]
    fn only_literals_raw_and_markup_go_in_unescaped() {
        let name = "a<b";
        let inner = markup!("<b>", name, "</b>");
        assert_eq!(
            &*inner, "<b>a&lt;b</b>",
            "a literal is markup, a variable text"
        );
        let (text, count, share) = ("<i>", 3, -1.5);
        let out = markup!("<p>", text, Raw("<br>"), inner, count, share, "</p>");
        assert_eq!(&*out, "<p>&lt;i&gt;<br><b>a&lt;b</b>3-1.5</p>");
        assert_eq!(
            &*markup!(format_args!("<{}>", 1)),
            "&lt;1&gt;",
            "Display: text"
        );
    }

    #[test]
    fn the_policy_allows_exactly_the_page_s_own_style_and_script() {
        let policy = policy().to_str().unwrap();
        assert!(policy.contains(&hash_source(STYLE)));
        assert!(policy.contains(&hash_source(SCRIPT)));
        assert!(policy.starts_with("default-src 'none';"));
        assert!(!policy.contains("unsafe"));
        let html = document("t", &markup!("<p>x</p>"), true);
        assert!(html.contains(&format!("<style>{STYLE}</style>")));
        assert!(html.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(!document("t", &Markup::new(), false).contains("<script>"));
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
