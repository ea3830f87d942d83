//! Property tests for the parsers that read attacker-controlled bytes on every request:
//! `Site::classify` (the URL), `Site::session_id` (`Cookie`), `Site::issued_session`
//! (`Set-Cookie`) and `RouteCookie::node` (the signed route cookie).
//!
//! The unit tests next to each parser pin the documented rules on hand-picked inputs; these
//! check the same rules over generated ones (and that nothing panics on garbage), so a rule
//! that holds only for the examples someone thought of shows up here. The fuzz targets in
//! `fuzz/` push the "never panics" part much further; these run in every `cargo test`.

use http::header::{COOKIE, SET_COOKIE};
use http::{HeaderMap, HeaderName, HeaderValue};
use moodle_gateway::moodle::{
    is_valid_session_id, login_attempt, may_try_password, AmbiguousPath, IssuedSession,
    RequestKind, Site,
};
use moodle_gateway::sessions::route_cookie::RouteCookie;
use proptest::prelude::*;
use proptest::sample::{select, Index};

type Kind = Result<RequestKind, AmbiguousPath>;

const ROUTE: &str = "MoodleGatewayRoute";
const SECRET: &[u8] = b"route-secret-shared-by-every-gateway";

fn root() -> Site {
    Site::new("", "MoodleSession", "/")
}

fn sub() -> Site {
    Site::new("/moodle", "MoodleSession", "/moodle/")
}

/// Classifies `path?query` as the gateway receives it.
fn kind(site: &Site, target: &str) -> Kind {
    match target.split_once('?') {
        Some((path, query)) => site.classify(path, Some(query)),
        None => site.classify(target, None),
    }
}

/// A map holding `lines` under `name`, skipping those that are not valid header values
/// (hyper would have refused them before the gateway saw them).
fn header_lines<L: AsRef<[u8]>>(name: HeaderName, lines: &[L]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in lines {
        if let Ok(value) = HeaderValue::from_bytes(line.as_ref()) {
            map.append(name.clone(), value);
        }
    }
    map
}

/// Arbitrary bytes as the `&str` hyper would hand over (lossily, as a fuzzer would).
fn lossy_text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 0..max)
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// Text built from the pieces the classifier treats specially, so that generated paths
/// hit the escapes, dot segments and script names far more often than random bytes would.
fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => select(vec![
            "/", "/", "/", ".", "..", "%", "%2F", "%2f", "%2e", "%2E%2E", "%00", "\0", "\\",
            "%5C", "%e9", "%zz", "?", "&", "=", "+", "file=", "pluginfile.php", "file.php",
            "tokenpluginfile.php", "webservice", "mod_scorm", "moddata", "scorm", "12", "x.css",
            ":", "é", "moodle", "login", "index.php", "token.php", "/pluginfile.php/",
        ])
        .prop_map(str::to_owned),
        1 => "[ -~]{1,4}",
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|pieces| pieces.concat())
}

/// Any path: random bytes, or the tricky pieces after a leading `/`.
fn any_path() -> impl Strategy<Value = String> {
    prop_oneof![lossy_text(64), tricky_text().prop_map(|t| format!("/{t}"))]
}

fn any_query() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![lossy_text(48), tricky_text()])
}

/// A valid PHP session id.
fn session_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9,-]{22,64}"
}

/// A file name without `..` (Moodle refuses those in the `file` parameter) or escapes.
fn file_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,12}(\\.[a-z]{1,4})?"
}

/// Paths around the login scripts: their segments with dot segments, doubled
/// slashes, a sub-path and escapes between them.
fn near_login() -> impl Strategy<Value = String> {
    let segment = select(vec![
        "login",
        "login",
        "index.php",
        "token.php",
        ".",
        "..",
        "",
        "moodle",
        "course",
        "%6cogin",
        "%6Cogin",
        "login%2Findex.php",
        "logi%6e",
        "index%2ephp",
    ]);
    prop::collection::vec(segment, 1..6).prop_map(|segments| format!("/{}", segments.join("/")))
}

mod classify {
    use super::*;

