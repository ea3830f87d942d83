//! What a request must be before the gateway looks at it: within the size limits,
//! framed one way only, for exactly one host this site serves.
//!
//! Why here, before routing: each rule stops something that would otherwise reach
//! PHP. A request that is both `Content-Length` and `Transfer-Encoding` is read one
//! way by one server and another way by the next (request smuggling): RFC 9112 6.1
//! lets a server reject it, and a proxy that forwards it must drop the length. The
//! gateway rejects it, 400 and the connection closed, the safest of the two: the
//! listener's own parser does so before anything else reads the request, and this
//! rule catches any other way in. (On a connection already handed to hyper's server,
//! after a chunked upload or an upgrade on it, hyper reads such a request as
//! chunked, drops the length and closes after answering: the other way 6.1 allows.
//! The node never sees both either way.) A forged
//! or second `Host` becomes Moodle's idea of its own address in password-reset
//! mails. Sizes are checked with the status each one has (414, 431, 413) so a
//! client learns what was wrong, and the connection is closed after framing errors
//! because what follows on it cannot be trusted.
//!
//! No Moodle knowledge and no allocation on the way through: one pass over the
//! header map the request already has.

use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::PathAndQuery;
use http::{Method, Request, Uri, Version};

use crate::config::LimitsConfig;
use crate::error::GatewayError;

/// The rules, from `[limits]` and `[site] hosts`.
#[derive(Debug, Clone)]
pub struct EdgeRules {
    max_header_bytes: usize,
    max_headers: usize,
    max_uri_bytes: usize,
    max_body_bytes: u64,
    /// Lowercase, each with or without a port; empty accepts any host.
    hosts: Box<[String]>,
}

impl EdgeRules {
    /// The rules of `[limits]` and `[site] hosts`.
    pub fn new(limits: &LimitsConfig, hosts: &[String]) -> Self {
        Self {
            max_header_bytes: limits.max_header_bytes,
            max_headers: limits.max_headers,
            max_uri_bytes: limits.max_uri_bytes,
            max_body_bytes: limits.max_body_bytes,
            hosts: hosts.into(),
        }
    }

    /// The largest body a request may carry.
    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// Checks `request` and, for HTTP/2, gives it the `Host` header PHP needs
    /// (HTTP/2 carries the host in `:authority`).
    pub fn admit<B>(&self, request: &mut Request<B>) -> Result<(), GatewayError> {
        // A reverse proxy for a web application: CONNECT would make it a tunnel to
        // anywhere, TRACE echoes credentials back (cross-site tracing), and
        // extension methods (a lowercase `get` among them) mean nothing to PHP.
        let method = request.method();
        if ![
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
            Method::PATCH,
        ]
        .contains(method)
        {
            return Err(GatewayError::MethodNotAllowed);
        }
        let target = target_len(request);
        if target > self.max_uri_bytes {
            return Err(GatewayError::UriTooLong);
        }
        let lines = Lines::of(request.headers());
        if lines.count > self.max_headers {
            return Err(GatewayError::HeadersTooLarge);
        }
        // As on the wire: the request line and "name: value\r\n" for each line.
        if target + request.method().as_str().len() + 12 + lines.bytes > self.max_header_bytes {
            return Err(GatewayError::HeadersTooLarge);
        }
        // Both framings: refused and closed (see the module's note). The listener's
        // parser refuses it first; this catches any other way in.
        if lines.transfer_encoding.0 > 0 && lines.content_length.is_some() {
            return Err(GatewayError::MalformedRequest);
        }
        // hyper reads `gzip, chunked` as chunked and the proxy re-frames it as plain
        // chunked, so the gzip coding would be silently lost on the way to PHP.
        if !only_chunked(lines.transfer_encoding) {
            return Err(GatewayError::MalformedRequest);
        }
        let declared = lines.content_length.and_then(content_length);
        if declared.is_some_and(|length| length > self.max_body_bytes) {
            return Err(GatewayError::PayloadTooLarge);
        }
        let host = host(request, lines.host)?;
        if !valid_port(host.as_bytes()) {
            return Err(GatewayError::MalformedRequest);
        }
        if !self.serves(host.as_bytes()) {
            return Err(GatewayError::UnknownHost);
        }
        if lines.host.0 == 0 {
            request.headers_mut().insert(HOST, host);
        }
        slash_empty_path(request)
    }

