//! Nodes that misbehave at the socket level, scripted with a raw `TcpListener`
//! where a hyper server would be too polite: refusing, hanging, stalling or closing
//! mid-body, answering garbage, closing pooled connections, framing bodiless
//! answers, sending `100 Continue`; and a student who gives up halfway through an
//! upload.
//!
//! Why the byte-level view: a proxy that turns a node's broken body into a complete
//! short one hands the browser a truncated page or file it believes is whole, and
//! one that writes body bytes after a `HEAD` or `204` desynchronises the next
//! response on the same connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, config_for, named_upstream, AfterwardsRaw, RawConn, TestGateway};

const WITHIN: Duration = Duration::from_secs(5);
const HOST: &str = "moodle.example.edu";

/// What a scripted node does after writing its answer to one request head.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Waits for the next request on the connection.
    KeepOpen,
    /// Closes the socket.
    Close,
    /// Holds the socket open and never writes again.
    Hold,
}

/// A node's answer to the head it was sent.
type Script = fn(&str) -> (Vec<u8>, Then);

/// A raw node on `127.0.0.1:0` playing `script` for every request head except the
/// gateway's health probes (which get an empty 200); counts requests.
async fn scripted(script: Script) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(play_script(stream, script, counted.clone()));
        }
    });
    (addr, requests)
}

async fn play_script(mut stream: TcpStream, script: Script, requests: Arc<AtomicUsize>) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let (answer, then) = if head.starts_with("GET /theme/image.php") {
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
                Then::KeepOpen,
            )
        } else {
            requests.fetch_add(1, Ordering::SeqCst);
            script(&head)
        };
        if stream.write_all(&answer).await.is_err() {
            return;
        }
        match then {
            Then::KeepOpen => continue,
            Then::Close => return,
            Then::Hold => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
        }
    }
}

async fn gateway_for(node: std::net::SocketAddr, extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn a_node_that_refuses_connections_gives_502() {
    let gateway = gateway_for(support::refused_addr().await, "").await;
    assert_eq!(
        support::get(&gateway.url("/course/view.php")).await.status,
        502
    );
}

#[tokio::test]
async fn a_node_that_never_sends_headers_gives_504_after_response_headers() {
    let extra = "timeouts.response_headers = \"500ms\"";
    let gateway = gateway_for(support::silent_upstream().await, extra).await;
    let started = std::time::Instant::now();
    assert_eq!(
        support::get(&gateway.url("/course/view.php")).await.status,
        504
    );
    // After the node had its 500 ms, not at once.
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(500),
        "504 after {waited:?}"
    );
}

/// A 1000-byte answer of which 100 bytes come.
const SHORT: (usize, usize) = (1000, 100);
/// A 4 MiB answer of which 300 KiB come: past the first node buffer, so what comes
/// after it goes by splice.
const LARGE: (usize, usize) = (4 << 20, 300 << 10);

/// An answer that says it is `length` bytes long and sends `sent` of them.
fn cut_body((length, sent): (usize, usize), then: Then) -> (Vec<u8>, Then) {
    let mut answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n").into_bytes();
    answer.extend(support::patterned(sent));
    (answer, then)
}

/// The client must see every byte that came, then a closed connection: never a
/// complete (shorter) response.
async fn assert_cut_short(gateway: &TestGateway, (length, sent): (usize, usize)) {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(&get("/pluginfile.php/1/mod_resource/content/1/notes.pdf"))
        .await
        .unwrap();
    let response = conn.response(WITHIN, false).await.expect("a response head");
    assert_eq!(response.status, 200);
    assert!(
        !response.complete && response.body.len() < length,
        "the client was handed a complete body: {} bytes, head {:?}",
        response.body.len(),
        response.head
    );
    assert_eq!(response.body.len(), sent, "not every byte that came");
    assert_eq!(
        conn.afterwards(Duration::from_secs(1)).await,
        AfterwardsRaw::Closed
    );
}

#[tokio::test]
async fn a_node_that_stalls_mid_body_gets_the_client_connection_aborted() {
    let (node, _) = scripted(|_| cut_body(SHORT, Then::Hold)).await;
    let gateway = gateway_for(node, "timeouts.body_idle = \"500ms\"").await;
    assert_cut_short(&gateway, SHORT).await;
}

#[tokio::test]
async fn a_node_that_closes_mid_body_gets_the_client_connection_aborted() {
    let (node, _) = scripted(|_| cut_body(SHORT, Then::Close)).await;
    let gateway = gateway_for(node, "").await;
    assert_cut_short(&gateway, SHORT).await;
}