    /// The documented URL forms of one SCORM file (docs/src/moodle.md, "SCORM URL forms").
    fn scorm_forms(ctx: u32, area: &str, rev: u32, file: &str, token: &str) -> Vec<String> {
        let rel = format!("/{ctx}/mod_scorm/{area}/{rev}/{file}");
        let legacy = format!("/{ctx}/moddata/scorm/{rev}/{file}");
        vec![
            format!("/pluginfile.php{rel}"),
            format!("/pluginfile.php?file={rel}"),
            format!("/pluginfile.php?file={}", rel.replace('/', "%2F")),
            format!("/webservice/pluginfile.php{rel}?token={token}"),
            format!("/tokenpluginfile.php/{token}{rel}"),
            format!("/file.php{legacy}"),
            format!("/file.php?file={legacy}"),
        ]
    }

    proptest! {
        #[test]
        fn never_panics_on_any_path_or_query(path in any_path(), query in any_query()) {
            for site in [root(), sub()] {
                let _ = site.classify(&path, query.as_deref());
            }
        }

        #[test]
        fn every_path_php_runs_as_a_login_script_is_one_the_limiter_looks_at(
            path in prop_oneof![any_path(), near_login()],
            query in any_query(),
        ) {
            for site in [root(), sub()] {
                let kind = site.classify(&path, query.as_deref());
                let tries = [true, false]
                    .into_iter()
                    .any(|post| kind.is_ok_and(|kind| login_attempt(kind, post).is_some()));
                if tries {
                    prop_assert!(may_try_password(&path), "{path:?} is a login");
                }
            }
        }

        #[test]
        fn redundant_dot_segments_and_doubled_slashes_change_nothing(
            path in tricky_text().prop_map(|t| format!("/{t}")),
            query in any_query(),
            at in any::<Index>(),
            redundant in select(vec!["/./", "//"]),
        ) {
            // Each '/' of the path may carry a `./` or a second `/` without changing the
            // path the web server resolves.
            let slashes: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
            let i = slashes[at.index(slashes.len())];
            let longer = format!("{}{redundant}{}", &path[..i], &path[i + 1..]);
            for site in [root(), sub()] {
                prop_assert_eq!(
                    site.classify(&longer, query.as_deref()),
                    site.classify(&path, query.as_deref()),
                    "{:?} vs {:?}", longer, path
                );
            }
        }

        #[test]
        fn every_form_of_a_scorm_file_is_a_scorm_file_at_any_site_path(
            ctx in 1u32..1_000_000_000,
            area in select(vec!["content", "package", "imsmanifest", "intro"]),
            rev in 0u32..100_000,
            dirs in prop::collection::vec(file_name(), 0..3),
            file in file_name(),
            token in "[0-9a-f]{8,32}",
            site_path in select(vec!["", "/moodle", "/lms/moodle-4.5"]),
        ) {
            let site = Site::new(site_path, "MoodleSession", "/");
            let file = [dirs, vec![file]].concat().join("/");
            for uri in scorm_forms(ctx, area, rev, &file, &token) {
                let uri = format!("{site_path}{uri}");
                prop_assert_eq!(kind(&site, &uri), Ok(RequestKind::ScormFile), "{}", uri);
            }
        }

        #[test]
        fn files_of_any_other_component_are_never_scorm_files(
            ctx in 1u32..1_000_000,
            component in "[a-z]{1,10}(_[a-z]{1,10})?",
            file in file_name(),
            token in "[0-9a-f]{8,32}",
        ) {
            // `scorm` only matters after `moddata` (the Moodle 1.9 form).
            prop_assume!(component != "mod_scorm" && component != "scorm");
            let rel = format!("/{ctx}/{component}/content/1/{file}");
            for uri in [
                format!("/pluginfile.php{rel}"),
                format!("/pluginfile.php?file={rel}"),
                format!("/webservice/pluginfile.php{rel}?token={token}"),
                format!("/tokenpluginfile.php/{token}{rel}"),
                format!("/file.php/{ctx}/moddata/{component}/1/{file}"),
            ] {
                for (site, prefix) in [(root(), ""), (sub(), "/moodle")] {
                    let uri = format!("{prefix}{uri}");
                    prop_assert_ne!(kind(&site, &uri), Ok(RequestKind::ScormFile), "{}", uri);
                }
            }
        }

        #[test]
        fn an_encoded_slash_in_the_path_is_always_refused(
            before in tricky_text(),
            slash in select(vec!["%2F", "%2f"]),
            after in tricky_text(),
            query in any_query(),
        ) {
            let path = format!("/{before}{slash}{after}");
            for site in [root(), sub()] {
                prop_assert_eq!(site.classify(&path, query.as_deref()), Err(AmbiguousPath));
            }
        }
    }

