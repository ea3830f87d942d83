//! The HTTP/1.1 a student's connection speaks, written out by hand for the
//! requests nearly every student sends, with hyper's server behind it for the rest.
//!
//! Why: hyper's server side was the largest share of the gateway's own work on a
//! small page (about 14,000 of 34,000 user-space instructions a request): its
//! dispatcher's state machine, a body channel for every request, a timer boxed for
//! every request head, a head parsed into hyper's own types before ours. This side
//! reads a request head into the request the stack takes with one parse, writes
//! the answer's head and body with one `writev`, and keeps one header deadline per
//! connection whose moves cost a compare-and-swap.
//!
//! It takes a request only when it is plain: `GET`, `POST` and the other methods
//! but `CONNECT`, HTTP/1.0 or 1.1, a body framed by one `Content-Length` or none.
//! A request with `Transfer-Encoding`, `Expect` or `Upgrade`, one this parse
//! refuses, a head past the size limit: the connection is handed, with the bytes
//! read so far, to hyper's server, which answers it (a WebSocket, a `100
//! Continue`, a chunked upload, or its own 400 or 431) and keeps the connection to
//! its end. So every odd request keeps the answer it had, and browsers' requests
//! (no browser sends a chunked or `Expect` upload) take the short way.
//!
//! What it writes follows hyper's server rule for rule, so that the handover is
//! invisible: the framing (`Content-Length` when known, chunked when not, nothing
//! for `HEAD`, `204` and `304`), `Connection: close` when the connection will
//! close, HTTP/1.0 answered as 1.0 and kept open only when asked, a `Date`.
//! A student whose socket keeps up gets three body chunks to a `writev` ([`BATCH`]);
//! one who does not is given one chunk at a time (see [`crate::http::body::stall`]).

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::clock::{Deadline, Timer};
use crate::error::GatewayError;
use crate::http::body::splice::{Pipe, Splice, PIPE_FILL};
use crate::http::body::stall::PROVEN;
use crate::http::body::{BoxError, NODE_BUFFER};
use crate::http::h1::handover::Replayed;
use crate::http::h1::stopping::Stopping;
use crate::http::h1::wire::{
    chunk_line, ends_chunked, has_token, itoa, known_names, line, parse_length, Outgoing,
};
use halves::{ReadHalf, WriteHalf};

/// A student's connection as this side holds it: plain TCP or TLS, behind one
/// pointer so that a request body can carry the connection's read side without
/// naming its type.
pub(crate) type StudentIo = Box<dyn Io>;

/// What a student's connection is: bytes both ways.
pub(crate) trait Io: std::any::Any + AsyncRead + AsyncWrite + Send + Sync + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Io for T {}

/// Header lines this side parses; a request with more goes to hyper, which holds
/// it to `limits.max_headers`.
const MAX_HEADERS: usize = 100;

/// hyper's longest request target; a longer one goes to hyper for its 414.
const MAX_URI: usize = u16::MAX as usize - 1;

/// Body bytes queued before the next chunk is asked for, once the student's socket
/// has shown it keeps up: under it a third node chunk is taken, so three go to one
/// `writev`, as hyper's server batched them. Two to a `writev` made a 1 MiB file
/// 33 writes instead of 23, and cost 1.2x the CPU (the kernel's, waking the
/// reader more often).
const BATCH: usize = 2 * NODE_BUFFER + 1;

/// What a read for a request head makes room for: most heads are well under a
/// KiB. A connection between requests holds no buffer at all (see
/// [`Reading::release`]).
const HEAD_READ: usize = 4096;

/// The smallest answer whose body goes by splice when it can. A smaller one comes
/// in a read or two of the node's socket, the first shared with its head, and
/// leaves in one `writev` with it: a splice moves each piece with two calls
/// instead, which pays only over many pieces (not measured below this size).
const SPLICE_FROM: u64 = PIPE_FILL as u64;

/// The largest unread body rest a connection reads away to carry another request
/// ([`Connection::reclaim`]); past it, closing costs the student less.
const DRAIN_MAX: u64 = 64 * 1024;

/// Three chunks with their framing (size line, data, CRLF) and the last chunk.
const BODY_PARTS: usize = 10;

/// How the listener's settings bound one connection.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// The deadline for a request head: from its first byte on a kept connection,
    /// from the connection's start for its first request.
    pub request_headers: Duration,
    /// How long a connection that has answered a request may wait for the first
    /// byte of the next one.
    pub keep_alive: Duration,
    /// `limits.max_headers`.
    pub max_headers: usize,
    /// The most bytes a head may take before it is complete.
    pub head_bytes: usize,
}

/// How a connection ended on this side.
pub(crate) enum Ended {
    /// Closed, or to be closed.
    Closed,
    /// A request this side does not take is next: hyper's server goes on from it.
    HandOver(Replayed),
    /// Idle past [`PARK_AFTER`]: the student is reading a page. What the
    /// connection keeps until the next click is in the [`Parked`].
    Parked(Parked),
}

/// How long a kept connection waits for its next request before it is parked: a
/// student who has not clicked for a second is reading a page, for seconds or
/// minutes, and thousands do at once. A connection in use (a page's assets, a
/// benchmark's loop) never idles that long and is never parked.
pub(crate) const PARK_AFTER: Duration = Duration::from_secs(1);

/// A kept connection between a student's clicks: its socket whole again (the two
/// halves' shared cell is given back until the next click), the timer of its
/// `keep_alive` and nothing else. The connection's task waits on it
/// ([`Parked::poll_wait`]) in a small future, and the serving state (the students'
/// stack, a request's room, the request scratch, the read buffer) is made again only
/// when the next request's bytes come, so an idle connection costs its socket and a
/// few hundred bytes, as nginx's does.
pub(crate) struct Parked {
    io: StudentIo,
    /// Armed for what is left of `keep_alive`.
    keep_alive: Timer,
    taken: usize,
}

impl Parked {
    /// Ready with the next request's first bytes, or `None` when the connection is
    /// to close instead (the keep-alive passed, the student closed, or `stopping`
    /// says so). A poll function, not an `async fn`: its caller awaits it in the
    /// task every idle connection keeps, where an `async fn`'s own state would take
    /// room beside it. The read takes one of the thread's spare heads and gives it
    /// back if nothing came.
    pub(crate) fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        stopping: &mut Stopping<'_>,
    ) -> Poll<Option<BytesMut>> {
        if stopping.poll_stopped(cx) {
            return Poll::Ready(None);
        }
        let mut reading = Reading {
            half: &mut self.io,
            buf: BytesMut::new(),
        };
        match reading.poll_fill(cx, HEAD_READ) {
            Poll::Ready(Ok(read)) => return Poll::Ready((read > 0).then_some(reading.buf)),
            Poll::Ready(Err(_)) => return Poll::Ready(None),
            Poll::Pending => reading.release(),
        }
        if self.keep_alive.as_mut().poll(cx).is_ready() {
            tracing::debug!("idle past timeouts.keep_alive: closed");
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    /// Closes the connection, as an idle one is closed.
    pub(crate) async fn close(&mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.io.shutdown().await;
    }
}

/// A student's request body: none, one this side reads by its `Content-Length`,
/// or hyper's (on a connection handed over, and over HTTP/2).
pub struct StudentBody {
    kind: Kind,
}

/// Who reads a student's body, and how it is framed.
enum Kind {
    /// None: no `Content-Length`, or 0.
    Empty,
    /// This side, by its `Content-Length`.
    Length(Box<LengthFramed>),
    /// hyper's server: chunked, after a handover, or HTTP/2.
    Hyper(Incoming),
    /// Read already by a layer that had to look inside (a login form's
    /// username), passed on intact; `None` once sent.
    Read(Option<Bytes>),
}

impl StudentBody {
    /// No body.
    pub fn empty() -> Self {
        Self { kind: Kind::Empty }
    }

    /// hyper's body for a request hyper's server read.
    pub fn hyper(incoming: Incoming) -> Self {
        Self {
            kind: Kind::Hyper(incoming),
        }
    }

    /// A body a layer read whole, to be sent on as it came.
    pub fn read(bytes: Bytes) -> Self {
        let kind = match bytes.is_empty() {
            true => Kind::Empty,
            false => Kind::Read(Some(bytes)),
        };
        Self { kind }
    }
}

impl std::fmt::Debug for StudentBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Empty => f.write_str("StudentBody::Empty"),
            Kind::Length(body) => write!(f, "StudentBody::Length({} left)", body.left),
            Kind::Hyper(_) => f.write_str("StudentBody::Hyper"),
            Kind::Read(bytes) => write!(
                f,
                "StudentBody::Read({} left)",
                bytes.as_ref().map_or(0, Bytes::len)
            ),
        }
    }
}

