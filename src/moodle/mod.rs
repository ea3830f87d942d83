//! Everything the gateway knows about Moodle, so no other module has to: which requests are
//! SCORM files, which never touch a session, and which session id PHP reads or a node issues.
//!
//! Every decision here is taken on a request *as the PHP backend will read it*: the web server
//! decodes and resolves the path, PHP decodes cookie and query names, and Moodle's `PARAM_PATH`
//! silently drops some characters from file paths. Deciding on the raw bytes instead would let a
//! disguised URL reach a node the gateway did not mean it for, and one misrouted request can log
//! a student out of every node (the book's "Moodle behind a proxy", docs/src/moodle.md, "When
//! the id changes"). What cannot be read only one way is refused ([`AmbiguousPath`]) rather
//! than guessed. The facts behind each rule are in that chapter.
//!
//! Three readers do the detailed work: `paths` (a path as PHP reads it, and which
//! URL forms serve SCORM files), `cookies` (the session id a request carries and the
//! one a node issues) and `php` (how PHP decodes names and values, which both share).
//! This file holds what they decide: the kinds of request, and the site they belong to.

mod cookies;
mod login;
mod masking;
mod pages;
mod paths;
mod php;
mod revisions;
mod work;

pub use cookies::{is_valid_session_id, IssuedSession};
pub use login::{login_attempt, may_try_password, username_in, LoginAttempt, LOGIN_FORM_MAX};
pub use masking::{masked, Masked};
pub use pages::{
    course_ids, in_maintenance, linked, login_token, page_settings, resource_ids,
    reverse_proxy_abused, PageSettings, Revisions,
};
pub use work::{is_attempt_page, opens_first_page, work, Work};

use paths::{file_script, normalise_path, serves_scorm};

/// What a request is, as far as routing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// A SCORM package file (`mod_scorm` component): always the data server.
    ScormFile,
    /// Never starts or reads a Moodle session (`NO_MOODLE_COOKIES` scripts, static files):
    /// any node, and it must not advance the new-session deal.
    Sessionless,
    /// A PHP script that runs inside the student's session.
    Page(PageKind),
}

/// The session-lifecycle scripts the affinity table cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// `/login/index.php`: a rotation on its response means the student logged in.
    Login,
    /// `/login/logout.php`: a rotation on its response means a new anonymous session.
    Logout,
    /// `/login/token.php`: the Moodle app's login, a username and password
    /// exchanged for a web-service token (see `login`).
    Token,
    /// `/mod/quiz/startattempt.php`: its POST creates a quiz attempt (see `work`).
    QuizStart,
    /// A script of an open quiz attempt: `attempt.php`, `processattempt.php`,
    /// `autosave.ajax.php`, `summary.php` (see `work`).
    QuizAttempt,
    /// Any other script.
    Other,
}

/// A request path the PHP backend could read in more than one way
/// (an encoded `/`, NUL, a backslash, `..` above the root): answered 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousPath;

/// Whether the student holding a freshly issued session id is logged in, judged from
/// the request on which the node issued it: a successful login POST rotates the id
/// into a logged-in session, a logout into a new anonymous one. Elsewhere Moodle
/// regenerates a live id only at login through another auth plugin's URL, or when it
/// times out or kills a session; calling that logged in keeps the longer idle limit,
/// the safe mistake for node-local sessions. A first id (`rotated` false) is a guest's.
pub fn logged_in_after(kind: RequestKind, is_post: bool, rotated: bool) -> bool {
    match kind {
        RequestKind::Page(PageKind::Login) if is_post => true,
        RequestKind::Page(PageKind::Logout) => false,
        _ => rotated,
    }
}

/// Whether Moodle replaces the session id on this request by design: login
/// (`session_regenerate_id`) and logout (a new anonymous session). Anywhere else, a
/// logged-in student's new id means the student was logged out.
pub fn rotates_by_design(kind: RequestKind) -> bool {
    matches!(kind, RequestKind::Page(PageKind::Login | PageKind::Logout))
}