    // `file_pluginfile()` reads the context id as `(int)array_shift($args)`, and PHP's
    // `(int)` takes the leading number of a string ("1x" is 1, " 1" and "+1" are 1, "1e1" is
    // 10): Moodle serves these as files of `mod_scorm` in context 1. Found reading Moodle's
    // source while writing these properties; `is_number` now follows the cast.
    #[test]
    fn a_context_id_php_casts_to_a_number_is_still_a_scorm_file() {
        for ctx in ["1x", "%201", "+1", "1e1", "1.5", "01"] {
            let uri = format!("/pluginfile.php/{ctx}/mod_scorm/content/1/a");
            assert_eq!(kind(&root(), &uri), Ok(RequestKind::ScormFile), "{uri}");
        }
        // No context at all: Moodle answers 404 from any node, so they stay pages.
        for ctx in ["0", "-1", "x1", "+", "%20"] {
            let uri = format!("/pluginfile.php/{ctx}/mod_scorm/content/1/a");
            assert_ne!(kind(&root(), &uri), Ok(RequestKind::ScormFile), "{uri}");
        }
    }
}

mod session_id {
    use super::*;

    /// A cookie name PHP never reads as `MoodleSession` (no escapes, dots or spaces).
    fn other_name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_]{1,16}".prop_filter("not the session cookie", |n| n != "MoodleSession")
    }

    /// A cookie value: any header byte but `;` (which would end the cookie).
    fn any_value() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![0x20u8..0x3b, 0x3cu8..0x7f, 0x80u8..=0xff];
        prop::collection::vec(byte, 0..24)
    }

    fn cookies(max: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
        let pair = (other_name(), any_value()).prop_map(|(n, v)| [n.as_bytes(), b"=", &v].concat());
        prop::collection::vec(pair, 0..max)
    }

    /// The cookies spread over `Cookie` lines, a new line starting wherever `breaks` says.
    fn lines(cookies: &[Vec<u8>], breaks: &[bool], tight: bool) -> Vec<Vec<u8>> {
        let separator: &[u8] = if tight { b";" } else { b"; " };
        let mut lines = vec![Vec::new()];
        for (i, cookie) in cookies.iter().enumerate() {
            let line = lines.last_mut().unwrap();
            if !line.is_empty() {
                line.extend_from_slice(separator);
            }
            line.extend_from_slice(cookie);
            if breaks.get(i).copied().unwrap_or(false) {
                lines.push(Vec::new());
            }
        }
        lines
    }

    proptest! {
        #[test]
        fn never_panics_on_any_cookie_bytes(
            raw in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..96), 0..4),
        ) {
            let headers = header_lines(COOKIE, &raw);
            if let Some(id) = root().session_id(&headers) {
                prop_assert!(is_valid_session_id(id));
            }
        }

        #[test]
        fn the_first_session_cookie_is_read_among_any_others_and_on_any_line(
            id in session_id(),
            before in cookies(6),
            after in cookies(6),
            later in prop::collection::vec(prop_oneof![session_id(), "[ -:<-~]{0,30}"], 0..3),
            breaks in prop::collection::vec(any::<bool>(), 16),
            tight in any::<bool>(),
        ) {
            let ours = format!("MoodleSession={id}").into_bytes();
            let later = later.iter().map(|v| format!("MoodleSession={v}").into_bytes());
            let all: Vec<Vec<u8>> = before
                .into_iter()
                .chain([ours])
                .chain(after.into_iter().zip(later.clone()).flat_map(|(a, l)| [a, l]))
                .chain(later)
                .collect();
            let headers = header_lines(COOKIE, &lines(&all, &breaks, tight));
            prop_assert_eq!(root().session_id(&headers), Some(id.as_str()));
        }

        #[test]
        fn a_later_valid_id_never_rescues_an_invalid_first_one(
            first in prop_oneof![Just(String::new()), "deleted", "[A-Za-z0-9]{1,21}", "[A-Za-z0-9_.]{22,40}"],
            id in session_id(),
            breaks in prop::collection::vec(any::<bool>(), 2),
        ) {
            prop_assume!(!is_valid_session_id(&first));
            let all = [format!("MoodleSession={first}").into_bytes(), format!("MoodleSession={id}").into_bytes()];
            let headers = header_lines(COOKIE, &lines(&all, &breaks, false));
            prop_assert_eq!(root().session_id(&headers), None);
        }
    }
}

mod issued_session {
    use super::*;

