//! The accept loop of one listener: connection caps, TLS handshakes, HTTP/1.1 (the
//! gateway's own side, [`crate::http::h1::server`], with hyper's behind it for upgrades and
//! the rest) or HTTP/2 by ALPN, and the drain at shutdown.
//!
//! Why hand-written rather than `axum::serve` or hyper-util's helpers: a public
//! proxy needs what those do not give together: a deadline for the request head (a
//! slowloris client must not hold a connection for ever), a cap on open
//! connections answered with a quick 503 instead of a queue, `TCP_NODELAY`, TLS with
//! the protocol chosen by ALPN, upgrades (which hyper-util's graceful shutdown cannot
//! watch), and a drain that lets requests in flight finish.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus::IntCounter;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::{LimitsConfig, Timeouts};
use crate::http::accept::streams::Streams;
use crate::http::body::splice::Splice;
use crate::http::body::stall::{Backlog, SocketPacedService, WriteStall};
use crate::http::h1::handover::{FromHyper, Replayed};
use crate::http::h1::server::{self, Ended, Parked, Start, StudentBody, StudentIo};
use crate::http::h1::stopping::Stopping;

/// A failing `accept` repeats every 50 ms while its cause lasts (`EMFILE`).
static ACCEPT_FAILED: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(10));

/// What answers a connection's requests: a tower service over the students'
/// bodies, one clone per connection. The gateway's own HTTP/1.1 calls it through
/// `&mut`, request after request; hyper's server gets it through [`FromHyper`],
/// which clones it per request as hyper calls through `&self`.
pub(crate) trait Serves<B>:
    tower::Service<
        Request<StudentBody>,
        Response = Response<B>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S, B> Serves<B> for S where
    S: tower::Service<
            Request<StudentBody>,
            Response = Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A response body both HTTP/1.1 sides and HTTP/2 can write to a connection.
/// The gateway's own HTTP/1.1 side may splice it ([`Splice`]).
pub(crate) trait ResponseBody:
    http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Splice
    + Send
    + 'static
{
}

impl<B> ResponseBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Splice
        + Send
        + 'static
{
}

/// How one listener serves its connections.
#[derive(Clone)]
pub(crate) struct Listening {
    /// The deadline for a request head, from its first byte; also the TLS
    /// handshake's, and on hyper's HTTP/1.1 the whole wait for the next request.
    request_headers: Duration,
    /// How long an answered connection may idle before its next request (HTTP/1.1)
    /// or with no stream open (HTTP/2).
    keep_alive: Duration,
    max_headers: usize,
    /// hyper's buffer limit for one HTTP/1.1 connection (see [`http1_buffer`]).
    http1_buffer: usize,
    max_connections: usize,
    http2_max_streams: u32,
    /// How long a write to the client may stay blocked (`timeouts.body_idle`).
    write_stall: Duration,
    /// TLS, with HTTP/2 or HTTP/1.1 chosen by ALPN; `None` for plain HTTP/1.1.
    tls: Option<TlsAcceptor>,
    /// Connections turned away at `max_connections`, and failed TLS handshakes.
    counters: Option<(IntCounter, IntCounter)>,
}

impl Listening {
    /// Plain HTTP/1.1 under `[limits]` and `[timeouts]`.
    pub(crate) fn plain(limits: &LimitsConfig, timeouts: &Timeouts) -> Self {
        Self {
            request_headers: timeouts.request_headers,
            keep_alive: timeouts.keep_alive,
            max_headers: limits.max_headers,
            http1_buffer: http1_buffer(limits.max_header_bytes),
            max_connections: limits.max_connections,
            http2_max_streams: limits.http2_max_streams,
            write_stall: timeouts.body_idle,
            tls: None,
            counters: None,
        }
    }

    /// The same, counting turned-away connections and failed TLS handshakes.
    pub(crate) fn counting(self, turned_away: IntCounter, tls_failed: IntCounter) -> Self {
        let counters = Some((turned_away, tls_failed));
        Self { counters, ..self }
    }

    /// The same, over TLS when `tls` is set.
    pub(crate) fn with_tls(self, tls: Option<TlsAcceptor>) -> Self {
        Self { tls, ..self }
    }
}

