//! What a Moodle page tells an outsider about the node that rendered it: the doctor's
//! eyes. Every page carries `M.cfg`, the settings Moodle hands its own JavaScript
//! (wwwroot, the session's sesskey, the theme and JavaScript revisions); the login
//! form carries a `logintoken` that Moodle keeps in the session. Reading these from
//! outside needs no account and writes nothing.

use serde_json::Value;

/// The part of `M.cfg` the doctor compares between nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageSettings {
    /// `$CFG->wwwroot` as this node has it.
    pub wwwroot: String,
    /// The session's `sesskey`: the same on two nodes only if they share the session.
    pub sesskey: String,
    /// The revisions in every theme, JavaScript and template URL. Nodes that disagree
    /// link different URLs for the same page: each node's caches were purged apart.
    pub revisions: Revisions,
    /// The signed-in user's id (0 for a visitor).
    pub user_id: u64,
}

/// `themerev`, `jsrev` and `templaterev`, as text (Moodle writes some as numbers).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Revisions {
    /// `theme_get_revision()`: in every theme CSS and image URL.
    pub themerev: String,
    /// `$CFG->jsrev`: in every JavaScript URL.
    pub jsrev: String,
    /// `$CFG->templaterev`: in the Mustache templates' URLs.
    pub templaterev: String,
}

