//! The pages a stand-in node renders, each ending as Moodle's do: `M.cfg` (wwwroot,
//! the session's sesskey, the revisions, the user's id) and the theme CSS and
//! JavaScript links of a Moodle page, so `doctor` reads a stand-in as it reads a
//! real node and a browser pulls cacheable assets through the gateway. What a test
//! reads first (`Hello ann from web1`, the login form) stays the page's first line.

use http::header::HOST;
use http::HeaderMap;

use super::assets::REVISION;
use super::files::SCORM_LAUNCH;

/// The site's address as Moodle writes it into links: the stand-in has no
/// `config.php`, so it takes wwwroot from the request, as the gateway forwards it
/// (the browser's `Host`, and `X-Forwarded-Proto`).
pub(super) fn wwwroot(headers: &HeaderMap, site: &str) -> String {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let scheme = match text("x-forwarded-proto") {
        Some(proto) if proto.trim().eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    let host = text(HOST.as_str()).unwrap_or("localhost");
    format!("{scheme}://{host}{site}")
}

/// Who the page is for: the session's sesskey and the user's id (0: not logged in).
pub(super) struct Viewer<'a> {
    pub(super) wwwroot: &'a str,
    pub(super) sesskey: &'a str,
    pub(super) user_id: u64,
}

impl Viewer<'_> {
    /// What every page ends with: Moodle's settings for its JavaScript and the
    /// theme's links.
    fn tail(&self) -> String {
        let cfg = serde_json::json!({
            "wwwroot": self.wwwroot,
            "sesskey": self.sesskey,
            "sessiontimeout": "28800",
            "themerev": REVISION.to_string(),
            "jsrev": REVISION.to_string(),
            "templaterev": REVISION.to_string(),
            "theme": "boost",
            "userId": self.user_id,
        });
        let root = self.wwwroot;
        format!(
            "<script>\nvar M = {{}}; M.yui = {{}};\nM.cfg = {cfg};\n</script>\n\
             <link rel=\"stylesheet\" href=\"{root}/theme/styles.php/boost/{REVISION}_1/all\">\n\
             <script src=\"{root}/lib/javascript.php/{REVISION}/lib/javascript-static.js\"></script>\n\
             <img src=\"{root}/theme/image.php/boost/core/{REVISION}/i/loading\" alt=\"\">\n"
        )
    }

    /// A usable form for a real browser (the demo), and `logintoken=TOKEN` for scripts.
    pub(super) fn login_form(&self, node: &str, token: &str, error: &str) -> String {
        let root = self.wwwroot;
        format!(
            "<!doctype html><title>Log in</title>{error}<p>Log in on {node} (any name and password)\n\
             <form method=\"post\" action=\"{root}/login/index.php\">\
             <input type=\"hidden\" name=\"logintoken\" value=\"{token}\">\
             <input name=\"username\" value=\"student\"><input name=\"password\" type=\"password\" value=\"x\">\
             <button>Log in</button></form>\n<!-- logintoken={token} -->\n{}",
            self.tail()
        )
    }

    /// A page behind `require_login()`: `Hello` and the user, then `content`.
    pub(super) fn hello(&self, user: &str, node: &str, content: &str) -> String {
        let root = self.wwwroot;
        format!(
            "Hello {user} from {node}\n<p><a href=\"{root}/course/view.php?id=2\">course</a> \
             <a href=\"{root}/mod/scorm/player.php?a=1\">SCORM</a> \
             <a href=\"{root}/login/logout.php?sesskey={}\">log out</a>\n{content}{}",
            self.sesskey,
            self.tail()
        )
    }

    /// The course: its SCORM activity and its handout (a file resource).
    pub(super) fn course(&self) -> String {
        let root = self.wwwroot;
        format!(
            "<h2>Course 2</h2>\n<ul><li><a href=\"{root}/mod/scorm/player.php?a=1\">A SCORM \
             package</a></li>\n<li><a href=\"{root}/mod/resource/view.php?id=31\">Handout</a>\
             </li></ul>\n"
        )
    }

    /// The SCORM player: the package's launch page in a frame, as Moodle's player
    /// loads it, so a browser fetches the SCORM file through the gateway.
    pub(super) fn player(&self) -> String {
        let root = self.wwwroot;
        format!(
            "<h2>SCORM player</h2>\n<iframe src=\"{root}{SCORM_LAUNCH}\" title=\"SCORM\"></iframe>\n\
             <p><a href=\"{root}{SCORM_LAUNCH}\">open the launch page</a>\n"
        )
    }

    /// The user's profile: the courses they are enrolled in.
    pub(super) fn profile(&self) -> String {
        let root = self.wwwroot;
        format!("<h2>Course profiles</h2>\n<a href=\"{root}/user/view.php?id=3&amp;course=2\">Course 2</a>\n")
    }
}
