//! A PHP node's Moodle-like session behaviour: which scripts run in a session, the
//! login form, login and logout rotating the id, and pages behind `require_login()`
//! (with `$CFG->xsendfile`, `pluginfile.php` too: the student's own node checks the
//! login and names the file for the data server's export).

use bytes::Bytes;
use http::header::{HeaderValue, COOKIE, LOCATION, SET_COOKIE};
use http::request::Parts;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body_util::Full;

use super::pages::{wwwroot, Viewer};
use super::registry::Current;
use super::{assets, files, reply, Inner, StandInConfig};

/// Scripts that never start a session (`NO_MOODLE_COOKIES`), relative to the site path.
/// Deliberately written out again rather than taken from `crate::moodle`: the
/// stand-in plays Moodle, and a test double that shared the gateway's classifier would
/// agree with any mistake in it.
const SESSIONLESS: &[&str] = &[
    "/theme/styles.php",
    "/theme/javascript.php",
    "/theme/image.php",
    "/theme/font.php",
    "/theme/yui_combo.php",
    "/lib/javascript.php",
    "/lib/requirejs.php",
    "/tokenpluginfile.php",
];
/// Scripts that call `require_login()` (and `pluginfile.php` on a node with
/// `$CFG->xsendfile`, which the stand-in then serves as Moodle does).
const LOGIN_REQUIRED: &[&str] = &[
    "/my/",
    "/course/view.php",
    "/mod/scorm/player.php",
    "/mod/scorm/datamodel.php",
    "/mod/resource/view.php",
    "/user/profile.php",
    "/mod/quiz/startattempt.php",
];

/// What a path under the site is, as Moodle's scripts see it.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    /// `tool_heartbeat`: no session, a fixed answer.
    Heartbeat,
    /// `NO_MOODLE_COOKIES` scripts and static files.
    Sessionless,
    /// A script (or directory index) that runs in a session.
    Script(&'a str),
}

/// `rest` is the path below the site; a script is the path up to its first `.php`
/// segment, so slash arguments (`/theme/styles.php/boost/1/all`) name their script.
fn target(rest: &str) -> Target<'_> {
    if rest.starts_with("/admin/tool/heartbeat/") {
        return Target::Heartbeat;
    }
    if rest.starts_with("/webservice/") {
        return Target::Sessionless;
    }
    let script = rest
        .match_indices(".php")
        .map(|(i, _)| &rest[..i + 4])
        .find(|s| matches!(rest.as_bytes().get(s.len()), None | Some(b'/')));
    match script {
        Some(s) if SESSIONLESS.contains(&s) => Target::Sessionless,
        Some(s) => Target::Script(s),
        None if rest.ends_with('/') => Target::Script(rest),
        None => Target::Sessionless,
    }
}

/// The path below `site`, or `None` when the request is outside the site.
fn under<'a>(path: &'a str, site: &str) -> Option<&'a str> {
    match path.strip_prefix(site)? {
        "" => Some("/"),
        rest if rest.starts_with('/') => Some(rest),
        _ => None,
    }
}

impl Inner {
    pub(super) fn node(&self, parts: &Parts, body: &[u8]) -> Response<Full<Bytes>> {
        let Some(rest) = under(parts.uri.path(), &self.config.site_path) else {
            return reply(StatusCode::NOT_FOUND, "not under the site path\n");
        };
        match target(rest) {
            Target::Heartbeat => reply(StatusCode::OK, "Server is ALIVE\n"),
            Target::Sessionless => assets::asset(rest, &self.config.name),
            Target::Script(script) => self.script(script, rest, parts, body),
        }
    }

    /// One script inside a session, then `Set-Cookie` if the session started or rotated.
    fn script(
        &self,
        script: &str,
        rest: &str,
        parts: &Parts,
        body: &[u8],
    ) -> Response<Full<Bytes>> {
        let StandInConfig {
            name,
            site_path: site,
            cookie,
            ..
        } = &self.config;
        let mut current = self
            .registry
            .resolve(name, session_cookie(&parts.headers, cookie));
        let root = wwwroot(&parts.headers, site);
        let post = parts.method == Method::POST;
        let guarded = LOGIN_REQUIRED.contains(&script)
            || script == "/my/index.php"
            || (script == "/pluginfile.php" && self.config.xsendfile);
        let mut response = match script {
            "/login/index.php" if post => self.log_in(&mut current, body, &root),
            "/login/index.php" => {
                let form = viewer(&root, &current).login_form(name, &current.logintoken, "");
                reply(StatusCode::OK, form)
            }
            "/login/logout.php" => self.log_out(&mut current, &root),
            s if guarded => match &current.user {
                None => redirect(format!("{root}/login/index.php")),
                Some(user) => self.behind_login(s, rest, user, viewer(&root, &current), post),
            },
            _ => reply(StatusCode::OK, format!("<p>{script} from {name}\n")),
        };
        if current.issue {
            let line = format!("{cookie}={}; path={site}/; HttpOnly", current.id);
            let line =
                HeaderValue::try_from(line).expect("ids and validated names are header-safe");
            response.headers_mut().append(SET_COOKIE, line);
        }
        response
    }

