//! Everything the gateway knows about Moodle, so no other module has to: which requests are
//! SCORM files, which never touch a session, and which session id PHP reads or a node issues.
//!
//! Every decision here is taken on a request *as the PHP backend will read it*: the web server
//! decodes and resolves the path, PHP decodes cookie and query names, and Moodle's `PARAM_PATH`
//! silently drops some characters from file paths. Deciding on the raw bytes instead would let a
//! disguised URL reach a node the gateway did not mean it for, and one misrouted request can log
//! a student out of every node (MOODLE.md). What cannot be read only one way is refused
//! ([`AmbiguousPath`]) rather than guessed. The facts behind each rule are in MOODLE.md.

use std::borrow::Cow;

use cookie::time::{Duration, OffsetDateTime};
use cookie::Cookie;
use http::header::{COOKIE, SET_COOKIE};
use http::HeaderMap;
use percent_encoding::percent_decode_str;

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
    /// Any other script.
    Other,
}

/// A request path the PHP backend could read in more than one way
/// (an encoded `/`, NUL, a backslash, `..` above the root): answered 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousPath;

/// A session cookie seen in a node's `Set-Cookie`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuedSession<'a> {
    /// The node started or rotated to this (valid) session id.
    Id(&'a str),
    /// The node cleared the cookie (`deleted`, empty, expired).
    Cleared,
}

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

/// The scripts that serve stored files through `get_file_argument()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileScript {
    /// `pluginfile.php` and `webservice/pluginfile.php`: `/{ctx}/{component}/…`.
    Plugin,
    /// `tokenpluginfile.php`: `/{token}/{ctx}/{component}/…`.
    Token,
    /// Moodle 1.9 `file.php`: `/{courseid}/moddata/scorm/…`.
    Legacy,
}

const FILE_SCRIPTS: [(&str, FileScript); 4] = [
    ("/pluginfile.php", FileScript::Plugin),
    ("/webservice/pluginfile.php", FileScript::Plugin),
    ("/tokenpluginfile.php", FileScript::Token),
    ("/file.php", FileScript::Legacy),
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
            _ => PageKind::Other,
        }))
    }

    /// The session id PHP would read from the request's `Cookie` headers, if it is a valid one.
    /// Borrowed from `headers`: no allocation.
    ///
    /// PHP keeps the first cookie of a name and drops an invalid id rather than looking further,
    /// so a later cookie never decides. Parsed as bytes, as PHP does, so stray non-UTF-8 bytes
    /// elsewhere in a header neither panic nor hide the cookie.
    pub fn session_id<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        let value = headers
            .get_all(COOKIE)
            .iter()
            .flat_map(|h| h.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| {
                let (name, value) = split_pair(pair.trim_ascii_start());
                (!name.is_empty() && php_name_is(name, &self.cookie)).then_some(value)
            })?;
        std::str::from_utf8(value)
            .ok()
            .filter(|v| is_valid_session_id(v))
    }

    /// The session cookie a node's response sets for this site; the last matching line wins.
    ///
    /// The last line wins because the browser applies them in order (PHP sends two when it
    /// regenerates an id); a last line with an invalid value leaves nothing to bind, so `None`.
    pub fn issued_session<'a>(&self, headers: &'a HeaderMap) -> Option<IssuedSession<'a>> {
        self.issued_session_at(headers, OffsetDateTime::now_utc)
    }

    /// Runs on every response: lines for other cookies are skipped before any parsing,
    /// and the clock is read only for a session cookie that carries `Expires`.
    fn issued_session_at<'a>(
        &self,
        headers: &'a HeaderMap,
        now: impl FnOnce() -> OffsetDateTime,
    ) -> Option<IssuedSession<'a>> {
        let line = headers
            .get_all(SET_COOKIE)
            .iter()
            .filter(|h| self.names_session_cookie(h.as_bytes()))
            .filter_map(|h| Cookie::parse(std::str::from_utf8(h.as_bytes()).ok()?).ok())
            .rfind(|c| c.name() == self.cookie && c.path().is_none_or(|p| p == self.cookie_path))?;
        // RFC 6265: Max-Age, when present, overrides Expires.
        let expired = match (line.max_age(), line.expires_datetime()) {
            (Some(age), _) => age <= Duration::ZERO,
            (None, Some(at)) => at <= now(),
            (None, None) => false,
        };
        let value = line.value_raw()?;
        if expired || value.is_empty() || value == "deleted" {
            return Some(IssuedSession::Cleared);
        }
        is_valid_session_id(value).then_some(IssuedSession::Id(value))
    }

    /// A cheap first look at a `Set-Cookie` line: does it set a cookie of our name?
    fn names_session_cookie(&self, line: &[u8]) -> bool {
        line.trim_ascii_start()
            .strip_prefix(self.cookie.as_bytes())
            .is_some_and(|rest| rest.trim_ascii_start().first() == Some(&b'='))
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

/// Whether `s` is an id PHP would accept (`session.sid_length` 22–256, `[A-Za-z0-9,-]`):
/// anything else is never a key the gateway can route on.
pub fn is_valid_session_id(s: &str) -> bool {
    (22..=256).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b',' || b == b'-')
}

