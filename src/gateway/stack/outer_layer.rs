//! A layer of an operator's own around the students' path, over real sockets: a
//! browser's request through the public listener and the stack to a node, and the
//! node's answer back. The layer reads and changes headers both ways through the
//! request's and the answer's `HeaderMap`, as tower-http's layers do, and every
//! other line goes through untouched, lines of one name in their order.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, Service};

use super::students;
use crate::access_log::AccessLog;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::http::accept::listener::{serve_connections, Listening};
use crate::http::upstream::proxy::{Client, Withheld};
use crate::sessions::clock::Clock;

/// What the layer saw of one exchange.
#[derive(Debug, Default)]
struct Seen {
    accept_encoding: Vec<String>,
    user_agent: Option<String>,
    content_type: Option<String>,
    nosniff: Option<String>,
}

/// A layer an operator might add: it reads what the browser accepts and who it
/// is, sets the language the site answers in, and hardens the answer (its own
/// `Content-Security-Policy`, no `X-Powered-By`) after reading its type.
#[derive(Clone)]
struct HardeningLayer(Arc<Mutex<Seen>>);

impl<S> Layer<S> for HardeningLayer {
    type Service = Hardening<S>;

    fn layer(&self, inner: S) -> Hardening<S> {
        Hardening {
            inner,
            seen: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct Hardening<S> {
    inner: S,
    seen: Arc<Mutex<Seen>>,
}

const CSP: HeaderName = HeaderName::from_static("content-security-policy");
const X_POWERED_BY: HeaderName = HeaderName::from_static("x-powered-by");

fn text(value: &HeaderValue) -> String {
    value.to_str().unwrap().to_owned()
}

impl<S, B, R> Service<Request<B>> for Hardening<S>
where
    S: Service<Request<B>, Response = Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let headers = request.headers_mut();
        {
            let mut seen = self.seen.lock().unwrap();
            seen.accept_encoding = headers
                .get_all(header::ACCEPT_ENCODING)
                .iter()
                .map(text)
                .collect();
            seen.user_agent = headers.get(header::USER_AGENT).map(text);
        }
        headers.insert(header::ACCEPT_LANGUAGE, HeaderValue::from_static("en-AU"));
        let answer = self.inner.call(request);
        let seen = self.seen.clone();
        Box::pin(async move {
            let mut response = answer.await?;
            let headers = response.headers_mut();
            {
                let mut seen = seen.lock().unwrap();
                seen.content_type = headers.get(header::CONTENT_TYPE).map(text);
                seen.nosniff = headers.get(header::X_CONTENT_TYPE_OPTIONS).map(text);
            }
            headers.remove(X_POWERED_BY);
            headers.insert(CSP, HeaderValue::from_static("frame-ancestors 'self'"));
            Ok(response)
        })
    }
}

/// A node that answers one request with `answer` and hands back the request's head
/// as it arrived.
async fn node(answer: &'static [u8]) -> (SocketAddr, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tell, told) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await;
        stream.write_all(answer).await.unwrap();
        let _ = tell.send(head);
        // Held open, as a node's kept connection is.
        let _ = stream.read(&mut [0; 64]).await;
    });
    (addr, told)
}

/// Reads up to the end of a head (the empty line).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.unwrap();
        assert!(n > 0, "closed inside a head: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// The public listener with the students' path inside `HardeningLayer`, in front
/// of `node`.
async fn gateway_in_front_of(node: SocketAddr, seen: Arc<Mutex<Seen>>) -> SocketAddr {
    let text = format!(
        "[[nodes]]\nname = \"web1\"\nurl = \"http://{node}\"\n\
         [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n"
    );
    let config = Config::parse(&text, std::path::Path::new("."), Default::default()).unwrap();
    let gateway = Arc::new(Gateway::new(&config, Clock::default()));
    let listening = Listening::plain(&config.limits, &config.timeouts);
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = public.local_addr().unwrap();
    let withheld = Arc::new(Withheld::new("gw-admin"));
    let shutdown = std::future::pending::<Duration>();
    tokio::spawn(serve_connections(
        public,
        listening,
        shutdown,
        move |peer, tls| {
            let client = Client::new(peer.ip(), tls);
            let path = students(
                gateway.clone(),
                AccessLog::default(),
                withheld.clone(),
                client,
            );
            HardeningLayer(seen.clone()).layer(path)
        },
    ));
    addr
}

/// The header lines of a head (after its first line), as (lower-case name, value).
fn lines(head: &str) -> Vec<(String, String)> {
    head.lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect()
}

/// The values of the lines named `name`, in order.
fn values<'a>(lines: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    (lines.iter())
        .filter(|(named, _)| named == name)
        .map(|(_, value)| value.as_str())
        .collect()
}