/// Whether a GET or HEAD may be sent again after its node closed the connection
/// without answering. Moodle guards every state-changing link with `sesskey` in its
/// query (`require_sesskey()`: logout, subscribe and unsubscribe toggles, course edits,
/// "mark as done"): the node may have acted before it died, and a toggle sent twice
/// undoes itself. Pages without it only read.
pub fn may_repeat(query: Option<&str>) -> bool {
    let Some(query) = query else {
        return true;
    };
    !query
        .split('&')
        .any(|pair| pair.split('=').next() == Some("sesskey"))
}

/// Whether a path a node named with `X-Accel-Redirect`, taken after the alias of the
/// dataroot (`$CFG->xsendfilealiases`), lies in Moodle's default `$CFG->localcachedir`,
/// `{dataroot}/localcache`. `theme/image.php`, `font.php`, `javascript.php` and
/// `requirejs.php` accelerate their cached copies only while that directory is under an
/// alias, which is exactly the default; a file export set up for the file pool
/// (`filedir/`) then answers them 404, and only the site's config can fix it.
pub fn in_default_localcache(under_alias: &str) -> bool {
    under_alias.starts_with("localcache/")
}

/// The smallest upload limit Moodle offers an admin, 10 KB (`get_max_upload_sizes()`
/// in `lib/moodlelib.php` starts its list at 10240 bytes). A request body limit below
/// it refuses what Moodle itself would accept: a forum post, a quiz page, a login
/// form is already a few hundred bytes.
pub const SMALLEST_UPLOAD_LIMIT: u64 = 10 * 1024;

/// One Moodle site as the gateway sees it: its sub-path and session cookie.
#[derive(Debug, Clone)]
pub struct Site {
    path: String,
    cookie: String,
    cookie_path: String,
}

/// `NO_MOODLE_COOKIES` scripts, also reached with path info after them.
const SESSIONLESS_SCRIPTS: [&str; 9] = [
    "/theme/styles.php",
    "/theme/javascript.php",
    "/theme/image.php",
    "/theme/font.php",
    "/theme/yui_combo.php",
    "/lib/javascript.php",
    "/lib/requirejs.php",
    "/tokenpluginfile.php",
    "/webservice",
];

/// `tool_heartbeat`: probed constantly, so it must never cost a session row.
const HEARTBEAT: [&str; 3] = [
    "/admin/tool/heartbeat",
    "/admin/tool/heartbeat/",
    "/admin/tool/heartbeat/index.php",
];

impl Site {
    /// `path` is `""` or `"/moodle"`; `cookie` the full cookie name; `cookie_path` its Path.
    pub fn new(path: &str, cookie: &str, cookie_path: &str) -> Self {
        Site {
            // A stray trailing slash would make every prefix test miss.
            path: path.trim_end_matches('/').to_owned(),
            cookie: cookie.to_owned(),
            cookie_path: cookie_path.to_owned(),
        }
    }

    /// The session cookie's `Path`: the gateway's own cookies use it too, so they
    /// travel with every request that carries the session.
    pub fn cookie_path(&self) -> &str {
        &self.cookie_path
    }

    /// Classifies a request from its path and raw query, decided on the path as PHP will read it.
    ///
    /// Outside the site's sub-path nothing is Moodle, so only the static-file rule applies there.
    pub fn classify(&self, path: &str, query: Option<&str>) -> Result<RequestKind, AmbiguousPath> {
        let normal = normalise_path(path)?;
        let Some(rel) = self.within(&normal) else {
            return Ok(if is_static_file(&normal) {
                RequestKind::Sessionless
            } else {
                RequestKind::Page(PageKind::Other)
            });
        };
        if let Some((script, info)) = file_script(rel) {
            if serves_scorm(script, info, path, query)? {
                return Ok(RequestKind::ScormFile);
            }
        }
        if is_sessionless(rel) {
            return Ok(RequestKind::Sessionless);
        }
        Ok(RequestKind::Page(match rel {
            "/login/index.php" => PageKind::Login,
            "/login/logout.php" => PageKind::Logout,
            "/login/token.php" => PageKind::Token,
            "/mod/quiz/startattempt.php" => PageKind::QuizStart,
            "/mod/quiz/attempt.php"
            | "/mod/quiz/processattempt.php"
            | "/mod/quiz/autosave.ajax.php"
            | "/mod/quiz/summary.php" => PageKind::QuizAttempt,
            _ => PageKind::Other,
        }))
    }

