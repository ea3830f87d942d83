//! The node side's HTTP/1.1 against a node scripted byte for byte: each answer
//! framing a proxy meets, what reaches the node, and when a connection may be kept.

use std::future::poll_fn;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use http_body_util::{BodyExt, Full};

/// What one exchange came to, as the pool sees it.
#[derive(Debug)]
struct Exchange {
    /// The answer's head: every line passed on is in its map.
    head: Response<()>,
    body: Vec<u8>,
    /// The connection could carry another request.
    kept: bool,
}

/// How the scripted node behaves once it has read the request.
#[derive(Clone, Copy)]
struct Script {
    /// Written back, in pieces of this many bytes (0: at once).
    answer: &'static [u8],
    pieces: usize,
    /// The connection is closed after the answer.
    close: bool,
}

fn answers(answer: &'static [u8]) -> Script {
    Script {
        answer,
        pieces: 0,
        close: false,
    }
}

/// A node that answers and then closes the connection.
fn answers_then_closes(answer: &'static [u8]) -> Script {
    Script {
        close: true,
        ..answers(answer)
    }
}

/// A node that reads one request (up to the end of its head, and `body` more
/// bytes), answers it as `script` says, and returns what it read.
async fn node(
    script: Script,
    body: usize,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut read = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let end = memchr::memmem::find(&read, b"\r\n\r\n");
            if end.is_some_and(|end| read.len() >= end + 4 + body) {
                break;
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "the request ended early: {:?}",
                String::from_utf8_lossy(&read)
            );
            read.extend_from_slice(&chunk[..n]);
        }
        if script.pieces == 0 {
            stream.write_all(script.answer).await.unwrap();
        } else {
            for piece in script.answer.chunks(script.pieces) {
                stream.write_all(piece).await.unwrap();
                stream.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        if !script.close {
            // Held open until the client is done with it.
            let _ = stream.read(&mut chunk).await;
        }
        read
    });
    (addr, served)
}

fn request(method: Method, body: Option<&'static [u8]>) -> Request<RequestBody> {
    let sent = body.map_or_else(RequestBody::empty, |body| {
        let whole = Full::new(Bytes::from_static(body));
        RequestBody::new(whole.map_err(|never| match never {}))
    });
    let mut request = Request::new(sent);
    *request.method_mut() = method;
    *request.uri_mut() = "/mod/scorm/player.php?id=7".parse().unwrap();
    let headers = request.headers_mut();
    headers.insert("host", HeaderValue::from_static("moodle.example"));
    if let Some(body) = body {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    request
}

async fn exchange_with(
    script: Script,
    request: Request<RequestBody>,
) -> (Result<Exchange, ClientError>, Vec<u8>) {
    let body_len = match request.body().is_end_stream() {
        true => 0,
        false => request.headers()[CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap(),
    };
    let (addr, served) = node(script, body_len).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut conn = Connection::new(WriteStall::new(stream, Duration::from_secs(10)));
    let outcome = async {
        conn.start(request, Duration::from_secs(10))?;
        let head = poll_fn(|cx| conn.poll_head(cx)).await?;
        let mut body = Vec::new();
        while let Some(piece) = poll_fn(|cx| conn.poll_data(cx)).await {
            body.extend_from_slice(&piece?);
        }
        Ok(Exchange {
            head,
            body,
            kept: conn.finish(),
        })
    };
    let outcome = tokio::time::timeout(Duration::from_secs(10), outcome)
        .await
        .expect("the exchange hung");
    drop(conn);
    (outcome, served.await.unwrap())
}

async fn exchange(script: Script) -> Result<Exchange, ClientError> {
    exchange_with(script, request(Method::GET, None)).await.0
}

#[tokio::test]
async fn a_get_goes_out_as_one_head_and_a_sized_answer_keeps_the_connection() {
    let script = answers(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Moodle: yes\r\n\r\nhello");
    let (outcome, sent) = exchange_with(script, request(Method::GET, None)).await;
    let answer = outcome.unwrap();
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        "GET /mod/scorm/player.php?id=7 HTTP/1.1\r\nhost: moodle.example\r\n\r\n"
    );
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.head.headers()["x-moodle"], "yes");
    assert_eq!(answer.body, b"hello");
    assert!(answer.kept);
}

#[tokio::test]
async fn a_post_read_whole_leaves_with_its_length_and_its_body() {
    let script = answers(b"HTTP/1.1 303 See Other\r\nLocation: /my/\r\nContent-Length: 0\r\n\r\n");
    let form: &[u8] = b"username=student&password=secret";
    let (outcome, sent) = exchange_with(script, request(Method::POST, Some(form))).await;
    let answer = outcome.unwrap();
    let sent = String::from_utf8(sent).unwrap();
    assert!(
        sent.starts_with("POST /mod/scorm/player.php?id=7 HTTP/1.1\r\n"),
        "{sent}"
    );
    assert!(sent.contains("\r\ncontent-length: 32\r\n"), "{sent}");
    assert!(
        sent.ends_with("\r\n\r\nusername=student&password=secret"),
        "{sent}"
    );
    assert_eq!(answer.head.status(), StatusCode::SEE_OTHER);
    assert!(answer.body.is_empty());
    assert!(answer.kept);
}

#[tokio::test]
async fn the_requests_lines_go_in_its_maps_order_and_its_framing_last() {
    let script = answers(b"HTTP/1.1 303 See Other\r\nLocation: /my/\r\nContent-Length: 0\r\n\r\n");
    let mut request = request(Method::POST, Some(b"a=b"));
    let headers = request.headers_mut();
    for (name, value) in [
        ("x-forwarded-for", "192.0.2.9"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "moodle.example"),
    ] {
        headers.append(name, HeaderValue::from_static(value));
    }
    let (outcome, sent) = exchange_with(script, request).await;
    outcome.unwrap();
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        "POST /mod/scorm/player.php?id=7 HTTP/1.1\r\nhost: moodle.example\r\n\
         x-forwarded-for: 192.0.2.9\r\nx-forwarded-proto: https\r\n\
         x-forwarded-host: moodle.example\r\ncontent-length: 3\r\n\r\na=b"
    );
}