    /// Whether `host` (as the request names it) is one of ours. An entry without a
    /// port matches the host on any port; names compare without regard to case.
    fn serves(&self, host: &[u8]) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let bare = strip_port(host);
        self.hosts.iter().any(|entry| {
            let has_port = strip_port(entry.as_bytes()).len() != entry.len();
            let wanted = if has_port { host } else { bare };
            wanted.eq_ignore_ascii_case(entry.as_bytes())
        })
    }
}

/// An absolute-form target with an empty path (`GET http://host?x=1`) goes on with
/// the path `/` (RFC 9112 3.2.2), as nginx sends it: PHP drops a request line
/// `GET ?x=1`. Only that rare form pays for the new target.
fn slash_empty_path<B>(request: &mut Request<B>) -> Result<(), GatewayError> {
    let uri = request.uri();
    let empty = uri.authority().is_some()
        && uri
            .path_and_query()
            .is_none_or(|p| !p.as_str().starts_with('/'));
    if !empty {
        return Ok(());
    }
    let target = match uri.query() {
        Some(query) => format!("/?{query}"),
        None => "/".to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query =
        Some(PathAndQuery::try_from(target).map_err(|_| GatewayError::MalformedRequest)?);
    *request.uri_mut() = Uri::from_parts(parts).map_err(|_| GatewayError::MalformedRequest)?;
    Ok(())
}

/// The request target's length as the client sent it.
fn target_len<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let path = uri.path_and_query().map_or(1, |p| p.as_str().len());
    // Absolute form (`GET http://host/path`): the scheme and authority count too.
    let absolute = match (request.version(), uri.authority()) {
        (Version::HTTP_2 | Version::HTTP_3, _) | (_, None) => 0,
        (_, Some(authority)) => authority.as_str().len() + 8,
    };
    path + absolute
}

/// What the rules read of a request's header lines, gathered in one pass over
/// them: a hashed lookup for each of the three names cost more than the pass.
struct Lines<'a> {
    count: usize,
    /// The lines' bytes as on the wire, without the request line.
    bytes: usize,
    /// How many `Transfer-Encoding` lines, and the first.
    transfer_encoding: (usize, Option<&'a HeaderValue>),
    /// The first `Content-Length` line.
    content_length: Option<&'a HeaderValue>,
    /// How many `Host` lines, and the first.
    host: (usize, Option<&'a HeaderValue>),
}

impl<'a> Lines<'a> {
    fn of(headers: &'a http::HeaderMap) -> Self {
        let mut lines = Lines {
            count: 0,
            bytes: 0,
            transfer_encoding: (0, None),
            content_length: None,
            host: (0, None),
        };
        let note = |seen: &mut (usize, Option<&'a HeaderValue>), value| {
            seen.0 += 1;
            seen.1 = seen.1.or(Some(value));
        };
        for (name, value) in headers {
            lines.count += 1;
            lines.bytes += name.as_str().len() + value.len() + 4;
            if name == HOST {
                note(&mut lines.host, value);
            } else if name == CONTENT_LENGTH {
                lines.content_length = lines.content_length.or(Some(value));
            } else if name == TRANSFER_ENCODING {
                note(&mut lines.transfer_encoding, value);
            }
        }
        lines
    }
}

/// The one host the request is for, from its `Host` lines (how many, the first).
/// HTTP/1 needs exactly one `Host` line, and an absolute-form target must name the
/// same host (otherwise which one did the client mean?); HTTP/2 names it in
/// `:authority`.
fn host<B>(
    request: &Request<B>,
    lines: (usize, Option<&HeaderValue>),
) -> Result<HeaderValue, GatewayError> {
    let authority = request.uri().authority();
    match (request.version(), lines, authority) {
        (_, (2.., _), _) => Err(GatewayError::MalformedRequest),
        (Version::HTTP_2 | Version::HTTP_3, (0, _), Some(authority)) => {
            HeaderValue::from_str(authority.as_str()).map_err(|_| GatewayError::MalformedRequest)
        }
        (_, (1, Some(host)), None) if !host.is_empty() => Ok(host.clone()),
        (_, (1, Some(host)), Some(authority))
            if host
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes()) =>
        {
            Ok(host.clone())
        }
        _ => Err(GatewayError::MalformedRequest),
    }
}

/// Whether `Transfer-Encoding` (how many lines, the first) is absent or exactly one
/// `chunked` (any case, surrounding spaces aside): the one coding the gateway
/// passes on as it came.
fn only_chunked(lines: (usize, Option<&HeaderValue>)) -> bool {
    match lines {
        (0, _) => true,
        (1, Some(line)) => line
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked"),
        _ => false,
    }
}