/// The path as the web server hands it to PHP: decoded, `.`/`..` resolved, `//` collapsed.
/// Borrows when there is nothing to do, because this runs on every proxied request.
fn normalise_path(raw: &str) -> Result<Cow<'_, str>, AmbiguousPath> {
    // `*` (OPTIONS *) and other non-path targets name no script a node could run.
    if !raw.starts_with('/') {
        return Err(AmbiguousPath);
    }
    // One pass over the bytes: refused bytes, escapes, `//`, `.` and `..` segments.
    let bytes = raw.as_bytes();
    let mut plain = true;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            0 | b'\\' => return Err(AmbiguousPath),
            b'%' => plain = false,
            b'/' => {
                if let [b'/', ..]
                | [b'.']
                | [b'.', b'/', ..]
                | [b'.', b'.']
                | [b'.', b'.', b'/', ..] = bytes[i + 1..]
                {
                    plain = false;
                }
            }
            _ => {}
        }
    }
    if plain {
        return Ok(Cow::Borrowed(raw));
    }
    let decoded = decode_path(raw)?;
    if decoded.contains(['\0', '\\']) {
        return Err(AmbiguousPath);
    }
    resolve_dots(&decoded).map(Cow::Owned)
}

/// Percent-decodes a path. An encoded `/` is refused because servers disagree on whether it
/// separates segments; a malformed escape because they answer it 400 or pass it through.
fn decode_path(raw: &str) -> Result<Cow<'_, str>, AmbiguousPath> {
    let bytes = raw.as_bytes();
    for (i, _) in raw.match_indices('%') {
        match bytes.get(i + 1..i + 3) {
            Some([b'2', b'f' | b'F']) => return Err(AmbiguousPath),
            Some([h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {}
            _ => return Err(AmbiguousPath),
        }
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| AmbiguousPath)
}

/// Resolves `.`, `..` and empty segments, keeping a trailing slash (a directory index).
fn resolve_dots(path: &str) -> Result<String, AmbiguousPath> {
    let mut out = String::with_capacity(path.len());
    let mut last = "";
    for seg in path.split('/') {
        last = seg;
        match seg {
            "" | "." => {}
            ".." => out.truncate(out.rfind('/').ok_or(AmbiguousPath)?),
            _ => {
                out.push('/');
                out.push_str(seg);
            }
        }
    }
    if out.is_empty() || matches!(last, "" | "." | "..") {
        out.push('/');
    }
    Ok(out)
}

/// The file-serving script `rel` runs, with its path info.
fn file_script(rel: &str) -> Option<(FileScript, &str)> {
    FILE_SCRIPTS.iter().find_map(|&(script, kind)| {
        let info = rel.strip_prefix(script)?;
        (info.is_empty() || info.starts_with('/')).then_some((kind, info))
    })
}

/// Whether the file Moodle will serve belongs to SCORM, following `get_file_argument()`:
/// path info wins only when the raw URI contains `/pluginfile.php/` and the path info has more
/// than two segments; otherwise a non-empty `file` parameter does.
fn serves_scorm(
    script: FileScript,
    info: &str,
    raw_path: &str,
    query: Option<&str>,
) -> Result<bool, AmbiguousPath> {
    const FORCED: &str = "/pluginfile.php/";
    let in_uri = raw_path.contains(FORCED) || query.is_some_and(|q| q.contains(FORCED));
    let forced = in_uri && info.trim_start_matches('/').split('/').count() > 2;
    let param = match query {
        Some(q) if !forced => file_parameter(q)?,
        _ => None,
    };
    let relative = match &param {
        Some(file) if file.chars().any(|c| !dropped_by_moodle(c)) => file.as_str(),
        _ => info,
    };
    let mut segs = moodle_segments(relative);
    if script == FileScript::Token {
        segs.next();
    }
    Ok(match script {
        FileScript::Plugin | FileScript::Token => {
            matches!((segs.next(), segs.next()), (Some(ctx), Some(component))
                if is_number(ctx) && cleaned_is(component, "mod_scorm"))
        }
        FileScript::Legacy => {
            matches!((segs.next(), segs.next(), segs.next()), (Some(course), Some(m), Some(s))
                if is_number(course) && cleaned_is(m, "moddata") && cleaned_is(s, "scorm"))
        }
    })
}

/// The last `file` query parameter (PHP keeps the last), decoded. Moodle drops `..` segments
/// where the web server would resolve them, and reads `\` as `/`: both refused.
fn file_parameter(query: &str) -> Result<Option<String>, AmbiguousPath> {
    let Some(raw) = query
        .split('&')
        .map(|pair| split_pair(pair.as_bytes()))
        .rfind(|(name, _)| php_name_is(name, "file"))
        .map(|(_, value)| value)
    else {
        return Ok(None);
    };
    let value = String::from_utf8(php_urldecode(raw).collect()).map_err(|_| AmbiguousPath)?;
    if value.contains(['\0', '\\']) || value.contains("..") {
        return Err(AmbiguousPath);
    }
    Ok(Some(value))
}

/// Characters `PARAM_PATH` deletes from every segment of a file path (so `mod_s:corm` is
/// `mod_scorm` to Moodle).
fn dropped_by_moodle(c: char) -> bool {
    c.is_ascii_control() || matches!(c, '&' | '<' | '>' | '"' | '`' | '|' | '\'' | ':')
}

fn cleaned_is(segment: &str, name: &str) -> bool {
    segment
        .chars()
        .filter(|&c| !dropped_by_moodle(c))
        .eq(name.chars())
}

/// Whether `file_pluginfile()` reads the segment as a context (or course) id: it takes
/// `(int)` of it, and PHP's cast skips leading spaces and a `+`, then reads the leading
/// digits, so `1x`, ` 1`, `+1`, `1.5` and `1e1` all name context 1 (or 10); `0`, `-1`
/// and `x1` name none, and Moodle answers them 404 from any node.
fn is_number(segment: &str) -> bool {
    let mut chars = segment
        .chars()
        .filter(|&c| !dropped_by_moodle(c))
        .skip_while(|&c| c == ' ')
        .peekable();
    chars.next_if_eq(&'+');
    chars
        .take_while(char::is_ascii_digit)
        .any(|digit| digit != '0')
}

/// The segments `file_pluginfile()` explodes, after `PARAM_PATH` has emptied and dropped some.
fn moodle_segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter(|s| !cleaned_is(s, "") && !cleaned_is(s, ".") && !cleaned_is(s, ".."))
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
fn is_static_file(path: &str) -> bool {
    let (dirs, last) = path.rsplit_once('/').unwrap_or(("", path));
    let has_ext = last
        .rsplit_once('.')
        .is_some_and(|(_, ext)| !ext.is_empty() && !ext.eq_ignore_ascii_case("php"));
    has_ext && !dirs.split('/').any(|d| ends_with_php(d.as_bytes()))
}

fn ends_with_php(s: &[u8]) -> bool {
    s.len() >= 4 && s[s.len() - 4..].eq_ignore_ascii_case(b".php")
}

/// Splits `name=value`; a bare `name` has an empty value, as in PHP.
fn split_pair(pair: &[u8]) -> (&[u8], &[u8]) {
    match pair.iter().position(|&b| b == b'=') {
        Some(i) => (&pair[..i], &pair[i + 1..]),
        None => (pair, b""),
    }
}

/// Whether PHP registers a raw cookie or query name as `name`: it URL-decodes it, skips leading
/// spaces, stops at NUL and turns `.` and ` ` into `_` (so `Moodle%53ession` is `MoodleSession`).
fn php_name_is(raw: &[u8], name: &str) -> bool {
    // Every request's cookies pass through here: a name with nothing PHP would
    // decode or replace is compared as it is.
    if !raw
        .iter()
        .any(|&b| matches!(b, b'%' | b'+' | b'.' | b' ' | 0))
    {
        return raw == name.as_bytes();
    }
    php_urldecode(raw)
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0)
        .map(|b| if b == b'.' || b == b' ' { b'_' } else { b })
        .eq(name.bytes())
}