impl Body for StudentBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Length(body) => body
                .poll_data(cx)
                .map(|data| data.map(|d| d.map(Frame::data))),
            Kind::Hyper(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(Into::into))),
            Kind::Read(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Length(body) => body.left == 0,
            Kind::Hyper(incoming) => incoming.is_end_stream(),
            Kind::Read(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Length(body) => SizeHint::with_exact(body.left),
            Kind::Hyper(incoming) => incoming.size_hint(),
            Kind::Read(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

/// The read side of a student's connection: the socket's half, and what was read
/// from it and not yet taken.
struct Reading<R = ReadHalf> {
    half: R,
    buf: BytesMut,
}

impl Reading {
    /// Reads away the `left` bytes of a body nobody read, as far as they have
    /// arrived (no wait): `true` when all of it was here. A rest over
    /// [`DRAIN_MAX`] is not read at all: the connection closes instead.
    fn drain(&mut self, mut left: u64) -> bool {
        if left > DRAIN_MAX {
            return false;
        }
        let mut noop = Context::from_waker(std::task::Waker::noop());
        loop {
            let here = self.buf.len().min(left as usize);
            self.buf.advance(here);
            left -= here as u64;
            if left == 0 {
                return true;
            }
            match self.poll_fill(&mut noop, NODE_BUFFER) {
                Poll::Ready(Ok(read)) if read > 0 => {}
                _ => return false,
            }
        }
    }
}

impl<R: AsyncRead + Unpin> Reading<R> {
    /// Reads more into the buffer, with room for `room` bytes: `Ok(0)` when the
    /// student closed. A connection without a buffer (new, or idle since its last
    /// answer) takes one of the thread's spare heads for the read.
    fn poll_fill(&mut self, cx: &mut Context<'_>, room: usize) -> Poll<io::Result<usize>> {
        if self.buf.capacity() == 0 {
            self.buf = spare::take();
        }
        // From the buffer's start again whenever nothing holds it (the last
        // request's lines are gone): the bytes there are still in the CPU's cache.
        // A buffer still held is read on into what is left of it.
        if self.buf.is_empty() {
            let _reclaimed = self.buf.try_reclaim(room);
        }
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(room);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.half), cx, &mut self.buf)
    }

    /// Gives the buffer back while the connection waits with nothing read: an idle
    /// keep-alive connection then costs its task and socket, not a head's room (a
    /// student reads a page for many seconds, and thousands wait at once). The
    /// buffer goes to the thread's spares, for the next head that arrives.
    fn release(&mut self) {
        spare::give(std::mem::take(&mut self.buf));
    }
}

/// Head buffers and request scratches that no connection holds, a few per thread:
/// a connection takes them when a request's bytes come and gives them back when it
/// waits for the next, as nginx allocates its header buffer when bytes arrive and
/// frees it when the request is done.
///
/// Why spares rather than the allocator: a request then allocates nothing for its
/// head, its header lines or its answer's head, as when every connection kept its
/// own (a fresh 4 KiB buffer is a trip to glibc's shared bins, and its first split a
/// second allocation), and at most [`spare::KEPT`] of each wait per thread, whatever
/// the number of idle connections.
mod spare {
    use std::cell::RefCell;

    use bytes::BytesMut;

    use super::{Scratch, HEAD_READ};

    /// Spares of each kind kept per thread; more are freed.
    pub(super) const KEPT: usize = 32;

    thread_local! {
        static SPARES: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
        // Boxed in the list too: a connection holds its scratch as a box, and one
        // moves between the two without an allocation.
        #[allow(clippy::vec_box)]
        static SCRATCHES: RefCell<Vec<Box<Scratch>>> = const { RefCell::new(Vec::new()) };
    }

    /// A spare scratch, or a new one.
    pub(super) fn scratch() -> Box<Scratch> {
        SCRATCHES.with_borrow_mut(Vec::pop).unwrap_or_default()
    }

    /// Keeps `scratch` for another connection's request if its answer is all out
    /// and there is room; frees it otherwise.
    pub(super) fn give_scratch(scratch: Option<Box<Scratch>>) {
        let Some(scratch) = scratch.filter(|scratch| scratch.out.is_empty()) else {
            return;
        };
        SCRATCHES.with_borrow_mut(|spares| {
            if spares.len() < KEPT {
                spares.push(scratch);
            }
        });
    }

    /// A spare head buffer, or a new one.
    pub(super) fn take() -> BytesMut {
        SPARES
            .with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| BytesMut::with_capacity(HEAD_READ))
    }

    /// Keeps `buf` for another connection's head if nothing else holds it (a
    /// request's lines still in use pin it) and there is room; frees it otherwise.
    pub(super) fn give(mut buf: BytesMut) {
        if buf.is_empty() && buf.try_reclaim(HEAD_READ) {
            SPARES.with_borrow_mut(|spares| {
                if spares.len() < KEPT {
                    spares.push(buf);
                }
            });
        }
    }
}

/// Where a request body leaves the connection's read side when it is done with
/// it, with how much of the body was left unread.
type Return = Mutex<Option<(Reading, u64)>>;

/// A body of `left` more bytes, read from the connection's read side, which it
/// holds until the last byte (or until dropped) and then gives back.
struct LengthFramed {
    reading: Option<Reading>,
    left: u64,
    back: Arc<Return>,
}

impl LengthFramed {
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        let Some(reading) = self.reading.as_mut() else {
            return Poll::Ready(None);
        };
        if self.left == 0 {
            self.give_back();
            return Poll::Ready(None);
        }
        if reading.buf.is_empty() {
            match ready!(reading.poll_fill(cx, NODE_BUFFER)) {
                Ok(0) => {
                    return Poll::Ready(Some(Err(
                        "the client closed the connection before the end of its body".into(),
                    )))
                }
                Ok(_) => {}
                Err(error) => return Poll::Ready(Some(Err(error.into()))),
            }
        }
        let take = reading
            .buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let data = reading.buf.split_to(take).freeze();
        self.left -= take as u64;
        if self.left == 0 {
            // Back before the answer is written, so the next request can follow.
            self.give_back();
        }
        Poll::Ready(Some(Ok(data)))
    }

    fn give_back(&mut self) {
        if let Some(reading) = self.reading.take() {
            if let Ok(mut back) = self.back.lock() {
                *back = Some((reading, self.left));
            }
        }
    }
}

