//! The gateway's HTTP/1.1 parsers held to references on the same bytes: the
//! request head parser to a plain reading of RFC 9112 over `httparse` and to
//! hyper's server, the node answer reader to the same reading of a response and a
//! strict chunk decoder. Shared by `tests/differential.rs` (proptest, every
//! `cargo test`) and the fuzz targets in `fuzz/` (included by path), so both hold
//! the parsers to one set of rules.
//!
//! Each `check_*` returns `Err` with a description of the first disagreement that
//! is not one of the deliberate differences in [`deliberate`], the one place
//! where the gateway is allowed to read bytes otherwise than the reference.

#![allow(dead_code)]

use std::cell::RefCell;
use std::time::Duration;

use http::{HeaderMap, Request};
use moodle_gateway::http::body::stall::WriteStall;
use moodle_gateway::http::fuzzing::{AnswerFraming, RequestRead};
use moodle_gateway::http::h1::client::{ClientError, Connection};

/// Header lines either side reads at most (`limits.max_headers`'s default).
const MAX_HEADERS: usize = 100;

/// How a message's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body, or a length of 0.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes.
    Close,
}

/// A head as the reference reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefHead {
    pub method: String,
    pub target: String,
    pub status: u16,
    /// 0 or 1.
    pub minor: u8,
    /// Every line, in order, the name lower-cased.
    pub lines: Vec<(String, Vec<u8>)>,
    pub framing: Framing,
    pub len: usize,
}

impl RefHead {
    fn has(&self, name: &str) -> bool {
        self.lines.iter().any(|(n, _)| n == name)
    }

    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.lines
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Whether a `Connection` line lists `token`.
    fn connection_says(&self, token: &[u8]) -> bool {
        self.values("connection").any(|v| {
            v.split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
        })
    }
}

/// The reference's verdict on a head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefRead {
    Partial,
    Head(RefHead),
    Reject(&'static str),
}