#[tokio::test]
async fn the_framing_sent_is_the_bodys_whatever_the_headers_said() {
    let script = answers(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    let mut stale = request(Method::POST, None);
    stale
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from_static("99"));
    stale
        .headers_mut()
        .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    let (outcome, sent) = exchange_with(script, stale).await;
    outcome.unwrap();
    let sent = String::from_utf8(sent).unwrap();
    assert!(sent.contains("\r\ncontent-length: 0\r\n"), "{sent}");
    assert!(!sent.contains("99") && !sent.contains("chunked"), "{sent}");
}

#[tokio::test]
async fn a_reason_phrase_of_the_nodes_own_travels_on() {
    let script = answers(b"HTTP/1.1 200 Fine Thanks\r\nContent-Length: 0\r\n\r\n");
    let answer = exchange(script).await.unwrap();
    let reason = answer.head.extensions().get::<hyper::ext::ReasonPhrase>();
    assert_eq!(reason.map(|r| r.as_bytes()), Some(&b"Fine Thanks"[..]));
    let script = answers(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    let answer = exchange(script).await.unwrap();
    assert!(answer
        .head
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .is_none());
}

#[tokio::test]
async fn a_chunked_answer_arriving_byte_by_byte_is_decoded_and_keeps_the_connection() {
    let script = Script {
        pieces: 1,
        ..answers(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;name=value\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: dropped\r\n\r\n",
        )
    };
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.body, b"hello, world");
    assert!(answer.kept);
}

#[tokio::test]
async fn an_answer_without_a_length_ends_when_the_node_closes_and_is_not_kept() {
    let script =
        answers_then_closes(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it");
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.body, b"all of it");
    assert!(!answer.kept);
}

#[tokio::test]
async fn informational_answers_are_read_past() {
    let script = answers(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </theme.css>\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    );
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert!(!answer.head.headers().contains_key("link"));
    assert_eq!(answer.body, b"ok");
}

#[tokio::test]
async fn a_head_request_and_a_304_have_no_body_whatever_their_length_says() {
    let script = answers(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
    let (outcome, _) = exchange_with(script, request(Method::HEAD, None)).await;
    let answer = outcome.unwrap();
    assert_eq!(answer.head.headers()[CONTENT_LENGTH], "1000");
    assert!(answer.body.is_empty());
    assert!(answer.kept);

    let script = answers(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1000\r\n\r\n");
    let answer = exchange(script).await.unwrap();
    assert!(answer.body.is_empty());
    assert!(answer.kept);
}

#[tokio::test]
async fn an_answer_framed_twice_is_read_as_chunked_loses_its_length_and_is_not_kept() {
    let script = answers(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    );
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.body, b"hello");
    assert!(!answer.head.headers().contains_key(CONTENT_LENGTH));
    assert!(!answer.kept);

    // Even without a body to read.
    let script = answers(
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    assert!(!exchange(script).await.unwrap().kept);
}

#[tokio::test]
async fn the_lines_about_the_node_connection_alone_are_not_passed_on() {
    let script = answers(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
          Transfer-Encoding: chunked\r\nX-Moodle: yes\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    );
    let answer = exchange(script).await.unwrap();
    let names: Vec<&str> = answer
        .head
        .headers()
        .keys()
        .map(HeaderName::as_str)
        .collect();
    assert_eq!(names, ["x-moodle"]);
    assert!(answer.kept);

    // A Connection line that names another header stays, so the proxy strips both.
    let script = answers(b"HTTP/1.1 200 OK\r\nConnection: x-secret\r\nContent-Length: 0\r\n\r\n");
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.head.headers()["connection"], "x-secret");
    assert!(answer.kept);

    // And still closes the connection when it says close among them.
    let script =
        answers(b"HTTP/1.1 200 OK\r\nConnection: close, x-secret\r\nContent-Length: 0\r\n\r\n");
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.head.headers()["connection"], "close, x-secret");
    assert!(!answer.kept);
}

