//! Which answers the gateway compresses, in which coding, and what their headers
//! become: pure functions over the request's and the answer's `HeaderMap`s.
//!
//! The request decides first, before anything is allocated: a `HEAD` (no body), a
//! `Range` request (its bytes are offsets into the uncompressed answer), or a client
//! that accepts neither brotli nor gzip is answered as the node answered. Then the
//! answer: only a status with a page worth compressing (2xx but `204` and `206`, and
//! the 4xx/5xx pages), only a media type of `types` (text, JSON, JavaScript, CSS,
//! SVG: never images, video, fonts or archives, which are compressed already), never
//! an answer with a `Content-Encoding` of its own (Moodle's CSS and JavaScript come
//! gzipped from PHP), with a `Content-Range`, or offering byte ranges
//! (`Accept-Ranges: bytes`: the file offload and the data server's files, and
//! Moodle's own `send_file()`, where a resumed download must find the same bytes),
//! and never one whose known length is under `min_length`. `Cache-Control:
//! no-transform` is honoured only when `honour_no_transform` says so (the book's
//! "Compression" says why it is not by default).
//!
//! What a compressed answer's headers become (what nginx's `gzip` does): a
//! `Content-Encoding`, no `Content-Length` (the body goes chunked), `Vary:
//! Accept-Encoding` added unless a line already names it, and a strong `ETag` made
//! weak.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use crate::http::body::inflate::weaken_etag;

/// A content coding the gateway compresses in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip`: every browser, every client library.
    Gzip,
    /// `br`: a fifth smaller than gzip for the same time at these levels; browsers
    /// offer it over HTTPS only.
    Brotli,
}

impl Coding {
    /// Its name in `Content-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Brotli => "br",
        }
    }
}

/// The compression settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// 1 (fastest) to 9 (smallest): gzip's level, brotli's quality.
    pub level: u32,
    /// An answer whose `Content-Length` is below this is sent as it is.
    pub min_length: u64,
    /// The media types compressed, lowercase, without parameters.
    pub types: Box<[Box<str>]>,
    /// Whether `Cache-Control: no-transform` keeps an answer as it is.
    pub honour_no_transform: bool,
}

impl Rules {
    /// The coding a request's answer may be compressed in: none for a `HEAD`, a
    /// `Range` request, or a client that accepts neither brotli nor gzip (every
    /// `Accept-Encoding` line read, q-values honoured, brotli preferred at equal
    /// quality). Reads the lines in place: no allocation.
    pub fn asked(method: &Method, headers: &HeaderMap) -> Option<Coding> {
        if method == Method::HEAD || headers.contains_key(header::RANGE) {
            return None;
        }
        let mut best: Option<(u16, Coding)> = None;
        let mut star = None;
        let mut gzip_named = false;
        for item in (headers.get_all(header::ACCEPT_ENCODING).iter())
            .flat_map(|line| line.as_bytes().split(|&b| b == b','))
        {
            let mut parts = item.split(|&b| b == b';');
            let name = parts.next().unwrap_or_default().trim_ascii();
            let q = parts.find_map(quality).unwrap_or(1000);
            let coding =
                if name.eq_ignore_ascii_case(b"gzip") || name.eq_ignore_ascii_case(b"x-gzip") {
                    gzip_named = true;
                    Coding::Gzip
                } else if name.eq_ignore_ascii_case(b"br") {
                    Coding::Brotli
                } else {
                    if name == b"*" {
                        star = Some(q);
                    }
                    continue;
                };
            best = prefer(best, q, coding);
        }
        // A `*` stands for gzip when gzip is not named (RFC 9110 12.5.3).
        if let (Some(q), false) = (star, gzip_named) {
            best = prefer(best, q, Coding::Gzip);
        }
        best.map(|(_, coding)| coding)
    }

