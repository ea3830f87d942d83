//! The Moodle readers against the requests and responses they must read.

use std::borrow::Cow;

use cookie::time::OffsetDateTime;
use http::header::{COOKIE, SET_COOKIE};
use http::HeaderMap;

use super::paths::normalise_path;
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
        "/pluginfile.php/1/mod_%7Cscorm%60/content/1/x",
        "/pluginfile.php/%3A1/mod_scorm/content/1/x",
        "/file.php/%3C4/mod%3Edata/sc%22orm/7/x",
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
        "/pluginfile.php/1/mod_scorn/content/1/x",
        "/pluginfile.php/1/mod_scorm%C3%A9/content/1/x",
        "/pluginfile.php/1/mod_sc%C3%A9rm/content/1/x",
        "/file.php/4/moddata/scorn/7/x",
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
    // Every byte outside the alphabet, at the start, the middle and the end.
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b',' || b == b'-';
    for c in (0..=255u8).map(char::from).chain(['é', '€', '\u{0}']) {
        let expected = c.is_ascii() && allowed(c as u8);
        for at in [0, 13, 25] {
            let mut id: String = "abcdefghijklmnopqrstuvwxyz".into();
            id.replace_range(at..at + 1, c.encode_utf8(&mut [0; 4]));
            assert_eq!(is_valid_session_id(&id), expected, "{c:?} at {at}");
        }
    }
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

#[test]
fn only_the_default_localcachedir_is_the_local_cache() {
    assert!(in_default_localcache(
        "localcache/theme/1700000000/boost/pix/core/t/edit.svg"
    ));
    assert!(!in_default_localcache(
        "filedir/3b/8f/3b8f0c1e9d2a7f4b5c6d7e8f9a0b1c2d3e4f5a6b"
    ));
    assert!(!in_default_localcache("localcachefoo/x"));
}

#[test]
fn a_get_that_carries_sesskey_may_have_changed_something_and_is_not_repeated() {
    assert!(super::may_repeat(None));
    assert!(super::may_repeat(Some("id=2")));
    assert!(super::may_repeat(Some("id=2&notsesskey=1")));
    assert!(!super::may_repeat(Some("sesskey=Xy12")));
    assert!(!super::may_repeat(Some("d=5&sesskey=Xy12&return=1")));
}

proptest::proptest! {
    #[test]
    fn text_cut_at_a_byte_is_what_str_split_gives(
        text in "([a-z=é\u{a0} ]{0,3}[;/]{0,2}){0,6}",
        byte in proptest::sample::select(vec![b';', b'/']),
    ) {
        let ours: Vec<&str> = split_at(&text, byte).collect();
        let std: Vec<&str> = text.split(char::from(byte)).collect();
        proptest::prop_assert_eq!(ours, std);
    }
}

#[test]
fn segments_split_byte_by_byte_are_the_segments_str_split_gives() {
    for path in [
        "",
        "/",
        "//",
        "a",
        "/a/b",
        "a//b/",
        "/42/mod_scorm/content/1/é.html",
        "ü/",
    ] {
        let ours: Vec<&str> = split_at(path, b'/').collect();
        let std: Vec<&str> = path.split('/').collect();
        assert_eq!(ours, std, "{path:?}");
    }
}

/// What a request to `uri` on `site` is in the middle of, as the gateway reads it:
/// from the kind `classify` found.
fn work_of(site: &Site, uri: &str, post: bool) -> Work {
    work(kind(site, uri).unwrap(), post)
}

#[test]
fn an_open_attempts_pages_autosave_and_finish_are_work_in_progress() {
    for (uri, post) in [
        ("/mod/quiz/processattempt.php?cmid=7", true),
        ("/mod/quiz/autosave.ajax.php", true),
        ("/mod/quiz/summary.php?attempt=12&cmid=7", false),
        ("/mod/quiz/attempt.php?attempt=12&cmid=7&page=3", false),
        ("/mod/quiz/attempt.php?attempt=12&cmid=7", false),
        ("/mod/scorm/datamodel.php", true),
        (
            "/lib/ajax/service.php?sesskey=abc&info=core_fetch_notifications",
            true,
        ),
        ("/mod/forum/post.php", true),
    ] {
        for (site, prefix) in [(root(), ""), (sub(), "/moodle")] {
            let uri = format!("{prefix}{uri}");
            assert_eq!(work_of(&site, &uri, post), Work::InProgress, "{uri}");
        }
    }
}

