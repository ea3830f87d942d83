//! The dashboard's Asset cache panel (`[cache] enabled` only): entries, memory,
//! hit rate, fills and evictions, and a Purge button (`POST /ui/cache/purge`) that
//! empties the cache by the same rule as `POST /cache/purge`.
//!
//! Why only when enabled: a cache turned off keeps nothing and counts nothing, so
//! the panel would be five zeros and a button that does nothing; a site that turns
//! it off keeps the page it had.
//!
//! Why no confirmation on Purge, unlike Disable: it costs one node request per
//! asset, after which everything is as before; nobody is logged out.
//!
//! Every figure is a number; nothing here comes from outside.

use axum::extract::rejection::FormRejection;
use axum::extract::State;
use axum::response::Response;
use axum::Form;

use super::cache::{self, CacheView};
use super::dashboard::{self, Dash};
use super::html::{figure, html, markup, tenths, Markup};
use super::login::{self, CsrfForm, Viewer};
use super::page::csrf_field;

/// Whether the page shows the panel: while the cache is on.
pub(super) fn shown(cache: &CacheView) -> bool {
    cache.enabled
}

/// The panel's `<section>`, its button carrying the login's `csrf` token.
pub(super) fn write(out: &mut Markup, cache: &CacheView, csrf: &str) {
    html!(
        out,
        "<section id=\"cache\"><h2>Asset cache</h2><p class=\"why\">Moodle's revisioned \
         theme and JavaScript answers, served from this gateway's memory. Purge when theme \
         files changed without Moodle's \u{201c}Purge all caches\u{201d}.</p><dl class=\"narrow\">"
    );
    figure(out, "Entries", "entries", &cache.entries);
    let memory = markup!(
        size(cache.bytes),
        " <small>of at most ",
        size(cache.max_bytes),
        "</small>"
    );
    figure(out, "Memory", "bytes", &memory);
    figure(out, "Hit rate", "hit-rate", &hit_rate(cache));
    figure(out, "Fills", "fills", &cache.fills);
    figure(out, "Evictions", "evictions", &cache.evictions);
    html!(
        out,
        "</dl><form method=\"post\" action=\"/ui/cache/purge\">",
        csrf_field(csrf),
        "<button type=\"submit\" data-action=\"purge\">Purge</button></form></section>"
    );
}

/// The hit rate as the panel says it, with what it is made of.
fn hit_rate(cache: &CacheView) -> Markup {
    match cache.hit_rate {
        None => markup!("none asked yet"),
        Some(rate) => markup!(
            tenths(rate * 100.0),
            " % <small>",
            cache.hits,
            " of ",
            cache.hits + cache.misses,
            "</small>"
        ),
    }
}

/// "512 B", "1.5 KiB", "64.0 MiB": bytes to the unit that matters.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let (mut value, mut unit) = (bytes as f64 / 1024.0, 0);
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        (value, unit) = (value / 1024.0, unit + 1);
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The one line the page shows after a purge.
fn flash(purged: usize) -> String {
    match purged {
        0 => "Asset cache purged: it was already empty.".into(),
        1 => "Asset cache purged: 1 entry forgotten; a node fills it again when asked.".into(),
        n => format!("Asset cache purged: {n} entries forgotten; nodes fill them when asked."),
    }
}

/// `POST /ui/cache/purge`: the panel's button, with the page's CSRF token; answered
/// by a redirect to the page with one line saying what happened.
pub(super) async fn purge(
    State(dash): State<Dash>,
    viewer: Viewer,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    if !form.is_ok_and(|Form(f)| dash.keys.csrf_ok(viewer.login, &f.csrf)) {
        return login::stale_form();
    }
    let purged = cache::purge_all(&dash.gateway);
    dashboard::back_with(&dash, "/", &flash(purged))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(hits: u64, misses: u64) -> CacheView {
        let asked = hits + misses;
        CacheView {
            enabled: true,
            entries: 3,
            bytes: 1536,
            max_bytes: 64 << 20,
            hits,
            misses,
            fills: 3,
            evictions: 1,
            hit_rate: (asked > 0).then(|| hits as f64 / asked as f64),
        }
    }

    fn shown_html(cache: &CacheView) -> String {
        let mut out = Markup::new();
        write(&mut out, cache, "c5rf");
        out.into_string()
    }

    #[test]
    fn the_panel_shows_entries_memory_hit_rate_fills_and_evictions() {
        let html = shown_html(&view(3, 1));
        for (key, value) in [
            ("entries", "3"),
            ("bytes", "1.5 KiB <small>of at most 64.0 MiB</small>"),
            ("hit-rate", "75.0 % <small>3 of 4</small>"),
            ("fills", "3"),
            ("evictions", "1"),
        ] {
            let figure = format!("data-figure=\"{key}\">{value}</dd>");
            assert!(html.contains(&figure), "{figure} in {html}");
        }
        assert!(html.starts_with("<section id=\"cache\"><h2>Asset cache</h2>"));
    }

    #[test]
    fn the_purge_button_posts_the_pages_csrf_token_under_ui() {
        let html = shown_html(&view(0, 0));
        assert!(html.contains(
            "<form method=\"post\" action=\"/ui/cache/purge\">\
             <input type=\"hidden\" name=\"csrf\" value=\"c5rf\">\
             <button type=\"submit\" data-action=\"purge\">Purge</button></form>"
        ));
        assert!(html.contains("data-figure=\"hit-rate\">none asked yet</dd>"));
    }

    #[test]
    fn a_cache_turned_off_hides_the_panel() {
        let mut cache = view(1, 1);
        assert!(shown(&cache));
        cache.enabled = false;
        assert!(!shown(&cache));
    }

    #[test]
    fn sizes_read_to_the_unit_that_matters() {
        let shown: Vec<_> = [0, 1023, 1024, 1536, 64 << 20, 3 << 30, u64::MAX]
            .into_iter()
            .map(size)
            .collect();
        let expected = ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "64.0 MiB", "3.0 GiB"];
        assert_eq!(shown[..6], expected);
        assert_eq!(shown[6], "16777216.0 TiB", "no unit past TiB");
    }

    #[test]
    fn the_flash_says_how_many_were_forgotten() {
        assert!(flash(0).contains("already empty"));
        assert!(flash(1).contains("1 entry forgotten"));
        assert!(flash(12).contains("12 entries forgotten"));
    }
}