    /// Whether an answer with this status and these headers is compressed.
    pub fn applies(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        let status_fits = (status.is_success()
            && status != StatusCode::NO_CONTENT
            && status != StatusCode::PARTIAL_CONTENT)
            || status.is_client_error()
            || status.is_server_error();
        status_fits
            && !headers.contains_key(header::CONTENT_ENCODING)
            && !headers.contains_key(header::CONTENT_RANGE)
            && !lists(headers, header::ACCEPT_RANGES, b"bytes")
            && self.type_fits(headers)
            && self.long_enough(headers)
            && !(self.honour_no_transform && lists(headers, header::CACHE_CONTROL, b"no-transform"))
    }

    fn type_fits(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::CONTENT_TYPE) else {
            return false;
        };
        let media = value.as_bytes().split(|&b| b == b';').next();
        let media = media.unwrap_or_default().trim_ascii();
        (self.types.iter()).any(|t| t.as_bytes().eq_ignore_ascii_case(media))
    }

    fn long_enough(&self, headers: &HeaderMap) -> bool {
        let length = headers.get(header::CONTENT_LENGTH);
        let length = length.and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        length.is_none_or(|n| n >= self.min_length)
    }
}

/// The headers of an answer about to be compressed in `coding`.
pub fn compressed_headers(headers: &mut HeaderMap, coding: Coding) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::ACCEPT_RANGES);
    headers.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(coding.name()),
    );
    if !lists(headers, header::VARY, b"accept-encoding") && !lists(headers, header::VARY, b"*") {
        headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    weaken_etag(headers);
}

