//! The students' HTTP/1.1 side over real sockets: a raw client writes bytes and
//! reads what comes back, as a browser or a hand-made request would.

use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// What a test waits for at most before it calls the gateway stuck.
const PATIENCE: Duration = Duration::from_secs(5);

fn limits() -> Limits {
    Limits {
        request_headers: Duration::from_secs(2),
        max_headers: 100,
        head_bytes: 16 * 1024,
    }
}

/// A server for one connection on loopback, answering with `answer`; a request
/// it hands over is served by hyper with the same service, as the listener does.
async fn serve_one<F, Fut, B>(answer: F) -> (TcpStream, tokio::task::JoinHandle<bool>)
where
    F: Fn(Request<StudentBody>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut service = tower::service_fn(move |request| {
            let answer = answer.clone();
            async move { Ok::<_, Infallible>(answer(request).await) }
        });
        let mut stop = std::pin::pin!(std::future::pending::<()>());
        let mut stopping = Stopping::new(stop.as_mut());
        match serve(Box::new(stream), &mut service, &limits(), &mut stopping).await {
            Ended::Closed => false,
            Ended::HandOver(io) => {
                let io = hyper_util::rt::TokioIo::new(io);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, FromHyper(service))
                    .await;
                true
            }
        }
    });
    (TcpStream::connect(addr).await.unwrap(), served)
}

/// Everything the server sends until it closes the connection.
async fn read_to_close(client: &mut TcpStream) -> String {
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, client.read_to_end(&mut got))
        .await
        .expect("the server closes the connection")
        .unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

