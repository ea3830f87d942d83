//! HTTP/1.1 on the wire, the pieces both of the gateway's hand-written sides share:
//! the queue of bytes one `writev` sends (a head written in place, then body
//! pieces with their chunk framing, none of them copied), and the numbers a head
//! carries.
//!
//! The node side ([`crate::http::client`]) writes requests and reads answers; the
//! student side ([`crate::http::server`]) reads requests and writes answers. Both
//! move bodies as the `Bytes` they arrived in.

use std::io::{self, IoSlice};

use bytes::{Buf, Bytes};
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The bytes queued for a socket: a head, then up to `PARTS` body pieces, written
/// together with one `writev`.
pub(crate) struct Outgoing<const PARTS: usize> {
    /// The head, written in place; its allocation is kept for the next message on
    /// the connection unless the head was unusually large.
    pub head: Vec<u8>,
    /// How much of `head` has been written.
    head_at: usize,
    parts: [Bytes; PARTS],
    len: usize,
    /// Body bytes queued in `parts`.
    queued: usize,
}

impl<const PARTS: usize> Default for Outgoing<PARTS> {
    fn default() -> Self {
        Self {
            head: Vec::new(),
            head_at: 0,
            parts: std::array::from_fn(|_| Bytes::new()),
            len: 0,
            queued: 0,
        }
    }
}

impl<const PARTS: usize> Outgoing<PARTS> {
    /// The most slices [`Self::slices`] fills: the head and every part.
    pub const SLICES: usize = PARTS + 1;
    /// A head allocation larger than this (a very large cookie) is not kept for the
    /// next message.
    const HEAD_KEPT: usize = 4096;

    /// Parts that can still be queued.
    pub fn room(&self) -> usize {
        PARTS - self.len
    }

    /// Whether no body part is queued (the head may be).
    pub fn no_parts(&self) -> bool {
        self.len == 0
    }

    /// Body bytes queued.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Whether nothing is left to write.
    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.head_at == self.head.len()
    }

    /// Queues a body piece after what is queued.
    pub fn push(&mut self, bytes: Bytes) {
        debug_assert!(self.len < PARTS);
        self.queued += bytes.len();
        self.parts[self.len] = bytes;
        self.len += 1;
    }

    /// Forgets everything queued.
    pub fn clear(&mut self) {
        self.head.clear();
        self.head_at = 0;
        for part in &mut self.parts[..self.len] {
            *part = Bytes::new();
        }
        self.len = 0;
        self.queued = 0;
    }

    /// Fills `slices` with what is left to write, in order; returns how many.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let head = &self.head[self.head_at..];
        let mut count = 0;
        if !head.is_empty() {
            slices[0] = IoSlice::new(head);
            count = 1;
        }
        for part in &self.parts[..self.len] {
            slices[count] = IoSlice::new(part);
            count += 1;
        }
        count
    }

    /// Drops the first `written` bytes.
    pub fn advance(&mut self, mut written: usize) {
        let head = self.head.len() - self.head_at;
        if head > 0 {
            if written < head {
                self.head_at += written;
                return;
            }
            written -= head;
            self.head.clear();
            self.head_at = 0;
            if self.head.capacity() > Self::HEAD_KEPT {
                self.head = Vec::new();
            }
        }
        self.queued -= written;
        let mut done = 0;
        for part in &mut self.parts[..self.len] {
            if written >= part.len() {
                written -= part.len();
                done += 1;
            } else {
                part.advance(written);
                break;
            }
        }
        self.parts[..self.len].rotate_left(done);
        for part in &mut self.parts[self.len - done..self.len] {
            *part = Bytes::new();
        }
        self.len -= done;
    }
}