/// PHP's `urldecode()`: `+` is a space, `%XX` a byte, a malformed `%` stays itself.
fn php_urldecode(s: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *s.get(i)?;
        i += 1;
        let hex = |at: usize| (*s.get(at)? as char).to_digit(16);
        Some(match (b, hex(i), hex(i + 1)) {
            (b'+', ..) => b' ',
            (b'%', Some(h), Some(l)) => {
                i += 2;
                (h * 16 + l) as u8
            }
            _ => b,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use IssuedSession::{Cleared, Id};

    type Kind = Result<RequestKind, AmbiguousPath>;
    const SCORM: Kind = Ok(RequestKind::ScormFile);
    const SESSIONLESS: Kind = Ok(RequestKind::Sessionless);
    const PAGE: Kind = Ok(RequestKind::Page(PageKind::Other));
    const LOGIN: Kind = Ok(RequestKind::Page(PageKind::Login));
    const LOGOUT: Kind = Ok(RequestKind::Page(PageKind::Logout));
    const AMBIGUOUS: Kind = Err(AmbiguousPath);

    const ID: &str = "abcdefghijklmnopqrstuvwxyz01";
    const ID2: &str = "ZYXWVUTSRQPONMLKJIHGFEDCBA-,9";

    fn root() -> Site {
        Site::new("", "MoodleSession", "/")
    }

    fn sub() -> Site {
        Site::new("/moodle", "MoodleSession", "/moodle/")
    }

    fn kind(site: &Site, uri: &str) -> Kind {
        match uri.split_once('?') {
            Some((path, query)) => site.classify(path, Some(query)),
            None => site.classify(uri, None),
        }
    }

    /// The kinds of `uri` at the host root and under `/moodle`.
    fn at_root_and_sub(uri: &str) -> [Kind; 2] {
        [kind(&root(), uri), kind(&sub(), &format!("/moodle{uri}"))]
    }

    fn both(uri: &str, expected: Kind) {
        assert_eq!(at_root_and_sub(uri), [expected; 2], "{uri}");
    }

    fn headers<V: AsRef<[u8]>>(name: http::HeaderName, values: &[V]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(name.clone(), HeaderValue::from_bytes(v.as_ref()).unwrap());
        }
        map
    }

    fn cookie(values: &[&str]) -> HeaderMap {
        headers(COOKIE, values)
    }

    fn assert_issued(site: &Site, lines: &[&str], expected: Option<IssuedSession>) {
        let map = headers(SET_COOKIE, lines);
        assert_eq!(site.issued_session(&map), expected, "{lines:?}");
    }

    #[test]
    fn every_scorm_file_form_goes_to_the_data_server_at_the_root_and_under_a_sub_path() {
        for uri in [
            "/pluginfile.php/12/mod_scorm/content/3/index.html",
            "/pluginfile.php/12/mod_scorm/package/3/course.zip",
            "/pluginfile.php/12/mod_scorm/imsmanifest/3/imsmanifest.xml",
            "/pluginfile.php/12/mod_scorm/intro/pic.png",
            "/pluginfile.php?file=/12/mod_scorm/content/3/index.html",
            "/pluginfile.php?file=%2F12%2Fmod_scorm%2Fcontent%2F3%2Fa+b.html",
            "/webservice/pluginfile.php/12/mod_scorm/content/3/index.html?token=abc",
            "/tokenpluginfile.php/abc123/12/mod_scorm/content/3/index.html",
            "/file.php/4/moddata/scorm/7/index.html",
            "/file.php?file=/4/moddata/scorm/7/index.html",
        ] {
            both(uri, SCORM);
        }
    }

    #[test]
    fn encoded_or_disguised_scorm_urls_are_still_scorm_files() {
        for uri in [
            "/pluginfile.php/1/mod_%73corm/content/1/x",
            "/%70luginfile.php/1/mod_scorm/content/1/x",
            "/pluginfile.php//1/./mod_scorm/content/1/x",
            "/mod/scorm/../../pluginfile.php/1/mod_scorm/content/1/x",
            "/pluginfile.php/1/mod_s:corm/content/1/x",
            "/pluginfile.php/1/mod_resource?file=/1/mod_scorm/content/1/x",
            "/pluginfile.php?file=/1/mod_resource/x&f%69le=/1/mod_scorm/content/1/x",
            "/pluginfile.php?file=//1/./mod_scorm/content/1/x",
            "/pluginfile%2Ephp/1/mod_resource/content/1/x?file=/1/mod_scorm/content/1/x",
        ] {
            both(uri, SCORM);
        }
    }

    #[test]
    fn scorm_look_alikes_are_not_scorm_files() {
        for uri in [
            "/pluginfile.phpx/1/mod_scorm/content/1/x",
            "/xpluginfile.php/1/mod_scorm/content/1/x",
            "/pluginfile.php/1/mod_scormx/content/1/x",
            "/pluginfile.php/1/mod_resource/content/1/x",
            "/pluginfile.php/1/MOD_SCORM/content/1/x",
            "/pluginfile.php/mod_scorm/content/1/x",
            "/pluginfile.php/x/mod_resource/mod_scorm/x",
            "/pluginfile.php?file=/1/mod_scorm/content/1/x&file=/1/mod_resource/x",
            "/pluginfile.php/1/mod_resource/content/1/x?file=/1/mod_scorm/content/1/x",
            "/file.php/4/moddata/forum/7/x.png",
            "/mod/scorm/player.php?scoid=1",
        ] {
            assert!(!at_root_and_sub(uri).contains(&SCORM), "{uri}");
        }
    }

    #[test]
    fn scorm_scripts_stay_with_the_students_session() {
        for script in ["view.php", "player.php", "loadSCO.php", "datamodel.php"] {
            both(&format!("/mod/scorm/{script}?id=3"), PAGE);
        }
        both("/mod/scorm/datamodels/scorm_12.js.php", PAGE);
    }

    #[test]
    fn paths_php_could_read_two_ways_are_refused() {
        for uri in [
            "/pluginfile.php/1%2Fmod_scorm/content/1/x",
            "/pluginfile.php/1%2fmod_scorm/content/1/x",
            "/login/index.php%00.css",
            "/login/index.php\0.css",
            "/theme\\image.php",
            "/theme%5Cimage.php",
            "/..",
            "/a/../../pluginfile.php/1/mod_scorm/x",
            "/%2e%2e/etc/passwd",
            "/caf%E9.css",
            "/bad%zzescape",
            "/pluginfile.php?file=/1/../mod_scorm/content/1/x",
            "/pluginfile.php?file=/1/mod_scorm%00/content/1/x",
            "/pluginfile.php?file=%5C1%5Cmod_scorm%5Ccontent",
        ] {
            assert_eq!(kind(&root(), uri), AMBIGUOUS, "{uri}");
        }
        assert_eq!(kind(&sub(), "/moodle/../../x"), AMBIGUOUS);
    }

    #[test]
    fn dots_and_doubled_slashes_resolve_before_deciding() {
        assert_eq!(kind(&sub(), "/moodle/mod/../login//index.php"), LOGIN);
        assert_eq!(kind(&root(), "/course/./../favicon.ico"), SESSIONLESS);
        assert_eq!(
            kind(&root(), "/theme/%69mage.php/boost/core/1/x"),
            SESSIONLESS
        );
    }

    #[test]
    fn a_plain_path_is_not_copied() {
        assert!(matches!(
            normalise_path("/mod/scorm/player.php"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalise_path("/"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn endpoints_that_never_start_a_session_are_sessionless() {
        for uri in [
            "/theme/styles.php/boost/1/all",
            "/theme/javascript.php/boost/1/footer",
            "/theme/image.php/boost/core/1/x",
            "/theme/font.php/boost/core/1/x.woff",
            "/theme/yui_combo.php?3.17/yui-min.js",
            "/lib/javascript.php/1/lib/requirejs/require.min.js",
            "/lib/requirejs.php/1/core/first.js",
            "/tokenpluginfile.php/abc/12/user/icon/boost/f1",
            "/webservice/rest/server.php",
            "/webservice/pluginfile.php/12/mod_resource/content/1/x.pdf",
            "/admin/tool/heartbeat/",
            "/admin/tool/heartbeat/index.php?fullcheck",
        ] {
            both(uri, SESSIONLESS);
        }
    }

    #[test]
    fn static_files_are_sessionless_but_directories_and_scripts_are_pages() {
        for uri in [
            "/favicon.ico",
            "/theme/boost/pix/x.png",
            "/lib/fonts/a.woff2",
            "/a.css",
        ] {
            both(uri, SESSIONLESS);
        }
        for uri in [
            "/",
            "/course/",
            "/course",
            "/index.PHP",
            "/pluginfile.php/1/mod_page/x.css",
        ] {
            both(uri, PAGE);
        }
        assert_eq!(kind(&sub(), "/moodle"), PAGE);
    }

    #[test]
    fn login_and_logout_are_recognised_only_under_the_sub_path() {
        both("/login/index.php", LOGIN);
        both("/login/logout.php?sesskey=x", LOGOUT);
        both("/login/", PAGE);
        assert_eq!(kind(&sub(), "/login/index.php"), PAGE);
        assert_eq!(kind(&sub(), "/moodlex/login/index.php"), PAGE);
    }

    #[test]
    fn outside_the_sub_path_only_static_files_are_sessionless() {
        let site = sub();
        assert_eq!(kind(&site, "/favicon.ico"), SESSIONLESS);
        assert_eq!(kind(&site, "/pluginfile.php/1/mod_scorm/content/1/x"), PAGE);
        assert_eq!(kind(&site, "/theme/image.php/boost/core/1/x"), PAGE);
    }

    #[test]
    fn session_id_is_read_from_any_cookie_header() {
        let map = cookie(&["a=1; b=2", &format!("theme=x;  MoodleSession={ID}; z=3")]);
        assert_eq!(root().session_id(&map), Some(ID));
    }

    #[test]
    fn the_first_session_cookie_decides_even_when_invalid() {
        let twice = cookie(&[
            &format!("MoodleSession={ID}"),
            &format!("MoodleSession={ID2}"),
        ]);
        assert_eq!(root().session_id(&twice), Some(ID));
        for first in [
            "MoodleSession=deleted",
            "MoodleSession=",
            "MoodleSession",
            "MoodleSession=x",
        ] {
            let map = cookie(&[&format!("{first}; MoodleSession={ID}")]);
            assert_eq!(root().session_id(&map), None, "{first}");
        }
        let encoded = cookie(&[&format!("Moodle%53ession=bad; MoodleSession={ID}")]);
        assert_eq!(
            root().session_id(&encoded),
            None,
            "PHP decodes cookie names"
        );
    }

    #[test]
    fn only_the_exact_cookie_name_is_the_session() {
        for other in [
            "moodlesession",
            "MoodleSession_ab",
            "MOODLEID1_",
            "XMoodleSession",
        ] {
            assert_eq!(
                root().session_id(&cookie(&[&format!("{other}={ID}")])),
                None,
                "{other}"
            );
        }
        let suffixed = Site::new("", "MoodleSession_ab", "/");
        let map = cookie(&[&format!("MoodleSession={ID2}; MoodleSession_ab={ID}")]);
        assert_eq!(suffixed.session_id(&map), Some(ID));
    }

    #[test]
    fn non_utf8_bytes_in_a_cookie_header_are_harmless() {
        let latin1 = [b"name=caf\xe9; MoodleSession=".as_slice(), ID.as_bytes()].concat();
        assert_eq!(root().session_id(&headers(COOKIE, &[latin1])), Some(ID));
        assert_eq!(
            root().session_id(&headers(COOKIE, &[b"MoodleSession=\xff\xfe"])),
            None
        );
    }

    #[test]
    fn session_ids_follow_phps_alphabet_and_length() {
        assert!(is_valid_session_id(&"a".repeat(22)));
        assert!(is_valid_session_id(&"A-,9".repeat(64)));
        assert!(!is_valid_session_id(&"a".repeat(21)));
        assert!(!is_valid_session_id(&"a".repeat(257)));
        assert!(!is_valid_session_id("abcdefghijklmnopqrstuvwxyz_1"));
        assert!(!is_valid_session_id("deleted"));
    }

    #[test]
    fn a_node_issuing_a_session_is_observed_and_the_last_line_wins() {
        let one = format!("MoodleSession={ID}; path=/; secure; HttpOnly");
        assert_issued(&root(), &[&one], Some(Id(ID)));
        let rotated = [one.as_str(), &format!("MoodleSession={ID2}; Path=/")];
        assert_issued(&root(), &rotated, Some(Id(ID2)));
        let no_path = format!("MoodleSession={ID}");
        assert_issued(&sub(), &[&no_path], Some(Id(ID)));
    }

    #[test]
    fn other_cookies_and_other_paths_are_ignored() {
        let lines = [
            format!("MoodleSession={ID}; PATH=/moodle/"),
            format!("MoodleSession={ID2}; path=/other/"),
            format!("MOODLEID1_={ID2}; path=/moodle/"),
            format!("MoodleSessionX={ID2}; path=/moodle/"),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_issued(&sub(), &lines, Some(Id(ID)));
        assert_issued(&sub(), &lines[1..], None);
    }

    #[test]
    fn deleted_empty_and_expired_cookies_are_cleared() {
        for line in [
            "MoodleSession=deleted; expires=Thu, 01 Jan 1970 00:00:01 GMT; Max-Age=0; path=/",
            "MoodleSession=; path=/",
            &format!("MoodleSession={ID}; Max-Age=0"),
            &format!("MoodleSession={ID}; max-age=-1"),
            &format!("MoodleSession={ID}; Expires=Thu, 01-Jan-1970 00:00:01 GMT"),
            &format!("MoodleSession={ID}; expires=Thursday, 01-Jan-70 00:00:01 GMT"),
            &format!("MoodleSession={ID}; expires=Thu Jan  1 00:00:01 1970"),
        ] {
            assert_issued(&root(), &[line], Some(Cleared));
        }
        let set_then_deleted = [
            &format!("MoodleSession={ID}; path=/"),
            "MoodleSession=deleted",
        ];
        assert_issued(&root(), &set_then_deleted, Some(Cleared));
    }

    #[test]
    fn a_future_expiry_or_positive_max_age_keeps_the_session() {
        let unreadable = format!("MoodleSession={ID}; Expires=someday");
        assert_issued(&root(), &[&unreadable], Some(Id(ID)));
        let future = format!("MoodleSession={ID}; Expires=Fri, 01 Jan 2100 00:00:00 GMT");
        assert_issued(&root(), &[&future], Some(Id(ID)));
        let max_age_wins =
            format!("MoodleSession={ID}; Max-Age=3600; Expires=Thu, 01 Jan 1970 00:00:01 GMT");
        assert_issued(&root(), &[&max_age_wins], Some(Id(ID)));
    }

    #[test]
    fn an_invalid_issued_value_is_not_a_session() {
        assert_issued(&root(), &["MoodleSession=short; path=/"], None);
        assert_issued(&root(), &[&format!("MoodleSession=\"{ID}\"")], None);
    }

    #[test]
    fn an_expiry_earlier_the_same_day_is_already_past() {
        let line = format!("MoodleSession={ID}; Expires=Thu, 29 Feb 2024 10:00:00 GMT");
        let map = headers(SET_COOKIE, &[line.as_bytes()]);
        let at = |h: i64| OffsetDateTime::from_unix_timestamp(1_709_164_800 + h * 3600).unwrap();
        assert_eq!(root().issued_session_at(&map, || at(12)), Some(Cleared));
        assert_eq!(root().issued_session_at(&map, || at(9)), Some(Id(ID)));
    }
}
