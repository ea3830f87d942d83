//! What of a request target must never reach a log: the credentials Moodle
//! carries in URLs.
//!
//! The mobile app's file URLs carry a web-service token in the path
//! (`/tokenpluginfile.php/{token}/…`) or the query (`?token=`), web-service calls
//! carry `wstoken`, every state-changing link carries `sesskey`, RSS feeds a user's
//! key in the path (`/rss/file.php/{ctx}/{token}/…`), the calendar export an
//! `authtoken`, private-key links a `key` or `userkey`, and `/login/token.php` takes
//! a `password` in the query. Each of these is as good as a login to whoever reads
//! the log.

use std::fmt;

/// The query parameters whose values are credentials.
const SECRET_PARAMS: [&str; 9] = [
    "token",
    "wstoken",
    "sesskey",
    "key",
    "userkey",
    "authtoken",
    "password",
    "wspassword",
    "logintoken",
];

/// Scripts that carry a token in their path: the script, and which segment after
/// it (counting from 0, empty segments skipped as PHP's `PARAM_PATH` collapses `//`).
const PATH_TOKENS: [(&str, usize); 2] = [("/tokenpluginfile.php/", 0), ("/rss/file.php/", 1)];

/// What a masked value is printed as.
const MASK: &str = "***";

/// A request target as a log may show it: [`Display`](fmt::Display) writes the path
/// and query with every credential replaced by `***`, without copying.
#[derive(Debug, Clone, Copy)]
pub struct Masked<'a> {
    path: &'a str,
    query: Option<&'a str>,
}

/// `uri`'s path and query, ready to log.
pub fn masked(uri: &http::Uri) -> Masked<'_> {
    Masked {
        path: uri.path(),
        query: uri.query(),
    }
}

impl fmt::Display for Masked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = PATH_TOKENS.iter().find_map(|(script, index)| {
            let at = self.path.find(script)? + script.len();
            Some((at, *index))
        });
        match token {
            Some((at, index)) => write_masked_segment(f, self.path, at, index)?,
            None => f.write_str(self.path)?,
        }
        let Some(query) = self.query else {
            return Ok(());
        };
        f.write_str("?")?;
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                f.write_str("&")?;
            }
            match pair.split_once('=') {
                Some((name, _)) if is_secret(name) => write!(f, "{name}={MASK}")?,
                _ => f.write_str(pair)?,
            }
        }
        Ok(())
    }
}

/// Writes `path` with its `index`-th non-empty segment from byte `at` on replaced.
fn write_masked_segment(
    f: &mut fmt::Formatter<'_>,
    path: &str,
    at: usize,
    index: usize,
) -> fmt::Result {
    let (head, rest) = path.split_at(at);
    f.write_str(head)?;
    let mut seen = 0;
    for (i, segment) in rest.split('/').enumerate() {
        if i > 0 {
            f.write_str("/")?;
        }
        let secret = !segment.is_empty() && seen == index;
        seen += usize::from(!segment.is_empty());
        f.write_str(if secret { MASK } else { segment })?;
    }
    Ok(())
}

/// Whether a parameter name (as sent, perhaps percent-encoded) names a credential.
/// PHP reads `to%6Ben` as `token`, so the name is compared decoded.
fn is_secret(name: &str) -> bool {
    let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    let decoded = decoded.trim_end_matches("[]");
    SECRET_PARAMS
        .iter()
        .any(|secret| decoded.eq_ignore_ascii_case(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(target: &str) -> String {
        masked(&target.parse().expect("a valid target")).to_string()
    }

    #[test]
    fn a_token_in_the_path_is_masked() {
        assert_eq!(
            shown("/tokenpluginfile.php/0123abcd/12/mod_scorm/content/3/index.html"),
            "/tokenpluginfile.php/***/12/mod_scorm/content/3/index.html"
        );
        assert_eq!(
            shown("/moodle/tokenpluginfile.php/0123abcd"),
            "/moodle/tokenpluginfile.php/***"
        );
        assert_eq!(
            shown("/tokenpluginfile.php//0123abcd/12/f"),
            "/tokenpluginfile.php//***/12/f",
            "PHP collapses the empty segment: the token is the first real one"
        );
        assert_eq!(
            shown("/rss/file.php/5/a1b2c3rsskey/mod_forum/2/rss.xml"),
            "/rss/file.php/5/***/mod_forum/2/rss.xml"
        );
    }

    #[test]
    fn credentials_in_the_query_are_masked_and_the_rest_kept() {
        assert_eq!(
            shown(
                "/webservice/pluginfile.php/12/mod_scorm/content/3/a.js?token=abc&forcedownload=1"
            ),
            "/webservice/pluginfile.php/12/mod_scorm/content/3/a.js?token=***&forcedownload=1"
        );
        assert_eq!(
            shown("/webservice/rest/server.php?wstoken=s3cret&wsfunction=core_webservice_get_site_info"),
            "/webservice/rest/server.php?wstoken=***&wsfunction=core_webservice_get_site_info"
        );
        assert_eq!(
            shown("/login/logout.php?sesskey=Xy12"),
            "/login/logout.php?sesskey=***"
        );
        assert_eq!(
            shown("/calendar/export_execute.php?userid=7&authtoken=5ee1d&preset_what=all"),
            "/calendar/export_execute.php?userid=7&authtoken=***&preset_what=all"
        );
        assert_eq!(
            shown("/login/token.php?username=ann&password=hunter2&service=moodle_mobile_app"),
            "/login/token.php?username=ann&password=***&service=moodle_mobile_app"
        );
    }

    #[test]
    fn a_disguised_name_is_masked_as_php_reads_it() {
        assert_eq!(shown("/x.php?to%6Ben=abc"), "/x.php?to%6Ben=***");
        assert_eq!(shown("/x.php?TOKEN=abc"), "/x.php?TOKEN=***");
        assert_eq!(shown("/x.php?key[]=abc"), "/x.php?key[]=***");
    }

    #[test]
    fn a_plain_page_is_unchanged() {
        assert_eq!(shown("/course/view.php?id=2"), "/course/view.php?id=2");
        assert_eq!(shown("/"), "/");
    }
}