/// hyper's buffer limit for an HTTP/1.1 connection: room for the largest request
/// head the edge accepts (a larger one gets hyper's own 431), and no more.
///
/// Why: the same limit bounds the response bytes hyper queues for a student while
/// their socket is full. At hyper's default (about 400 KiB in up to 16 queued
/// chunks, each holding on to the node connection's read buffer) a student who
/// stops reading cost 0.9 MB; with this limit hyper stops taking the node's body
/// after three 16 KiB chunks (and [`crate::http::body::stall::SocketPaced`] after one, on
/// a connection that has not yet shown it keeps up), and back-pressure reaches the node.
fn http1_buffer(max_header_bytes: usize) -> usize {
    (max_header_bytes + 8 * 1024).max(16 * 1024)
}

/// The open connections of one listener: how many (for `max_connections`), and a
/// wake-up when one closes (for the drain at shutdown).
#[derive(Default)]
struct Connections {
    open: AtomicUsize,
    closed: tokio::sync::Notify,
}

/// An open connection's place under `max_connections`, given back when dropped.
struct Open(Arc<Connections>);

impl Open {
    fn take(connections: &Arc<Connections>, max: usize) -> Option<Self> {
        if connections.open.fetch_add(1, Ordering::Relaxed) >= max {
            connections.open.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Self(connections.clone()))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.closed.notify_waiters();
    }
}

/// A hyper connection that can be asked to finish its request in flight and close.
trait Closable: Future {
    fn close(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> Closable for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn close(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B, E> Closable for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn close(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// A listener's closing as its connections wait for it: a flag, and the wake-up
/// of every connection waiting.
///
/// Why not a `watch` channel: each connection keeps its wait for the closing in its
/// task as long as it lives, idle ones too, and a watch's wait (144 bytes) is
/// nearly twice a `Notify`'s.
#[derive(Default)]
struct Closing {
    closed: AtomicBool,
    notify: tokio::sync::Notify,
}

/// Closes the listener's connections when dropped: when the listener ends, and
/// also if its future is dropped before that.
struct CloseOnDrop(Arc<Closing>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }
}

/// Resolves when the listener starts closing. The wait is made before the flag is
/// read: a `notify_waiters` after that point wakes it, one before it set the flag.
async fn closed(closing: &Closing) {
    let notified = closing.notify.notified();
    if closing.closed.load(Ordering::Acquire) {
        return;
    }
    notified.await;
}

/// Runs one hyper connection until it ends, or until `stopping` says so (the
/// listener closes, an HTTP/2 connection has idled): then it finishes the request
/// in flight and closes.
async fn serve_until_closed<C, T, E>(connection: C, stopping: &mut Stopping<'_>, peer: SocketAddr)
where
    C: Closable<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut connection = std::pin::pin!(connection);
    let stopped = poll_fn(|cx| {
        if let Poll::Ready(ended) = connection.as_mut().poll(cx) {
            return Poll::Ready(Some(ended));
        }
        if stopping.poll_stopped(cx) {
            return Poll::Ready(None);
        }
        Poll::Pending
    });
    let ended = match stopped.await {
        Some(ended) => ended,
        None => {
            connection.as_mut().close();
            connection.await
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%peer, "connection ended: {error}");
    }
}

/// Connections past `max_connections` answered at the same time; more are closed.
const TURN_AWAY_AT_ONCE: usize = 256;

/// The page a connection over `max_connections` gets; it says when to come back as
/// the other 503s do, in the words of their `Retry-After`.
const TURNED_AWAY: &str = concat!(
    "service unavailable: too many connections; ",
    crate::error::come_back!()
);

/// What a connection over `max_connections` gets: a 503 that tells the browser when
/// to come back, then the close. Written by hand, without parsing the request:
/// the point is to spend as little as possible on it (the bytes are made once).
async fn turn_away(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    static ANSWER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {}\r\n\
             Content-Type: text/plain; charset=utf-8\r\nCache-Control: no-store\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n{TURNED_AWAY}",
            crate::error::RETRY_AFTER_SECS,
            TURNED_AWAY.len()
        )
    });
    // Read what has arrived, so closing does not reset the connection before the
    // client has read the answer.
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut scratch)).await;
    let _ = stream.write_all(ANSWER.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Accepts connections and serves each with the service `service_for(peer, tls)`
/// builds, until `shutdown` resolves with the grace period; then waits up to that
/// long for open requests to finish. Plain connections speak HTTP/1.1; TLS ones
/// HTTP/2 or HTTP/1.1, as ALPN settled.
pub(crate) async fn serve_connections<S, B>(
    listener: TcpListener,
    how: Listening,
    shutdown: impl Future<Output = Duration>,
    service_for: impl MakesService<S>,
) where
    S: Serves<B>,
    B: ResponseBody,
{
    let service_for = Arc::new(service_for);
    let connections = Arc::new(Connections::default());
    let turning_away = Arc::new(tokio::sync::Semaphore::new(TURN_AWAY_AT_ONCE));
    let closing = CloseOnDrop(Arc::default());
    let serving = Arc::new(Serving::new(how));
    let how = &serving.how;
    let mut shutdown = std::pin::pin!(shutdown);
    let grace = loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            grace = &mut shutdown => break grace,
        };
        let Some(place) = Open::take(&connections, how.max_connections) else {
            if let Some((turned_away, _)) = &how.counters {
                turned_away.inc();
            }
            // A flood past the cap must not cost a descriptor each for long: a few
            // hundred get the 503 at once, the rest are simply closed.
            if let Ok(permit) = turning_away.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    turn_away(stream).await;
                    drop(permit);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            stream,
            peer,
            closing: closing.0.clone(),
        };
        tokio::spawn(connection.serve(serving.clone(), service_for.clone(), place));
    };
    drop(listener);
    drop(closing);
    drain(&connections, grace).await;
}