const NODE_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\
    Date: Sun, 06 Dec 2026 08:00:00 GMT\r\n\
    Server: Apache/2.4.62 (Debian)\r\n\
    X-Powered-By: PHP/8.3.14\r\n\
    Set-Cookie: MoodleSession=q1w2e3r4t5y6u7i8o9p0a1s2d3; path=/; HttpOnly\r\n\
    Expires: Mon, 20 Aug 1969 09:23:00 GMT\r\n\
    Cache-Control: private, pre-check=0, post-check=0, max-age=0, no-transform\r\n\
    Pragma: no-cache\r\n\
    Content-Language: en\r\n\
    Set-Cookie: MOODLEID1_=%25F1; path=/\r\n\
    X-Frame-Options: sameorigin\r\n\
    X-Content-Type-Options: nosniff\r\n\
    X-Site-Note: kept as it came\r\n\
    Vary: Accept-Encoding\r\n\
    Content-Type: text/html; charset=utf-8\r\n\
    Content-Length: 4\r\n\
    \r\n\
    page";

#[tokio::test]
async fn a_layer_around_the_students_path_reads_and_writes_any_header_both_ways() {
    let (node_addr, node_read) = node(NODE_ANSWER).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let addr = gateway_in_front_of(node_addr, seen.clone()).await;

    let mut browser = TcpStream::connect(addr).await.unwrap();
    browser
        .write_all(
            b"GET /course/view.php?id=2 HTTP/1.1\r\n\
              Host: moodle.example.edu\r\n\
              Connection: keep-alive\r\n\
              sec-ch-ua: \"Chromium\";v=\"131\"\r\n\
              User-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0\r\n\
              Accept: text/html,application/xhtml+xml\r\n\
              Accept-Encoding: deflate\r\n\
              Accept-Encoding: gzip, br\r\n\
              Accept-Language: de-CH\r\n\
              Referer: http://moodle.example.edu/my/\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"\r\n\r\npage") {
        let n = tokio::time::timeout(Duration::from_secs(10), browser.read(&mut buf))
            .await
            .expect("the answer arrives")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8(answer).unwrap();
    let node_read = lines(&node_read.await.unwrap());

    // The layer read the request's lines a browser sends of itself, every
    // `Accept-Encoding` line in order.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.accept_encoding, ["deflate", "gzip, br"]);
    assert_eq!(
        seen.user_agent.as_deref(),
        Some("Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0")
    );
    // The node got the layer's language, and the rest as the browser sent it.
    assert_eq!(values(&node_read, "accept-language"), ["en-AU"]);
    assert_eq!(
        values(&node_read, "accept-encoding"),
        ["deflate", "gzip, br"]
    );
    assert_eq!(values(&node_read, "sec-ch-ua"), ["\"Chromium\";v=\"131\""]);
    assert_eq!(
        values(&node_read, "referer"),
        ["http://moodle.example.edu/my/"]
    );

    // The layer read the answer's type, and its changes reached the browser.
    assert_eq!(
        seen.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(seen.nosniff.as_deref(), Some("nosniff"));
    let got = lines(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!(
        values(&got, "content-security-policy"),
        ["frame-ancestors 'self'"]
    );
    assert!(values(&got, "x-powered-by").is_empty(), "{answer}");
    // Every other line of the node's reached the browser as the node sent it,
    // lines of one name in the node's order.
    let from_node = lines(std::str::from_utf8(NODE_ANSWER).unwrap());
    for (name, _) in from_node.iter().filter(|(name, _)| name != "x-powered-by") {
        assert_eq!(
            values(&got, name),
            values(&from_node, name),
            "{name}: {answer}"
        );
    }
}
