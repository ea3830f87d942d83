//! Moodle's revisioned assets: the theme and JavaScript scripts whose URL carries
//! the revision of the bytes they serve, so that one URL's answer can never change.
//!
//! Why the gateway may keep them: each of these scripts is `NO_MOODLE_COOKIES` (it
//! never reads or starts a session), and Moodle bumps the theme revision
//! (`theme_get_revision()`) or the JavaScript revision (`$CFG->jsrev`) whenever the
//! bytes change, so a new theme or a new build is a new URL and nothing goes stale.
//! Moodle itself marks such an answer `Cache-Control: public, max-age=…, immutable`.
//!
//! The revision rule is Moodle's own `min_is_revision_valid_and_current()`: a
//! revision is an integer, positive, and not more than 60 s in the future; Moodle
//! serves anything else (`-1` in theme designer mode or with `$CFG->cachejs = false`,
//! `0`, a forged far-future number) uncached, and so does the gateway. Where each
//! script carries it:
//! - `theme/styles.php/{theme}/{rev}[_{subrev}]/{type}` (an `_s/` prefix for
//!   non-SVG), or `?theme=&rev=&type=`;
//! - `theme/javascript.php/{theme}/{rev}/{type}`, or `?theme=&rev=&type=`;
//! - `theme/image.php/[_s/]{theme}/{component}/{rev}/{image}`, or `?…&rev=`;
//! - `theme/font.php/{theme}/{component}/{rev}/{font}`, or `?…&rev=`;
//! - `lib/javascript.php/{rev}/{file}`, or `?rev=&jsfile=`;
//! - `lib/requirejs.php/{rev}/{file}` (slash arguments only);
//! - `theme/yui_combo.php?{part}&{part}…`: each `m/{rev}/…` part (Moodle's own YUI
//!   modules) carries the JavaScript revision, a YUI release part carries its version;
//!   a part with `/-1/` anywhere means "never cache" (Moodle's own test).

use super::php::{php_urldecode, split_pair};

/// The most a revision may lie in the future: Moodle's `min_get_maximum_revision()`.
const FUTURE_SLACK: u64 = 60;

/// Where a script keeps the revision in its slash argument, and under which query
/// key in its plain form.
struct Script {
    path: &'static str,
    /// The revision's position among the slash argument's segments (after `_s/`).
    segment: usize,
    /// The query key of the same revision; `None`: slash arguments only.
    key: Option<&'static str>,
}

const SCRIPTS: [Script; 6] = [
    Script {
        path: "/theme/styles.php",
        segment: 1,
        key: Some("rev"),
    },
    Script {
        path: "/theme/javascript.php",
        segment: 1,
        key: Some("rev"),
    },
    Script {
        path: "/theme/image.php",
        segment: 2,
        key: Some("rev"),
    },
    Script {
        path: "/theme/font.php",
        segment: 2,
        key: Some("rev"),
    },
    Script {
        path: "/lib/javascript.php",
        segment: 0,
        key: Some("rev"),
    },
    Script {
        path: "/lib/requirejs.php",
        segment: 0,
        key: None,
    },
];

const YUI_COMBO: &str = "/theme/yui_combo.php";

/// Whether `rel` (the path within the site, as PHP reads it) with `query` is one of
/// Moodle's revisioned assets at a revision that may be kept, `now` being Unix
/// seconds.
pub(super) fn is_revisioned(rel: &str, query: Option<&str>, now: u64) -> bool {
    if let Some(info) = rel.strip_prefix(YUI_COMBO) {
        return info.is_empty() && query.is_some_and(|q| yui_parts_keepable(q, now));
    }
    SCRIPTS.iter().any(|script| {
        let Some(info) = rel.strip_prefix(script.path) else {
            return false;
        };
        let revision = match info {
            "" => script.key.and_then(|key| query_value(query?, key)),
            slash if slash.starts_with('/') => slash_segment(slash, script.segment),
            _ => return false,
        };
        revision.is_some_and(|r| is_current(&r, now))
    })
}

/// The revision segment of a slash argument (`/_s/boost/…` skips the `_s`).
fn slash_segment(info: &str, segment: usize) -> Option<String> {
    let rest = info.trim_start_matches('/');
    let rest = rest.strip_prefix("_s/").unwrap_or(rest);
    rest.split('/').nth(segment).map(str::to_owned)
}

/// The first value of `key` in `query`, decoded as PHP decodes it.
fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (name, value) = split_pair(pair.as_bytes());
        let name: Vec<u8> = php_urldecode(name).collect();
        (name == key.as_bytes()).then(|| {
            String::from_utf8_lossy(&php_urldecode(value).collect::<Vec<_>>()).into_owned()
        })
    })
}

