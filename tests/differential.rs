//! The HTTP/1.1 side held to references on the same bytes, in every `cargo test`:
//!
//! - request heads (mostly valid, with the mutations request smuggling is made of)
//!   read by the gateway's parser, by a plain RFC 9112 reading over `httparse` and
//!   by hyper's server: the same verdict, request line, lines and body framing;
//! - node answers and chunked bodies read by the node answer reader and by the
//!   reference, whole and in pieces;
//! - each shape of answer written by the students' side and by hyper's server:
//!   the same status line, framing, `Connection`, other lines and body bytes.
//!
//! The rules and the deliberate differences live in `http_reference/mod.rs`, which
//! the fuzz targets in `fuzz/` share; these runs are short, the fuzzers go on.

mod http_reference;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Header lines a generated head picks from: the ones that frame a body, spelt
/// the ways smuggling spells them, and the ones browsers send.
fn request_line_pool() -> Vec<&'static str> {
    vec![
        "Host: moodle.example",
        "Host: moodle.example",
        "Content-Length: 5",
        "Content-Length: 0",
        "Content-Length: +5",
        "Content-Length: 0x5",
        "Content-Length: 05",
        "Content-Length:  5 ",
        "Content-Length: 5, 5",
        "Content-Length: 5,6",
        "Content-Length: -1",
        "Content-Length: ",
        "Content-Length: 18446744073709551615",
        "Content-Length: 99999999999999999999",
        "content-length: 5",
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: Chunked",
        "Transfer-Encoding: chunked ",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding: identity, chunked",
        "Transfer-Encoding: gzip",
        "Transfer-Encoding: xchunked",
        "Connection: close",
        "Connection: keep-alive",
        "Connection: Keep-Alive, X-Forwarded-For",
        "Connection: upgrade",
        "Upgrade: websocket",
        "Expect: 100-continue",
        "Accept-Encoding: gzip, deflate, br",
        "Accept-Encoding: ",
        "Accept: text/html",
        "User-Agent: Mozilla/5.0",
        "Referer: https://moodle.example/my/",
        "Cookie: MoodleSession=abc123",
        "Sec-Fetch-Mode: navigate",
        "X-Requested-With: XMLHttpRequest",
        "X-Empty:",
        "Priority: u=0, i",
    ]
}

fn request_head() -> impl Strategy<Value = Vec<u8>> {
    let method = select(vec![
        "GET", "GET", "POST", "HEAD", "PUT", "OPTIONS", "DELETE", "CONNECT", "get", "PATCH",
    ]);
    let target = select(vec![
        "/",
        "/course/view.php?id=5",
        "/theme/yui_combo.php?rollup/3.18.1/yui-moodlesimple-min.css",
        "*",
        "http://moodle.example/login/index.php",
        "http://moodle.example?x=1",
        "/a%2Fb",
        "moodle.example:443",
        "/\u{e9}",
    ]);
    let version = select(vec![
        "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2.0",
    ]);
    let lines = proptest::collection::vec(select(request_line_pool()), 0..6);
    let body = select(vec![
        "",
        "hello",
        "0\r\n\r\n",
        "5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
    ]);
    (method, target, version, lines, body, mutations()).prop_map(
        |(method, target, version, lines, body, mutations)| {
            let mut head = format!("{method} {target} {version}\r\n");
            for line in lines {
                head.push_str(line);
                head.push_str("\r\n");
            }
            head.push_str("\r\n");
            head.push_str(body);
            mutate(head.into_bytes(), &mutations)
        },
    )
}

/// Up to two edits: a byte put in, taken out or changed, most of them the ones
/// that end or split lines.
fn mutations() -> impl Strategy<Value = Vec<(u8, Index, u8)>> {
    let byte = prop_oneof![
        4 => select(vec![b'\r', b'\n', b' ', b'\t', 0, b':', b',', 0x7f, 0x80, 0x0b]),
        1 => any::<u8>(),
    ];
    proptest::collection::vec((0u8..4, any::<Index>(), byte), 0..3)
}