impl Drop for LengthFramed {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Where [`serve`] takes a connection up.
pub(crate) enum Start {
    /// A new connection, or one whose TLS handshake is just done.
    New(StudentIo),
    /// A parked connection, with its next request's first bytes.
    Woken(Parked, BytesMut),
}

/// Serves a connection's requests with `service` until it closes, idles past
/// [`PARK_AFTER`] or a request this side does not take comes; `stopping` says when the listener closes (the
/// request in flight is finished and answered with `Connection: close`). The
/// service is called through `&mut`: no clone of the stack and no `Oneshot` per
/// request, as hyper's `&self` calls need.
///
/// Not an `async fn`, for the reason `Layout`'s conventions give: the connection is
/// made here and moved into the block, which uses it in place.
#[allow(clippy::manual_async_fn)]
pub(crate) fn serve<'a, 'b, S, B>(
    start: Start,
    service: &'a mut S,
    limits: &'a Limits,
    stopping: &'a mut Stopping<'b>,
) -> impl Future<Output = Ended> + use<'a, 'b, S, B>
where
    S: tower::Service<Request<StudentBody>, Response = Response<B>, Error = Infallible>,
    B: Body<Data = Bytes> + Splice,
    B::Error: Into<BoxError>,
{
    let mut connection = match start {
        Start::New(io) => Connection::new(io, limits),
        Start::Woken(parked, read) => Connection::woken(parked, read),
    };
    async move {
        let refused = loop {
            // Taken apart in the statement that awaits it, and nothing awaited in
            // its arms: the head (and the `Next` it came in) is a temporary there,
            // and takes no room in the task while the connection idles.
            let Head {
                request,
                method,
                version,
                body_len,
                keep_alive,
            } = match poll_fn(|cx| connection.poll_head(cx, limits, stopping)).await {
                Next::Request(head) => head,
                Next::Close => break None,
                Next::Park => return connection.park(limits).map_or(Ended::Closed, Ended::Parked),
                Next::HandOver(read) => return connection.hand_over(read),
                Next::Refuse(error) => break Some(error),
            };
            let body = connection.body(body_len);
            // Boxed, in one allocation: an idle connection's task keeps room for
            // whatever it awaits, and the stack's future and the answer being written
            // (some 5 KB) are needed only while a request is in flight. The stack is
            // called inside the exchange, so that its future has one place in the box
            // (an argument moved into a pinned local would take two); the request is
            // moved in whole, never borrowed here, so that it takes no room in the
            // task either.
            let answer = |service: &mut S| service.call(request.map(|()| body));
            let exchange =
                connection.exchange(service, answer, method, version, keep_alive, stopping);
            match Box::pin(exchange).await {
                Ok(true) => {}
                Ok(false) => break None,
                Err(Cut) => return Ended::Closed,
            }
        };
        if let Some(error) = refused {
            let mut keep_alive = false;
            let refusal = error.response();
            // Boxed, as a request's exchange is: rare, and no idle task keeps its room.
            let refusal =
                connection.respond(refusal, &Method::GET, Version::HTTP_11, &mut keep_alive);
            let _ = Box::pin(refusal).await;
        }
        connection.close().await;
        Ended::Closed
    }
}

/// One student connection on this side.
struct Connection {
    /// `None` while a request body holds it.
    reading: Option<Reading>,
    writer: WriteHalf,
    /// The deadline for the next request (its first byte, then its whole head),
    /// one timer for the connection's life, moved on the coarse clock.
    deadline: Deadline,
    /// What the deadline is set for.
    waiting: Waiting,
    /// A request came on this connection: waiting with nothing of the next one
    /// read is idling between clicks, not sending a head slowly.
    answered: bool,
    /// Where a request's body leaves the read side: made for the connection's first
    /// body, so that a connection that has sent none (most: browsers' clicks are
    /// `GET`s) keeps no room for it while idle.
    back: Option<Arc<Return>>,
    /// Bytes the socket took since it last refused a write or took part of one,
    /// up to [`PROVEN`].
    taken: usize,
    /// How much of a head that came in part was parsed (0: none).
    partial: usize,
    /// What a request and its answer need, held from the request's first bytes
    /// until the connection waits again.
    scratch: Option<Box<Scratch>>,
}

/// What a connection needs while it reads a request and writes the answer, and
/// no idle connection does; its allocations serve request after request (see
/// [`spare`]).
#[derive(Default)]
struct Scratch {
    out: Outgoing<BODY_PARTS>,
    /// Where the last head's lines sat, kept for the next head's parse.
    spans: Vec<Span>,
    /// The last answer's header map, emptied: the next request's.
    cached: Option<HeaderMap>,
}

/// What a connection waits for, and so which limit its deadline keeps.
///
/// Why two: a student reads a page for many seconds before the next click, and a
/// connection closed meanwhile costs that click a new TCP and TLS handshake
/// (`keep_alive`, nginx's 75 s); a head trickled a byte at a time (slowloris) must
/// still be cut short (`request_headers`, from the head's first byte, so that
/// idling first buys a slow head no time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// A request is in flight: the deadline is not watched.
    No,
    /// A kept connection with nothing of its next request read: `keep_alive`.
    Idle,
    /// A request head, begun or (a new connection's first) not: `request_headers`.
    Head,
}

/// What comes next on a connection.
// A head is what comes nearly every time: boxed, it would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Next {
    Request(Head),
    Close,
    /// Idle for [`PARK_AFTER`], with `keep_alive` longer than that.
    Park,
    /// A request this side refuses itself, with the connection closed after the
    /// answer: its framing or version cannot be trusted, and hyper's server would
    /// answer it less clearly (see [`refusal`]).
    Refuse(GatewayError),
    /// A request for hyper, with the bytes read so far.
    HandOver(BytesMut),
}

/// A request head, read.
struct Head {
    request: Request<()>,
    /// The request's, for its answer: kept beside it so that the request itself
    /// is never borrowed where the connection waits.
    method: Method,
    version: Version,
    body_len: u64,
    keep_alive: bool,
}

/// How a response's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes; 0 for an answer without a body.
    Length(u64),
    Chunked,
    /// Until the connection closes (HTTP/1.0 without a length).
    UntilClose,
}

/// A response's body as hyper's encoder sees it when the head is written.
#[derive(Debug, Clone, Copy)]
enum BodyLength {
    None,
    Known(u64),
    Unknown,
}

/// Whether a response's body may go by splice, with its pipe once it has one.
enum Splicing {
    Off,
    Wanted(Option<Pipe>),
}

impl Splicing {
    fn is_wanted(&self) -> bool {
        matches!(self, Splicing::Wanted(_))
    }

    /// The pipe holds bytes not yet written to the student.
    fn holds(&self) -> bool {
        matches!(self, Splicing::Wanted(Some(pipe)) if pipe.held() > 0)
    }
}

/// Where a splice stopped.
enum Spliced {
    /// The body is all out.
    End,
    /// The body's next bytes come as frames.
    Frames,
}

/// A response the connection cannot finish: it is closed at once.
#[derive(Debug)]
struct Cut;

impl Connection {
    fn new(io: StudentIo, limits: &Limits) -> Self {
        let (half, writer) = halves::split(io);
        Self {
            reading: Some(Reading {
                half,
                buf: BytesMut::new(),
            }),
            writer,
            deadline: Deadline::after(limits.request_headers),
            waiting: Waiting::No,
            answered: false,
            back: None,
            taken: 0,
            partial: 0,
            scratch: None,
        }
    }

