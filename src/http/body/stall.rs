//! A client that stops reading: the write side of a student's connection may wait
//! for the student at most `timeouts.body_idle`, then the connection is cut.
//!
//! Why: a browser that stops reading a download (a tab suspended, a phone that lost
//! its signal without a FIN) leaves the gateway's writes pending for ever, and with
//! them the node's connection and a PHP worker streaming the file. The bodies'
//! own idle limit ([`crate::http::body::IdleLimited`]) only watches the *node's* pauses;
//! this watches the student's. The timer is armed only while a write is actually
//! blocked, so a connection whose writes go straight into the socket buffer never
//! touches the timer wheel.
//!
//! The same student costs the gateway memory while they do not read: whatever has
//! been taken of the node's body and not yet written. The gateway's own HTTP/1.1
//! side ([`crate::http::h1::server`]) keeps the rule below by itself (one chunk at a
//! time until the socket has taken [`PROVEN`] bytes in a row, three after); on a
//! connection handed to hyper's server, it is hyper that takes the node's body. hyper takes body chunks until
//! its queue holds its buffer limit (`max_header_bytes` + 8 KiB), which is three of
//! the node connection's 16 KiB chunks, each a buffer of its own. [`Backlog`] and
//! [`SocketPaced`] keep it to one: the body hands hyper its next chunk only once the
//! socket has taken all of what came before. A chunk the socket took part of still
//! holds its whole buffer, so waiting for "most of it" would hold two. (Heads and
//! chunk framing are counted as body when written, so a reader who stalls within
//! those few hundred bytes of a chunk's end holds two all the same.)

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Buf;
use futures_util::task::AtomicWaker;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::http::body::splice::Pipe;

/// `inner` with a limit on how long one write may stay blocked.
#[derive(Debug)]
pub struct WriteStall<S> {
    inner: S,
    limit: Duration,
    /// Allocated at the first blocked write and reset after.
    timer: Option<Pin<Box<Sleep>>>,
    blocked: bool,
    /// What the connection's response bodies gave hyper, counted down by each write.
    backlog: Option<Arc<Backlog>>,
}

impl<S> WriteStall<S> {
    /// Wraps `inner`; a write blocked for `limit` fails with `TimedOut`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            blocked: false,
            backlog: None,
        }
    }

    /// The same, counting what it writes against `backlog`.
    pub fn pacing(self, backlog: Arc<Backlog>) -> Self {
        Self {
            backlog: Some(backlog),
            ..self
        }
    }

    /// Counts what it writes from now on against `backlog`.
    pub fn pace_by(&mut self, backlog: Arc<Backlog>) {
        self.backlog = Some(backlog);
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Called with the outcome of a write or flush: clears the clock when it made
    /// progress, starts or checks it when it is blocked.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if outcome.is_ready() {
            self.blocked = false;
            return outcome;
        }
        if !self.blocked {
            self.blocked = true;
            let deadline = Instant::now() + self.limit;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let timer = self.timer.as_mut().expect("armed above");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading for longer than timeouts.body_idle",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S> WriteStall<S> {
    fn wrote(&self, outcome: &Poll<io::Result<usize>>) {
        match (&self.backlog, outcome) {
            (Some(backlog), Poll::Ready(Ok(written))) => backlog.written(*written),
            (Some(backlog), Poll::Pending) => backlog.refused(),
            _ => {}
        }
    }
}