    /// What one `Set-Cookie` line means on its own for the root site.
    #[derive(Debug, Clone)]
    enum Meaning {
        /// Not about the session cookie at `/`: skipped.
        Ignored,
        Id(String),
        Cleared,
    }

    /// One `Set-Cookie` line a node might send, with what it means.
    fn line() -> impl Strategy<Value = (String, Meaning)> {
        let attributes = prop::collection::vec(
            select(vec![
                "; Secure",
                "; HttpOnly",
                "; SameSite=Lax",
                "; Path=/",
                "; Domain=example.org",
            ]),
            0..3,
        )
        .prop_map(|a| a.concat());
        let deleted = prop_oneof![session_id(), Just("deleted".to_owned())];
        prop_oneof![
            (session_id(), attributes.clone())
                .prop_map(|(id, attrs)| (format!("MoodleSession={id}{attrs}"), Meaning::Id(id))),
            (deleted, attributes.clone(), select(vec!["0", "-1"])).prop_map(|(v, attrs, age)| {
                (
                    format!("MoodleSession={v}{attrs}; Max-Age={age}"),
                    Meaning::Cleared,
                )
            }),
            (session_id(), attributes.clone()).prop_map(|(id, attrs)| {
                (
                    format!("MoodleSession={id}{attrs}; Path=/elsewhere/"),
                    Meaning::Ignored,
                )
            }),
            ("[A-Za-z_]{1,12}", session_id(), attributes)
                .prop_filter("other cookies", |(n, ..)| n != "MoodleSession")
                .prop_map(|(n, id, attrs)| (format!("{n}={id}{attrs}"), Meaning::Ignored)),
        ]
    }

    /// What the root site's session cookie comes to when `cookie::Cookie::parse`
    /// reads the lines (the gateway's reading until 2026-12-05), its last line for
    /// the cookie at `/` deciding; dates far from today, so the clock does not count.
    fn as_the_cookie_crate_reads(lines: &[String]) -> Option<IssuedSession<'_>> {
        use cookie::time::{Duration, OffsetDateTime};
        let line = (lines.iter())
            .filter(|line| {
                let rest = line.trim_ascii_start().strip_prefix("MoodleSession");
                rest.is_some_and(|rest| rest.trim_ascii_start().starts_with('='))
            })
            .filter_map(|line| cookie::Cookie::parse(line.as_str()).ok())
            .rfind(|c| c.name() == "MoodleSession" && c.path().is_none_or(|p| p == "/"))?;
        let expired = match (line.max_age(), line.expires_datetime()) {
            (Some(age), _) => age <= Duration::ZERO,
            (None, Some(at)) => at <= OffsetDateTime::now_utc(),
            (None, None) => false,
        };
        let value = line.value_raw()?;
        if expired || value.is_empty() || value == "deleted" {
            return Some(IssuedSession::Cleared);
        }
        is_valid_session_id(value).then_some(IssuedSession::Id(value))
    }

    proptest! {
        #[test]
        fn never_panics_on_any_set_cookie_lines(
            raw in prop::collection::vec(
                prop_oneof![
                    prop::collection::vec(any::<u8>(), 0..96),
                    tricky_text().prop_map(|t| format!("MoodleSession={t}").into_bytes()),
                ],
                0..4,
            ),
        ) {
            let headers = header_lines(SET_COOKIE, &raw);
            for site in [root(), sub()] {
                if let Some(IssuedSession::Id(id)) = site.issued_session(&headers) {
                    prop_assert!(is_valid_session_id(id));
                }
            }
        }

        #[test]
        fn the_last_line_for_the_session_cookie_decides(
            lines in prop::collection::vec(line(), 0..6),
        ) {
            let expected = lines.iter().rev().find_map(|(_, meaning)| match meaning {
                Meaning::Ignored => None,
                Meaning::Id(id) => Some(IssuedSession::Id(id)),
                Meaning::Cleared => Some(IssuedSession::Cleared),
            });
            let text: Vec<&str> = lines.iter().map(|(l, _)| l.as_str()).collect();
            let headers = header_lines(SET_COOKIE, &text);
            prop_assert_eq!(root().issued_session(&headers), expected, "{:?}", text);
        }

        #[test]
        fn max_age_zero_clears_whatever_else_the_line_says(
            id in session_id(),
            mut attributes in prop::collection::vec(
                select(vec![
                    "Path=/", "Secure", "HttpOnly", "SameSite=None",
                    "Expires=Fri, 01 Jan 2100 00:00:00 GMT", "Domain=example.org",
                ]),
                0..4,
            ),
            at in any::<Index>(),
        ) {
            attributes.insert(at.index(attributes.len() + 1), "Max-Age=0");
            let line = format!("MoodleSession={id}; {}", attributes.join("; "));
            let headers = header_lines(SET_COOKIE, &[&line]);
            prop_assert_eq!(root().issued_session(&headers), Some(IssuedSession::Cleared), "{}", line);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn set_cookie_lines_are_read_as_the_cookie_crate_reads_them(
            lines in prop::collection::vec(
                (
                    select(vec!["MoodleSession", " MoodleSession ", "MoodleSession\u{a0}", "Other"]),
                    select(vec!["=", " = ", "=\"", ""]),
                    prop_oneof![session_id(), Just("deleted".to_owned()), Just(String::new())],
                    prop::collection::vec(
                        (
                            select(vec![
                                "Path", "path", " PATH ", "Max-Age", "max-age", "\u{a0}Max-Age",
                                "Expires", "expires", "Secure", "HttpOnly", "Domain", "",
                            ]),
                            select(vec!["=", " = ", ""]),
                            select(vec![
                                "/", "/elsewhere/", "", "0", "-1", "-", "60", "+5", "1e3",
                                "99999999999999999999", "\u{a0}7", "None",
                                "Thu, 01-Jan-1970 00:00:01 GMT", "Fri, 01 Jan 2100 00:00:00 GMT",
                                "Sun Nov  6 08:49:37 1994", "yesterday",
                            ]),
                        ),
                        0..5,
                    ),
                ),
                1..4,
            ),
        ) {
            let text: Vec<String> = lines
                .iter()
                .map(|(name, eq, value, attributes)| {
                    let attributes: String = attributes
                        .iter()
                        .map(|(key, eq, value)| format!("; {key}{eq}{value}"))
                        .collect();
                    format!("{name}{eq}{value}{attributes}")
                })
                .collect();
            let headers = header_lines(SET_COOKIE, &text);
            prop_assert_eq!(root().issued_session(&headers), as_the_cookie_crate_reads(&text), "{:?}", text);
        }
    }
}