    /// A parked connection again, its next request's first bytes read: it was
    /// idle, so the head's own deadline starts now (see [`Waiting`]).
    fn woken(parked: Parked, read: BytesMut) -> Self {
        let Parked {
            io,
            keep_alive,
            taken,
        } = parked;
        let (half, writer) = halves::split(io);
        Self {
            reading: Some(Reading { half, buf: read }),
            writer,
            deadline: Deadline::from_timer(keep_alive),
            waiting: Waiting::Idle,
            answered: true,
            back: None,
            taken,
            partial: 0,
            scratch: None,
        }
    }

    /// What an idle connection keeps, its deadline moved to what is left of
    /// `keep_alive`. Called only while nothing is read and no body is out (its
    /// reading side is here, its buffer and scratch given back).
    fn park(self, limits: &Limits) -> Option<Parked> {
        let Connection {
            reading,
            writer,
            deadline,
            taken,
            ..
        } = self;
        let Reading { half, buf } = reading?;
        // Empty, and given back already when the connection began to idle.
        spare::give(buf);
        Some(Parked {
            io: half.unsplit(writer)?,
            keep_alive: deadline.into_timer(limits.keep_alive.saturating_sub(PARK_AFTER)),
            taken,
        })
    }

    /// The body of a request whose head says `body_len` bytes follow: with any,
    /// the read side goes with it until its last byte.
    fn body(&mut self, body_len: u64) -> StudentBody {
        let kind = match body_len {
            0 => Kind::Empty,
            left => Kind::Length(Box::new(LengthFramed {
                reading: self.reading.take(),
                left,
                back: self.back.get_or_insert_with(Arc::default).clone(),
            })),
        };
        StudentBody { kind }
    }

    /// Calls the stack (`answer` on `service`), waits for its answer and writes it;
    /// whether the connection is kept after it (`keep_alive` as the request asked,
    /// turned false when the listener closes meanwhile or the answer says so).
    async fn exchange<S, F, B>(
        &mut self,
        service: &mut S,
        answer: impl FnOnce(&mut S) -> F,
        method: Method,
        version: Version,
        mut keep_alive: bool,
        stopping: &mut Stopping<'_>,
    ) -> Result<bool, Cut>
    where
        S: tower::Service<Request<StudentBody>, Future = F, Error = Infallible>,
        F: Future<Output = Result<Response<B>, Infallible>>,
        B: Body<Data = Bytes> + Splice,
        B::Error: Into<BoxError>,
    {
        // Ready at once: no layer of the students' stack makes a request wait
        // for readiness (past `max_in_flight` a student gets a quick 503), so
        // nothing waits here that the listener's closing would have to cut short.
        let Ok(()) = poll_fn(|cx| service.poll_ready(cx)).await;
        let Ok(response) = {
            let mut answer = std::pin::pin!(answer(service));
            poll_fn(|cx| {
                if keep_alive && stopping.poll_stopped(cx) {
                    keep_alive = false;
                }
                answer.as_mut().poll(cx)
            })
            .await
        };
        // Before the head, so that it can say the connection will close.
        keep_alive &= self.reclaim();
        self.respond(response, &method, version, &mut keep_alive)
            .await?;
        Ok(keep_alive)
    }

    /// Takes the read side back from the request's body if it is done with it,
    /// and says whether the connection can carry another request: not when the
    /// body left a rest unread that has not all arrived (where the next request
    /// would start), nor while a body still holds the read side (an answer before
    /// the end of its upload).
    ///
    /// Why a rest that has arrived is read away: an answer the stack gave without
    /// reading the body (a 421 for an unknown host, a 405) says nothing against
    /// the request's framing, and hyper's server, which answers the same request
    /// on a connection handed to it, reads such a rest away and goes on. Both
    /// sides keep the connection then, and close it only after an answer that
    /// says `Connection: close` ([`GatewayError::closes_connection`]).
    fn reclaim(&mut self) -> bool {
        if self.reading.is_some() {
            return true;
        }
        let back = (self.back.as_ref())
            .and_then(|back| back.lock().ok())
            .and_then(|mut back| back.take());
        let Some((mut reading, left)) = back else {
            return false;
        };
        let drained = left == 0 || reading.drain(left);
        self.reading = Some(reading);
        drained
    }