/// A `Content-Length` as RFC 9110 8.6 reads it: every line a list of the same
/// `1*DIGIT`.
fn content_length(head: &RefHead) -> Result<Option<u64>, &'static str> {
    let mut length = None;
    for value in head.values("content-length") {
        for item in value.split(|&b| b == b',') {
            let item = item.trim_ascii();
            if item.is_empty() || !item.iter().all(u8::is_ascii_digit) {
                return Err("Content-Length is not a number");
            }
            let n = std::str::from_utf8(item)
                .unwrap()
                .parse::<u64>()
                .map_err(|_| "Content-Length overflows")?;
            if length.is_some_and(|seen| seen != n) {
                return Err("two different Content-Lengths");
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Whether the last coding of the last `Transfer-Encoding` line is `chunked`.
fn ends_chunked(head: &RefHead) -> bool {
    let Some(last) = head.values("transfer-encoding").last() else {
        return false;
    };
    let coding = last.rsplit(|&b| b == b',').next().unwrap_or_default();
    coding.trim_ascii().eq_ignore_ascii_case(b"chunked")
}

fn lines(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect()
}

/// A request head as RFC 9112 reads it (sections 2-6), over `httparse`'s
/// default grammar.
pub fn reference_request(bytes: &[u8]) -> RefRead {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return RefRead::Partial,
        Err(_) => return RefRead::Reject("httparse refuses it"),
    };
    let mut head = RefHead {
        method: parsed.method.unwrap().to_owned(),
        target: parsed.path.unwrap().to_owned(),
        status: 0,
        minor: parsed.version.unwrap(),
        lines: lines(parsed.headers),
        framing: Framing::None,
        len,
    };
    // 6.3: Transfer-Encoding overrides Content-Length; a request whose last coding
    // is not chunked cannot be framed (400); 6.1: an HTTP/1.0 one is faulty.
    head.framing = if head.has("transfer-encoding") {
        if head.minor == 0 {
            return RefRead::Reject("Transfer-Encoding in HTTP/1.0");
        }
        if !ends_chunked(&head) {
            return RefRead::Reject("a request's last coding is not chunked");
        }
        Framing::Chunked
    } else {
        match content_length(&head) {
            Err(why) => return RefRead::Reject(why),
            Ok(None | Some(0)) => Framing::None,
            Ok(Some(n)) => Framing::Length(n),
        }
    };
    RefRead::Head(head)
}

/// A response head as RFC 9112 6.3 reads it, informational answers (but 101)
/// read past, to a `HEAD` when `head_request`.
pub fn reference_answer_head(bytes: &[u8], head_request: bool) -> RefRead {
    let mut from = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        let len = match parsed.parse(&bytes[from..]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return RefRead::Partial,
            Err(_) => return RefRead::Reject("httparse refuses it"),
        };
        let status = parsed.code.unwrap();
        if (100..200).contains(&status) && status != 101 {
            from += len;
            continue;
        }
        if status < 100 {
            return RefRead::Reject("status code out of range");
        }
        let mut head = RefHead {
            method: String::new(),
            target: String::new(),
            status,
            minor: parsed.version.unwrap(),
            lines: lines(parsed.headers),
            framing: Framing::None,
            len: from + len,
        };
        let cl = content_length(&head);
        head.framing = if head_request || matches!(status, 101 | 204 | 304) {
            Framing::None
        } else if head.has("transfer-encoding") {
            if head.minor == 0 {
                return RefRead::Reject("Transfer-Encoding in HTTP/1.0");
            }
            if ends_chunked(&head) {
                Framing::Chunked
            } else {
                Framing::Close
            }
        } else {
            match cl {
                Err(why) => return RefRead::Reject(why),
                Ok(Some(0)) => Framing::None,
                Ok(Some(n)) => Framing::Length(n),
                Ok(None) => Framing::Close,
            }
        };
        return RefRead::Head(head);
    }
}

/// A chunked body as RFC 9112 7.1 writes it, read strictly: `1*HEXDIG`, chunk
/// extensions of `;`-separated tokens or quoted strings with optional `BWS`, CRLF
/// and nothing else, a trailer section of field lines. The decoded bytes and
/// how many the body took, or why it is refused; `Ok(None)` if it is not complete.
pub fn reference_chunked(bytes: &[u8]) -> Result<Option<(Vec<u8>, usize)>, &'static str> {
    let mut at = 0;
    let mut body = Vec::new();
    let line = |at: usize| -> Result<Option<(&[u8], usize)>, &'static str> {
        let Some(lf) = bytes[at..].iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let line = &bytes[at..at + lf];
        match line.split_last() {
            // A CR inside the line is left to the grammar of what the line holds.
            Some((b'\r', line)) => Ok(Some((line, at + lf + 1))),
            _ => Err("a line not ended by CRLF"),
        }
    };
    loop {
        let Some((size_line, next)) = line(at)? else {
            return Ok(None);
        };
        let digits = size_line
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if digits == 0 {
            return Err("no chunk size");
        }
        let significant = size_line[..digits]
            .iter()
            .skip_while(|&&b| b == b'0')
            .count();
        if significant > 16 {
            return Err("chunk size overflows");
        }
        let size = u64::from_str_radix(std::str::from_utf8(&size_line[..digits]).unwrap(), 16)
            .map_err(|_| "chunk size overflows")?;
        if !chunk_ext(&size_line[digits..]) {
            return Err("invalid chunk extension");
        }
        at = next;
        if size == 0 {
            break;
        }
        let Some(end) = usize::try_from(size).ok().and_then(|s| at.checked_add(s)) else {
            return Ok(None);
        };
        if bytes.len() < end + 2 {
            if bytes.len() > end && bytes[end] != b'\r' {
                return Err("chunk data not followed by CRLF");
            }
            return Ok(None);
        }
        if &bytes[end..end + 2] != b"\r\n" {
            return Err("chunk data not followed by CRLF");
        }
        body.extend_from_slice(&bytes[at..end]);
        at = end + 2;
    }
    loop {
        let Some((field, next)) = line(at)? else {
            return Ok(None);
        };
        at = next;
        if field.is_empty() {
            return Ok(Some((body, at)));
        }
        let mut headers = [httparse::EMPTY_HEADER; 1];
        let mut with_end = field.to_vec();
        with_end.extend_from_slice(b"\r\n\r\n");
        if !matches!(
            httparse::parse_headers(&with_end, &mut headers),
            Ok(httparse::Status::Complete(_))
        ) {
            return Err("invalid trailer field");
        }
    }
}