    /// A script behind `require_login()`, for a logged-in `user`.
    fn behind_login(
        &self,
        script: &str,
        rest: &str,
        user: &str,
        viewer: Viewer<'_>,
        post: bool,
    ) -> Response<Full<Bytes>> {
        let name = &self.config.name;
        let page = |content: &str| reply(StatusCode::OK, viewer.hello(user, name, content));
        match script {
            "/mod/scorm/datamodel.php" if post => reply(StatusCode::OK, "true"),
            // Creates the attempt (the stand-in keeps none) and sends the student on
            // to its first page, as `startattempt.php` does.
            "/mod/quiz/startattempt.php" if post => redirect(format!(
                "{}/mod/quiz/attempt.php?attempt=1&cmid=7",
                viewer.wwwroot
            )),
            "/pluginfile.php" => files::accelerated(rest),
            // The resource's "open" display: straight to its file.
            "/mod/resource/view.php" => redirect(format!("{}{HANDOUT}", viewer.wwwroot)),
            "/course/view.php" => page(&viewer.course()),
            "/mod/scorm/player.php" => page(&viewer.player()),
            "/user/profile.php" => page(&viewer.profile()),
            _ => page(""),
        }
    }

    /// `login_user()` after the `logintoken` check: any username and password pass.
    fn log_in(&self, current: &mut Current, body: &[u8], root: &str) -> Response<Full<Bytes>> {
        let name = &self.config.name;
        if form_value(body, "logintoken").as_deref() != Some(current.logintoken.as_str()) {
            let error = "<p class=\"error\">invalidlogintoken: your session may have timed out\n";
            let form = viewer(root, current).login_form(name, &current.logintoken, error);
            return reply(StatusCode::OK, form);
        }
        let user = form_value(body, "username").filter(|u| !u.is_empty());
        let user = user.unwrap_or_else(|| "student".to_owned());
        self.registry.rotate(name, current, Some(user));
        redirect(format!("{root}/my/"))
    }

    /// `terminate_current()`: a logged-in student gets a new anonymous session.
    fn log_out(&self, current: &mut Current, root: &str) -> Response<Full<Bytes>> {
        if current.user.is_some() {
            self.registry.rotate(&self.config.name, current, None);
        }
        redirect(format!("{root}/"))
    }
}

/// The handout's file, below the site: where its resource page sends the student.
const HANDOUT: &str = "/pluginfile.php/31/mod_resource/content/1/handout.txt";

/// The page settings of `current`'s session: its sesskey is part of its login
/// token here (Moodle keeps both in the session).
fn viewer<'a>(root: &'a str, current: &'a Current) -> Viewer<'a> {
    Viewer {
        wwwroot: root,
        sesskey: current.logintoken.get(..10).unwrap_or(""),
        user_id: if current.user.is_some() { 3 } else { 0 },
    }
}

/// Moodle's `redirect()` answers 303 See Other, to an absolute URL under wwwroot.
fn redirect(location: String) -> Response<Full<Bytes>> {
    let mut response = reply(StatusCode::SEE_OTHER, "");
    let location = HeaderValue::try_from(location).expect("site paths are header-safe");
    response.headers_mut().insert(LOCATION, location);
    response
}

/// The first cookie called `name` across all `Cookie` headers, as PHP reads it;
/// empty and `deleted` count as no cookie.
fn session_cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let (_, value) = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)?;
    (!value.is_empty() && value != "deleted").then_some(value)
}

fn form_value(body: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let (_, value) = text
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == key)?;
    let value = value.replace('+', " ");
    Some(
        percent_encoding::percent_decode_str(&value)
            .decode_utf8_lossy()
            .into_owned(),
    )
}
