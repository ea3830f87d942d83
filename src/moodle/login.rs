//! Where a password is tried: the login form's POST and the app's `login/token.php`,
//! and the username each names, as Moodle reads it.
//!
//! Moodle locks an account after `lockoutthreshold` failed logins (off by default),
//! never an address, so a botnet can try stolen passwords on many accounts, or one
//! account from many addresses, as fast as PHP answers. The gateway's limits
//! (`[rate_limits]`) count these requests per address and per username; this file
//! says which requests they are and whose username they carry.

use super::php::{php_name_is, php_urldecode, split_pair};
use super::{PageKind, RequestKind};

/// A request that tries a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginAttempt {
    /// `login/index.php` POST: the login form, `username` and `password` in its
    /// urlencoded body.
    Form,
    /// `login/token.php`, any method: the Moodle app's login, `username` in the
    /// query or (as the app sends it) in a urlencoded POST body.
    Token,
}

/// The largest login body whose username is read: Moodle's login form is
/// `logintoken`, `anchor`, `username` and `password`, a few hundred bytes, and
/// the app's `token.php` POST is smaller. A larger body is passed on unread (and
/// counted per address only): nothing is buffered for a body Moodle never sends.
pub const LOGIN_FORM_MAX: usize = 4096;

/// Whether a request of `kind` tries a password.
pub fn login_attempt(kind: RequestKind, is_post: bool) -> Option<LoginAttempt> {
    match kind {
        RequestKind::Page(PageKind::Login) if is_post => Some(LoginAttempt::Form),
        RequestKind::Page(PageKind::Token) => Some(LoginAttempt::Token),
        _ => None,
    }
}

/// Whether a request for `path` could try a password, asked before the path is
/// classified: both scripts that take one (`login/index.php`, `login/token.php`)
/// lie in `login/`, and the path PHP runs keeps that segment's `/login/` in the raw
/// path unless an escape spells it. The rate limiter asks this of every request,
/// and with its defaults nothing else needs the class there: the journey classifies
/// each request once, not twice.
pub fn may_try_password(path: &str) -> bool {
    path.contains("/login/") || path.contains('%')
}

/// The `username` a urlencoded form or query names, as Moodle keys an account by it:
/// PHP's decoding (of a repeated name, PHP keeps the last), then `trim` and
/// lower case (`login/index.php` and `token.php` both do
/// `trim(core_text::strtolower($username))`), so `Admin ` and `admin` are one
/// account and one bucket. `None` when there is none, or it is empty.
pub fn username_in(form: &[u8]) -> Option<String> {
    let value = form
        .split(|&b| b == b'&')
        .map(split_pair)
        .rfind(|(name, _)| !name.is_empty() && php_name_is(name, "username"))?
        .1;
    let decoded: Vec<u8> = php_urldecode(value).collect();
    let name = String::from_utf8_lossy(&decoded).trim().to_lowercase();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_however_spelt_is_looked_at_and_a_page_is_not() {
        let logins = [
            "/login/index.php",
            "/moodle/login/token.php",
            "//login//index.php",
            "/./login/./index.php",
            "/course/../login/index.php",
            "/%6cogin/index.php",
            "/login%2Findex.php",
        ];
        for path in logins {
            assert!(may_try_password(path), "{path}");
        }
        for path in [
            "/course/view.php",
            "/mod/quiz/attempt.php",
            "/loginx/index.php",
        ] {
            assert!(!may_try_password(path), "{path}");
        }
    }

    #[test]
    fn the_login_forms_post_and_the_apps_token_script_try_passwords() {
        let login = RequestKind::Page(PageKind::Login);
        let token = RequestKind::Page(PageKind::Token);
        assert_eq!(login_attempt(login, true), Some(LoginAttempt::Form));
        assert_eq!(login_attempt(login, false), None, "the form itself");
        assert_eq!(login_attempt(token, false), Some(LoginAttempt::Token));
        assert_eq!(login_attempt(token, true), Some(LoginAttempt::Token));
        let page = RequestKind::Page(PageKind::Other);
        assert_eq!(login_attempt(page, true), None);
        assert_eq!(login_attempt(RequestKind::Sessionless, true), None);
    }

    #[test]
    fn a_username_is_read_as_moodle_keys_the_account() {
        let form = b"anchor=&logintoken=abc&username=+Admin%40School.edu+&password=x";
        assert_eq!(username_in(form).as_deref(), Some("admin@school.edu"));
        assert_eq!(username_in(b"user%6eame=Bob").as_deref(), Some("bob"));
        assert_eq!(
            username_in(b"username=a&username=b").as_deref(),
            Some("b"),
            "PHP keeps the last of a repeated name"
        );
        assert_eq!(username_in(b"username=&password=x"), None);
        assert_eq!(username_in(b"password=x"), None);
        assert_eq!(username_in(b"usernamex=a"), None);
        assert_eq!(
            username_in(b"\xff\xfe=1&username=%FF").as_deref(),
            Some("\u{fffd}")
        );
    }
}