    /// Whether a request comes from the Moodle app rather than a browser: the app's
    /// user agent says `MoodleMobile`, and it speaks to the web services and
    /// `login/token.php` with tokens, never a page. Such a request must be answered
    /// in JSON: the app shows an HTML page's bytes as a broken answer.
    pub fn is_app_request(&self, path: &str, user_agent: Option<&[u8]>) -> bool {
        let from_app =
            user_agent.is_some_and(|ua| memchr::memmem::find(ua, b"MoodleMobile").is_some());
        from_app
            || (path.strip_prefix(self.path.as_str()))
                .is_some_and(|rel| rel.starts_with("/webservice/") || rel == "/login/token.php")
    }

    /// Whether a request for `path` and `query` asks for one of Moodle's revisioned
    /// assets (theme CSS, JavaScript, images, fonts) at a revision whose bytes can
    /// never change, `now` being Unix seconds: an answer the gateway may keep (see
    /// `revisions`).
    pub fn is_revisioned_asset(&self, path: &str, query: Option<&str>, now: u64) -> bool {
        let Ok(normal) = normalise_path(path) else {
            return false;
        };
        (self.within(&normal)).is_some_and(|rel| revisions::is_revisioned(rel, query, now))
    }

    /// The path relative to the site, `None` when it lies outside the site's sub-path.
    fn within<'p>(&self, path: &'p str) -> Option<&'p str> {
        match path.strip_prefix(self.path.as_str())? {
            "" => Some("/"),
            rest if rest.starts_with('/') => Some(rest),
            _ => None,
        }
    }
}

fn is_sessionless(rel: &str) -> bool {
    let script = |s: &&str| {
        rel.strip_prefix(*s)
            .is_some_and(|i| i.is_empty() || i.starts_with('/'))
    };
    SESSIONLESS_SCRIPTS.iter().any(script) || HEARTBEAT.contains(&rel) || is_static_file(rel)
}

/// A file the web server sends itself: an extension other than `.php` (in any case, as some
/// servers match it so) and no `.php/` before it. Anything else may run PHP, and sending a
/// session-bearing request to a random node is the dangerous mistake.
///
/// Every request asks, so it reads bytes from the end: `str::rsplit_once` spent some
/// 400 instructions a request setting up its searches for two short ones.
fn is_static_file(path: &str) -> bool {
    let bytes = path.as_bytes();
    let slash = bytes.iter().rposition(|&b| b == b'/');
    let (dirs, last) = match slash {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (&[][..], bytes),
    };
    let has_ext = match last.iter().rposition(|&b| b == b'.') {
        Some(dot) => {
            let ext = &last[dot + 1..];
            !ext.is_empty() && !ext.eq_ignore_ascii_case(b"php")
        }
        None => false,
    };
    has_ext && !dirs.split(|&b| b == b'/').any(ends_with_php)
}

fn ends_with_php(s: &[u8]) -> bool {
    s.len() >= 4 && s[s.len() - 4..].eq_ignore_ascii_case(b".php")
}

/// `text.split(byte as char)` for an ASCII `byte`, found byte by byte: the pieces cut
/// here (a path's segments, a `Set-Cookie` line's attributes) are a few bytes long,
/// and `split`'s searcher costs more to set up for each (a `memchr`) than the search:
/// some 125 instructions a segment on every SCORM file's request, 160 a piece of a new
/// session's line.
fn split_at(text: &str, byte: u8) -> impl Iterator<Item = &str> {
    debug_assert!(byte.is_ascii(), "a cut inside a character");
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let now = rest?;
        match now.bytes().position(|b| b == byte) {
            Some(at) => {
                rest = Some(&now[at + 1..]);
                Some(&now[..at])
            }
            None => {
                rest = None;
                Some(now)
            }
        }
    })
}

#[cfg(test)]
mod tests;