/// RFC 9112 7.1.1: `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`.
fn chunk_ext(mut ext: &[u8]) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let bws = |s: &[u8]| -> usize { s.iter().take_while(|b| matches!(b, b' ' | b'\t')).count() };
    let token = |s: &[u8]| -> usize { s.iter().take_while(|&&b| tchar(b)).count() };
    while !ext.is_empty() {
        ext = &ext[bws(ext)..];
        let [b';', rest @ ..] = ext else { return false };
        ext = &rest[bws(rest)..];
        let name = token(ext);
        if name == 0 {
            return false;
        }
        ext = &ext[name..];
        let ws = bws(ext);
        if let [b'=', rest @ ..] = &ext[ws..] {
            ext = &rest[bws(rest)..];
            if let [b'"', rest @ ..] = ext {
                let mut i = 0;
                loop {
                    match rest.get(i) {
                        None => return false,
                        Some(b'"') => break,
                        Some(b'\\') => i += 2,
                        Some(&b) if b == b'\t' || b >= 0x20 && b != 0x7f => i += 1,
                        Some(_) => return false,
                    }
                }
                ext = &rest[i + 1..];
            } else {
                let value = token(ext);
                if value == 0 {
                    return false;
                }
                ext = &ext[value..];
            }
        }
    }
    true
}