impl WriteStall<TcpStream> {
    /// Moves what `pipe` holds into the socket, under the same limit as a write
    /// (see [`crate::http::body::splice`]).
    pub(crate) fn poll_splice_from(
        &mut self,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
    ) -> Poll<io::Result<usize>> {
        let outcome = pipe.poll_drain(cx, &self.inner);
        self.wrote(&outcome);
        self.watch(cx, outcome)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&outcome);
        self.watch(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&outcome);
        self.watch(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The body bytes of one HTTP/1.1 connection that hyper holds and its socket has
/// not taken yet, shared by the connection's [`WriteStall`] (which counts writes
/// down) and its responses' [`SocketPaced`] bodies (which count chunks up). Heads are
/// written but not counted up, so it errs low.
///
/// Paced only until the socket has shown it keeps up: [`PROVEN`] bytes taken since it
/// last refused a write. A student downloading at full speed then gets hyper's own
/// batching (three chunks to a `writev`): on loopback one write per chunk cost twice
/// the CPU per 1 MiB file, almost all of it in the kernel. A new connection starts
/// paced, so a reader that is slow from its first byte (slowhttptest `-X`) costs one
/// chunk; one that stalls later keeps what hyper held at that moment (three).
#[derive(Debug, Default)]
pub struct Backlog {
    unwritten: AtomicUsize,
    /// Bytes the socket took since it last refused a write, up to [`PROVEN`].
    taken: AtomicUsize,
    /// The body waiting for the socket to take its share.
    waiting: AtomicWaker,
}

/// What a socket must take in a row to be let off pacing: four node chunks.
pub const PROVEN: usize = 4 * crate::http::body::NODE_BUFFER;

impl Backlog {
    /// A backlog no write counts down: proven from the start, so that it never
    /// holds a body back.
    pub fn proven() -> Self {
        Self {
            taken: AtomicUsize::new(PROVEN),
            ..Self::default()
        }
    }

    fn gave(&self, bytes: usize) {
        self.unwritten.fetch_add(bytes, Ordering::Relaxed);
    }

    fn written(&self, bytes: usize) {
        if self.taken.load(Ordering::Relaxed) < PROVEN {
            self.taken.fetch_add(bytes, Ordering::Relaxed);
        }
        let before = self
            .unwritten
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(bytes))
            })
            .unwrap_or_default();
        if before > 0 && before <= bytes {
            self.waiting.wake();
        }
    }

    /// A new response starts: whatever the last one left counted is forgotten. hyper
    /// cuts a body that runs past its `Content-Length` and never writes the rest, and
    /// such a count would otherwise hold back every later response on the connection.
    /// Forgetting errs low, as the heads do: at worst one chunk more is held.
    fn next_response(&self) {
        self.unwritten.store(0, Ordering::Relaxed);
    }

    fn refused(&self) {
        self.taken.store(0, Ordering::Relaxed);
    }

    /// Whether the next chunk must wait for the socket.
    fn full(&self) -> bool {
        self.unwritten.load(Ordering::Relaxed) > 0 && self.taken.load(Ordering::Relaxed) < PROVEN
    }
}

pin_project_lite::pin_project! {
    /// A response body that hands hyper a chunk only while the student's socket
    /// keeps up with what it already has (see the module's doc).
    pub struct SocketPaced<B> {
        #[pin]
        inner: B,
        backlog: Arc<Backlog>,
    }
}

impl<B> Body for SocketPaced<B>
where
    B: Body,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        if this.backlog.full() {
            this.backlog.waiting.register(cx.waker());
            // A write may have taken the bytes between the check and the register.
            if this.backlog.full() {
                return Poll::Pending;
            }
        }
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            this.backlog.gave(data.remaining());
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's service whose responses' bodies are [`SocketPaced`] by its `backlog`.
#[derive(Clone)]
pub struct SocketPacedService<S> {
    inner: S,
    backlog: Arc<Backlog>,
}

impl<S> SocketPacedService<S> {
    /// `inner`, its bodies paced by `backlog`.
    pub fn new(inner: S, backlog: Arc<Backlog>) -> Self {
        Self { inner, backlog }
    }
}

impl<S, R, B> hyper::service::Service<R> for SocketPacedService<S>
where
    S: hyper::service::Service<R, Response = Response<B>>,
{
    type Response = Response<SocketPaced<B>>;
    type Error = S::Error;
    type Future = SocketPacedResponse<S::Future>;

    fn call(&self, request: R) -> Self::Future {
        SocketPacedResponse {
            inner: Box::pin(self.inner.call(request)),
            backlog: Some(self.backlog.clone()),
        }
    }
}