#[tokio::test]
async fn a_node_that_says_close_or_speaks_http_1_0_is_not_kept() {
    let script = answers(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok");
    assert!(!exchange(script).await.unwrap().kept);
    let script = answers(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
    assert!(!exchange(script).await.unwrap().kept);
    let script =
        answers(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok");
    assert!(exchange(script).await.unwrap().kept);
}

#[tokio::test]
async fn bytes_after_the_answer_make_the_connection_unfit_to_keep() {
    let script = answers(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n");
    let answer = exchange(script).await.unwrap();
    assert_eq!(answer.body, b"ok");
    assert!(!answer.kept);
}

#[tokio::test]
async fn answers_that_break_http_fail_the_exchange() {
    let mut trailers = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
    while trailers.len() < 2 * NODE_BUFFER {
        trailers.extend_from_slice(format!("X-Trailer: {}\r\n", "t".repeat(1000)).as_bytes());
    }
    trailers.extend_from_slice(b"\r\n");
    let broken: [&'static [u8]; 9] = [
        trailers.leak(),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ];
    for answer in broken {
        let error = exchange(answers(answer)).await.unwrap_err();
        assert!(
            matches!(error, ClientError::Malformed(_)),
            "{:?} gave {error:?}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[tokio::test]
async fn a_head_larger_than_the_buffer_is_refused() {
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    // Few lines, each long: the line limit must not be what refuses it.
    let padding = format!("X-Padding: {}\r\n", "p".repeat(500));
    while head.len() <= NODE_BUFFER {
        head.extend_from_slice(padding.as_bytes());
    }
    head.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    let error = exchange(answers(head.leak())).await.unwrap_err();
    assert!(matches!(error, ClientError::HeadTooLarge), "{error:?}");
}

#[tokio::test]
async fn a_node_that_closes_without_answering_or_mid_body_is_told_apart() {
    let script = answers_then_closes(b"");
    let error = exchange(script).await.unwrap_err();
    assert!(error.closed_without_answer(), "{error:?}");

    let script = answers_then_closes(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf");
    let error = exchange(script).await.unwrap_err();
    assert!(matches!(error, ClientError::ClosedMidBody), "{error:?}");
    assert!(!error.closed_without_answer());
}

#[test]
fn lengths_and_chunk_sizes_are_read_strictly() {
    assert_eq!(parse_length(b"42"), Some(42));
    assert_eq!(parse_length(b"42, 42"), Some(42));
    assert_eq!(parse_length(b"42, 43"), None);
    assert_eq!(parse_length(b"+42"), None);
    assert_eq!(parse_length(b""), None);
    assert_eq!(parse_length(b"0"), Some(0));
    assert_eq!(parse_length(b"007"), Some(7));
    assert_eq!(parse_length(b"4 2"), None);
    assert_eq!(parse_length(b"42,"), None);
    assert_eq!(parse_length(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(parse_length(b"18446744073709551616"), None, "past u64");
    assert_eq!(chunk_size(b"1F").unwrap(), 31);
    assert_eq!(chunk_size(b"a;ext=1").unwrap(), 10);
    assert!(chunk_size(b"").is_err());
    assert!(chunk_size(b"0x10").is_err());
    assert!(chunk_size(b"11111111111111111").is_err());
    assert_eq!(chunk_size(b"00000000000000000005").unwrap(), 5);
    assert_eq!(chunk_size(b"5 \t;ext").unwrap(), 5);
    assert_eq!(chunk_size(b"0").unwrap(), 0);
    assert!(chunk_size(b" 5").is_err());
    assert!(chunk_size(b"5\r").is_err());
}

#[test]
fn the_names_read_without_the_general_parse_are_the_names_it_gives() {
    for spelt in KNOWN_SPELLINGS {
        let parsed = HeaderName::from_bytes(spelt).unwrap();
        let name = String::from_utf8_lossy(spelt);
        assert_eq!(known_name(spelt), Some(parsed), "{name}");
    }
    // Any other spelling, or any other name, goes through the general parse.
    assert_eq!(known_name(b"date"), None);
    assert_eq!(known_name(b"X-Node"), None);
}

#[tokio::test]
async fn every_line_of_a_nodes_answer_is_in_its_map_each_name_in_the_nodes_order() {
    let script = answers(
        b"HTTP/1.1 200 OK\r\nServer: Apache\r\nDate: Sat, 05 Dec 2026 10:00:00 GMT\r\n\
          Set-Cookie: MoodleSession=abc; path=/\r\nX-Frame-Options:sameorigin\r\n\
          Content-Type: text/html\r\nSet-Cookie: MOODLEID1_=x; path=/\r\n\
          X-Content-Type-Options: nosniff\r\nX-Site: ours\r\nCache-Control: private\r\n\
          Content-Length: 2\r\n\r\nok",
    );
    let answer = exchange(script).await.unwrap();
    let headers = answer.head.headers();
    let lines: Vec<(&str, &str)> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.to_str().unwrap()))
        .collect();
    assert_eq!(
        lines,
        [
            ("server", "Apache"),
            ("date", "Sat, 05 Dec 2026 10:00:00 GMT"),
            ("set-cookie", "MoodleSession=abc; path=/"),
            ("set-cookie", "MOODLEID1_=x; path=/"),
            ("x-frame-options", "sameorigin"),
            ("content-type", "text/html"),
            ("x-content-type-options", "nosniff"),
            ("x-site", "ours"),
            ("cache-control", "private"),
            ("content-length", "2"),
        ],
        "each name where its first line was, its lines in the node's order"
    );
    assert!(answer.kept);
}

#[tokio::test]
async fn lines_of_one_name_keep_their_order_when_one_is_empty() {
    let script = answers(
        b"HTTP/1.1 200 OK\r\nServer: nginx\r\nCache-Control: no-store\r\n\
          Cache-Control:\r\nCache-Control: private\r\nContent-Length: 2\r\n\r\nok",
    );
    let answer = exchange(script).await.unwrap();
    let lines: Vec<&str> = (answer.head.headers().get_all("cache-control").iter())
        .map(|value| value.to_str().unwrap())
        .collect();
    assert_eq!(lines, ["no-store", "", "private"]);
    assert_eq!(answer.head.headers()["server"], "nginx");
}

#[tokio::test]
async fn many_lines_of_one_name_stay_in_the_map_in_their_order() {
    let mut head = b"HTTP/1.1 200 OK\r\nServer: nginx\r\n".to_vec();
    for n in 0..20 {
        head.extend_from_slice(format!("X-Line: {n}\r\n").as_bytes());
    }
    head.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
    let answer = exchange(answers(Box::leak(head.into_boxed_slice())))
        .await
        .unwrap();
    let lines: Vec<&str> = (answer.head.headers().get_all("x-line").iter())
        .map(|value| value.to_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..20).map(|n| n.to_string()).collect();
    assert_eq!(lines, expected);
}

/// A node that answers every request on one kept connection with `answer`.
async fn node_answering_each(answer: &'static [u8]) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let (mut read, mut chunk) = (Vec::new(), [0u8; 4096]);
        loop {
            while let Some(end) = memchr::memmem::find(&read, b"\r\n\r\n") {
                read.drain(..end + 4);
                stream.write_all(answer).await.unwrap();
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
            }
        }
    });
    addr
}

/// One GET on `conn`, its body as the pieces the connection handed out.
async fn body_pieces(conn: &mut Connection) -> Vec<Bytes> {
    conn.start(request(Method::GET, None), Duration::from_secs(10))
        .unwrap();
    poll_fn(|cx| conn.poll_head(cx)).await.unwrap();
    let mut pieces = Vec::new();
    while let Some(piece) = poll_fn(|cx| conn.poll_data(cx)).await {
        pieces.push(piece.unwrap());
    }
    assert!(conn.finish(), "the connection was not kept");
    pieces
}

#[tokio::test]
async fn a_kept_connection_reads_each_answer_into_the_same_memory_once_the_last_is_gone() {
    let addr = node_answering_each(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut conn = Connection::new(WriteStall::new(stream, Duration::from_secs(10)));
    let first = body_pieces(&mut conn).await;
    let at = first[0].as_ptr();
    drop(first);
    // The bytes the last answer used are the ones still in the CPU's cache.
    for _ in 0..3 {
        let next = body_pieces(&mut conn).await;
        assert_eq!(next.concat(), b"hello");
        assert_eq!(next[0].as_ptr(), at, "the answer was read elsewhere");
    }
}

#[tokio::test]
async fn an_answer_a_slow_student_still_holds_is_never_written_over_by_the_next() {
    let addr = node_answering_each(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut conn = Connection::new(WriteStall::new(stream, Duration::from_secs(10)));
    // Every answer is still held when the next is read.
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(body_pieces(&mut conn).await);
    }
    for pieces in &held {
        assert_eq!(pieces.concat(), b"hello");
    }
    let mut places: Vec<_> = held.iter().map(|pieces| pieces[0].as_ptr()).collect();
    places.sort();
    places.dedup();
    assert_eq!(places.len(), held.len(), "two answers shared their bytes");
}