fn mutate(mut bytes: Vec<u8>, mutations: &[(u8, Index, u8)]) -> Vec<u8> {
    for &(kind, at, byte) in mutations {
        let at = at.index(bytes.len() + 1);
        match kind {
            0 => bytes.insert(at, byte),
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            2 if at < bytes.len() => bytes[at] = byte,
            // An obs-fold: a line continued on the next.
            _ => bytes.splice(at..at, *b"\r\n ").for_each(drop),
        }
    }
    bytes
}

fn answer_head() -> impl Strategy<Value = Vec<u8>> {
    let status = select(vec![
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.0 200 OK",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 101 Switching Protocols",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
        "HTTP/1.1 200 Fine",
        "HTTP/1.1 200",
        "HTTP/1.1 099 Low",
        "HTTP/1.1 999 High",
    ]);
    let lines = proptest::collection::vec(
        select(vec![
            "Content-Length: 5",
            "Content-Length: 5",
            "Content-Length: 0",
            "Content-Length: 5, 5",
            "Content-Length: 5,6",
            "Content-Length: +5",
            "Content-Length: 0x5",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: Chunked",
            "Transfer-Encoding: gzip, chunked",
            "Transfer-Encoding: chunked, gzip",
            "Connection: close",
            "Connection: keep-alive",
            "Connection: X-Secret",
            "Keep-Alive: timeout=5",
            "Date: Sun, 06 Nov 1994 08:49:37 GMT",
            "Content-Type: text/html; charset=utf-8",
            "Set-Cookie: MoodleSession=abc; path=/",
            "Cache-Control: no-store",
            "X-Powered-By: PHP/8.3",
            "X-Accel-Redirect: /files/x",
            "ETag: \"1\"",
            "Vary:",
        ]),
        0..6,
    );
    let body = prop_oneof![
        select(vec!["", "hello", "hello world", "5\r\nhello\r\n0\r\n\r\n"])
            .prop_map(|b| b.as_bytes().to_vec()),
        chunked_body(),
    ];
    (status, lines, body, mutations()).prop_map(|(status, lines, body, mutations)| {
        let mut head = format!("{status}\r\n");
        for line in lines {
            head.push_str(line);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&body);
        mutate(bytes, &mutations)
    })
}

/// A chunked body as nodes write it, and as they should not: sizes in either
/// case, with leading zeros, extensions and trailers.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        proptest::collection::vec(any::<u8>(), 1..12),
        select(vec![
            "",
            "",
            ";a=b",
            ";a=\"x y\"",
            " ;a",
            ";",
            ";a=\"\r\"",
            "\t",
        ]),
        select(vec!["{:x}", "{:X}", "00{:x}"]),
    );
    let trailers = select(vec!["", "", "X-Sum: 1\r\n", "bad trailer\r\n"]);
    (
        proptest::collection::vec(chunk, 0..4),
        trailers,
        mutations(),
    )
        .prop_map(|(chunks, trailers, mutations)| {
            let mut body = Vec::new();
            for (data, ext, size) in chunks {
                let size = match size {
                    "{:x}" => format!("{:x}", data.len()),
                    "{:X}" => format!("{:X}", data.len()),
                    _ => format!("00{:x}", data.len()),
                };
                body.extend_from_slice(size.as_bytes());
                body.extend_from_slice(ext.as_bytes());
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(&data);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n");
            body.extend_from_slice(trailers.as_bytes());
            body.extend_from_slice(b"\r\n");
            mutate(body, &mutations)
        })
}

/// 512 cases each (well under a second), or `PROPTEST_CASES` for a longer run.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_heads_read_as_the_reference_and_hyper_read_them(bytes in request_head()) {
        if let Err(difference) = http_reference::check_request(&bytes, true) {
            prop_assert!(false, "{:?}\n{}", String::from_utf8_lossy(&bytes), difference);
        }
    }

    #[test]
    fn node_answers_read_as_the_reference_reads_them(
        bytes in answer_head(),
        head_request in proptest::bool::weighted(0.1),
        piece in 1usize..40,
    ) {
        if let Err(difference) = http_reference::check_answer(&bytes, head_request, piece) {
            prop_assert!(false, "{:?}\n{}", String::from_utf8_lossy(&bytes), difference);
        }
    }

    #[test]
    fn chunked_bodies_decode_as_the_reference_decodes_them(
        body in chunked_body(),
        piece in 1usize..16,
    ) {
        if let Err(difference) = http_reference::check_chunked(&body, piece) {
            prop_assert!(false, "{:?}\n{}", String::from_utf8_lossy(&body), difference);
        }
    }
}