/// Whether the port of `host` (if it names one) is a usable TCP port, 1 to 65535:
/// `host:` or `host:99999` reach PHP as `$_SERVER['HTTP_HOST']` and Moodle's idea
/// of its own address, and no browser sends them.
///
/// Read from the end in one pass (the port's digits, its colon, then the name back
/// to any `]`), byte by byte: a search for the literal's `]` and another for the
/// colon took some 270 instructions a request, iterator chains 180.
fn valid_port(host: &[u8]) -> bool {
    let mut name = host;
    while let [rest @ .., b'0'..=b'9'] = name {
        name = rest;
    }
    let port = &host[name.len()..];
    let ported = match name {
        [rest @ .., b':'] => {
            name = rest;
            true
        }
        _ => false,
    };
    // Back to any IPv6 literal's `]`: a colon in between would start the port.
    while let [rest @ .., last] = name {
        match last {
            b']' => break,
            b':' => return false,
            _ => name = rest,
        }
    }
    let value = || port.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
    !ported || (port.len() <= 5 && (1..=65535).contains(&value()))
}

/// `host:port` → `host`; `[v6]:port` → `[v6]`; a host without a port unchanged.
fn strip_port(host: &[u8]) -> &[u8] {
    let colon = host.iter().rposition(|&b| b == b':');
    match colon {
        Some(i) if !host[i..].contains(&b']') && host[i + 1..].iter().all(u8::is_ascii_digit) => {
            &host[..i]
        }
        _ => host,
    }
}