#[tokio::test]
async fn a_node_that_stalls_mid_large_body_gets_the_client_connection_aborted() {
    let (node, _) = scripted(|_| cut_body(LARGE, Then::Hold)).await;
    let gateway = gateway_for(node, "timeouts.body_idle = \"500ms\"").await;
    assert_cut_short(&gateway, LARGE).await;
}

#[tokio::test]
async fn a_node_that_closes_mid_large_body_gets_the_client_connection_aborted() {
    let (node, _) = scripted(|_| cut_body(LARGE, Then::Close)).await;
    let gateway = gateway_for(node, "").await;
    assert_cut_short(&gateway, LARGE).await;
}

#[tokio::test]
async fn a_node_answering_garbage_gives_502() {
    let (node, _) = scripted(|_| (b"HELLO\r\n\r\n".to_vec(), Then::Close)).await;
    let gateway = gateway_for(node, "").await;
    assert_eq!(
        support::get(&gateway.url("/course/view.php")).await.status,
        502
    );
}

#[tokio::test]
async fn a_node_closing_each_connection_after_answering_never_fails_the_next_request() {
    // No `Connection: close`: the gateway pools the connection, then finds it closed.
    let ok = |_: &str| {
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            Then::Close,
        )
    };
    let (node, requests) = scripted(ok).await;
    let gateway = gateway_for(node, "").await;
    for i in 0..20 {
        let seen = support::get(&gateway.url(&format!("/course/view.php?id={i}"))).await;
        assert_eq!(
            (seen.status.as_u16(), seen.text().as_str()),
            (200, "ok"),
            "request {i}"
        );
    }
    assert_eq!(requests.load(Ordering::SeqCst), 20);
}

fn bodiless_answers(head: &str) -> (Vec<u8>, Then) {
    let answer: &[u8] = match head.split(' ').take(2).collect::<Vec<_>>()[..] {
        ["HEAD", _] => b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
        [_, "/no-content"] => b"HTTP/1.1 204 No Content\r\n\r\n",
        [_, "/not-modified"] => b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n",
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext",
    };
    (answer.to_vec(), Then::KeepOpen)
}