    /// Waits for the next request head, under the keep-alive deadline until its
    /// first byte and the head deadline from then, and while the listener stays open.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        limits: &Limits,
        stopping: &mut Stopping<'_>,
    ) -> Poll<Next> {
        let Some(reading) = self.reading.as_mut() else {
            return Poll::Ready(Next::Close);
        };
        loop {
            // A head that came in part is parsed again only once what came since
            // may end it: a client trickling a 40 KiB head a byte at a time would
            // otherwise have it parsed from the start 40,000 times.
            let fresh = self.partial == 0 || may_end_head(&reading.buf, self.partial);
            if !reading.buf.is_empty() && fresh {
                let scratch = self.scratch.get_or_insert_with(spare::scratch);
                match parse(
                    &mut reading.buf,
                    limits.max_headers,
                    &mut scratch.spans,
                    &mut scratch.cached,
                ) {
                    Parsed::Head(head) => {
                        self.waiting = Waiting::No;
                        self.answered = true;
                        self.partial = 0;
                        return Poll::Ready(Next::Request(head));
                    }
                    Parsed::Partial => self.partial = reading.buf.len(),
                    Parsed::ForHyper => {
                        if let Some(error) = refusal(&reading.buf, false) {
                            return Poll::Ready(Next::Refuse(error));
                        }
                        return Poll::Ready(Next::HandOver(std::mem::take(&mut reading.buf)));
                    }
                    Parsed::Refuse(error) => return Poll::Ready(Next::Refuse(error)),
                    Parsed::ForHyperFrom(head) => {
                        let mut read = BytesMut::from(&head[..]);
                        read.extend_from_slice(&reading.buf);
                        return Poll::Ready(Next::HandOver(read));
                    }
                }
            } else if !fresh {
                self.partial = reading.buf.len();
            }
            if reading.buf.len() >= limits.head_bytes {
                // Too large a head: a request line that has not ended is a 414 of
                // ours; otherwise the lines are too many, hyper's to refuse (431).
                if let Some(error) = refusal(&reading.buf, true) {
                    return Poll::Ready(Next::Refuse(error));
                }
                return Poll::Ready(Next::HandOver(std::mem::take(&mut reading.buf)));
            }
            if stopping.poll_stopped(cx) {
                return Poll::Ready(Next::Close);
            }
            match reading.poll_fill(cx, HEAD_READ) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Next::Close),
                Poll::Ready(Ok(_)) => continue,
                Poll::Pending => {}
            }
            if reading.buf.is_empty() {
                // Nothing of the next request yet: no buffer is held while waiting.
                reading.release();
                spare::give_scratch(self.scratch.take());
            }
            let now = if self.answered && reading.buf.is_empty() {
                Waiting::Idle
            } else {
                Waiting::Head
            };
            return self.poll_deadline(cx, now, limits);
        }
    }

    /// Arms the deadline of what the connection waits for `now` (`keep_alive`
    /// between requests, `request_headers` once a head has begun), and is ready
    /// when it has passed: to close, or to park an idle connection (its first
    /// [`PARK_AFTER`] of `keep_alive`).
    fn poll_deadline(&mut self, cx: &mut Context<'_>, now: Waiting, limits: &Limits) -> Poll<Next> {
        let parks = limits.keep_alive > PARK_AFTER;
        if self.waiting != now {
            // Idle to head: the head's first byte came just now.
            self.waiting = now;
            self.deadline.set(match now {
                Waiting::Idle if parks => PARK_AFTER,
                Waiting::Idle => limits.keep_alive,
                Waiting::Head | Waiting::No => limits.request_headers,
            });
        }
        if !self.deadline.poll_passed(cx) {
            return Poll::Pending;
        }
        match now {
            Waiting::Idle if parks => return Poll::Ready(Next::Park),
            Waiting::Idle => tracing::debug!("idle past timeouts.keep_alive: closed"),
            Waiting::Head | Waiting::No => {
                tracing::debug!("request head not complete within timeouts.request_headers")
            }
        }
        Poll::Ready(Next::Close)
    }

    /// Writes `response`; `keep_alive` comes back false when the connection must
    /// close after it.
    async fn respond<B>(
        &mut self,
        response: Response<B>,
        method: &Method,
        version: Version,
        keep_alive: &mut bool,
    ) -> Result<(), Cut>
    where
        B: Body<Data = Bytes> + Splice,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = response.into_parts();
        let length = if body.is_end_stream() {
            BodyLength::None
        } else {
            body.size_hint()
                .exact()
                .map_or(BodyLength::Unknown, BodyLength::Known)
        };
        let mut framing = write_head(
            &mut self.out().head,
            &parts,
            method,
            version,
            length,
            keep_alive,
        )?;
        // Written: the values hold the node connection's read buffer, which it
        // reuses once nothing else does.
        let mut headers = parts.headers;
        headers.clear();
        self.scratch().cached = Some(headers);
        let mut body = std::pin::pin!(body);
        let mut body = match (framing, length) {
            (Framing::Length(0), _) | (_, BodyLength::None) => None,
            _ => Some(body.as_mut()),
        };
        if body.is_none() && framing == Framing::Chunked {
            self.out().push(Bytes::from_static(b"0\r\n\r\n"));
        }
        let mut splicing = match framing {
            Framing::Length(length)
                if length >= SPLICE_FROM && self.writer.with_tcp(|_| ()).is_some() =>
            {
                Splicing::Wanted(None)
            }
            _ => Splicing::Off,
        };
        let sent = poll_fn(|cx| self.poll_send(cx, &mut body, &mut framing, &mut splicing)).await;
        if let Splicing::Wanted(Some(pipe)) = splicing {
            pipe.give_back();
        }
        sent
    }

    /// Writes what is queued and feeds the body's frames to the socket until the
    /// answer is out, or the socket or the body has to wait.
    fn poll_send<B>(
        &mut self,
        cx: &mut Context<'_>,
        body: &mut Option<Pin<&mut B>>,
        framing: &mut Framing,
        splicing: &mut Splicing,
    ) -> Poll<Result<(), Cut>>
    where
        B: Body<Data = Bytes> + Splice,
        B::Error: Into<BoxError>,
    {
        loop {
            ready!(self.poll_queue(cx, body, framing, splicing))?;
            if self.out().is_empty() {
                ready!(Pin::new(&mut self.writer).poll_flush(cx)).map_err(|_| Cut)?;
                return match body {
                    None => Poll::Ready(Ok(())),
                    Some(_) => Poll::Pending,
                };
            }
            ready!(self.poll_write_out(cx))?;
        }
    }

    /// Queues the body's frames with their framing while there is room (or moves
    /// the body by splice when it can): ready when the queue should go out, or the
    /// body has nothing more for now.
    fn poll_queue<B>(
        &mut self,
        cx: &mut Context<'_>,
        body: &mut Option<Pin<&mut B>>,
        framing: &mut Framing,
        splicing: &mut Splicing,
    ) -> Poll<Result<(), Cut>>
    where
        B: Body<Data = Bytes> + Splice,
        B::Error: Into<BoxError>,
    {
        // Room for a chunk with its framing and the last chunk after it.
        while self.out().room() >= 4 && (self.out().no_parts() || self.proven()) {
            if self.out().queued() >= BATCH {
                break;
            }
            let Some(live) = body.as_mut() else {
                break;
            };
            // A pipe that holds bytes is emptied first, whatever the body says
            // now: its last fill has already ended it.
            if splicing.holds() || (splicing.is_wanted() && live.can_splice()) {
                if !self.out().is_empty() {
                    // What is queued goes first; the pipe takes over after it.
                    break;
                }
                match ready!(self.poll_splice(cx, live.as_mut(), splicing, framing))? {
                    Spliced::End => {
                        *body = None;
                        break;
                    }
                    Spliced::Frames => {}
                }
            }
            let frame = match live.as_mut().poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(frame) => frame,
            };
            let data = match frame {
                None => {
                    *body = None;
                    self.end_body(*framing)?;
                    break;
                }
                Some(Err(error)) => {
                    let error: BoxError = error.into();
                    tracing::debug!("response body failed: {error}");
                    return Poll::Ready(Err(Cut));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    // Trailers: not sent, as hyper's server does without a
                    // `Trailer` header.
                    Err(_) => continue,
                },
            };
            if !data.is_empty() {
                self.queue_data(data, framing);
            }
            if *framing == Framing::Length(0) {
                // A sized body is complete at its length: not polled again
                // (hyper cuts a body that runs past it the same way).
                *body = None;
            } else if body.as_ref().is_some_and(|b| b.is_end_stream()) {
                *body = None;
                self.end_body(*framing)?;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what is queued with one `writev`, and notes whether the socket took
    /// all of it (see [`Connection::proven`]).
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cut>> {
        let written = {
            let mut slices = [IoSlice::new(&[]); Outgoing::<BODY_PARTS>::SLICES];
            let out = &self.scratch.get_or_insert_with(spare::scratch).out;
            let count = out.slices(&mut slices);
            match Pin::new(&mut self.writer).poll_write_vectored(cx, &slices[..count]) {
                Poll::Pending => {
                    self.taken = 0;
                    return Poll::Pending;
                }
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Err(Cut)),
                Poll::Ready(Ok(written)) => written,
            }
        };
        self.out().advance(written);
        if self.out().is_empty() {
            self.taken = self.taken.saturating_add(written);
        } else {
            // A write the socket took only part of is as good as refused: the
            // socket is full, and a chunk asked for now would wait there too.
            self.taken = 0;
        }
        Poll::Ready(Ok(()))
    }

    /// Moves the body from the node's socket into the student's through a pipe for
    /// as long as the body lets it (see [`crate::http::body::splice`]), keeping the rules
    /// of the frames' way: one node buffer at a time until the socket has shown it
    /// keeps up, the write stall, the body's own limits.
    fn poll_splice<B: Splice>(
        &mut self,
        cx: &mut Context<'_>,
        mut body: Pin<&mut B>,
        splicing: &mut Splicing,
        framing: &mut Framing,
    ) -> Poll<Result<Spliced, Cut>> {
        let Framing::Length(left) = framing else {
            return Poll::Ready(Ok(Spliced::Frames));
        };
        let pipe = match splicing {
            Splicing::Off => return Poll::Ready(Ok(Spliced::Frames)),
            Splicing::Wanted(Some(pipe)) => pipe,
            Splicing::Wanted(pipe @ None) => match Pipe::take() {
                Ok(new) => pipe.insert(new),
                Err(error) => {
                    // Out of file descriptors, say: the frames' way still works.
                    tracing::debug!("no pipe for a splice: {error}");
                    *splicing = Splicing::Off;
                    return Poll::Ready(Ok(Spliced::Frames));
                }
            },
        };
        loop {
            if pipe.held() > 0 {
                let drained = self
                    .writer
                    .with_tcp(|socket| socket.poll_splice_from(cx, pipe))
                    .ok_or(Cut)?;
                let moved = match drained {
                    Poll::Pending => {
                        self.taken = 0;
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(error)) => {
                        tracing::debug!("splice to the student failed: {error}");
                        return Poll::Ready(Err(Cut));
                    }
                    Poll::Ready(Ok(moved)) => moved,
                };
                *left -= moved as u64;
                self.taken = match pipe.held() {
                    0 => self.taken.saturating_add(moved),
                    // Took part of it: the socket is full, as after a partial write.
                    _ => 0,
                };
                continue;
            }
            if *left == 0 {
                return Poll::Ready(Ok(Spliced::End));
            }
            if !body.can_splice() {
                return Poll::Ready(Ok(Spliced::Frames));
            }
            let max = if self.proven() {
                PIPE_FILL
            } else {
                NODE_BUFFER
            };
            let max = usize::try_from(*left).map_or(max, |left| left.min(max));
            if let Err(error) = ready!(body.as_mut().poll_splice(cx, pipe, max)) {
                tracing::debug!("response body failed: {error}");
                return Poll::Ready(Err(Cut));
            }
        }
    }

    /// The request's scratch, taken from the thread's spares if the connection
    /// has none yet.
    fn scratch(&mut self) -> &mut Scratch {
        self.scratch.get_or_insert_with(spare::scratch)
    }

    /// The queue the answer's bytes go out from.
    fn out(&mut self) -> &mut Outgoing<BODY_PARTS> {
        &mut self.scratch().out
    }

    /// Whether the socket has taken enough in a row to be given a batch.
    fn proven(&self) -> bool {
        self.taken >= PROVEN
    }

    /// Queues one piece of the body with its framing.
    fn queue_data(&mut self, mut data: Bytes, framing: &mut Framing) {
        match framing {
            Framing::Length(left) => {
                let len = (data.len() as u64).min(*left);
                data.truncate(len as usize);
                *left -= len;
                self.out().push(data);
            }
            Framing::Chunked => {
                self.out().push(chunk_line(data.len()));
                self.out().push(data);
                self.out().push(Bytes::from_static(b"\r\n"));
            }
            Framing::UntilClose => self.out().push(data),
        }
    }

    /// The body said it has no more frames.
    fn end_body(&mut self, framing: Framing) -> Result<(), Cut> {
        match framing {
            Framing::Chunked => self.out().push(Bytes::from_static(b"0\r\n\r\n")),
            Framing::Length(0) | Framing::UntilClose => {}
            Framing::Length(_) => {
                tracing::debug!("response body shorter than its Content-Length");
                return Err(Cut);
            }
        }
        Ok(())
    }

    /// Closes the write side once all is out (the read side goes with it).
    async fn close(&mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.writer.shutdown().await;
    }

    /// The connection as one stream again, for hyper, with `read` in front.
    fn hand_over(mut self, read: BytesMut) -> Ended {
        let Some(io) = self
            .reading
            .take()
            .and_then(|reading| reading.half.unsplit(self.writer))
        else {
            return Ended::Closed;
        };
        Ended::HandOver(Replayed::new(read.freeze(), io))
    }
}