/// An answer both servers are given.
type Shape = fn() -> Response<axum::body::Body>;

fn sized() -> Response<axum::body::Body> {
    Response::new(axum::body::Body::from("hello"))
}

/// A body whose length is not known when the head is written.
fn streamed() -> Response<axum::body::Body> {
    let pieces = [Bytes::from_static(b"hel"), Bytes::from_static(b"lo")];
    let stream = futures_util::stream::iter(pieces.map(Ok::<_, std::io::Error>));
    Response::new(axum::body::Body::from_stream(stream))
}

fn empty_with(status: StatusCode) -> Response<axum::body::Body> {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = status;
    response
}

/// What a client sees of an answer: its status line, its lines but `Date`, its
/// body's bytes as they came on the wire, and whether the connection took a
/// second request after it.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status_line: String,
    /// The lines that frame the body or the connection.
    framing: Vec<(String, String)>,
    /// Every other line, sorted.
    others: Vec<(String, String)>,
    body: Vec<u8>,
    open_after: bool,
}

/// Reads one answer to a request (a `HEAD` when `head`) off `stream`: its head,
/// then its body by its framing.
async fn read_one(stream: &mut TcpStream, head: bool) -> Option<(Vec<u8>, Vec<u8>, bool)> {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut more = [0; 4096];
        let n = stream.read(&mut more).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&more[..n]);
    };
    let head_bytes = buf[..end].to_vec();
    let mut body = buf[end..].to_vec();
    let text = String::from_utf8_lossy(&head_bytes).to_ascii_lowercase();
    let status: u16 = text[9..12].parse().ok()?;
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|l| l.trim().parse::<usize>().ok());
    let chunked = text.contains("transfer-encoding: chunked");
    let mut closed = false;
    let done = |body: &[u8]| {
        if head || status == 204 || status == 304 {
            true
        } else if chunked {
            body.ends_with(b"0\r\n\r\n")
        } else if let Some(length) = length {
            body.len() >= length
        } else {
            false
        }
    };
    while !done(&body) {
        let mut more = [0; 4096];
        match stream.read(&mut more).await {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(n) => body.extend_from_slice(&more[..n]),
        }
    }
    Some((head_bytes, body, closed))
}

/// Where the students' side writes otherwise than hyper's server on purpose,
/// the one place such a difference is allowed.
fn deliberate(ours: &Seen, hypers: &Seen) -> Option<&'static str> {
    let keep_alive = ("connection".to_owned(), "keep-alive".to_owned());
    let close_delimited =
        !hypers.open_after && !hypers.framing.iter().any(|(name, _)| name != "connection");
    // hyper tells an HTTP/1.0 client that asked to keep its connection that it
    // will, and then ends the body by closing it (no length is known): the
    // gateway does not promise what it cannot keep.
    (hypers.status_line.starts_with("HTTP/1.0")
        && close_delimited
        && hypers.framing.contains(&keep_alive)
        && !ours.framing.contains(&keep_alive))
    .then_some("no keep-alive promised on a close-delimited HTTP/1.0 answer")
}

/// Sends `request` twice on one connection to `addr` and tells what came back.
async fn ask(addr: std::net::SocketAddr, request: &[u8]) -> Seen {
    let head = request.starts_with(b"HEAD");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let (head_bytes, body, closed) =
        tokio::time::timeout(Duration::from_secs(5), read_one(&mut stream, head))
            .await
            .expect("an answer in time")
            .expect("an answer");
    let open_after = !closed && {
        let _ = stream.write_all(request).await;
        tokio::time::timeout(Duration::from_secs(5), read_one(&mut stream, head))
            .await
            .expect("the second answer or a close in time")
            .is_some()
    };
    let text = String::from_utf8(head_bytes).unwrap();
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let status_line = lines.next().unwrap().to_owned();
    let (mut framing, mut others) = (Vec::new(), Vec::new());
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        let line = (name.to_ascii_lowercase(), value.trim().to_owned());
        match line.0.as_str() {
            "date" => {}
            "content-length" | "transfer-encoding" | "connection" | "keep-alive" => {
                framing.push(line)
            }
            _ => others.push(line),
        }
    }
    // Lines of different names in any order (RFC 9110 5.3): hyper writes
    // `connection` before `content-length`, the gateway after.
    framing.sort();
    others.sort();
    Seen {
        status_line,
        framing,
        others,
        body,
        open_after,
    }
}