/// The next accepted connection. A failed `accept` (out of file descriptors, a
/// connection reset while queued) leaves the listener itself fine: it pauses
/// briefly and accepts again. At the open-file limit that is 20 failures a second
/// for as long as it lasts: said once per interval, with the count held back.
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(error) => {
                if let Some(held_back) = ACCEPT_FAILED.allow() {
                    tracing::warn!(held_back, "accept failed: {error}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// What every connection of one listener is served with: its settings, the
/// HTTP/1.1 side's limits, and hyper's two protocols set up from them once (one
/// `Arc` for each connection to share).
struct Serving {
    how: Listening,
    limits: server::Limits,
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
}

impl Serving {
    fn new(how: Listening) -> Self {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        // hyper starts its head deadline as soon as it waits for a head, so on the
        // rare connection handed to it (a chunked upload, `Expect`, an upgrade) an
        // idle wait is held to `request_headers`, not `keep_alive`: its deadline
        // cannot tell an idle client from a slow head, and slowloris is the one
        // that must not win.
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(how.request_headers)
            .max_headers(how.max_headers)
            // A client may send its whole request and then shut down its write side
            // (`socat -t`, HTTP/1.0-style tools); nginx and Apache answer it. Without
            // this hyper takes the FIN for a hang-up, drops the request in flight and
            // a POST already sent to its node loses its answer.
            .half_close(true)
            .max_buf_size(how.http1_buffer)
            .keep_alive(true);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(how.http2_max_streams)
            .max_header_list_size(64 * 1024)
            // A peer gone without a FIN (a phone that lost its signal) is found by a
            // ping it does not answer, while a stream waits on the node (and while
            // idle, which frees its place before `keep_alive` would).
            .keep_alive_interval(Some(how.request_headers))
            .keep_alive_timeout(how.request_headers);
        let limits = server::Limits {
            request_headers: how.request_headers,
            keep_alive: how.keep_alive,
            max_headers: how.max_headers,
            head_bytes: how.http1_buffer,
        };
        Self {
            how,
            limits,
            http1,
            http2,
        }
    }
}

/// One accepted connection, before its protocol is known.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// Says when the listener starts closing.
    closing: Arc<Closing>,
}

impl Connection {
    /// Serves the connection to its end, holding its `place` under
    /// `max_connections` until then: plain HTTP/1.1, or over TLS the protocol ALPN
    /// chose (an HTTP/2 connection is handed, with its `place`, to a task of its own).
    ///
    /// Not an `async fn`: one keeps each argument twice in the task, as it came and
    /// as the local it is moved into, and the task is what every idle connection
    /// costs. The block below uses what it captured in place.
    #[allow(clippy::manual_async_fn)]
    fn serve<F, S, B>(
        self,
        serving: Arc<Serving>,
        service_for: Arc<F>,
        place: Open,
    ) -> impl Future<Output = ()> + Send
    where
        F: MakesService<S>,
        S: Serves<B>,
        B: ResponseBody,
    {
        let Connection {
            stream,
            peer,
            closing,
        } = self;
        // Boxed before the block, which keeps room for all it captured as long as
        // the connection lives: a pointer, where the stream itself would leave its
        // bytes unused once it is moved on. A plain connection's box is its
        // `StudentIo` as it is; the TLS handshake takes the stream out of it.
        let stream = Box::new(WriteStall::new(stream, serving.how.write_stall));
        async move {
            let how = &serving.how;
            let tls = how.tls.is_some();
            let io: StudentIo = match &how.tls {
                None => stream,
                // Boxed, and given back once done: rustls's session as it is made and
                // the handshake's deadline, which no idle connection needs. What comes
                // out is a box either way: a TLS stream held here by value would keep
                // its room in every connection's task, plain ones too.
                Some(acceptor) => match Box::pin(handshake(acceptor, *stream, how, peer)).await {
                    None => return,
                    Some(Accepted::Http1(io)) => io,
                    Some(Accepted::Http2(stream)) => {
                        // A task of its own, this one ending: hyper's HTTP/2 connection
                        // is several KiB that a connection speaking HTTP/1.1 keeps no
                        // room for, and awaited here, what the handshake handed on would
                        // keep its room in every connection's task.
                        let service = service_for(peer, tls);
                        let (serving, closing) = (serving.clone(), closing.clone());
                        tokio::spawn(async move {
                            http2(stream, &serving, service, peer, closing).await;
                            drop(place);
                        });
                        return;
                    }
                },
            };
            let mut stop = std::pin::pin!(closed(&closing));
            let mut stopping = Stopping::new(stop.as_mut());
            let mut start = Start::New(io);
            // Awake, the connection is served in a box of its own, which holds the
            // students' stack and the room a request needs. Parked between a
            // student's clicks, it is only its `Parked`, waited on in this small
            // loop. The stack is made again at each wake: a few reference counts,
            // once per click after a page was read.
            // (A `let ... else`, not a `while let`: the scrutinee of a `while let`
            // lives through the loop's body, and would keep a second `Parked`'s
            // room in the task.)
            loop {
                let service = service_for(peer, tls);
                let awake = http1(start, &serving, service, &mut stopping, &peer);
                let Some(mut parked) = Box::pin(awake).await else {
                    break;
                };
                let Some(read) = poll_fn(|cx| parked.poll_wait(cx, &mut stopping)).await else {
                    parked.close().await;
                    break;
                };
                start = Start::Woken(parked, read);
            }
            drop(place);
        }
    }
}

/// What makes a connection's students' stack from its peer and whether it came
/// over TLS: called when the connection starts and each time it wakes from
/// [`Parked`].
pub(crate) trait MakesService<S>: Fn(SocketAddr, bool) -> S + Send + Sync + 'static {}

impl<F, S> MakesService<S> for F where F: Fn(SocketAddr, bool) -> S + Send + Sync + 'static {}

/// Serves an HTTP/1.1 connection until it ends or parks: on the gateway's own side
/// ([`server`]) while its requests are plain, then on hyper's if one is not.
/// `Some` when it parked, to wait for the student's next click.
///
/// Not an `async fn`, for the same reason as [`Connection::serve`]; the service is
/// its own, made for this wake.
#[allow(clippy::manual_async_fn)]
fn http1<'a, 'b, S, B>(
    start: Start,
    serving: &'a Serving,
    mut service: S,
    stopping: &'a mut Stopping<'b>,
    peer: &'a SocketAddr,
) -> impl Future<Output = Option<Parked>> + use<'a, 'b, S, B>
where
    S: Serves<B>,
    B: ResponseBody,
{
    async move {
        let ended = server::serve(start, &mut service, &serving.limits, stopping).await;
        // Taken whole (not matched in place), so that it holds no room while hyper's
        // side runs.
        let io = match ended {
            Ended::Closed => return None,
            Ended::Parked(parked) => return Some(parked),
            Ended::HandOver(io) => io,
        };
        // Boxed: only the rare connection that needs hyper pays for its room.
        Box::pin(hyper_http1(io, serving, &service, stopping, peer)).await;
        None
    }
}

/// Serves the rest of an HTTP/1.1 connection on hyper's side, from a request the
/// gateway's own side does not take (its bytes are in `io`).
async fn hyper_http1<S, B>(
    io: Replayed,
    serving: &Serving,
    service: &S,
    stopping: &mut Stopping<'_>,
    peer: &SocketAddr,
) where
    S: Serves<B>,
    B: ResponseBody,
{
    let mut io = io;
    let backlog = paced(io.io_mut());
    let io = TokioIo::new(io);
    let service = SocketPacedService::new(FromHyper(service.clone()), backlog);
    let connection = serving.http1.serve_connection(io, service).with_upgrades();
    serve_until_closed(connection, stopping, *peer).await;
}

/// The backlog hyper's answers on `io` are paced by ([`SocketPacedService`]),
/// counted down by the connection's [`WriteStall`] from now on.
///
/// Made at the handover, not with the connection: only hyper's side reads it, and
/// every idle connection would keep one. A connection that is not a
/// listener's stream (none is) is not paced.
fn paced(io: &mut StudentIo) -> Arc<Backlog> {
    let io: &mut dyn std::any::Any = &mut **io;
    let stream = match io.downcast_mut::<WriteStall<TcpStream>>() {
        Some(plain) => Some(plain),
        None => (io.downcast_mut::<TlsStream<WriteStall<TcpStream>>>()).map(|tls| tls.get_mut().0),
    };
    match stream {
        Some(stream) => {
            let backlog = Arc::new(Backlog::default());
            stream.pace_by(backlog.clone());
            backlog
        }
        None => Arc::new(Backlog::proven()),
    }
}

/// A connection whose TLS handshake is done, by the protocol ALPN chose.
enum Accepted {
    Http1(StudentIo),
    Http2(Box<TlsStream<WriteStall<TcpStream>>>),
}

/// The TLS handshake of a new connection, under the same deadline as a request
/// head; `None` when it failed (counted) or took too long.
async fn handshake(
    acceptor: &TlsAcceptor,
    stream: WriteStall<TcpStream>,
    how: &Listening,
    peer: SocketAddr,
) -> Option<Accepted> {
    let accepted = tokio::time::timeout(how.request_headers, acceptor.accept(stream)).await;
    if !matches!(accepted, Ok(Ok(_))) {
        if let Some((_, tls_failed)) = &how.counters {
            tls_failed.inc();
        }
    }
    match accepted {
        Ok(Ok(stream)) if stream.get_ref().1.alpn_protocol() == Some(b"h2") => {
            Some(Accepted::Http2(Box::new(stream)))
        }
        Ok(Ok(stream)) => Some(Accepted::Http1(Box::new(stream))),
        Ok(Err(error)) => {
            tracing::debug!(%peer, "TLS handshake failed: {error}");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake took too long");
            None
        }
    }
}

/// Serves an HTTP/2 connection to its end, closing it once it has had no stream
/// for `keep_alive`.
async fn http2<S, B>(
    stream: Box<TlsStream<WriteStall<TcpStream>>>,
    serving: &Serving,
    service: S,
    peer: SocketAddr,
    closing: Arc<Closing>,
) where
    S: Serves<B>,
    B: ResponseBody,
{
    let how = &serving.how;
    let io = TokioIo::new(stream);
    let streams = Streams::new(how.write_stall);
    let connection = serving
        .http2
        .serve_connection(io, streams.serve(FromHyper(service)));
    let mut stop = std::pin::pin!(async {
        tokio::select! {
            () = closed(&closing) => {}
            () = streams.idle(how.keep_alive) => {
                tracing::debug!(%peer, "HTTP/2 connection idle: closed");
            }
        }
    });
    let mut stopping = Stopping::new(stop.as_mut());
    serve_until_closed(connection, &mut stopping, peer).await;
}

/// The bytes a connection's task keeps for its future, whatever it waits for:
/// what every idle connection costs beside its socket and a few small boxes
/// (a test of the students' stack holds it down).
#[cfg(test)]
pub(crate) async fn task_bytes<S, B>(service_for: impl MakesService<S>, how: Listening) -> usize
where
    S: Serves<B>,
    B: ResponseBody,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stream, peer) = tokio::join!(TcpStream::connect(listener.local_addr().unwrap()), async {
        listener.accept().await.unwrap()
    });
    drop(stream);
    let closing = Arc::default();
    let connections = Arc::new(Connections::default());
    let place = Open::take(&connections, 1).unwrap();
    let (stream, peer) = peer;
    let connection = Connection {
        stream,
        peer,
        closing,
    };
    let serving = Arc::new(Serving::new(how));
    let task = connection.serve(serving, Arc::new(service_for), place);
    std::mem::size_of_val(&task)
}