fn content_length(value: &HeaderValue) -> Option<u64> {
    std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(hosts: &[&str]) -> EdgeRules {
        EdgeRules {
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: 1 << 30,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    fn request(lines: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::get("/course/view.php?id=2").body(()).unwrap();
        for (name, value) in lines {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            let value = HeaderValue::from_bytes(value.as_bytes()).unwrap();
            request.headers_mut().append(name, value);
        }
        request
    }

    fn verdict(rules: &EdgeRules, mut request: Request<()>) -> Result<(), GatewayError> {
        rules.admit(&mut request)
    }

    #[test]
    fn an_ordinary_request_passes_untouched() {
        let r = rules(&[]);
        let mut ordinary = request(&[("host", "moodle.example.edu"), ("cookie", "a=b")]);
        assert_eq!(r.admit(&mut ordinary), Ok(()));
        assert_eq!(ordinary.headers().len(), 2);
    }

    #[test]
    fn only_the_methods_a_web_application_uses_pass() {
        let r = rules(&[]);
        for method in ["CONNECT", "TRACE", "get", "PROPFIND"] {
            let mut odd = request(&[("host", "m")]);
            *odd.method_mut() = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(
                verdict(&r, odd),
                Err(GatewayError::MethodNotAllowed),
                "{method}"
            );
        }
    }

    #[test]
    fn host_must_be_exactly_one() {
        let r = rules(&[]);
        let none = request(&[]);
        assert_eq!(verdict(&r, none), Err(GatewayError::MalformedRequest));
        let two = request(&[("host", "a.example"), ("host", "b.example")]);
        assert_eq!(verdict(&r, two), Err(GatewayError::MalformedRequest));
        let empty = request(&[("host", "")]);
        assert_eq!(verdict(&r, empty), Err(GatewayError::MalformedRequest));
    }

    #[test]
    fn an_absolute_form_target_must_name_the_host_line() {
        let r = rules(&[]);
        let mut same = Request::get("http://Moodle.example.edu/my/")
            .body(())
            .unwrap();
        same.headers_mut()
            .insert(HOST, HeaderValue::from_static("moodle.example.edu"));
        assert_eq!(r.admit(&mut same), Ok(()));
        let mut other = Request::get("http://evil.example/my/").body(()).unwrap();
        other
            .headers_mut()
            .insert(HOST, HeaderValue::from_static("moodle.example.edu"));
        assert_eq!(r.admit(&mut other), Err(GatewayError::MalformedRequest));
    }

    #[test]
    fn an_absolute_form_target_with_an_empty_path_goes_on_with_the_path_slash() {
        for (target, sent) in [
            ("http://moodle.example.edu?x=1", "/?x=1"),
            ("http://moodle.example.edu", "/"),
            ("http://moodle.example.edu/my/?x=1", "/my/?x=1"),
        ] {
            let mut asked = Request::get(target).body(()).unwrap();
            asked
                .headers_mut()
                .insert(HOST, HeaderValue::from_static("moodle.example.edu"));
            rules(&[]).admit(&mut asked).unwrap();
            let uri = asked.uri();
            assert_eq!(uri.path_and_query().unwrap().as_str(), sent, "{target}");
            assert_eq!(uri.authority().unwrap(), "moodle.example.edu");
        }
    }

    #[test]
    fn http2_gets_its_host_from_the_authority() {
        let r = rules(&[]);
        let mut h2 = Request::get("https://moodle.example.edu/my/")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        assert_eq!(r.admit(&mut h2), Ok(()));
        assert_eq!(h2.headers()[HOST], "moodle.example.edu");
    }

    #[test]
    fn the_host_allow_list_ignores_case_and_an_unlisted_port() {
        let r = rules(&["moodle.example.edu", "lms.example.edu:8443"]);
        let host = |h: &str| verdict(&r, request(&[("host", h)]));
        assert_eq!(host("MOODLE.example.edu"), Ok(()));
        assert_eq!(host("moodle.example.edu:443"), Ok(()));
        assert_eq!(host("lms.example.edu:8443"), Ok(()));
        assert_eq!(host("lms.example.edu:443"), Err(GatewayError::UnknownHost));
        assert_eq!(host("evil.example"), Err(GatewayError::UnknownHost));
    }

    #[test]
    fn both_framings_at_once_are_refused() {
        let r = rules(&[]);
        let both = request(&[
            ("host", "m"),
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
        ]);
        assert_eq!(verdict(&r, both), Err(GatewayError::MalformedRequest));
    }

    #[test]
    fn each_size_limit_has_its_own_status() {
        let r = EdgeRules {
            max_uri_bytes: 1024,
            max_headers: 3,
            max_body_bytes: 100,
            ..rules(&[])
        };
        let mut long = request(&[("host", "m")]);
        *long.uri_mut() = format!("/{}", "a".repeat(1024)).parse().unwrap();
        assert_eq!(verdict(&r, long), Err(GatewayError::UriTooLong));
        let many = request(&[("host", "m"), ("a", "1"), ("b", "2"), ("c", "3")]);
        assert_eq!(verdict(&r, many), Err(GatewayError::HeadersTooLarge));
        let big = "x".repeat(40 * 1024);
        let huge = request(&[("host", "m"), ("x-big", &big)]);
        assert_eq!(verdict(&r, huge), Err(GatewayError::HeadersTooLarge));
        let body = request(&[("host", "m"), ("content-length", "101")]);
        assert_eq!(verdict(&r, body), Err(GatewayError::PayloadTooLarge));
        let fits = request(&[("host", "m"), ("content-length", "100")]);
        assert_eq!(verdict(&r, fits), Ok(()));
    }

    #[test]
    fn transfer_encoding_is_chunked_alone_or_refused() {
        let r = rules(&[]);
        let te = |values: &[&str]| {
            let mut lines = vec![("host", "m")];
            lines.extend(values.iter().map(|v| ("transfer-encoding", *v)));
            verdict(&r, request(&lines))
        };
        assert_eq!(te(&[]), Ok(()));
        assert_eq!(te(&["chunked"]), Ok(()));
        assert_eq!(te(&["Chunked "]), Ok(()));
        for odd in [
            &["gzip, chunked"][..],
            &["gzip", "chunked"],
            &["chunked, chunked"],
        ] {
            assert_eq!(te(odd), Err(GatewayError::MalformedRequest), "{odd:?}");
        }
    }

    #[test]
    fn a_host_port_outside_1_to_65535_is_refused() {
        let r = rules(&[]);
        let host = |h: &str| verdict(&r, request(&[("host", h)]));
        for good in [
            "m.example",
            "m.example:8080",
            "m.example:65535",
            "[::1]:443",
            "[::1]",
            "8080",
            "[::1]:1",
        ] {
            assert_eq!(host(good), Ok(()), "{good}");
        }
        for bad in [
            "m.example:",
            "m.example:99999",
            "m.example:0",
            "m.example:8o",
            "a:1:2",
            "a:b80",
            "[::1]:",
            "[::1]:080808",
        ] {
            assert_eq!(host(bad), Err(GatewayError::MalformedRequest), "{bad}");
        }
    }

    #[test]
    fn ports_are_stripped_only_where_they_are_ports() {
        assert_eq!(strip_port(b"a.example:8080"), b"a.example");
        assert_eq!(strip_port(b"a.example"), b"a.example");
        assert_eq!(strip_port(b"[::1]:443"), b"[::1]");
        assert_eq!(strip_port(b"[::1]"), b"[::1]");
    }
}