/// Reads until `count` answers ending in `end` have arrived.
async fn read_answers(client: &mut TcpStream, end: &str, count: usize) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&got).matches(end).count() < count {
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("the answers arrive")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Answers with the request's path, method and body.
async fn echo(request: Request<StudentBody>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = format!(
        "{} {} [{}]",
        parts.method,
        parts.uri,
        String::from_utf8_lossy(&body)
    );
    Response::new(Full::new(Bytes::from(text)))
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (mut client, _) = serve_one(echo).await;
    client
        .write_all(
            b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n\
              POST /two HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
              GET /three HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .unwrap();
    let got = read_answers(&mut client, "]", 3).await;
    let one = got.find("GET /one []").unwrap();
    let two = got.find("POST /two [hello]").unwrap();
    let three = got.find("GET /three []").unwrap();
    assert!(one < two && two < three, "{got}");
    assert_eq!(got.matches("HTTP/1.1 200 OK\r\n").count(), 3);
    assert_eq!(got.matches("content-length: ").count(), 3, "{got}");
    assert!(got.contains("date: "), "every answer has a Date: {got}");
}

#[tokio::test]
async fn a_body_that_arrives_in_pieces_reaches_the_service_whole() {
    let (mut client, _) = serve_one(echo).await;
    client
        .write_all(b"POST /form HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(b" world").await.unwrap();
    let got = read_answers(&mut client, "]", 1).await;
    assert!(got.contains("POST /form [hello world]"), "{got}");
}

#[tokio::test]
async fn a_chunked_upload_after_a_plain_request_is_answered_by_hyper() {
    let (mut client, served) = serve_one(echo).await;
    client
        .write_all(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_answers(&mut client, "]", 1).await;
    client
        .write_all(
            b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.contains("POST /chunked [hello]"), "{got}");
    assert!(got.contains("GET /after []"), "{got}");
    assert!(served.await.unwrap(), "the connection went to hyper");
}

#[tokio::test]
async fn a_request_this_side_cannot_read_gets_hypers_400() {
    let (mut client, served) = serve_one(echo).await;
    client
        .write_all(b"GET /\x01 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    assert!(served.await.unwrap());
}

#[tokio::test]
async fn http_1_0_is_answered_as_1_0_and_closed_unless_it_asks_to_keep_alive() {
    let (mut client, _) = serve_one(echo).await;
    client
        .write_all(b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    // Kept, and told so: an HTTP/1.0 client closes otherwise (hyper's rule).
    let got = read_answers(&mut client, "]", 1).await;
    assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
    assert!(got.contains("\r\nconnection: keep-alive\r\n"), "{got}");
    client
        .write_all(b"GET /plain HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
    assert!(!got.contains("connection:"), "{got}");
    assert!(got.ends_with("GET /plain []"), "{got}");
}

#[tokio::test]
async fn a_length_that_is_a_list_goes_to_hyper_for_its_400() {
    let (mut client, served) = serve_one(echo).await;
    client
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\nhi")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    assert!(served.await.unwrap());
}

/// A body of `left` pieces of seven bytes that says it ended with its last piece,
/// as a node's body does.
struct Pieces {
    left: usize,
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"piece.\n")))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

/// A student's socket that has one request to read and takes at most `per_write`
/// bytes of each write, never refusing one: every write stops at a different place
/// of the queue, inside a chunk's framing as often as not.
struct Narrow {
    request: &'static [u8],
    per_write: usize,
    written: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Narrow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.request.is_empty() {
            return Poll::Pending;
        }
        let n = self.request.len().min(buf.remaining());
        buf.put_slice(&self.request[..n]);
        self.request = &self.request[n..];
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Narrow {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(self.per_write);
        self.written.lock().unwrap().extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_chunked_answer_is_written_whole_whatever_each_write_takes() {
    // Past PROVEN bytes a socket gets three chunks (nine parts) to a write; a write
    // that stops inside the first chunk's CRLF leaves seven, and a last piece then
    // needs four places: its three and the last chunk after it.
    let pieces = crate::http::stall::PROVEN / 12 + 10;
    for per_write in 1..40 {
        for pieces in pieces..pieces + 3 {
            let written = Arc::new(Mutex::new(Vec::new()));
            let io = Narrow {
                request: b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                per_write,
                written: written.clone(),
            };
            let mut service = tower::service_fn(move |_: Request<StudentBody>| async move {
                Ok::<_, Infallible>(Response::new(Pieces { left: pieces }))
            });
            let mut stop = std::pin::pin!(std::future::pending::<()>());
            let mut stopping = Stopping::new(stop.as_mut());
            let limits = limits();
            let ended = tokio::time::timeout(
                PATIENCE,
                serve(Box::new(io), &mut service, &limits, &mut stopping),
            );
            assert!(matches!(ended.await, Ok(Ended::Closed)));
            let written = written.lock().unwrap();
            let got = String::from_utf8_lossy(&written);
            let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
            assert_eq!(body.matches("7\r\npiece.\n\r\n").count(), pieces);
            assert!(body.ends_with("\r\n0\r\n\r\n"), "{per_write} {pieces}");
        }
    }
}

#[tokio::test]
async fn connection_close_is_answered_and_honoured() {
    let (mut client, _) = serve_one(echo).await;
    client
        .write_all(b"GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.contains("\r\nconnection: close\r\n"), "{got}");
}

#[tokio::test]
async fn a_body_of_unknown_length_is_sent_chunked() {
    let (mut client, _) = serve_one(|_| async {
        let pieces =
            ["stream", "ed"].map(|piece| Ok::<_, Infallible>(Frame::data(Bytes::from(piece))));
        Response::new(StreamBody::new(futures_util::stream::iter(pieces)))
    })
    .await;
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.contains("transfer-encoding: chunked\r\n"), "{got}");
    assert!(
        got.ends_with("\r\n\r\n6\r\nstream\r\n2\r\ned\r\n0\r\n\r\n"),
        "{got}"
    );
}

#[tokio::test]
async fn head_keeps_the_length_and_sends_no_body() {
    let (mut client, _) = serve_one(|_| async {
        let mut response = Response::new(Full::new(Bytes::new()));
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1234"));
        response
    })
    .await;
    client
        .write_all(b"HEAD /file HTTP/1.1\r\nHost: x\r\n\r\nHEAD /file HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert_eq!(got.matches("content-length: 1234\r\n").count(), 2, "{got}");
    assert!(got.ends_with("\r\n\r\n"), "no body after the head: {got}");
}

#[tokio::test]
async fn a_body_left_unread_closes_the_connection_after_the_answer() {
    let (mut client, _) =
        serve_one(|_| async { Response::new(Full::new(Bytes::from("refused"))) }).await;
    client
        .write_all(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(got.contains("\r\nconnection: close\r\n"), "{got}");
    assert!(got.ends_with("refused"), "{got}");
}

#[tokio::test]
async fn a_body_shorter_than_its_length_cuts_the_connection() {
    let (mut client, _) = serve_one(|_| async {
        let mut response = Response::new(StreamBody::new(futures_util::stream::iter([Ok::<
            _,
            Infallible,
        >(
            Frame::data(Bytes::from("short")),
        )])));
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("100"));
        response
    })
    .await;
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Closed after the five bytes, never ended as if whole: the browser sees a
    // truncated answer, not a complete wrong one.
    let got = read_to_close(&mut client).await;
    assert!(got.contains("content-length: 100\r\n"), "{got}");
    assert!(got.ends_with("short"), "{got}");
}

#[tokio::test]
async fn a_head_that_does_not_come_in_time_closes_the_connection() {
    let (mut client, served) = serve_one(echo).await;
    client.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    let started = tokio::time::Instant::now();
    let got = read_to_close(&mut client).await;
    assert!(got.is_empty(), "{got}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(!served.await.unwrap());
}

#[test]
fn the_names_browsers_spell_read_without_the_general_parse_are_the_names_it_gives() {
    for spelt in KNOWN_REQUEST_SPELLINGS {
        let parsed = HeaderName::from_bytes(spelt).unwrap();
        let name = String::from_utf8_lossy(spelt);
        assert_eq!(known_request_name(spelt), Some(parsed), "{name}");
    }
    assert_eq!(known_request_name(b"host"), None);
    assert_eq!(known_request_name(b"X-Node"), None);
}