/// Waits up to `grace` for every open connection to close.
async fn drain(connections: &Connections, grace: Duration) {
    let drained = async {
        loop {
            let closed = connections.closed.notified();
            if connections.open.load(Ordering::Relaxed) == 0 {
                return;
            }
            closed.await;
        }
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!("shutdown grace passed with requests still in flight");
    }
}

#[cfg(test)]
mod tests {

    use std::sync::Mutex;
    use std::task::{Context, Wake, Waker};

    use super::*;

    /// A listener's stop that resolves when told to, and whose waker the test can
    /// fire without resolving it (a spurious wake).
    #[derive(Default)]
    struct Stop {
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Stop {
        /// The future a connection is handed: ready once told, its waker left here.
        fn until_told(self: &Arc<Self>) -> impl Future<Output = ()> + Send {
            let stop = self.clone();
            poll_fn(move |cx| {
                *stop.waker.lock().unwrap() = Some(cx.waker().clone());
                match stop.ready.load(Ordering::SeqCst) {
                    true => Poll::Ready(()),
                    false => Poll::Pending,
                }
            })
        }

        fn wake(&self, ready: bool) {
            self.ready.store(ready, Ordering::SeqCst);
            let waker = self.waker.lock().unwrap().take();
            waker
                .expect("the stop was polled and left its waker")
                .wake();
        }
    }