#[test]
fn a_quiz_start_and_the_pages_around_an_attempt_are_not_work_in_progress() {
    let site = root();
    let start = work_of(&site, "/mod/quiz/startattempt.php", true);
    assert_eq!(start, Work::QuizStart);
    // The GET shows the preflight form; only the POST creates an attempt.
    let form = work_of(&site, "/mod/quiz/startattempt.php?cmid=7", false);
    assert_eq!(form, Work::New);
    for page in [
        "/my/",
        "/course/view.php?id=3",
        "/mod/quiz/view.php?id=3",
        "/mod/quiz/review.php?attempt=12",
    ] {
        assert_eq!(work_of(&site, page, false), Work::New, "{page}");
    }
}

#[test]
fn a_starts_303_to_attempt_php_opens_its_first_page_and_nothing_else_does() {
    use http::header::LOCATION;
    use http::StatusCode;
    let answer = |location: Option<&str>| {
        let mut headers = HeaderMap::new();
        if let Some(location) = location {
            headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
        }
        headers
    };
    let opened = [
        "https://moodle.example.org/mod/quiz/attempt.php?attempt=12&cmid=7",
        "https://school.example/moodle/mod/quiz/attempt.php?attempt=3&cmid=2",
        "https://moodle.example.org/mod/quiz/attempt.php#question-12-1",
    ];
    for location in opened {
        let headers = answer(Some(location));
        assert!(
            opens_first_page(StatusCode::SEE_OTHER, &headers),
            "{location}"
        );
    }
    let not_opened = [
        // A closed quiz or an error: back to the quiz's page.
        (
            StatusCode::SEE_OTHER,
            Some("https://moodle.example.org/mod/quiz/view.php?id=7"),
        ),
        // The preflight form of a password or a browser check.
        (StatusCode::OK, None),
        (
            StatusCode::OK,
            Some("https://moodle.example.org/mod/quiz/attempt.php?attempt=1"),
        ),
        (StatusCode::SEE_OTHER, None),
        (
            StatusCode::SEE_OTHER,
            Some("https://x.example/mod/quiz/attempt.php.bak"),
        ),
    ];
    for (status, location) in not_opened {
        let headers = answer(location);
        assert!(!opens_first_page(status, &headers), "{status} {location:?}");
    }
}

#[test]
fn an_attempts_page_is_a_get_of_an_attempts_script() {
    let kind = |uri: &str| root().classify(uri, None).unwrap();
    assert!(is_attempt_page(kind("/mod/quiz/attempt.php"), false));
    assert!(!is_attempt_page(kind("/mod/quiz/processattempt.php"), true));
    assert!(!is_attempt_page(kind("/mod/quiz/startattempt.php"), false));
    assert!(!is_attempt_page(kind("/course/view.php"), false));
}

#[test]
fn outside_the_site_a_quiz_script_is_no_quiz() {
    let site = sub();
    let outside = work_of(&site, "/mod/quiz/attempt.php", false);
    assert_eq!(outside, Work::New);
    let start = work_of(&site, "/mod/quiz/startattempt.php", true);
    assert_eq!(start, Work::InProgress, "a POST, but no start");
    let inside = work_of(&site, "/moodle/mod/quiz/startattempt.php", true);
    assert_eq!(inside, Work::QuizStart);
}

#[test]
fn the_moodle_app_is_known_by_its_user_agent_or_its_scripts() {
    let site = sub();
    let app = Some(&b"Mozilla/5.0 (Linux; Android 14) MoodleMobile 4.4.0"[..]);
    let browser = Some(&b"Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0"[..]);
    assert!(site.is_app_request("/moodle/my/", app));
    assert!(site.is_app_request("/moodle/login/token.php", None));
    assert!(site.is_app_request("/moodle/webservice/rest/server.php", browser));
    assert!(!site.is_app_request("/moodle/login/index.php", browser));
    assert!(!site.is_app_request("/webservice/rest/server.php", None));
}