/// Where the gateway is allowed to read bytes otherwise than the reference, each
/// with why. `ours` and `reference` say what each made of `bytes`, in a few words.
/// Everything not listed here is a finding.
pub fn deliberate(difference: Difference<'_>) -> Option<&'static str> {
    use Difference::*;
    Some(match difference {
        // The request parser takes only the plain requests browsers send and hands
        // every other one, the bytes untouched, to hyper's server, which answers it:
        // what matters for those is hyper's verdict, which `check_request` compares.
        RequestLeftToHyper(head) => left_to_hyper(head)?,
        // A request framed two ways (Content-Length and Transfer-Encoding) is refused
        // and its connection closed, which RFC 9112 6.1 allows and which leaves no
        // reading for a smuggler to play one party against another (hyper reads it
        // as chunked, httparse just parses the lines).
        RequestRefusedHere(head) if head.has("content-length") && head.has("transfer-encoding") => {
            "framed two ways: refused"
        }
        RequestRefusedHere(_) => return None,
        // A map keeps the order of the lines of one name, which is all RFC 9110
        // 5.3 makes significant; lines of different names may be reordered (a
        // map writes each name's lines together, where its first line was).
        OrderAcrossNames => "only the order within a name is significant",
        // The node connection's own lines are not passed on: the body is decoded
        // and framed anew for the student (Transfer-Encoding), the connection is
        // the pool's (Connection: close / keep-alive, Keep-Alive), and a length
        // beside chunks is dropped (RFC 9112 6.3).
        AnswerLineDropped(name) => match name {
            "transfer-encoding" | "keep-alive" | "connection" | "content-length" => {
                "a line about the node connection alone"
            }
            _ => return None,
        },
        // A node's agreeing Content-Length lines (`5, 5`, two lines of `5`, `0005`)
        // go on as one plain number: a student's client or a cache in front that
        // reads such a list differently cannot be told two lengths.
        LengthNormalised => "one plain Content-Length",
        // Chunk extensions are dropped unread, never passed on: any bytes but CR
        // and LF up to the line's CRLF are ignored, as nginx does (hyper too, but it
        // refuses a bare CR inside one). So is whitespace after the size (hyper's and
        // nginx's leniency: implementations write `5 ;ext`).
        ChunkExtension => "extensions are dropped, never passed on",
        // Trailer lines are dropped unread: the student's body is framed anew.
        TrailerField => "trailers are dropped, never passed on",
        // The reader's bounds on what it holds of a chunked body's framing: a
        // chunk-size line of 4 KiB, a trailer section of 16 KiB.
        Bound("chunk line too long" | "trailer section too large") => "a bound on memory",
        Bound(_) => return None,
    })
}

/// One kind of difference between the gateway and a reference.
#[derive(Debug, Clone, Copy)]
pub enum Difference<'a> {
    RequestLeftToHyper(&'a RefHead),
    RequestRefusedHere(&'a RefHead),
    OrderAcrossNames,
    AnswerLineDropped(&'a str),
    LengthNormalised,
    ChunkExtension,
    TrailerField,
    /// The reader refused a body the reference reads, for this reason.
    Bound(&'static str),
}

/// Why the request parser leaves a request the reference reads to hyper, if it
/// is one of the kinds it does.
fn left_to_hyper(head: &RefHead) -> Option<&'static str> {
    if head.has("transfer-encoding") {
        return Some("a chunked upload");
    }
    if head.has("expect") || head.has("upgrade") || head.method == "CONNECT" {
        return Some("Expect, Upgrade or CONNECT");
    }
    let simple_length = |v: &[u8]| !v.is_empty() && v.iter().all(u8::is_ascii_digit);
    let lengths: Vec<_> = head.values("content-length").collect();
    if lengths.len() > 1 || lengths.iter().any(|v| !simple_length(v)) {
        return Some("a Content-Length that is a list, has a sign or repeats");
    }
    if head.target.len() > u16::MAX as usize - 1 {
        return Some("a target past hyper's 414");
    }
    if http::Uri::try_from(head.target.as_str()).is_err() {
        return Some("a target `http` refuses");
    }
    if head.lines.iter().any(|(n, v)| {
        http::HeaderName::from_bytes(n.as_bytes()).is_err()
            || http::HeaderValue::from_bytes(v).is_err()
    }) {
        return Some("a line `http` refuses");
    }
    if http::Method::from_bytes(head.method.as_bytes()).is_err() {
        return Some("a method `http` refuses");
    }
    if let Some(length) = lengths.first() {
        if std::str::from_utf8(length)
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .is_none_or(|n| n > u64::MAX - 2)
        {
            return Some("a Content-Length past hyper's largest");
        }
    }
    None
}

/// Each name's values in order, for comparing maps whatever the order across names.
fn by_name(lines: impl IntoIterator<Item = (String, Vec<u8>)>) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut names: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    for (name, value) in lines {
        match names.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => names.push((name, vec![value])),
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    names
}

fn map_lines(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// Compares the lines of a map with the reference's, each name's values in order.
fn same_lines(ours: &HeaderMap, reference: &[(String, Vec<u8>)]) -> Result<(), String> {
    let (ours, theirs) = (by_name(map_lines(ours)), by_name(reference.to_vec()));
    if ours != theirs {
        return Err(format!("lines differ: ours {ours:?}, reference {theirs:?}"));
    }
    debug_assert!(deliberate(Difference::OrderAcrossNames).is_some());
    Ok(())
}

/// Holds the request head parser to the reference and hyper's server on `bytes`.
pub fn check_request(bytes: &[u8], with_hyper: bool) -> Result<(), String> {
    let ours = moodle_gateway::http::fuzzing::parse_request(bytes, MAX_HEADERS);
    let reference = reference_request(bytes);
    match (&ours, &reference) {
        (RequestRead::Partial, RefRead::Partial) => {}
        (RequestRead::ForHyper | RequestRead::Refused(_), RefRead::Reject(_)) => {}
        (RequestRead::Refused(_), RefRead::Head(head)) => {
            if deliberate(Difference::RequestRefusedHere(head)).is_none() {
                return Err(format!("refused for no known reason: {head:?}"));
            }
        }
        (RequestRead::ForHyper, RefRead::Head(head)) => {
            if deliberate(Difference::RequestLeftToHyper(head)).is_none() {
                return Err(format!("left to hyper for no known reason: {head:?}"));
            }
        }
        (
            RequestRead::Head {
                request,
                body_len,
                consumed,
                keep_alive,
            },
            RefRead::Head(head),
        ) => {
            // RFC 9112 9.3: HTTP/1.1 persists unless `close`; HTTP/1.0 only
            // with `keep-alive`.
            let keep = if head.minor == 1 {
                !head.connection_says(b"close")
            } else {
                head.connection_says(b"keep-alive") && !head.connection_says(b"close")
            };
            if *keep_alive != keep {
                return Err(format!("keep-alive: ours {keep_alive}, reference {keep}"));
            }
            let version = if head.minor == 1 {
                http::Version::HTTP_11
            } else {
                http::Version::HTTP_10
            };
            // The target as `http` reads it: its display of an absolute form with an
            // empty path says `/`.
            let target = http::Uri::try_from(head.target.as_str()).ok();
            if request.method().as_str() != head.method
                || Some(request.uri()) != target.as_ref()
                || request.version() != version
                || *consumed != head.len
            {
                return Err(format!("request line differs: {request:?} / {head:?}"));
            }
            same_lines(request.headers(), &head.lines)?;
            let framing = match body_len {
                0 => Framing::None,
                n => Framing::Length(*n),
            };
            if framing != head.framing {
                return Err(format!(
                    "framing: ours {framing:?}, reference {:?}",
                    head.framing
                ));
            }
        }
        _ => return Err(format!("verdict: ours {ours:?}, reference {reference:?}")),
    }
    if with_hyper {
        compare_with_hyper(&ours, bytes)?;
    }
    Ok(())
}

/// What hyper's server made of a request: its head and its body's framing.
#[derive(Debug)]
struct HyperRead {
    request: Request<()>,
    framing: Framing,
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    /// A node connection whose socket is never used: `read_answer` reads bytes handed to it.
    static NODE: RefCell<Option<(Connection, std::net::TcpStream)>> = const { RefCell::new(None) };
}

/// hyper's server, as the listener sets it up, on `bytes` followed by the end
/// of the stream: the first request it hands its service, if any.
fn hyper_reads(bytes: &[u8]) -> Result<Option<HyperRead>, String> {
    use http_body::Body as _;
    use tokio::io::AsyncWriteExt;
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
            let record = seen.clone();
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let framing = match request.body().size_hint().exact() {
                        Some(0) => Framing::None,
                        Some(n) => Framing::Length(n),
                        None => Framing::Chunked,
                    };
                    let mut first = record.lock().unwrap();
                    if first.is_none() {
                        *first = Some(HyperRead {
                            request: request.map(|_| ()),
                            framing,
                        });
                    }
                    std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Empty::<bytes::Bytes>::new(),
                    )))
                });
            let connection = hyper::server::conn::http1::Builder::new()
                .max_headers(MAX_HEADERS)
                .half_close(true)
                .header_read_timeout(None)
                .keep_alive(true)
                .serve_connection(hyper_util::rt::TokioIo::new(server), service);
            client.write_all(bytes).await.unwrap();
            client.shutdown().await.unwrap();
            match tokio::time::timeout(Duration::from_secs(5), connection).await {
                Ok(_) => {}
                Err(_) => return Err("hyper's server hangs on it".to_owned()),
            }
            drop(client);
            let first = seen.lock().unwrap().take();
            Ok(first)
        })
    })
}