/// Writes a function that gives the `HeaderName` of each spelling listed, matched
/// byte for byte (the compiler turns the `match` into a switch on the length), and
/// `None` for any other; and, for its test, the list of those spellings. A header
/// name spelt as the peer usually spells it skips the general parse, which folds
/// the case of every byte and looks the name up.
macro_rules! known_names {
    ($(#[$doc:meta])* fn $known:ident, $spellings:ident; $($spelt:literal => $name:expr,)*) => {
        $(#[$doc])*
        fn $known(name: &[u8]) -> Option<HeaderName> {
            Some(match name {
                $($spelt => $name,)*
                _ => return None,
            })
        }

        /// Every spelling the function above knows.
        #[cfg(test)]
        const $spellings: &[&[u8]] = &[$($spelt),*];
    };
}

pub(crate) use known_names;

/// `n` in decimal, written into `digits`.
pub(crate) fn itoa(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

/// A chunk's size line: its length in hexadecimal and CRLF.
pub(crate) fn chunk_line(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// A `Content-Length` value: one number, or the same number repeated in a list.
/// Read digit by digit (every answer has one, and `str::parse` after a UTF-8
/// check and a split cost ten times as much).
pub(crate) fn parse_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for item in value.split(|&b| b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() {
            return None;
        }
        let mut n: u64 = 0;
        for &digit in item {
            if !digit.is_ascii_digit() {
                return None;
            }
            n = n.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        }
        if length.is_some_and(|seen| seen != n) {
            return None;
        }
        length = Some(n);
    }
    length
}

/// One header line, as both sides write them: the name as `http` keeps it (lower
/// case), the value as it came.
pub(crate) fn line(head: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    head.extend_from_slice(name.as_str().as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value.as_bytes());
    head.extend_from_slice(b"\r\n");
}

/// How many lines [`PassedLines`] holds; a head with more keeps them all in its
/// `HeaderMap`. A browser sends some fifteen lines of itself with each request.
const PASSED: usize = 16;

/// The header lines of a node's answer that no part of the gateway reads or
/// changes, written to the student as the node sent them.
///
/// Why: a line that goes through a `HeaderMap` is validated, hashed, inserted,
/// written out again and dropped, about 500 instructions, where a small page's
/// whole journey is some 28,000; `Server`, `Date` and Moodle's `X-*` lines are
/// half of a page's lines. Which names pass is [`PassedLines::passes`]; an answer
/// the gateway reads more closely (an upgrade, `X-Accel-*`, a `Connection` that
/// names other lines) keeps every line in its map.
#[derive(Clone, Default)]
pub struct PassedLines {
    /// The answer's head as it came; the lines are cut from it.
    head: Bytes,
    /// Where each line sits in `head`: from its name to the end of its value.
    spans: [(u16, u16); PASSED],
    count: u8,
    /// One of the lines is `Date`: noted as it is pushed (its name is at hand
    /// then), where a scan at write time cost some 60 instructions an answer.
    date: bool,
}

impl std::fmt::Debug for PassedLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.lines().map(String::from_utf8_lossy))
            .finish()
    }
}

impl PassedLines {
    /// Whether a line named `name` (any case) passes. A name joins this list only
    /// once nothing on an answer's way reads it: not the session learning
    /// (`Set-Cookie`), the offload (`X-Accel-*`), the framing (`Content-Length`,
    /// `Transfer-Encoding`, `Connection`), the tunnel (`Upgrade`), a redirect
    /// (`Location`) or Moodle's maintenance page (`Retry-After`). The caching
    /// lines pass too (`Content-Type`, `Cache-Control`, `ETag`, …): the asset
    /// cache is their only reader, and an answer it may keep has them folded back
    /// into its map first ([`crate::http::asset_cache::Fill::keep`]). A Moodle page
    /// sends five of them.
    pub(crate) fn passes(name: &[u8]) -> bool {
        if name.len() > 2 && name_is(&name[..2], b"x-") {
            return !is_accel(name);
        }
        match name.len() {
            4 => name_is(name, b"date") || name_is(name, b"etag") || name_is(name, b"vary"),
            6 => name_is(name, b"server") || name_is(name, b"pragma"),
            7 => name_is(name, b"expires"),
            12 => name_is(name, b"content-type"),
            13 => [b"accept-ranges", b"cache-control", b"last-modified"]
                .iter()
                .any(|known| name_is(name, *known)),
            15 => name_is(name, b"referrer-policy"),
            16 => name_is(name, b"content-language") || name_is(name, b"content-encoding"),
            18 => name_is(name, b"content-style-type"),
            19 => name_is(name, b"content-script-type") || name_is(name, b"content-disposition"),
            _ => false,
        }
    }

