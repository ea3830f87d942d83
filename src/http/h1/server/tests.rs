//! The students' HTTP/1.1 side over real sockets: a raw client writes bytes and
//! reads what comes back, as a browser or a hand-made request would.

use std::time::Duration;

use http_body_util::{BodyExt, Either, Full, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::http::body::splice::patterned as file;
use crate::http::body::stall::WriteStall;
use crate::http::h1::handover::FromHyper;

/// What a test waits for at most before it calls the gateway stuck.
const PATIENCE: Duration = Duration::from_secs(5);

fn limits() -> Limits {
    Limits {
        request_headers: Duration::from_secs(2),
        keep_alive: Duration::from_secs(4),
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
    B: Body<Data = Bytes> + Splice + Send + 'static,
    B::Error: Into<BoxError>,
{
    serve_one_over(answer, |stream| Box::new(stream)).await
}

/// [`serve_one`] over the socket as the listener hands over a plain connection
/// (one a body can be spliced into).
async fn serve_one_plain<F, Fut, B>(answer: F) -> (TcpStream, tokio::task::JoinHandle<bool>)
where
    F: Fn(Request<StudentBody>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Splice + Send + 'static,
    B::Error: Into<BoxError>,
{
    serve_one_over(answer, |stream| Box::new(WriteStall::new(stream, PATIENCE))).await
}

async fn serve_one_over<F, Fut, B>(
    answer: F,
    io: fn(TcpStream) -> StudentIo,
) -> (TcpStream, tokio::task::JoinHandle<bool>)
where
    F: Fn(Request<StudentBody>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Splice + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let stream = io(stream);
        let mut service = tower::service_fn(move |request| {
            let answer = answer.clone();
            async move { Ok::<_, Infallible>(answer(request).await) }
        });
        let mut stop = std::pin::pin!(std::future::pending::<()>());
        let mut stopping = Stopping::new(stop.as_mut());
        // As the listener goes on with a connection: woken when it parked, on
        // hyper's side when handed over.
        let mut start = Start::New(stream);
        loop {
            match serve(start, &mut service, &limits(), &mut stopping).await {
                Ended::Closed => return false,
                Ended::Parked(mut parked) => {
                    let Some(read) = poll_fn(|cx| parked.poll_wait(cx, &mut stopping)).await else {
                        parked.close().await;
                        return false;
                    };
                    start = Start::Woken(parked, read);
                }
                Ended::HandOver(io) => {
                    let io = hyper_util::rt::TokioIo::new(io);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, FromHyper(service))
                        .await;
                    return true;
                }
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
async fn a_kept_connection_reads_each_request_into_the_same_memory_once_the_last_is_gone() {
    let places = Arc::new(Mutex::new(Vec::new()));
    let seen = places.clone();
    let (mut client, _) = serve_one(move |request: Request<StudentBody>| {
        // The path is cut from the bytes the head was read into.
        seen.lock()
            .unwrap()
            .push(request.uri().path().as_ptr() as usize);
        async { Response::new(Full::new(Bytes::from_static(b"ok]"))) }
    })
    .await;
    for _ in 0..4 {
        client
            .write_all(b"GET /course/view.php?id=2 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_answers(&mut client, "ok]", 1).await;
    }
    let places = places.lock().unwrap();
    assert_eq!(places.len(), 4);
    // The bytes the last request used are the ones still in the CPU's cache.
    assert!(places.iter().all(|&at| at == places[0]), "{places:?}");
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

impl Splice for Pieces {}

/// The streamed answers here are the gateway's own, never a node's.
impl<S> Splice for StreamBody<S> {}

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
    let pieces = crate::http::body::stall::PROVEN / 12 + 10;
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
                serve(
                    Start::New(Box::new(io)),
                    &mut service,
                    &limits,
                    &mut stopping,
                ),
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

/// A student reads a page: once the connection has idled [`PARK_AFTER`] it is
/// parked (this side lets go of it, keeping only its `Parked`), and the next
/// click wakes it and is answered on the same connection.
#[tokio::test]
async fn a_connection_idle_past_park_after_parks_and_the_next_click_wakes_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, _) = listener.accept().await.unwrap();
    let served = tokio::spawn(async move {
        let mut service =
            tower::service_fn(|request| async { Ok::<_, Infallible>(echo(request).await) });
        let mut stop = std::pin::pin!(std::future::pending::<()>());
        let mut stopping = Stopping::new(stop.as_mut());
        let mut ends = Vec::new();
        let mut start = Start::New(Box::new(stream));
        loop {
            match serve(start, &mut service, &limits(), &mut stopping).await {
                Ended::Parked(mut parked) => {
                    ends.push("parked");
                    let read = poll_fn(|cx| parked.poll_wait(cx, &mut stopping)).await;
                    let read = read.expect("woken by the next click");
                    start = Start::Woken(parked, read);
                }
                Ended::Closed => return (ends, "closed"),
                Ended::HandOver(_) => return (ends, "handed over"),
            }
        }
    });
    client
        .write_all(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_answers(&mut client, "]", 1)
        .await
        .contains("GET /one []"));
    // Reading the page, for longer than PARK_AFTER and well within keep_alive (4 s).
    tokio::time::sleep(PARK_AFTER + Duration::from_millis(500)).await;
    client
        .write_all(b"GET /two HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut client).await;
    assert!(
        got.contains("GET /two []"),
        "the click after the page was read: {got}"
    );
    let (ends, end) = served.await.unwrap();
    assert_eq!(
        ends.len(),
        1,
        "parked once, while the page was read: {ends:?}"
    );
    assert_eq!(end, "closed");
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

/// A node's answer body read from a real socket, as [`crate::http::upstream::pool::NodeBody`]
/// reads one: in frames, or into a pipe when asked, noting the largest fill asked
/// for each time and how many bytes went by splice.
struct FromNode {
    socket: TcpStream,
    left: u64,
    fills: Fills,
}

impl FromNode {
    /// The body of `length` bytes the node writes on `socket`.
    fn new(socket: TcpStream, length: u64) -> (Self, Fills) {
        let fills = Arc::new(Mutex::new(Vec::new()));
        let body = Self {
            socket,
            left: length,
            fills: fills.clone(),
        };
        (body, fills)
    }
}

impl Body for FromNode {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let mut buf = vec![0; NODE_BUFFER.min(self.left as usize)];
        let mut read = ReadBuf::new(&mut buf);
        ready!(Pin::new(&mut self.socket).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            return Poll::Ready(Some(Err("the node closed".into())));
        }
        self.left -= n as u64;
        buf.truncate(n);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

impl Splice for FromNode {
    fn can_splice(&self) -> bool {
        self.left > 0
    }

    fn poll_splice(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let this = &mut *self;
        this.fills.lock().unwrap().push(max);
        let max = max.min(this.left as usize);
        let moved = ready!(pipe.poll_fill(cx, &this.socket, max))?;
        if moved == 0 {
            return Poll::Ready(Err("the node closed".into()));
        }
        this.left -= moved as u64;
        Poll::Ready(Ok(moved))
    }
}

/// A node's socket with `bytes` written into it by a task of its own (closed after),
/// and the gateway's end of it.
async fn node_sending(bytes: Vec<u8>) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut node, _) = listener.accept().await.unwrap();
        node.write_all(&bytes).await.unwrap();
    });
    TcpStream::connect(addr).await.unwrap()
}

/// The largest fill asked of a [`FromNode`] each time it was spliced.
type Fills = Arc<Mutex<Vec<usize>>>;

/// What answers the first request with `length` bytes read from `node`, and every
/// later one with a short page.
type FirstFromNode = dyn Fn(Request<StudentBody>) -> std::future::Ready<Response<Either<FromNode, Full<Bytes>>>>
    + Send
    + Sync;

fn first_from_node(node: TcpStream, length: u64) -> (Arc<FirstFromNode>, Fills) {
    let (body, fills) = FromNode::new(node, length);
    let body = Mutex::new(Some(body));
    let answer = move |_: Request<StudentBody>| {
        let response = match body.lock().unwrap().take() {
            Some(body) => Response::new(Either::Left(body)),
            None => Response::new(Either::Right(Full::new(Bytes::from("next page")))),
        };
        std::future::ready(response)
    };
    (Arc::new(answer), fills)
}

/// Reads an answer's head and then `length` bytes of its body.
async fn read_answer(client: &mut TcpStream, length: usize) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let head_end = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("the head arrives")
            .unwrap();
        assert!(n > 0, "closed before the head");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let mut body = got.split_off(head_end);
    while body.len() < length {
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("the body arrives")
            .unwrap();
        assert!(n > 0, "closed after {} of {length} bytes", body.len());
        body.extend_from_slice(&buf[..n]);
    }
    (head, body)
}

#[tokio::test]
async fn a_large_answer_from_a_node_goes_by_splice_byte_for_byte_and_the_connection_goes_on() {
    const LENGTH: usize = 1 << 20;
    let sent = file(LENGTH);
    let (answer, fills) = first_from_node(node_sending(sent.clone()).await, LENGTH as u64);
    let (mut client, _) = serve_one_plain(move |request| answer(request)).await;
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut client, LENGTH).await;
    assert!(head.contains("content-length: 1048576\r\n"), "{head}");
    assert!(body == sent, "the file arrived changed");
    let spliced: usize = fills.lock().unwrap().len();
    assert!(spliced > 0, "the body came in frames");
    client
        .write_all(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let next = read_answers(&mut client, "next page", 1).await;
    assert!(next.starts_with("HTTP/1.1 200 OK\r\n"), "{next}");
}

/// The last pipe-load ends the node's body while it still waits in the pipe for a
/// slow student's socket: it must reach them all the same.
#[tokio::test]
async fn a_slow_student_gets_the_last_pipe_load_of_a_spliced_file() {
    const LENGTH: usize = 32 << 20;
    let sent = file(LENGTH);
    let (answer, fills) = first_from_node(node_sending(sent.clone()).await, LENGTH as u64);
    let (mut client, _) = serve_one_plain(move |request| answer(request)).await;
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The socket buffers fill, and the student reads slowly to the end.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut got = Vec::with_capacity(LENGTH + 1024);
    let mut buf = vec![0u8; 64 * 1024];
    while got.len() < LENGTH {
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("the file keeps coming")
            .unwrap();
        assert!(n > 0, "cut after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    while got.len() < head_end + LENGTH {
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("the file's end comes")
            .unwrap();
        assert!(
            n > 0,
            "cut {} bytes before the end",
            head_end + LENGTH - got.len()
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got[head_end..] == sent[..], "the file arrived changed");
    assert!(!fills.lock().unwrap().is_empty(), "the body came in frames");
}

#[tokio::test]
async fn a_student_who_has_not_kept_up_yet_gets_one_node_buffer_in_the_pipe_at_a_time() {
    // Long enough for a busy machine's reader to keep up for four buffers in a row.
    const LENGTH: usize = 8 << 20;
    let (answer, fills) = first_from_node(node_sending(file(LENGTH)).await, LENGTH as u64);
    let (mut client, _) = serve_one_plain(move |request| answer(request)).await;
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_answer(&mut client, LENGTH).await;
    let fills = fills.lock().unwrap();
    assert_eq!(fills.first(), Some(&NODE_BUFFER), "{fills:?}");
    // Once the socket took four node buffers in a row, the pipe's whole capacity.
    assert!(fills.contains(&PIPE_FILL), "{fills:?}");
}

#[tokio::test]
async fn a_small_answer_and_one_over_tls_come_in_frames() {
    const SMALL: usize = 2048;
    let (answer, fills) = first_from_node(node_sending(file(SMALL)).await, SMALL as u64);
    let (mut client, _) = serve_one_plain(move |request| answer(request)).await;
    client
        .write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (_, body) = read_answer(&mut client, SMALL).await;
    assert_eq!(body, file(SMALL));
    assert!(
        fills.lock().unwrap().is_empty(),
        "a 2 KiB answer was spliced"
    );

    // `serve_one` hands the server a stream that is not a plain socket, as TLS is.
    const LARGE: usize = 1 << 20;
    let (answer, fills) = first_from_node(node_sending(file(LARGE)).await, LARGE as u64);
    let (mut client, _) = serve_one(move |request| answer(request)).await;
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (_, body) = read_answer(&mut client, LARGE).await;
    assert!(body == file(LARGE), "the file arrived changed");
    assert!(fills.lock().unwrap().is_empty(), "spliced into a stream");
}

#[tokio::test]
async fn a_node_that_closes_mid_splice_cuts_the_student_connection_after_what_came() {
    const CAME: usize = 100 * 1024;
    let (answer, fills) = first_from_node(node_sending(file(CAME)).await, 1 << 20);
    let (mut client, _) = serve_one_plain(move |request| answer(request)).await;
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (head, mut body) = read_answer(&mut client, 0).await;
    assert!(head.contains("content-length: 1048576\r\n"), "{head}");
    tokio::time::timeout(PATIENCE, client.read_to_end(&mut body))
        .await
        .expect("the connection is cut")
        .unwrap();
    // Every byte that came, and then the end of the connection: never a whole answer.
    assert!(body == file(CAME), "got {} bytes", body.len());
    assert!(!fills.lock().unwrap().is_empty(), "the body came in frames");
}