#[tokio::test]
async fn head_204_and_304_answers_carry_no_body_and_the_connection_stays_usable() {
    let (node, _) = scripted(bodiless_answers).await;
    let gateway = gateway_for(node, "").await;
    let cases = [
        ("HEAD", "/course/view.php", 200),
        ("GET", "/no-content", 204),
        ("GET", "/not-modified", 304),
    ];
    for (method, path, status) in cases {
        let mut conn = RawConn::connect(gateway.addr).await;
        let request = format!("{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
        conn.send(request.as_bytes()).await.unwrap();
        let response = conn.response(WITHIN, true).await.unwrap();
        assert_eq!(response.status, status, "{method} {path}");
        let after = conn.afterwards(Duration::from_millis(300)).await;
        assert_eq!(
            after,
            AfterwardsRaw::Open,
            "{method} {path}: bytes after the head"
        );
        conn.send(&get("/course/view.php?id=2")).await.unwrap();
        let next = conn.response(WITHIN, false).await.unwrap();
        assert_eq!(
            (next.status, next.body.as_slice()),
            (200, &b"next"[..]),
            "after {method} {path}"
        );
    }
}

#[tokio::test]
async fn a_100_continue_from_the_node_is_followed_by_the_final_response() {
    let (node, _) = scripted(|_| {
        let answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        (answer.to_vec(), Then::KeepOpen)
    })
    .await;
    let gateway = gateway_for(node, "").await;
    let seen = support::get(&gateway.url("/course/view.php")).await;
    assert_eq!((seen.status.as_u16(), seen.text().as_str()), (200, "ok"));
}

/// One request as the connection-counting node saw it.
#[derive(Debug, Clone)]
struct Arrival {
    connection: usize,
    path: String,
    body: Result<usize, String>,
}

/// A hyper node that numbers its connections and records, per request (probes
/// excluded), the connection it came on and how its body ended.
async fn connection_counting_node() -> (std::net::SocketAddr, Arc<Mutex<Vec<Arrival>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let log = arrivals.clone();
    tokio::spawn(async move {
        for connection in 0.. {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let log = log.clone();
                async move {
                    let path = request.uri().path().to_owned();
                    let body = request.into_body().collect().await;
                    let body = body.map(|b| b.to_bytes().len()).map_err(|e| e.to_string());
                    if path != "/theme/image.php" {
                        log.lock().unwrap().push(Arrival {
                            connection,
                            path,
                            body,
                        });
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
                }
            });
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, arrivals)
}

/// Uploads stream to the node as they arrive, as those above `spool_body_bytes` do.
const STREAMED: &str = "[limits]\nspool_body_bytes = 0\n";

#[tokio::test]
async fn an_upload_the_student_abandons_is_cut_short_at_the_node_and_its_connection_not_reused() {
    let (node, arrivals) = connection_counting_node().await;
    // A streamed upload (the spool off: a spooled one never reaches the node).
    let gateway = gateway_for(node, STREAMED).await;
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = format!(
        "POST /repository/repository_ajax.php HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 100000\r\n\r\n"
    );
    conn.send(head.as_bytes()).await.unwrap();
    conn.send(&[b'a'; 50_000]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(conn);

    let first = wait_for_arrivals(&arrivals, 1).await.remove(0);
    assert!(
        !matches!(first.body, Ok(100_000)),
        "the node saw a complete body: {first:?}"
    );
    let seen = support::get(&gateway.url("/course/view.php")).await;
    assert_eq!(seen.status, 200);
    let second = wait_for_arrivals(&arrivals, 2).await.remove(1);
    assert_eq!(second.path, "/course/view.php");
    assert_ne!(
        second.connection, first.connection,
        "the next request went on the connection of the abandoned upload"
    );
}

/// A node that answers an upload before it has read it all (a 413 at once, as PHP's
/// `post_max_size` check can): the student gets that answer, then a closed
/// connection, never one left hanging with the rest of the upload stuck in the
/// gateway.
#[tokio::test]
async fn an_upload_the_node_answers_early_gets_the_answer_then_a_closed_connection() {
    let early = |_: &str| {
        (
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig".to_vec(),
            Then::KeepOpen,
        )
    };
    let (node, _) = scripted(early).await;
    let gateway = gateway_for(node, STREAMED).await;
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = format!(
        "POST /repository/repository_ajax.php HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 1000000\r\n\r\n"
    );
    conn.send(head.as_bytes()).await.unwrap();
    conn.send(&[b'a'; 10_000]).await.unwrap();
    let response = conn
        .response(WITHIN, false)
        .await
        .expect("the node's answer");
    assert_eq!(
        (response.status, response.body.as_slice()),
        (413, &b"big"[..])
    );
    assert_eq!(
        conn.afterwards(Duration::from_secs(2)).await,
        AfterwardsRaw::Closed
    );
}

/// Keep-alive towards the node: requests one after another travel on the connection
/// the first one opened (the gateway keeps it between requests).
#[tokio::test]
async fn requests_one_after_another_share_one_node_connection() {
    let (node, arrivals) = connection_counting_node().await;
    let gateway = gateway_for(node, "").await;
    // One browser's connection: a first request from a new one would take only a
    // node connection that has been quiet (`pool::QUIET`).
    let browser = support::client();
    for i in 0..10 {
        let url = gateway.url(&format!("/course/view.php?id={i}"));
        let seen = browser.get(url.parse().unwrap()).await.unwrap();
        assert_eq!(seen.status(), 200, "request {i}");
        seen.into_body().collect().await.unwrap();
    }
    let arrivals = wait_for_arrivals(&arrivals, 10).await;
    assert!(
        arrivals
            .iter()
            .all(|a| a.connection == arrivals[0].connection),
        "a new node connection for a request that could reuse one: {arrivals:?}"
    );
}

async fn wait_for_arrivals(arrivals: &Mutex<Vec<Arrival>>, count: usize) -> Vec<Arrival> {
    for _ in 0..100 {
        let seen = arrivals.lock().unwrap().clone();
        if seen.len() >= count {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the node saw fewer than {count} requests: {:?}",
        arrivals.lock().unwrap()
    );
}

/// A student who stops reading a large download is cut after `body_idle`, so the
/// node's connection and its PHP worker are freed rather than held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_who_stops_reading_is_cut_after_body_idle() {
    const SIZE: usize = 64 << 20;
    let node =
        support::upstream(|_request| async { Response::new(Body::from(vec![7u8; SIZE])) }).await;
    let data = named_upstream("data").await;
    let config = config_for(&[node], data, "[timeouts]\nbody_idle = \"500ms\"");
    let gateway = TestGateway::start(&config).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let request = format!(
        "GET /pluginfile.php/1/course/overviewfiles/big.bin HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let mut first = vec![0u8; 64 * 1024];
    client.read_exact(&mut first).await.unwrap();
    // The student stops reading; the socket buffers fill and the gateway's writes block.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(WITHIN, client.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the connection was closed, not left hanging");
    assert!(
        first.len() + rest.len() < SIZE,
        "cut before the whole file went out"
    );
}

/// A node that accepts the connection but never reads (every PHP worker wedged): a
/// large upload fills the socket, and without a limit on blocked writes to the node
/// the student would wait for ever. Found in review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_to_a_node_that_never_reads_is_answered() {
    let extra = "[timeouts]\nresponse_headers = \"500ms\"\nbody_idle = \"1s\"";
    let data = named_upstream("data").await;
    let node = support::silent_upstream().await;
    let gateway = TestGateway::start(&config_for(&[node], data, extra)).await;
    let request = Request::post(gateway.url("/course/view.php"))
        .header("host", HOST)
        .body(Body::from(vec![b'x'; 32 << 20]))
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(15), support::client().request(request));
    let response = answer.await.expect("an answer, not a hang").unwrap();
    // The node's fault, told at `body_idle`: not a wait for response headers on
    // top of it (a 504), with the PHP worker held all that time.
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
}

/// A node's `Content-Length` spelt oddly (a repeated list, two lines, leading
/// zeros) reaches the student as one plain number, as HAProxy rewrites it: a
/// client or cache behind the gateway never meets a spelling it could read
/// another way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_content_length_reaches_the_student_as_one_plain_number() {
    let (node, _) = scripted(|head| {
        let length = if head.contains("/list") {
            "Content-Length: 5, 5\r\n"
        } else if head.contains("/lines") {
            "Content-Length: 5\r\nContent-Length: 5\r\n"
        } else {
            "Content-Length: 0005\r\n"
        };
        let answer = format!("HTTP/1.1 200 OK\r\n{length}\r\nhello");
        (answer.into_bytes(), Then::KeepOpen)
    })
    .await;
    let gateway = gateway_for(node, "").await;
    for path in ["/list", "/lines", "/zeros"] {
        let mut raw = RawConn::connect(gateway.addr).await;
        let head = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
        raw.send(head.as_bytes()).await.unwrap();
        let seen = raw.response(WITHIN, false).await.unwrap();
        assert_eq!(seen.status, 200, "{path}");
        assert_eq!(seen.body, b"hello", "{path}");
        let lengths: Vec<&str> = (seen.head.lines())
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
            .collect();
        assert_eq!(lengths, ["content-length: 5"], "{path}");
    }
}

/// A node that sends late stray bytes: the first answer on each connection is
/// complete (`first`), then ~300 ms later a whole stray answer follows on the same
/// connection (`stray`); a later request there is answered (`fresh`) only after it.
async fn late_stray_node() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, write) = stream.into_split();
                let write = Arc::new(tokio::sync::Mutex::new(write));
                let stray_sent = Arc::new(tokio::sync::Notify::new());
                let mut buf = Vec::new();
                let mut answered = 0;
                loop {
                    let end = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end;
                        }
                        let mut chunk = [0u8; 4096];
                        match read.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let probe = buf.starts_with(b"GET /theme/image.php");
                    buf.drain(..end + 4);
                    let answer = |body: &str| {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    if probe {
                        let _ = write
                            .lock()
                            .await
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                            .await;
                        continue;
                    }
                    answered += 1;
                    if answered == 1 {
                        let _ = write
                            .lock()
                            .await
                            .write_all(answer("first").as_bytes())
                            .await;
                        let (write, sent) = (write.clone(), stray_sent.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            let _ = write
                                .lock()
                                .await
                                .write_all(answer("stray").as_bytes())
                                .await;
                            sent.notify_one();
                        });
                    } else {
                        stray_sent.notified().await;
                        let _ = write
                            .lock()
                            .await
                            .write_all(answer("fresh").as_bytes())
                            .await;
                    }
                }
            });
        }
    });
    addr
}

/// A node's late stray bytes never reach another student's first request: a
/// kept node connection goes to a student's first request only once it has been
/// quiet (`pool::QUIET`), and the stray answer is then seen and the connection
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_late_stray_bytes_never_reach_another_students_first_request() {
    let gateway = gateway_for(late_stray_node().await, "").await;
    let ask = |path: &'static str| {
        let addr = gateway.addr;
        async move {
            let mut raw = RawConn::connect(addr).await;
            let head = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
            raw.send(head.as_bytes()).await.unwrap();
            let seen = raw.response(WITHIN, false).await.unwrap();
            String::from_utf8_lossy(&seen.body).into_owned()
        }
    };
    assert_eq!(ask("/course/view.php?id=1").await, "first");
    // Another student, a moment later, while the stray answer is on its way.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        ask("/course/view.php?id=2").await,
        "first",
        "a connection of its own"
    );
    // And once the stray bytes have come: the connection that holds them is dropped.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let later = ask("/course/view.php?id=3").await;
    assert_ne!(later, "stray", "never another student's bytes");
}