    /// Whether a line of a student's request named `name` (any case) passes to its
    /// node as it came. The lines a browser sends of itself that no part of the
    /// students' path changes, and that only a few parts read (the access log
    /// `User-Agent` and `Referer`, the waiting room `Accept`, the asset cache
    /// `Accept-Encoding`), through [`request_values`]. Only the students'
    /// listener passes lines: the dashboard's reads its requests' maps.
    pub(crate) fn passes_request(name: &[u8]) -> bool {
        match name.len() {
            3 => name_is(name, b"dnt"),
            6 => name_is(name, b"accept"),
            7 => name_is(name, b"referer"),
            8 => name_is(name, b"priority"),
            9 => name_is(name, b"sec-ch-ua"),
            10 => name_is(name, b"user-agent"),
            14 => [
                b"sec-fetch-dest",
                b"sec-fetch-mode",
                b"sec-fetch-site",
                b"sec-fetch-user",
            ]
            .iter()
            .any(|known| name_is(name, *known)),
            15 => name_is(name, b"accept-language") || name_is(name, b"accept-encoding"),
            16 => name_is(name, b"sec-ch-ua-mobile"),
            18 => name_is(name, b"sec-ch-ua-platform"),
            25 => name_is(name, b"upgrade-insecure-requests"),
            _ => false,
        }
    }

    /// The values of the lines named `name` (lower case), in order.
    pub(crate) fn values<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        self.lines().filter_map(move |line| {
            let value = match line.split_at_checked(name.len())? {
                (named, [b':', value @ ..]) if name_is(named, name) => value,
                _ => return None,
            };
            Some(value.trim_ascii_start())
        })
    }

    /// How many lines there are.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Their bytes as written, each line with its CRLF.
    pub(crate) fn written_len(&self) -> usize {
        self.lines().map(|line| line.len() + 2).sum()
    }

    /// Takes the line whose name starts at `start` and whose value runs from
    /// `value_at` to `end` in the head. `false` (the line not taken, and the caller
    /// keeps every line in its map) once the list is full, or for an empty value:
    /// an empty line goes through the map, and its namesakes must go with it, or
    /// lines of one name would go out in another order.
    pub(crate) fn push(&mut self, start: u16, value_at: u16, end: u16, date: bool) -> bool {
        if value_at == end {
            return false;
        }
        let Some(span) = self.spans.get_mut(usize::from(self.count)) else {
            return false;
        };
        *span = (start, end);
        self.count += 1;
        self.date |= date;
        true
    }

    /// The head the spans point into, once it has been cut from the buffer.
    pub(crate) fn set_head(&mut self, head: Bytes) {
        self.head = head;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether one of the lines is the answer's `Date`.
    pub(crate) fn has_date(&self) -> bool {
        self.date
    }

    /// Each line, from its name to the end of its value.
    fn lines(&self) -> impl Iterator<Item = &[u8]> {
        self.spans[..usize::from(self.count)]
            .iter()
            .map(|&(start, end)| &self.head[usize::from(start)..usize::from(end)])
    }

    /// Appends the lines to a head being written, each ended by CRLF.
    pub(crate) fn write(&self, head: &mut Vec<u8>) {
        for line in self.lines() {
            head.extend_from_slice(line);
            head.extend_from_slice(b"\r\n");
        }
    }

    /// Puts the lines into `headers`, for a writer that knows only the map
    /// (hyper's HTTP/2 and upgrade sides). The parser checked every name and
    /// value, so none fails here.
    pub(crate) fn fold_into(self, headers: &mut HeaderMap) {
        for (start, end) in self.spans.into_iter().take(usize::from(self.count)) {
            let line = self.head.slice(usize::from(start)..usize::from(end));
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let value = line[colon + 1..].trim_ascii_start();
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&line[..colon]),
                HeaderValue::from_maybe_shared(line.slice(line.len() - value.len()..)),
            ) else {
                continue;
            };
            headers.append(name, value);
        }
    }
}