    /// A connection's task: counts how often it is woken.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_connection_hears_the_stop_after_any_number_of_wakes_that_were_not_it() {
        let stop = Arc::new(Stop::default());
        let mut stop_future = std::pin::pin!(stop.until_told());
        let mut stopping = Stopping::new(stop_future.as_mut());
        let task = Arc::new(Task::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);

        for woken in 1..=3 {
            // Polled as the task is for its own reasons: no stop yet, nothing woken.
            assert!(!stopping.poll_stopped(&mut cx));
            assert!(!stopping.poll_stopped(&mut cx));
            // The listener's wait wakes without stopping (a spurious wake).
            stop.wake(false);
            assert_eq!(
                task.0.load(Ordering::SeqCst),
                woken,
                "each wake reaches the task"
            );
        }
        assert!(!stopping.poll_stopped(&mut cx));
        stop.wake(true);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            4,
            "the stop itself reaches the task"
        );
        assert!(stopping.poll_stopped(&mut cx));
    }

    #[test]
    fn a_connection_polled_by_another_task_hands_that_task_the_stop() {
        let stop = Arc::new(Stop::default());
        let mut stop_future = std::pin::pin!(stop.until_told());
        let mut stopping = Stopping::new(stop_future.as_mut());
        let (first, second) = (Arc::new(Task::default()), Arc::new(Task::default()));
        let first_waker = Waker::from(first.clone());
        let second_waker = Waker::from(second.clone());
        assert!(!stopping.poll_stopped(&mut Context::from_waker(&first_waker)));
        assert!(!stopping.poll_stopped(&mut Context::from_waker(&second_waker)));
        stop.wake(true);
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(
            second.0.load(Ordering::SeqCst),
            1,
            "the task that polled last is woken"
        );
        assert!(stopping.poll_stopped(&mut Context::from_waker(&second_waker)));
    }
}