/// Serves connections on the gateway's students' side, answering with `shape`.
async fn ours(shape: Shape) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let plain =
                    moodle_gateway::http::fuzzing::serve_connection(stream, |_| shape()).await;
                assert!(plain, "a request of the table was handed over to hyper");
            });
        }
    });
    addr
}

/// Serves connections with hyper's server as the listener sets it up, answering
/// with `shape`.
async fn hypers(shape: Shape) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_: Request<hyper::body::Incoming>| {
                        std::future::ready(Ok::<_, std::convert::Infallible>(shape()))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .half_close(true)
                    .keep_alive(true)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: m\r\n\r\n";
const HEAD: &[u8] = b"HEAD / HTTP/1.1\r\nHost: m\r\n\r\n";
const GET_10: &[u8] = b"GET / HTTP/1.0\r\nHost: m\r\n\r\n";
const GET_10_KEPT: &[u8] = b"GET / HTTP/1.0\r\nHost: m\r\nConnection: keep-alive\r\n\r\n";
const GET_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn each_shape_of_answer_is_written_as_hypers_server_writes_it() {
    let table: &[(&str, &[u8], Shape)] = &[
        ("a known length", GET, sized),
        ("an unknown length, chunked", GET, streamed),
        ("an empty body", GET, || empty_with(StatusCode::OK)),
        ("a length set by the service", GET, || {
            let mut response = sized();
            response
                .headers_mut()
                .insert("content-length", "5".parse().unwrap());
            response
        }),
        ("chunked set by the service", GET, || {
            let mut response = streamed();
            response
                .headers_mut()
                .insert("transfer-encoding", "chunked".parse().unwrap());
            response
        }),
        ("HEAD, known length", HEAD, sized),
        ("HEAD, unknown length", HEAD, streamed),
        ("HEAD, empty body", HEAD, || empty_with(StatusCode::OK)),
        ("204", GET, || empty_with(StatusCode::NO_CONTENT)),
        ("204 with a body", GET, || {
            let mut response = sized();
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }),
        ("304", GET, || empty_with(StatusCode::NOT_MODIFIED)),
        ("304 with a length set by the service", GET, || {
            let mut response = empty_with(StatusCode::NOT_MODIFIED);
            response
                .headers_mut()
                .insert("content-length", "5".parse().unwrap());
            response
        }),
        ("404 with a reason", GET, || {
            empty_with(StatusCode::NOT_FOUND)
        }),
        ("HTTP/1.0, known length", GET_10, sized),
        ("HTTP/1.0, unknown length", GET_10, streamed),
        ("HTTP/1.0 keep-alive, known length", GET_10_KEPT, sized),
        ("HTTP/1.0 keep-alive, unknown length", GET_10_KEPT, streamed),
        ("Connection: close asked", GET_CLOSE, sized),
        (
            "Connection: close asked, unknown length",
            GET_CLOSE,
            streamed,
        ),
        ("Connection: close answered", GET, || {
            let mut response = sized();
            response
                .headers_mut()
                .insert("connection", "close".parse().unwrap());
            response
        }),
        ("an HTTP/1.0 answer", GET, || {
            let mut response = sized();
            *response.version_mut() = http::Version::HTTP_10;
            response
        }),
    ];
    let mut differences = Vec::new();
    for &(name, request, shape) in table {
        let ours = ask(ours(shape).await, request).await;
        let mut hypers = ask(hypers(shape).await, request).await;
        if let Some(why) = deliberate(&ours, &hypers) {
            eprintln!("{name}: ours differs from hyper's on purpose: {why}");
            hypers.framing.retain(|line| ours.framing.contains(line));
        }
        if ours != hypers {
            differences.push(format!("{name}:\n  ours  {ours:?}\n  hyper {hypers:?}"));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