/// Whether any line of `name` lists `token` (any case), as a comma-separated list
/// of tokens with optional parameters.
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &[u8]) -> bool {
    (headers.get_all(name).iter())
        .flat_map(|line| line.as_bytes().split(|&b| b == b','))
        .map(|item| item.split(|&b| b == b'=').next().unwrap_or_default())
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// The higher quality wins; brotli wins a tie; a quality of 0 never.
fn prefer(best: Option<(u16, Coding)>, q: u16, coding: Coding) -> Option<(u16, Coding)> {
    match best {
        _ if q == 0 => best,
        Some((best_q, best_coding))
            if best_q > q || (best_q == q && best_coding == Coding::Brotli) =>
        {
            best
        }
        _ => Some((q, coding)),
    }
}

/// A `q=` parameter's value in thousandths (RFC 9110 12.4.2: `0` to `1`, three
/// decimals at most); `None` for another parameter or a malformed value.
fn quality(param: &[u8]) -> Option<u16> {
    let param = param.trim_ascii();
    let value = param
        .strip_prefix(b"q=")
        .or_else(|| param.strip_prefix(b"Q="))?
        .trim_ascii();
    let (whole, fraction) = match value.split_first()? {
        (b'0', rest) => (0, rest),
        (b'1', rest) => (1000, rest),
        _ => return None,
    };
    let digits = match fraction {
        [] => &[][..],
        [b'.', digits @ ..] if digits.len() <= 3 => digits,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, d) in digits.iter().enumerate() {
        if !d.is_ascii_digit() {
            return None;
        }
        thousandths += u16::from(d - b'0') * [100, 10, 1][i];
    }
    (whole + thousandths <= 1000).then_some(whole + thousandths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, lines: &[&str]) -> Option<Coding> {
        let mut headers = HeaderMap::new();
        for line in lines {
            let (name, value) = line.split_once(": ").unwrap();
            headers.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        Rules::asked(&method, &headers)
    }

    fn get(lines: &[&str]) -> Option<Coding> {
        request(Method::GET, lines)
    }

    #[test]
    fn the_client_chooses_among_brotli_and_gzip_by_every_line_and_its_q_values() {
        use Coding::*;
        assert_eq!(get(&[]), None);
        assert_eq!(get(&["accept-encoding: identity"]), None);
        assert_eq!(get(&["accept-encoding: gzip, deflate"]), Some(Gzip));
        assert_eq!(
            get(&["accept-encoding: gzip, deflate, br, zstd"]),
            Some(Brotli)
        );
        assert_eq!(
            get(&["accept-encoding: gzip", "accept-encoding: br"]),
            Some(Brotli)
        );
        assert_eq!(get(&["accept-encoding: br;q=0.5, gzip"]), Some(Gzip));
        assert_eq!(get(&["accept-encoding: gzip;q=0, br;q=0"]), None);
        assert_eq!(get(&["accept-encoding: X-GZIP"]), Some(Gzip));
        assert_eq!(get(&["accept-encoding: *"]), Some(Gzip));
        assert_eq!(get(&["accept-encoding: *, gzip;q=0"]), None);
        assert_eq!(get(&["accept-encoding: gzip;q=0.001"]), Some(Gzip));
        assert_eq!(
            get(&["accept-encoding: gzip;q=2"]),
            Some(Gzip),
            "malformed q: 1"
        );
    }

    #[test]
    fn a_head_or_a_range_request_is_never_compressed() {
        let gzip = "accept-encoding: gzip";
        assert_eq!(request(Method::HEAD, &[gzip]), None);
        assert_eq!(get(&[gzip, "range: bytes=0-99"]), None);
    }

    fn rules() -> Rules {
        Rules {
            level: 5,
            min_length: 1024,
            types: ["text/html", "application/json"]
                .map(Box::<str>::from)
                .into(),
            honour_no_transform: false,
        }
    }

    fn answer(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            let (name, value) = line.split_once(": ").unwrap();
            headers.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn only_a_text_answer_the_node_left_plain_and_not_ranged_is_compressed() {
        let r = rules();
        let html = "content-type: Text/HTML; charset=utf-8";
        assert!(r.applies(StatusCode::OK, &answer(&[html])));
        assert!(r.applies(StatusCode::NOT_FOUND, &answer(&[html])));
        assert!(r.applies(StatusCode::OK, &answer(&[html, "content-length: 1024"])));
        assert!(!r.applies(StatusCode::OK, &answer(&[html, "content-length: 1023"])));
        assert!(!r.applies(StatusCode::OK, &answer(&["content-type: image/png"])));
        assert!(!r.applies(StatusCode::OK, &answer(&[])));
        assert!(!r.applies(StatusCode::PARTIAL_CONTENT, &answer(&[html])));
        assert!(!r.applies(StatusCode::NOT_MODIFIED, &answer(&[html])));
        assert!(!r.applies(StatusCode::NO_CONTENT, &answer(&[html])));
        assert!(!r.applies(StatusCode::FOUND, &answer(&[html])));
        assert!(!r.applies(StatusCode::OK, &answer(&[html, "content-encoding: gzip"])));
        assert!(!r.applies(StatusCode::OK, &answer(&[html, "accept-ranges: bytes"])));
        assert!(r.applies(StatusCode::OK, &answer(&[html, "accept-ranges: none"])));
        let no_transform = "cache-control: private, no-transform";
        assert!(r.applies(StatusCode::OK, &answer(&[html, no_transform])));
        let honour = Rules {
            honour_no_transform: true,
            ..rules()
        };
        assert!(!honour.applies(StatusCode::OK, &answer(&[html, no_transform])));
    }

    #[test]
    fn a_compressed_answer_varies_on_accept_encoding_once_and_its_etag_is_weak() {
        let mut headers = answer(&[
            "content-length: 5000",
            "etag: \"abc\"",
            "vary: Accept-Encoding",
        ]);
        compressed_headers(&mut headers, Coding::Gzip);
        assert_eq!(headers["content-encoding"], "gzip");
        assert!(!headers.contains_key("content-length"));
        assert_eq!(headers["etag"], "W/\"abc\"");
        assert_eq!(headers.get_all("vary").iter().count(), 1);
        let mut headers = answer(&["vary: Cookie"]);
        compressed_headers(&mut headers, Coding::Brotli);
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Cookie", "accept-encoding"]);
        assert_eq!(headers["content-encoding"], "br");
    }
}