/// Holds a head the gateway read to hyper's reading of the same bytes.
fn compare_with_hyper(ours: &RequestRead, bytes: &[u8]) -> Result<(), String> {
    let theirs = hyper_reads(bytes)?;
    match (ours, theirs) {
        // Handed to hyper: hyper's verdict is the gateway's. Refused here: held to
        // `deliberate` above (hyper would read chunked).
        (RequestRead::ForHyper | RequestRead::Refused(_), _) => Ok(()),
        (RequestRead::Partial, None) => Ok(()),
        (RequestRead::Partial, Some(theirs)) => Err(format!(
            "ours waits for more, hyper read {:?}",
            theirs.request
        )),
        (RequestRead::Head { request, .. }, None) => {
            Err(format!("ours read {request:?}, hyper refused it"))
        }
        (
            RequestRead::Head {
                request, body_len, ..
            },
            Some(theirs),
        ) => {
            let framing = match body_len {
                0 => Framing::None,
                n => Framing::Length(*n),
            };
            let line = |r: &Request<()>| (r.method().clone(), r.uri().to_string(), r.version());
            if line(request) != line(&theirs.request)
                || by_name(map_lines(request.headers()))
                    != by_name(map_lines(theirs.request.headers()))
                || framing != theirs.framing
            {
                return Err(format!(
                    "ours {request:?} framed {framing:?}, hyper {:?} framed {:?}",
                    theirs.request, theirs.framing
                ));
            }
            Ok(())
        }
    }
}