/// Reads `M.cfg = {…};` from a page: `None` when the page has none (not a Moodle
/// page, or an error page printed before the theme was set up).
pub fn page_settings(html: &str) -> Option<PageSettings> {
    let start = html.find("M.cfg = ")? + "M.cfg = ".len();
    // The object is followed by `;` and more script: read exactly one JSON value.
    let mut values = serde_json::Deserializer::from_str(&html[start..]).into_iter::<Value>();
    let cfg = values.next()?.ok()?;
    let text = |key: &str| match cfg.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    Some(PageSettings {
        wwwroot: text("wwwroot"),
        sesskey: text("sesskey"),
        revisions: Revisions {
            themerev: text("themerev"),
            jsrev: text("jsrev"),
            templaterev: text("templaterev"),
        },
        user_id: cfg.get("userId").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// The login form's `logintoken`: Moodle keeps it in the visitor's session and shows
/// the same one again for as long as that session lives, so two nodes shown one
/// session id print the same token only if they read the same session store.
pub fn login_token(html: &str) -> Option<&str> {
    let input = html.find("name=\"logintoken\"")?;
    // The tag's attributes, either side of the name.
    let tag_start = html[..input].rfind('<')?;
    let tag_end = input + html[input..].find('>')?;
    attribute(&html[tag_start..tag_end], "value")
}

fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = start + tag[start..].find('"')?;
    Some(&tag[start..end])
}

/// The first URL on the page that starts with `{wwwroot}{script}`, without the
/// wwwroot: e.g. the page's `/lib/javascript.php/…` link. JSON inside the page
/// escapes `/` as `\/`; both spellings are looked for.
pub fn linked(html: &str, wwwroot: &str, script: &str) -> Option<String> {
    let plain = format!("{wwwroot}{script}");
    let escaped = plain.replace('/', "\\/");
    let (at, escaped_form) = match (html.find(&plain), html.find(&escaped)) {
        (Some(p), Some(e)) if e < p => (e + escaped.len(), true),
        (Some(p), _) => (p + plain.len(), false),
        (None, Some(e)) => (e + escaped.len(), true),
        (None, None) => return None,
    };
    let rest = &html[at..];
    let end = rest.find(['"', '\'', ' ', '<', '>']).unwrap_or(rest.len());
    let mut tail = rest[..end].to_owned();
    if escaped_form {
        tail = tail.replace("\\/", "/");
    }
    Some(format!("{script}{}", tail.replace("&amp;", "&")))
}

/// Whether an answer is Moodle's maintenance page: `503` with `Retry-After`, which both
/// the CLI maintenance file (`climaintenance.html` in the dataroot) and the site
/// administration's maintenance mode send; a 503 without it is a failing server.
pub fn in_maintenance(status: u16, headers: &http::HeaderMap) -> bool {
    status == 503 && headers.contains_key(http::header::RETRY_AFTER)
}

/// Whether a page is the error Moodle prints when `$CFG->reverseproxy` is on while
/// the request's Host is wwwroot's own: the setting is for a proxy that rewrites Host,
/// which this gateway never does.
pub fn reverse_proxy_abused(html: &str) -> bool {
    html.contains("reverseproxyabused")
}

/// The courses a profile page lists (`/user/profile.php`'s "Course profiles": links
/// with `course=ID`), in page order, the site itself (id 1) left out.
pub fn course_ids(html: &str) -> Vec<u64> {
    numbers_after(html, "course=")
        .into_iter()
        .filter(|&id| id != 1)
        .collect()
}

/// The file resources a course page links to (`/mod/resource/view.php?id=CMID`).
pub fn resource_ids(html: &str) -> Vec<u64> {
    numbers_after(html, "/mod/resource/view.php?id=")
}

/// Every distinct number that follows `key`, in order of first appearance.
fn numbers_after(html: &str, key: &str) -> Vec<u64> {
    let mut found = Vec::new();
    for (at, _) in html.match_indices(key) {
        let digits: String = html[at + key.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(id) = digits.parse::<u64>() {
            if !found.contains(&id) {
                found.push(id);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of a Moodle 4.5 login page, as a node rendered it.
    const LOGIN: &str = r#"<script>
//<![CDATA[
var M = {}; M.yui = {};
M.pageloadstarttime = new Date();
M.cfg = {"wwwroot":"http:\/\/127.0.0.1:8080","apibase":"http:\/\/127.0.0.1:8080\/r.php\/api","homeurl":{},"sesskey":"Abc123XyZ9","sessiontimeout":"28800","sessiontimeoutwarning":"1200","themerev":"1725361234","slasharguments":1,"theme":"boost","iconsystemmodule":"core\/icon_system_fontawesome","jsrev":"1725361234","admin":"admin","svgicons":true,"usertimezone":"Europe\/London","language":"en","courseId":1,"courseContextId":2,"contextid":1,"contextInstanceId":0,"langrev":1725361234,"templaterev":1725361235,"siteId":1,"userId":0};var yui1ConfigFn = function(me) {};
//]]>
</script>
<link rel="stylesheet" type="text/css" href="http://127.0.0.1:8080/theme/styles.php/boost/1725361234_1/all" />
<form class="login-form" action="http://127.0.0.1:8080/login/index.php" method="post" id="login">
    <input id="anchor" type="hidden" name="anchor" value="">
    <input type="hidden" name="logintoken" value="k3Fj29sLq0Zx8Wm1">
</form>"#;

    #[test]
    fn the_settings_moodle_gives_its_javascript_are_read_whatever_their_json_type() {
        let settings = page_settings(LOGIN).expect("M.cfg is read");
        assert_eq!(settings.wwwroot, "http://127.0.0.1:8080");
        assert_eq!(settings.sesskey, "Abc123XyZ9");
        assert_eq!(settings.revisions.themerev, "1725361234");
        assert_eq!(settings.revisions.templaterev, "1725361235");
        assert_eq!(settings.user_id, 0);
    }

    #[test]
    fn a_page_without_moodle_settings_says_so() {
        assert_eq!(page_settings("<html>It works!</html>"), None);
        assert_eq!(page_settings("M.cfg = {broken"), None);
    }

    #[test]
    fn the_login_token_is_the_value_of_its_hidden_input() {
        assert_eq!(login_token(LOGIN), Some("k3Fj29sLq0Zx8Wm1"));
        let reordered = r#"<input value="T0k" type="hidden" name="logintoken">"#;
        assert_eq!(login_token(reordered), Some("T0k"));
        assert_eq!(login_token("<form></form>"), None);
    }

    #[test]
    fn a_linked_script_is_found_in_markup_and_in_escaped_json() {
        let css = linked(LOGIN, "http://127.0.0.1:8080", "/theme/styles.php/");
        assert_eq!(
            css.as_deref(),
            Some("/theme/styles.php/boost/1725361234_1/all")
        );
        let json = r#"{"url":"http:\/\/h\/lib\/javascript.php\/17\/lib\/a.js"}"#;
        let js = linked(json, "http://h", "/lib/javascript.php/");
        assert_eq!(js.as_deref(), Some("/lib/javascript.php/17/lib/a.js"));
        assert_eq!(linked(LOGIN, "http://other", "/theme/styles.php/"), None);
    }

    #[test]
    fn courses_and_resources_are_read_from_their_links() {
        let profile = r#"<a href="http://h/user/view.php?id=5&amp;course=2">Course</a>
            <a href="http://h/user/view.php?id=5&amp;course=7">Other</a>
            <a href="http://h/course/view.php?id=2&course=2">again</a> <a href="?course=1">site</a>"#;
        assert_eq!(course_ids(profile), vec![2, 7]);
        let course = r#"<a href="http://h/mod/resource/view.php?id=31">Handout</a>
            <a href="http://h/mod/scorm/view.php?id=30">SCORM</a>"#;
        assert_eq!(resource_ids(course), vec![31]);
    }

    #[test]
    fn maintenance_is_a_503_that_says_when_to_come_back() {
        let mut headers = http::HeaderMap::new();
        assert!(
            !in_maintenance(503, &headers),
            "a 503 alone is a failing server"
        );
        headers.insert(http::header::RETRY_AFTER, "300".parse().unwrap());
        assert!(in_maintenance(503, &headers));
        assert!(!in_maintenance(200, &headers));
    }
}