/// Moodle's rule: the integer before any `_subrev`, positive, not in the future.
fn is_current(revision: &str, now: u64) -> bool {
    let number = revision.split('_').next().unwrap_or("");
    let digits = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    digits
        && number
            .parse::<u64>()
            .is_ok_and(|r| r > 0 && r <= now + FUTURE_SLACK)
}

/// `yui_combo.php`'s parts: none says `-1`, and each of Moodle's own modules
/// (`m/{rev}/…`) has a current revision.
fn yui_parts_keepable(query: &str, now: u64) -> bool {
    let mut parts = query.split('&').filter(|p| !p.is_empty()).peekable();
    if parts.peek().is_none() || query.contains("/-1/") {
        return false;
    }
    parts.all(|part| match part.strip_prefix("m/") {
        Some(rest) => rest.split('/').next().is_some_and(|r| is_current(r, now)),
        // A YUI release (`3.18.1/…`, `rollup/3.18.1/…`, `gallery/…`): versioned.
        None => part.contains('/'),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_000_000;
    const REV: &str = "1763990000";

    fn kept(rel: &str, query: Option<&str>) -> bool {
        is_revisioned(rel, query, NOW)
    }

    #[test]
    fn each_script_carries_its_revision_where_moodle_reads_it() {
        for rel in [
            format!("/theme/styles.php/boost/{REV}_1/all"),
            format!("/theme/styles.php/_s/boost/{REV}/all"),
            format!("/theme/javascript.php/boost/{REV}/footer"),
            format!("/theme/image.php/boost/core/{REV}/t/edit"),
            format!("/theme/image.php/_s/boost/core/{REV}/t/edit"),
            format!("/theme/font.php/boost/core/{REV}/fontawesome-webfont.woff2"),
            format!("/lib/javascript.php/{REV}/lib/polyfills/polyfill.js"),
            format!("/lib/requirejs.php/{REV}/core/first.js"),
        ] {
            assert!(kept(&rel, None), "{rel}");
        }
        let query = format!("theme=boost&rev={REV}&type=all");
        assert!(kept("/theme/styles.php", Some(&query)));
        let query = format!("rev={REV}&jsfile=/lib/a.js");
        assert!(kept("/lib/javascript.php", Some(&query)));
    }

    #[test]
    fn designer_mode_zero_the_future_garbage_or_no_revision_is_never_kept() {
        for rev in [
            "-1",
            "0",
            "1764000061",
            "99999999999999999999",
            "abc",
            "",
            "+5",
        ] {
            let rel = format!("/theme/styles.php/boost/{rev}/all");
            assert!(!kept(&rel, None), "{rel}");
            let rel = format!("/lib/requirejs.php/{rev}/core/first.js");
            assert!(!kept(&rel, None), "{rel}");
        }
        assert!(
            kept("/lib/requirejs.php/1764000060/core/first.js", None),
            "within Moodle's 60 s"
        );
        assert!(
            !kept("/theme/styles.php", Some("theme=boost")),
            "no rev: uncached"
        );
        assert!(
            !kept("/lib/requirejs.php", Some(&format!("rev={REV}"))),
            "slash arguments only"
        );
        assert!(!kept("/theme/styles.phpx/boost/1/all", None));
        assert!(
            !kept("/course/view.php", Some(&format!("rev={REV}"))),
            "another script"
        );
        assert!(
            !kept("/pluginfile.php/1/theme_boost/logo/1/x.png", None),
            "files check the login"
        );
    }

    #[test]
    fn yui_combo_parts_are_judged_one_by_one() {
        let modules = format!("m/{REV}/core/event/event-min.js&m/{REV}/core/dock/dock-min.js");
        assert!(kept(YUI_COMBO, Some(&modules)));
        assert!(kept(
            YUI_COMBO,
            Some("rollup/3.18.1/yui-moodlesimple-min.js")
        ));
        assert!(kept(YUI_COMBO, Some("3.18.1/cssbutton/cssbutton-min.css")));
        assert!(
            !kept(YUI_COMBO, Some("m/-1/core/event/event-min.js")),
            "designer mode"
        );
        let mixed = format!("m/{REV}/core/a-min.js&m/0/core/b-min.js");
        assert!(!kept(YUI_COMBO, Some(&mixed)), "one part at revision 0");
        assert!(!kept(YUI_COMBO, Some("")) && !kept(YUI_COMBO, None));
    }
}