/// The one number every `Content-Length` line and list item agrees on, if any.
fn agreed_length(lines: &[(String, Vec<u8>)]) -> Option<u64> {
    let mut items = (lines.iter())
        .filter(|(name, _)| name == "content-length")
        .flat_map(|(_, value)| value.split(|&b| b == b','))
        .map(|item| {
            let item = item.trim_ascii();
            let digits = !item.is_empty() && item.iter().all(u8::is_ascii_digit);
            digits.then(|| std::str::from_utf8(item).ok()?.parse::<u64>().ok())?
        });
    let first = items.next()??;
    items.all(|n| n == Some(first)).then_some(first)
}

/// The node answer reader on `bytes`, arriving `piece` at a time.
pub fn read_answer(
    bytes: &[u8],
    head_request: bool,
    piece: usize,
) -> Result<moodle_gateway::http::fuzzing::Answer, ClientError> {
    NODE.with_borrow_mut(|node| {
        let (connection, _) = node.get_or_insert_with(|| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (peer, _) = listener.accept().unwrap();
            ours.set_nonblocking(true).unwrap();
            let ours = RUNTIME.with(|runtime| {
                let _entered = runtime.enter();
                tokio::net::TcpStream::from_std(ours).unwrap()
            });
            let connection = Connection::new(WriteStall::new(ours, Duration::from_secs(10)));
            (connection, peer)
        });
        connection.read_answer(bytes, head_request, piece)
    })
}

/// Holds the node answer reader to the reference on `bytes` (an answer to a
/// `HEAD` when `head_request`), and to itself on the same bytes arriving
/// `piece` at a time.
pub fn check_answer(bytes: &[u8], head_request: bool, piece: usize) -> Result<(), String> {
    let ours = read_answer(bytes, head_request, usize::MAX);
    let pieces = read_answer(bytes, head_request, piece);
    let same = match (&ours, &pieces) {
        (Ok(a), Ok(b)) => {
            a.framing == b.framing
                && a.body == b.body
                && a.kept == b.kept
                && a.response.status() == b.response.status()
                && by_name(map_lines(a.response.headers()))
                    == by_name(map_lines(b.response.headers()))
        }
        (Err(a), Err(b)) => a.to_string() == b.to_string(),
        _ => false,
    };
    if !same {
        return Err(format!(
            "whole and in pieces of {piece} differ: {ours:?} / {pieces:?}"
        ));
    }
    let reference = reference_answer_head(bytes, head_request);
    let head = match (&ours, reference) {
        // The reader's own bound on a head (NODE_BUFFER): the reference has none.
        (Err(ClientError::HeadTooLarge), _) => return Ok(()),
        (Err(_), RefRead::Reject(_)) => return Ok(()),
        (Err(error), RefRead::Partial) if error.closed_without_answer() => return Ok(()),
        (_, RefRead::Head(head)) => head,
        (ours, reference) => {
            return Err(format!("verdict: ours {ours:?}, reference {reference:?}"));
        }
    };
    let rest = &bytes[head.len..];
    let reference_body = reference_body(head.framing, rest);
    let answer = match (ours, reference_body) {
        (Ok(answer), RefBody::Done(body, took)) => (answer, body, &rest[took..]),
        (Ok(_), RefBody::Refused(why)) => return lenient_chunks(rest, why),
        (Err(ClientError::ClosedMidBody), RefBody::Incomplete) => return Ok(()),
        // Both fail the exchange (the reader may find the end missing before it
        // finds the fault, as it does not read trailer lines closely).
        (Err(_), RefBody::Refused(_)) => return Ok(()),
        (Err(ClientError::Malformed(why)), RefBody::Done(..))
            if deliberate(Difference::Bound(why)).is_some() =>
        {
            return Ok(())
        }
        (ours, reference) => {
            return Err(format!("body: ours {ours:?}, reference {reference:?}"));
        }
    };
    let (answer, body, after) = answer;
    let framing = match answer.framing {
        AnswerFraming::None => Framing::None,
        AnswerFraming::Length(n) => Framing::Length(n),
        AnswerFraming::Chunked => Framing::Chunked,
        AnswerFraming::Close => Framing::Close,
    };
    if answer.response.status().as_u16() != head.status || framing != head.framing {
        return Err(format!(
            "head: ours {} framed {framing:?}, reference {} framed {:?}",
            answer.response.status(),
            head.status,
            head.framing
        ));
    }
    let framed_twice = head.has("transfer-encoding") && head.has("content-length");
    let expected: Vec<_> = head
        .lines
        .iter()
        .filter(|(name, value)| {
            let dropped = match name.as_str() {
                "transfer-encoding" | "keep-alive" => true,
                // A 101 has no body to frame: the tunnel reads what follows.
                "content-length" => framed_twice && head.status != 101,
                "connection" => value.split(|&b| b == b',').all(|t| {
                    let t = t.trim_ascii();
                    t.is_empty()
                        || t.eq_ignore_ascii_case(b"close")
                        || t.eq_ignore_ascii_case(b"keep-alive")
                }),
                _ => false,
            };
            !(dropped && deliberate(Difference::AnswerLineDropped(name)).is_some())
        })
        .cloned()
        .collect();
    let mut expected = expected;
    // A 101 is not framed by its length (the tunnel reads what follows): its lines
    // go on as they came.
    if let Some(n) = agreed_length(&expected).filter(|_| head.status != 101) {
        if deliberate(Difference::LengthNormalised).is_some() {
            expected.retain(|(name, _)| name != "content-length");
            expected.push(("content-length".to_owned(), n.to_string().into_bytes()));
        }
    }
    same_lines(answer.response.headers(), &expected)?;
    if answer.body != body {
        return Err(format!(
            "body: ours {:?}, reference {:?}",
            String::from_utf8_lossy(&answer.body),
            String::from_utf8_lossy(&body)
        ));
    }
    let keep = if head.minor == 1 {
        !head.connection_says(b"close")
    } else {
        head.connection_says(b"keep-alive") && !head.connection_says(b"close")
    };
    // A 101's connection is the tunnel's from then on, never the pool's.
    let kept = keep
        && head.status != 101
        && !framed_twice
        && head.framing != Framing::Close
        && after.is_empty();
    if answer.kept != kept {
        return Err(format!("kept: ours {}, reference {kept}", answer.kept));
    }
    Ok(())
}