/// What the buffer holds.
#[allow(clippy::large_enum_variant)] // As `Next`: a head nearly every time.
enum Parsed {
    Head(Head),
    Partial,
    /// A request refused here (both `Content-Length` and `Transfer-Encoding`).
    Refuse(GatewayError),
    /// A request for hyper's server; nothing was taken from the buffer.
    ForHyper,
    /// The same, found after its head was taken from the buffer.
    ForHyperFrom(Bytes),
}

/// A header line of the head being read: its name, and where its value sits
/// (offset and length).
type Span = (HeaderName, u32, u32);

known_names! {
    /// The names browsers send, spelt as they send them over HTTP/1.1.
    fn known_request_name, KNOWN_REQUEST_SPELLINGS;
    b"Host" => header::HOST,
    b"Connection" => header::CONNECTION,
    b"User-Agent" => header::USER_AGENT,
    b"Accept" => header::ACCEPT,
    b"Accept-Language" => header::ACCEPT_LANGUAGE,
    b"Accept-Encoding" => header::ACCEPT_ENCODING,
    b"Cookie" => header::COOKIE,
    b"Referer" => header::REFERER,
    b"Origin" => header::ORIGIN,
    b"Cache-Control" => header::CACHE_CONTROL,
    b"Pragma" => header::PRAGMA,
    b"If-Modified-Since" => header::IF_MODIFIED_SINCE,
    b"If-None-Match" => header::IF_NONE_MATCH,
    b"Content-Type" => header::CONTENT_TYPE,
    b"Content-Length" => header::CONTENT_LENGTH,
    b"Upgrade-Insecure-Requests" => header::UPGRADE_INSECURE_REQUESTS,
    b"DNT" => header::DNT,
    b"Range" => header::RANGE,
    b"Sec-Fetch-Dest" => SEC_FETCH_DEST,
    b"Sec-Fetch-Mode" => SEC_FETCH_MODE,
    b"Sec-Fetch-Site" => SEC_FETCH_SITE,
    b"Sec-Fetch-User" => SEC_FETCH_USER,
    b"X-Requested-With" => X_REQUESTED_WITH,
    b"Priority" => PRIORITY,
    b"sec-ch-ua" => SEC_CH_UA,
    b"sec-ch-ua-mobile" => SEC_CH_UA_MOBILE,
    b"sec-ch-ua-platform" => SEC_CH_UA_PLATFORM,
}

const SEC_FETCH_DEST: HeaderName = HeaderName::from_static("sec-fetch-dest");
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");
const SEC_FETCH_USER: HeaderName = HeaderName::from_static("sec-fetch-user");
const X_REQUESTED_WITH: HeaderName = HeaderName::from_static("x-requested-with");
const PRIORITY: HeaderName = HeaderName::from_static("priority");
const SEC_CH_UA: HeaderName = HeaderName::from_static("sec-ch-ua");
const SEC_CH_UA_MOBILE: HeaderName = HeaderName::from_static("sec-ch-ua-mobile");
const SEC_CH_UA_PLATFORM: HeaderName = HeaderName::from_static("sec-ch-ua-platform");

/// Reads the request head at the front of `buf`, if it is whole and plain.
///
/// `spans` and `cached` are the connection's, kept between requests so that a
/// request head allocates nothing of its own: `cached` is the last answer's
/// header map, emptied (hyper's trick), which has room for the forwarding headers
/// the request gains on its way to a node.
fn parse(
    buf: &mut BytesMut,
    max_headers: usize,
    spans: &mut Vec<Span>,
    cached: &mut Option<HeaderMap>,
) -> Parsed {
    // Left uninitialised, as hyper does: the parser writes what it uses.
    let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        &mut lines[..max_headers.min(MAX_HEADERS)],
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::ForHyper,
    };
    let (Some(method), Some(path), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Parsed::ForHyper;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::ForHyper;
    };
    if method == Method::CONNECT || path.len() > MAX_URI {
        return Parsed::ForHyper;
    }
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // Where each piece sits, so that they can be cut from the buffer once the
    // parser lets go of it.
    let base = buf.as_ptr() as usize;
    let path_at = (path.as_ptr() as usize - base, path.len());
    let keep_alive = version == Version::HTTP_11;
    let Some(said) = header_spans(parsed.headers, base, keep_alive, spans) else {
        return Parsed::ForHyper;
    };
    if said.two_framings {
        // Framed two ways (RFC 9112 6.1): refused and closed, the safest answer to
        // a smuggling attempt. hyper's server would read it as chunked.
        return Parsed::Refuse(GatewayError::MalformedRequest);
    }
    if said.for_hyper {
        return Parsed::ForHyper;
    }
    let raw = buf.split_to(len).freeze();
    let Some(mut request) = request_from(&raw, path_at, spans, cached) else {
        return Parsed::ForHyperFrom(raw);
    };
    *request.method_mut() = method.clone();
    *request.version_mut() = version;
    Parsed::Head(Head {
        request,
        method,
        version,
        body_len: said.body_len.unwrap_or(0),
        keep_alive: said.keep_alive,
    })
}