mod route_cookie {
    use super::*;

    fn route() -> RouteCookie {
        RouteCookie::new(ROUTE, SECRET, "/")
    }

    /// The `NAME=value` a browser sends back for an issued `Set-Cookie` line.
    fn sent_back(line: &HeaderValue) -> Vec<u8> {
        let line = line.as_bytes();
        line[..line.iter().position(|&b| b == b';').unwrap()].to_vec()
    }

    proptest! {
        #[test]
        fn an_issued_cookie_always_leads_back_to_its_node(
            node in "[A-Za-z0-9._-]{1,64}",
            session in session_id(),
            secure in any::<bool>(),
            before in "([A-Za-z]{1,8}=[A-Za-z0-9]{0,8}; ){0,3}",
        ) {
            let route = route();
            let cookie = sent_back(&route.issue(&node, &session, secure));
            let headers = header_lines(COOKIE, &[[before.as_bytes(), &cookie].concat()]);
            prop_assert_eq!(route.node(&headers, &session), Some(node.as_str()));
        }

        #[test]
        fn any_single_byte_change_to_the_value_is_refused(
            node in "[A-Za-z0-9._-]{1,64}",
            session in session_id(),
            at in any::<Index>(),
            byte in any::<u8>(),
        ) {
            let route = route();
            let mut cookie = sent_back(&route.issue(&node, &session, false));
            let value_start = ROUTE.len() + 1;
            let i = value_start + at.index(cookie.len() - value_start);
            prop_assume!(cookie[i] != byte);
            cookie[i] = byte;
            let headers = header_lines(COOKIE, &[&cookie]);
            prop_assert_eq!(route.node(&headers, &session), None, "{:?}", cookie.escape_ascii().to_string());
        }

        #[test]
        fn never_panics_on_any_cookie_bytes(
            raw in prop::collection::vec(
                prop_oneof![
                    prop::collection::vec(any::<u8>(), 0..128),
                    tricky_text().prop_map(|t| format!("{ROUTE}={t}").into_bytes()),
                ],
                0..4,
            ),
            session in lossy_text(40),
        ) {
            let headers = header_lines(COOKIE, &raw);
            // Nobody but the holder of the secret can make a value that verifies.
            prop_assert_eq!(route().node(&headers, &session), None);
        }
    }
}