/// A body as the reference reads it after its head.
#[derive(Debug)]
enum RefBody {
    /// The body and how many bytes it took.
    Done(Vec<u8>, usize),
    /// The connection closed before its end.
    Incomplete,
    Refused(&'static str),
}

fn reference_body(framing: Framing, rest: &[u8]) -> RefBody {
    match framing {
        Framing::None => RefBody::Done(Vec::new(), 0),
        Framing::Close => RefBody::Done(rest.to_vec(), rest.len()),
        Framing::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= rest.len() => RefBody::Done(rest[..n].to_vec(), n),
            _ => RefBody::Incomplete,
        },
        Framing::Chunked => match reference_chunked(rest) {
            Ok(Some((body, took))) => RefBody::Done(body, took),
            Ok(None) => RefBody::Incomplete,
            Err(why) => RefBody::Refused(why),
        },
    }
}

/// The reader took a chunked body the strict reference refuses: allowed only
/// where [`deliberate`] says so.
fn lenient_chunks(rest: &[u8], why: &'static str) -> Result<(), String> {
    let difference = match why {
        "invalid chunk extension" => Difference::ChunkExtension,
        "invalid trailer field" => Difference::TrailerField,
        _ => {
            return Err(format!(
                "ours read a chunked body the reference refuses ({why}): {rest:?}"
            ))
        }
    };
    match deliberate(difference) {
        Some(_) => Ok(()),
        None => Err(format!("chunked body: {why}")),
    }
}

/// The node answer reader on a chunked body: `body` after a head that frames it
/// so, whole and `piece` at a time.
pub fn check_chunked(body: &[u8], piece: usize) -> Result<(), String> {
    let mut bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    bytes.extend_from_slice(body);
    check_answer(&bytes, false, piece)
}
