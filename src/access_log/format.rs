//! How one access log line reads: the combined log format (what nginx and Apache
//! write, so GoAccess, AWStats and fail2ban read it) with the gateway's fields after
//! it, or one JSON object; every value escaped so one line stays one line.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use http::Request;

use super::Pending;
use crate::moodle;

/// The combined log format, then the gateway's own fields as `key=value`:
/// `1.2.3.4 - - [01/Dec/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8"
/// upstream=web1 upstream_time=0.004 queue_time=0.000 class=working request_time=0.005
/// session=1f…` (`queue_time`: the wait for a slot on a capped node, `class` the line's
/// class it waited in; both `-` on a node without a cap).
pub(super) fn combined(p: &Pending) -> String {
    let b = &p.begun;
    let quoted = |v: &Option<String>| v.as_deref().map_or_else(|| "-".into(), escape);
    let mut line = format!(
        "{} - - [{}] \"{}\" {} {} \"{}\" \"{}\"",
        b.client,
        clf_time(b.at),
        escape(&b.request_line),
        p.status,
        p.bytes,
        quoted(&b.referer),
        quoted(&b.user_agent),
    );
    let t = &p.trail;
    let upstream = if t.cached {
        Some("cache")
    } else {
        t.upstream.as_deref()
    };
    let _ = write!(line, " upstream={}", upstream.unwrap_or("-"));
    match t.upstream_time {
        Some(time) => write!(line, " upstream_time={:.3}", time.as_secs_f64()),
        None => write!(line, " upstream_time=-"),
    }
    .ok();
    match t.queue_time {
        Some(time) => write!(line, " queue_time={:.3}", time.as_secs_f64()),
        None => write!(line, " queue_time=-"),
    }
    .ok();
    let _ = write!(line, " class={}", t.class.unwrap_or("-"));
    let elapsed = b.started.elapsed().as_secs_f64();
    let _ = write!(line, " request_time={elapsed:.3}");
    let _ = writeln!(line, " session={}", t.session.as_deref().unwrap_or("-"));
    line
}

pub(super) fn json(p: &Pending) -> String {
    let b = &p.begun;
    let t = &p.trail;
    let mut line = serde_json::json!({
        "time": humantime::format_rfc3339_millis(b.at).to_string(),
        "client": b.client.to_string(),
        "request": b.request_line,
        "status": p.status,
        "bytes": p.bytes,
        "referer": b.referer,
        "user_agent": b.user_agent,
        "upstream": if t.cached { Some("cache") } else { t.upstream.as_deref() },
        "upstream_time": t.upstream_time.map(|d| d.as_secs_f64()),
        "queue_time": t.queue_time.map(|d| d.as_secs_f64()),
        "class": t.class,
        "request_time": b.started.elapsed().as_secs_f64(),
        "session": t.session,
    })
    .to_string();
    line.push('\n');
    line
}

pub(super) fn request_line<B>(request: &Request<B>) -> String {
    let version = match request.version() {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    };
    let target = moodle::masked(request.uri());
    format!("{} {target} {version}", request.method())
}

/// The request's first line named `name`, as text.
pub(super) fn header<'a>(
    headers: &'a http::HeaderMap,
    name: &http::header::HeaderName,
) -> Option<&'a str> {
    let value = headers.get(name)?.as_bytes();
    std::str::from_utf8(value).ok().filter(|text| {
        text.bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    })
}

/// A `Referer` is a URL of the site, so it carries the same credentials.
pub(super) fn masked_referer(referer: &str) -> String {
    let Ok(uri) = referer.parse::<http::Uri>() else {
        return "-".into();
    };
    let origin = match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}"),
        _ => String::new(),
    };
    format!("{origin}{}", moodle::masked(&uri))
}

/// A value inside double quotes: `"` and `\` escaped, control bytes as `\xHH`,
/// so one line stays one line whatever a client sent.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `01/Dec/2026:12:00:00 +0000`, in UTC.
fn clf_time(at: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (year, month, day) = civil_from_days(secs / 86_400);
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let month = MONTHS[month as usize - 1];
    format!("{day:02}/{month}/{year}:{h:02}:{m:02}:{s:02} +0000")
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_are_written_as_the_combined_format_does() {
        let at = UNIX_EPOCH + Duration::from_secs(1_796_083_200 + 3_723);
        assert_eq!(clf_time(at), "01/Dec/2026:01:02:03 +0000");
        assert_eq!(clf_time(UNIX_EPOCH), "01/Jan/1970:00:00:00 +0000");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(clf_time(leap), "29/Feb/2000:00:00:00 +0000");
    }

    #[test]
    fn a_hostile_header_cannot_break_the_line() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\x0ad");
    }

    #[test]
    fn a_referer_keeps_its_origin_and_loses_its_credentials() {
        assert_eq!(
            masked_referer("https://moodle.example.edu/mod/scorm/player.php?a=1&sesskey=abc"),
            "https://moodle.example.edu/mod/scorm/player.php?a=1&sesskey=***"
        );
        assert_eq!(masked_referer("not a url"), "-");
    }
}