/// The values of a student request's lines named `name`: those in its map, then
/// those it passes to its node as they came ([`PassedLines::passes_request`],
/// carried by its body). What reads a passed name reads it through here.
pub(crate) fn request_values<'a, B: PassesLines>(
    request: &'a http::Request<B>,
    name: &'a HeaderName,
) -> impl Iterator<Item = &'a [u8]> {
    let passed = request.body().passed_lines();
    let passed = passed
        .into_iter()
        .flat_map(|p| p.values(name.as_str().as_bytes()));
    let mapped = request.headers().get_all(name).iter();
    mapped.map(HeaderValue::as_bytes).chain(passed)
}

/// A request body that carries its request's passed lines
/// ([`PassedLines::passes_request`]): the students' (`StudentBody`).
pub trait PassesLines {
    /// The request's lines that go to its node as they came, if any.
    fn passed_lines(&self) -> Option<&PassedLines> {
        None
    }
}

/// A body built in a test, with every line in its map.
impl PassesLines for () {}

/// Whether a line is one of nginx's `X-Accel-*` (any case), which the offload
/// reads and strips from the map ([`crate::http::offload::is_accel`]).
pub(crate) fn is_accel(name: &[u8]) -> bool {
    name.len() >= 8 && name_is(&name[..8], b"x-accel-")
}

/// Whether a header name (any case, as a parser accepted it) is `lower`, a name of
/// lower-case letters and dashes. Setting bit 5 lowers a letter and leaves a dash
/// as it is; of the other bytes only CR would become a dash, and no name holds
/// one. Every line of every answer is held against half a dozen names: this way
/// costs about 230 instructions a page less than `eq_ignore_ascii_case`, which
/// lowers both sides.
pub(crate) fn name_is(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower.iter().all(|&b| b.is_ascii_lowercase() || b == b'-'));
    name.len() == lower.len() && name.iter().zip(lower).all(|(&b, &l)| b | 0x20 == l)
}