/// The response of a [`SocketPacedService`], its body paced once it arrives.
///
/// The request's future is boxed: hyper keeps room for one of these in each HTTP/1
/// connection for the connection's whole life, idle keep-alive ones and stalled
/// readers included, and the gateway's stack makes it about 8 KB. Boxed, those bytes
/// exist only while a request waits for its response head.
pub struct SocketPacedResponse<F> {
    inner: Pin<Box<F>>,
    backlog: Option<Arc<Backlog>>,
}

impl<F, B, E> Future for SocketPacedResponse<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<SocketPaced<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = ready!(this.inner.as_mut().poll(cx))?;
        let Some(backlog) = this.backlog.take() else {
            // Polled again after it was ready: a future's contract says nothing more.
            return Poll::Pending;
        };
        backlog.next_response();
        Poll::Ready(Ok(response.map(|inner| SocketPaced { inner, backlog })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A node connection's chunk, as a fast node's body comes.
    const CHUNK: usize = crate::http::body::NODE_BUFFER;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_reader_never_takes_fails_after_the_limit() {
        // A 64-byte pipe nobody reads: the second write blocks.
        let (writer, _reader) = tokio::io::duplex(64);
        let mut stalled = WriteStall::new(writer, Duration::from_secs(60));
        stalled.write_all(&[0u8; 64]).await.unwrap();
        let started = Instant::now();
        let error = stalled.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_up_is_never_cut() {
        let (writer, mut reader) = tokio::io::duplex(64);
        let mut stalled = WriteStall::new(writer, Duration::from_secs(1));
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut chunk = [0u8; 64];
                let n = tokio::io::AsyncReadExt::read(&mut reader, &mut chunk)
                    .await
                    .unwrap();
                sink.extend_from_slice(&chunk[..n]);
            }
            sink.len()
        });
        for _ in 0..50 {
            stalled.write_all(&[1u8; 64]).await.unwrap();
        }
        drop(stalled);
        assert!(drain.await.unwrap() >= 50 * 64 - 64);
    }

    /// A body of chunks that are all ready, as a fast node's.
    type Ready = http_body_util::StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<bytes::Bytes>, io::Error>>>,
    >;

    /// Sixteen 16 KiB chunks, ready at once, as a fast node's body is.
    fn node_body() -> Ready {
        let chunks = (0..16)
            .map(|_| Ok(Frame::data(bytes::Bytes::from(vec![7u8; CHUNK]))))
            .collect::<Vec<_>>();
        http_body_util::StreamBody::new(futures_util::stream::iter(chunks))
    }

    /// The next frame's data length, or `None` while the body waits.
    fn poll_len<B: Body<Data = bytes::Bytes> + Unpin>(
        body: &mut B,
        cx: &mut Context<'_>,
    ) -> Option<usize>
    where
        B::Error: std::fmt::Debug,
    {
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(frame)) => Some(frame.unwrap().into_data().unwrap().len()),
            Poll::Ready(None) => Some(0),
            Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_new_connection_gets_its_next_chunk_only_as_its_socket_takes_the_last() {
        let backlog = Arc::new(Backlog::default());
        let (writer, _reader) = tokio::io::duplex(4 * CHUNK);
        let mut socket = WriteStall::new(writer, Duration::from_secs(60)).pacing(backlog.clone());
        let mut body = SocketPaced {
            inner: node_body(),
            backlog: backlog.clone(),
        };
        let woken = Arc::new(Woken::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(poll_len(&mut body, &mut cx), Some(CHUNK));
        // hyper asks again before it flushes: the chunk it holds is not out yet.
        assert_eq!(poll_len(&mut body, &mut cx), None);
        assert!(!woken.take(), "woken before the socket took anything");
        // The socket takes all but a byte: hyper still holds the chunk's buffer.
        socket.write_all(&[7u8; CHUNK - 1]).await.unwrap();
        assert!(!woken.take(), "woken while hyper still holds the chunk");
        assert_eq!(poll_len(&mut body, &mut cx), None);
        socket.write_all(&[7u8; 1]).await.unwrap();
        assert!(
            woken.take(),
            "the body was not woken once the socket took the chunk"
        );
        assert_eq!(poll_len(&mut body, &mut cx), Some(CHUNK));
    }

    #[tokio::test]
    async fn a_socket_that_keeps_up_gets_hypers_batching_until_it_refuses_a_write() {
        let backlog = Arc::new(Backlog::default());
        let (writer, mut reader) = tokio::io::duplex(PROVEN + CHUNK);
        let mut socket = WriteStall::new(writer, Duration::from_secs(60)).pacing(backlog.clone());
        let mut body = SocketPaced {
            inner: node_body(),
            backlog: backlog.clone(),
        };
        let waker = std::task::Waker::from(Arc::new(Woken::default()));
        let mut cx = Context::from_waker(&waker);
        // The first chunks one at a time, each written before the next is given.
        for _ in 0..PROVEN / CHUNK {
            assert_eq!(poll_len(&mut body, &mut cx), Some(CHUNK));
            assert_eq!(poll_len(&mut body, &mut cx), None);
            socket.write_all(&[7u8; CHUNK]).await.unwrap();
        }
        // Proven: three chunks in a row, as hyper's queue takes them.
        for _ in 0..3 {
            assert_eq!(poll_len(&mut body, &mut cx), Some(CHUNK));
        }
        // The socket fills (nobody reads): paced again while it is behind.
        socket.write_all(&[7u8; CHUNK]).await.unwrap();
        let mut refused = std::pin::pin!(socket.write_all(&[7u8; CHUNK]));
        let mut noop = Context::from_waker(std::task::Waker::noop());
        assert!(refused.as_mut().poll(&mut noop).is_pending());
        assert_eq!(poll_len(&mut body, &mut cx), None);
        let mut drained = vec![0u8; PROVEN + CHUNK];
        reader.read_exact(&mut drained).await.unwrap();
        refused.await.unwrap();
        assert_eq!(
            poll_len(&mut body, &mut cx),
            None,
            "given while a chunk behind"
        );
        socket.write_all(&[7u8; CHUNK]).await.unwrap();
        assert_eq!(poll_len(&mut body, &mut cx), Some(CHUNK));
    }

    #[tokio::test]
    async fn bytes_hyper_never_wrote_do_not_hold_back_the_next_response() {
        let backlog = Arc::new(Backlog::default());
        let service = SocketPacedService::new(
            hyper::service::service_fn(
                |_: http::Request<http_body_util::Empty<bytes::Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(node_body()))
                },
            ),
            backlog.clone(),
        );
        let respond = || async {
            let request = http::Request::new(http_body_util::Empty::new());
            let response = hyper::service::Service::call(&service, request).await;
            response.unwrap().into_body()
        };
        let waker = std::task::Waker::from(Arc::new(Woken::default()));
        let mut cx = Context::from_waker(&waker);
        let mut first = respond().await;
        assert_eq!(poll_len(&mut first, &mut cx), Some(CHUNK));
        // hyper cut that body (it ran past its length): the chunk is never written.
        drop(first);
        let mut next = respond().await;
        assert_eq!(
            poll_len(&mut next, &mut cx),
            Some(CHUNK),
            "the next response waits for bytes nobody will write"
        );
    }

    /// A waker that remembers it was woken.
    #[derive(Default)]
    struct Woken(std::sync::atomic::AtomicBool);

    impl Woken {
        fn take(&self) -> bool {
            self.0.swap(false, Ordering::Relaxed)
        }
    }

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}