/// What a request head's lines said of how to read it.
struct RequestLines {
    /// Its one `Content-Length`.
    body_len: Option<u64>,
    keep_alive: bool,
    /// A line sends the request to hyper's server (`Transfer-Encoding`, `Expect`,
    /// `Upgrade`, a `Content-Length` that is not one number).
    for_hyper: bool,
    /// Both `Content-Length` and `Transfer-Encoding`.
    two_framings: bool,
}

/// Notes where each of the head's `lines` sits in `spans` (offsets from `base`),
/// and what they said; `None` for a name this side does not take.
fn header_spans(
    lines: &[httparse::Header<'_>],
    base: usize,
    keep_alive: bool,
    spans: &mut Vec<Span>,
) -> Option<RequestLines> {
    spans.clear();
    let mut said = RequestLines {
        body_len: None,
        keep_alive,
        for_hyper: false,
        two_framings: false,
    };
    let mut close = false;
    // Lines that send the request to hyper's server, once every line is read:
    // `Transfer-Encoding` is looked at with `Content-Length` first.
    let (mut chunked, mut lengths) = (false, 0);
    for line in lines {
        let name = request_name(line.name.as_bytes())?;
        if name == header::CONTENT_LENGTH {
            lengths += 1;
            match (said.body_len, request_length(line.value)) {
                (None, Some(len)) => said.body_len = Some(len),
                // Two lengths, or one that is not a number: hyper's to judge.
                _ => said.for_hyper = true,
            }
        } else if name == header::CONNECTION {
            if close || has_token(line.value, b"close") {
                close = true;
                said.keep_alive = false;
            } else if !said.keep_alive {
                said.keep_alive = has_token(line.value, b"keep-alive");
            }
        } else if name == header::TRANSFER_ENCODING {
            (chunked, said.for_hyper) = (true, true);
        } else if name == header::EXPECT || name == header::UPGRADE {
            said.for_hyper = true;
        }
        // The head is at most a few tens of KiB: offsets fit.
        let value_at = line.value.as_ptr() as usize - base;
        spans.push((name, value_at as u32, line.value.len() as u32));
    }
    said.two_framings = chunked && lengths > 0;
    Some(said)
}

/// The request of the head `raw`, its target and header values slices of it (no
/// copy), into `cached`'s map; `None` for a target or a value `http` refuses.
fn request_from(
    raw: &Bytes,
    path_at: (usize, usize),
    spans: &mut Vec<Span>,
    cached: &mut Option<HeaderMap>,
) -> Option<Request<()>> {
    let uri = http::Uri::from_maybe_shared(raw.slice(path_at.0..path_at.0 + path_at.1)).ok()?;
    let mut headers = cached.take().unwrap_or_default();
    headers.reserve(spans.len());
    for (name, value_at, value_len) in spans.drain(..) {
        let value_at = value_at as usize;
        let value = raw.slice(value_at..value_at + value_len as usize);
        let value = HeaderValue::from_maybe_shared(value).ok()?;
        headers.append(name, value);
    }
    let mut request = Request::new(());
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Some(request)
}

/// The answer this side gives itself to a head hyper's server would answer less
/// clearly, from the bytes read so far (`full`: as many as a head may take).
///
/// - HTTP/2's preface (`PRI * HTTP/2.0`) on this HTTP/1.1 port: a 505 that says
///   HTTP/2 is offered over TLS (ALPN), where hyper closes without a word. An h2c
///   client reads it as a failed connection and says so; a person with `curl
///   --http2-prior-knowledge` or `nc` reads why.
/// - A request line whose version is well formed but not 1.0 or 1.1 (`HTTP/1.2`,
///   `HTTP/2.0`, `HTTP/3`): 505, where hyper answers 400.
/// - A request line that has not ended when the buffer is full: 414, where hyper
///   answers 431 for the head.
fn refusal(buf: &[u8], full: bool) -> Option<GatewayError> {
    if buf.starts_with(b"PRI * HTTP/2.0\r\n") {
        tracing::debug!("HTTP/2 preface on the HTTP/1.1 port (h2c is not served): 505, closed");
        return Some(GatewayError::VersionNotSupported);
    }
    let Some(end) = memchr::memchr(b'\n', buf) else {
        return full.then_some(GatewayError::UriTooLong);
    };
    let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    let version = line.rsplit(|&b| b == b' ').next()?;
    let numbers = version.strip_prefix(b"HTTP/")?;
    let well_formed = matches!(numbers, [major, b'.', minor] if major.is_ascii_digit() && minor.is_ascii_digit())
        || matches!(numbers, [major] if major.is_ascii_digit());
    let ours = numbers == b"1.1" || numbers == b"1.0";
    (well_formed && !ours && line.contains(&b' ')).then_some(GatewayError::VersionNotSupported)
}

/// A request line's name: a browser's usual spelling without a parse, any other
/// checked; `None` for one `http` refuses (hyper's to answer).
fn request_name(raw: &[u8]) -> Option<HeaderName> {
    known_request_name(raw).or_else(|| HeaderName::from_bytes(raw).ok())
}

/// Whether the bytes after the first `parsed` of `buf` may complete a head: they
/// hold, or finish, an empty line (`\n\n` or `\n\r\n`).
fn may_end_head(buf: &[u8], parsed: usize) -> bool {
    let from = parsed.saturating_sub(2);
    let tail = &buf[from..];
    memchr::memchr_iter(b'\n', tail)
        .any(|at| matches!(&tail[at + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// A request's `Content-Length`: digits only, and no more than hyper takes. A list
/// (`2, 2`), a sign or a length past hyper's largest goes to hyper for its answer
/// (a 400 or 431), as does a second line: a front proxy that read such a length
/// otherwise could frame the body differently.
fn request_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value
        .iter()
        .try_fold(0u64, |n, &digit| {
            n.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
        })
        .filter(|&n| n <= u64::MAX - 2)
}

/// Whether an answer to `method` with `status` carries a body on the wire.
fn can_have_body(method: &Method, status: StatusCode) -> bool {
    *method != Method::HEAD
        && !status.is_informational()
        && !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
}

/// Whether an answer with `status` may say a `Content-Length`.
fn can_have_length(status: StatusCode) -> bool {
    !status.is_informational()
        && !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
}

/// Writes the answer's head into `head` as hyper's server would, and returns its
/// body's framing. `keep_alive` turns false when the connection must close after.
/// The steps are hyper's (`role.rs`): the status line, the answer's own lines with
/// the framing they say, the framing decided where they said none, then the lines
/// the server adds (`Connection`, `Date`).
fn write_head(
    head: &mut Vec<u8>,
    parts: &http::response::Parts,
    method: &Method,
    request_version: Version,
    length: BodyLength,
    keep_alive: &mut bool,
) -> Result<Framing, Cut> {
    let mut status = parts.status;
    let mut headers = &parts.headers;
    let no_headers = HeaderMap::new();
    let mut length = length;
    if status.is_informational() {
        // A service cannot answer with one (hyper's rule: a 500 in its place).
        status = StatusCode::INTERNAL_SERVER_ERROR;
        headers = &no_headers;
        length = BodyLength::None;
        *keep_alive = false;
    }
    let version = match (request_version, parts.version) {
        (Version::HTTP_10, _) | (_, Version::HTTP_10) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let says_keep_alive = keep_alive_of_1_0(headers, parts.version, request_version, keep_alive);
    head.reserve(64 + headers.len() * 48);
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    status_line(head, version, status, reason);
    let chunkable = version == Version::HTTP_11 && can_have_body(method, status);
    let said = header_lines(head, headers, method, length, chunkable, keep_alive)?;
    let framing = match said.framing {
        Some(framing) => framing,
        None => framing_lines(head, method, status, length, chunkable),
    };
    let framing = if can_have_body(method, status) {
        framing
    } else {
        Framing::Length(0)
    };
    if framing == Framing::UntilClose {
        *keep_alive = false;
    }
    if !*keep_alive && !said.close && request_version == Version::HTTP_11 {
        head.extend_from_slice(b"connection: close\r\n");
    } else if *keep_alive && says_keep_alive {
        head.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !said.date {
        head.extend_from_slice(b"date: ");
        date::extend(head);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Ok(framing)
}

/// An HTTP/1.0 client that asked to keep its connection keeps it, told so by a
/// `Connection: keep-alive` the answer is given if it lacks one; unless the answer
/// is itself HTTP/1.0 and does not say keep-alive (hyper's rule). Returns whether
/// that line must be added.
fn keep_alive_of_1_0(
    headers: &HeaderMap,
    answer_version: Version,
    request_version: Version,
    keep_alive: &mut bool,
) -> bool {
    if request_version != Version::HTTP_10 || !*keep_alive {
        return false;
    }
    let answer_says = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|value| has_token(value.as_bytes(), b"keep-alive"));
    if !answer_says && answer_version == Version::HTTP_10 {
        *keep_alive = false;
    }
    !answer_says
}

/// The status line, with the service's own reason phrase when it set one.
fn status_line(
    head: &mut Vec<u8>,
    version: Version,
    status: StatusCode,
    reason: Option<&hyper::ext::ReasonPhrase>,
) {
    if version == Version::HTTP_11 && status == StatusCode::OK && reason.is_none() {
        head.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    head.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    match reason {
        Some(reason) => head.extend_from_slice(reason.as_bytes()),
        None => head.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    head.extend_from_slice(b"\r\n");
}

/// What an answer's own header lines said, as [`write_head`] needs it.
struct AnswerLines {
    /// The framing its `Content-Length` or `Transfer-Encoding` gave.
    framing: Option<Framing>,
    /// It carries a `Date`.
    date: bool,
    /// Its `Connection` says `close`.
    close: bool,
}

/// Writes the answer's own lines as hyper's server passes them on, and what they
/// said of the framing: two framings, or a `Content-Length` that is not a number,
/// cut the answer.
fn header_lines(
    head: &mut Vec<u8>,
    headers: &HeaderMap,
    method: &Method,
    length: BodyLength,
    chunkable: bool,
    keep_alive: &mut bool,
) -> Result<AnswerLines, Cut> {
    let mut said = AnswerLines {
        framing: None,
        date: false,
        close: false,
    };
    for (name, value) in headers {
        if *name == header::CONTENT_LENGTH {
            content_length_line(head, value, method, length, &mut said.framing)?;
            continue;
        }
        if *name == header::TRANSFER_ENCODING {
            if chunkable {
                transfer_encoding_line(head, value, &mut said.framing)?;
            }
            continue;
        }
        if *name == header::CONNECTION {
            if has_token(value.as_bytes(), b"close") {
                said.close = true;
                *keep_alive = false;
            }
        } else if *name == header::DATE {
            said.date = true;
        } else if *name == header::TRAILER && !chunkable {
            continue;
        }
        line(head, name, value);
    }
    Ok(said)
}

/// One `Content-Length` line of the answer: written if it is the framing, checked
/// against the one before it.
fn content_length_line(
    head: &mut Vec<u8>,
    value: &HeaderValue,
    method: &Method,
    length: BodyLength,
    framing: &mut Option<Framing>,
) -> Result<(), Cut> {
    match length {
        BodyLength::Known(known) => {
            if framing.is_none() {
                *framing = Some(Framing::Length(known));
                line(head, &header::CONTENT_LENGTH, value);
            }
        }
        BodyLength::Unknown => {
            let Some(len) = parse_length(value.as_bytes()) else {
                tracing::warn!("answer with an invalid Content-Length: {value:?}");
                return Err(Cut);
            };
            match *framing {
                None => {
                    *framing = Some(Framing::Length(len));
                    line(head, &header::CONTENT_LENGTH, value);
                }
                Some(Framing::Length(seen)) if seen == len => {}
                Some(_) => {
                    tracing::warn!("answer with two framings");
                    return Err(Cut);
                }
            }
        }
        // No body to send: the length stands only for a HEAD's.
        BodyLength::None => {
            if *method == Method::HEAD && framing.is_none() {
                *framing = Some(Framing::Length(0));
                line(head, &header::CONTENT_LENGTH, value);
            }
        }
    }
    Ok(())
}

/// The answer's `Transfer-Encoding`, written with `chunked` last.
fn transfer_encoding_line(
    head: &mut Vec<u8>,
    value: &HeaderValue,
    framing: &mut Option<Framing>,
) -> Result<(), Cut> {
    if matches!(framing, Some(Framing::Length(_))) {
        tracing::warn!("answer with two framings");
        return Err(Cut);
    }
    *framing = Some(Framing::Chunked);
    head.extend_from_slice(b"transfer-encoding: ");
    head.extend_from_slice(value.as_bytes());
    if !ends_chunked(value.as_bytes()) {
        head.extend_from_slice(b", chunked");
    }
    head.extend_from_slice(b"\r\n");
    Ok(())
}

/// The framing of an answer whose own lines said none, from what the body knows
/// of its length, with the line that says it.
fn framing_lines(
    head: &mut Vec<u8>,
    method: &Method,
    status: StatusCode,
    length: BodyLength,
    chunkable: bool,
) -> Framing {
    match length {
        BodyLength::Unknown if chunkable => {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        BodyLength::Unknown if can_have_body(method, status) => Framing::UntilClose,
        BodyLength::Unknown => Framing::Length(0),
        BodyLength::None | BodyLength::Known(0) => {
            if can_have_length(status) && *method != Method::HEAD {
                head.extend_from_slice(b"content-length: 0\r\n");
            }
            Framing::Length(0)
        }
        BodyLength::Known(len) => {
            if can_have_length(status) {
                head.extend_from_slice(b"content-length: ");
                head.extend_from_slice(itoa(len, &mut [0; 20]));
                head.extend_from_slice(b"\r\n");
                Framing::Length(len)
            } else {
                Framing::Length(0)
            }
        }
    }
}

/// The `Date` every answer carries, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    /// `Sun, 06 Nov 1994 08:49:37 GMT`
    const LEN: usize = 29;

    thread_local! {
        static NOW: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
    }

    /// Appends the current date.
    pub(super) fn extend(head: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        NOW.with_borrow_mut(|(at, text)| {
            if *at != second {
                let formatted = httpdate::fmt_http_date(now);
                if formatted.len() == LEN {
                    text.copy_from_slice(formatted.as_bytes());
                    *at = second;
                }
            }
            head.extend_from_slice(text);
        });
    }
}

#[doc(hidden)]
pub(crate) mod fuzzing;
mod halves;
#[cfg(test)]
mod tests;