/// Whether a comma-separated header value lists `token` (any case).
pub(crate) fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Whether a `Connection` value names other lines (anything but `close` and
/// `keep-alive`), which a proxy removes along with it.
pub(crate) fn names_lines(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|token| {
            !(token.is_empty()
                || token.eq_ignore_ascii_case(b"close")
                || token.eq_ignore_ascii_case(b"keep-alive"))
        })
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked` (any case): the
/// last coding is the one that frames the body.
pub(crate) fn ends_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether a failed write means the peer closed its side of the connection.
pub(crate) fn closed(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_parts_advance_across_their_boundaries() {
        let mut out = Outgoing::<3>::default();
        out.head.extend_from_slice(b"head");
        out.push(Bytes::from_static(b"5\r\n"));
        out.push(Bytes::from_static(b"hello"));
        let left = |out: &Outgoing<3>| {
            let mut slices = [IoSlice::new(&[]); Outgoing::<3>::SLICES];
            let count = out.slices(&mut slices);
            slices[..count]
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect::<Vec<u8>>()
        };
        out.advance(2);
        assert_eq!(left(&out), b"ad5\r\nhello");
        out.advance(4);
        assert_eq!(left(&out), b"\nhello");
        assert!(
            out.head.is_empty(),
            "the head is written and its buffer emptied"
        );
        out.advance(6);
        assert!(out.is_empty());
        assert_eq!(out.room(), 3);
        assert_eq!(out.queued(), 0);
    }

    #[test]
    fn only_lines_nothing_reads_are_passed_as_they_came() {
        for name in [
            "Server",
            "date",
            "X-Powered-By",
            "x-frame-options",
            "X-UA-Compatible",
            "Content-Language",
            "content-script-type",
            "Content-Style-Type",
            "Referrer-Policy",
            "accept-ranges",
            "X-Node",
            // The asset cache's, folded back for an answer it may keep.
            "content-type",
            "Cache-Control",
            "expires",
            "ETag",
            "last-modified",
            "vary",
            "Pragma",
            "content-encoding",
            "Content-Disposition",
        ] {
            assert!(PassedLines::passes(name.as_bytes()), "{name}");
        }
        // Read on an answer's way: by the session learning, the offload, the
        // framing, the tunnel, a redirect, a refusal, the maintenance check.
        for name in [
            "set-cookie",
            "Set-Cookie2",
            "X-Accel-Redirect",
            "x-accel-buffering",
            "x-accel-",
            "content-length",
            "Transfer-Encoding",
            "connection",
            "keep-alive",
            "upgrade",
            "trailer",
            "location",
            "retry-after",
            "www-authenticate",
            "age",
            "content-range",
            "x-",
        ] {
            assert!(!PassedLines::passes(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn only_a_browsers_own_request_lines_pass_the_map_by() {
        for name in [
            "User-Agent",
            "accept",
            "Accept-Language",
            "accept-encoding",
            "Referer",
            "DNT",
            "priority",
            "Upgrade-Insecure-Requests",
            "sec-fetch-dest",
            "Sec-Fetch-Mode",
            "sec-fetch-site",
            "Sec-Fetch-User",
            "Sec-CH-UA",
            "sec-ch-ua-mobile",
            "Sec-CH-UA-Platform",
        ] {
            assert!(PassedLines::passes_request(name.as_bytes()), "{name}");
        }
        // Read or changed on a request's way: by the edge, the session lookup, the
        // forwarding hygiene, the framing, the offload, the asset cache's answers.
        for name in [
            "host",
            "Cookie",
            "content-length",
            "transfer-encoding",
            "connection",
            "keep-alive",
            "te",
            "upgrade",
            "expect",
            "x-forwarded-for",
            "X-Forwarded-Proto",
            "x-forwarded-host",
            "forwarded",
            "authorization",
            "origin",
            "range",
            "if-range",
            "if-none-match",
            "if-modified-since",
            "content-type",
            "sec-ch-ua-arch",
            "accept-charset",
            "user-agent-x",
        ] {
            assert!(!PassedLines::passes_request(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn a_requests_values_are_read_from_its_map_then_its_passed_lines() {
        let head = Bytes::from_static(b"GET / HTTP/1.1\r\nAccept:  text/html\r\nACCEPT:*/*\r\n");
        let mut passed = PassedLines::default();
        assert!(passed.push(16, 25, 34, false));
        assert!(passed.push(36, 43, 46, false));
        assert!(
            !passed.push(36, 46, 46, false),
            "an empty value is not taken"
        );
        passed.set_head(head);
        struct Carrying(PassedLines);
        impl PassesLines for Carrying {
            fn passed_lines(&self) -> Option<&PassedLines> {
                Some(&self.0)
            }
        }
        let mut request = http::Request::new(Carrying(passed));
        let accept = http::header::ACCEPT;
        request
            .headers_mut()
            .insert(&accept, HeaderValue::from_static("a/b"));
        let values: Vec<&[u8]> = request_values(&request, &accept).collect();
        assert_eq!(values, [&b"a/b"[..], b"text/html", b"*/*"]);
        let agent = http::header::USER_AGENT;
        assert_eq!(request_values(&request, &agent).count(), 0);
    }

    #[test]
    fn names_are_matched_in_any_case_and_only_letter_for_letter() {
        assert!(name_is(b"Content-Length", b"content-length"));
        assert!(name_is(b"X-ACCEL-", b"x-accel-"));
        for other in [&b"content_length"[..], b"content-lengt", b"Content-Length "] {
            assert!(!name_is(other, b"content-length"), "{other:?}");
        }
        // Byte by byte: a letter matches its two cases only, a dash itself and CR,
        // which no parsed name holds.
        for byte in 0..=255u8 {
            let letter = name_is(&[byte], b"q");
            assert_eq!(letter, byte == b'q' || byte == b'Q', "{byte}");
            assert_eq!(
                name_is(&[byte], b"-"),
                byte == b'-' || byte == b'\r',
                "{byte}"
            );
        }
    }

    #[test]
    fn tokens_are_found_in_lists_in_any_case() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(has_token(b"Keep-Alive", b"keep-alive"));
        assert!(!has_token(b"closed", b"close"));
        assert!(ends_chunked(b"gzip, Chunked "));
        assert!(!ends_chunked(b"chunked, gzip"));
    }
}
