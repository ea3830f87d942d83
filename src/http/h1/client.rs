//! The HTTP/1.1 the gateway speaks to its nodes, written out by hand: one request
//! head and its body out, one response head and its body in, on a connection the
//! request's own task drives.
//!
//! Why not hyper's client connection: it is built for a connection that a task of
//! its own drives, so it keeps for every node connection, for that connection's
//! whole life, an 8 KiB write buffer and a 32-slot channel for requests (8 KiB
//! more), hands each request through that channel and its answer back through a
//! oneshot. A node connection here carries one exchange at a time for the task
//! that leased it: the request head is written straight from a buffer the size of
//! that head, the body's frames go to the socket as they are (one `writev` for a
//! chunk and its framing), and the answer is read into one buffer of
//! [`NODE_BUFFER`], whose pieces become the response's header values and body
//! chunks without a copy. A student who reads slowly therefore holds the node
//! connection's read buffer and the chunks hyper's server side has queued for it,
//! and nothing else.
//!
//! What it reads is held to RFC 9112 as a proxy must: a head larger than
//! [`NODE_BUFFER`] or malformed, a `Content-Length` that is not one number, a
//! chunk size that is not hexadecimal, all fail the exchange (a 502), never guess.
//! A response framed by both `Transfer-Encoding` and `Content-Length` is read as
//! chunked, loses its `Content-Length` before it is passed on (9112 6.3), and its
//! connection is not kept. Informational answers (`100 Continue`, `103`) are read
//! past; a `101` is returned for the caller to refuse.

use std::fmt;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::clock::Deadline;
use crate::http::body::splice::Pipe;
use crate::http::body::stall::WriteStall;
use crate::http::body::{BoxError, RequestBody, NODE_BUFFER};
use crate::http::h1::wire::{
    chunk_line, closed, ends_chunked, itoa, known_names, line, name_is, parse_length, Outgoing,
};

// A head fits in it, so the offsets of its lines fit in `u16` (see `parse_head`).
const _: () = assert!(NODE_BUFFER <= u16::MAX as usize);

/// A request body's queue: one chunk with its size line and CRLF.
const BODY_PARTS: usize = 3;

/// Response header lines a node may send (hyper's limit, and far above Moodle's
/// dozen or so).
const MAX_HEADERS: usize = 100;

/// The longest chunk-size line accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;

/// The largest trailer section accepted after a chunked body (which is dropped):
/// as large as a head may be.
const MAX_TRAILERS: usize = NODE_BUFFER;

/// Reading less than this into the buffer is not worth a system call: the buffer
/// is renewed first.
const MIN_READ: usize = 1024;

/// What a request head reserves beyond its request line: a browser's head with its
/// cookies and the forwarding lines fits, and a larger one grows the buffer once.
const HEAD_ROOM: usize = 1024;

/// A connection to a node: its writes may stay blocked at most `body_idle` (see
/// [`WriteStall`]: a node that accepted an upload but stopped reading would
/// otherwise hold the request for ever).
pub struct Connection {
    io: WriteStall<TcpStream>,
    /// What the node sent and nobody took yet. Kept between exchanges: the next
    /// answer is read into its start if nothing holds the last one's bytes, else
    /// into what is left of it, so that a small page costs no allocation here.
    buf: BytesMut,
    out: Outgoing<BODY_PARTS>,
    /// The request's body while it is being sent.
    body: Option<RequestBody>,
    /// The request's head once it is queued, until the answer's head arrives:
    /// handed back if the node closes without answering (a GET goes again as it
    /// was sent, without a copy kept of every request for that rare case), and
    /// otherwise its header map, emptied, takes the answer's headers, so that a
    /// request and its answer allocate one map between them (hyper's trick).
    request_head: Option<Parts>,
    framing: Framing,
    /// A write failed before the answer's head arrived; the node may still have
    /// answered (a `413` before it closes), so reading goes on, and this is the
    /// error if it did not.
    write_failed: Option<io::Error>,
    reading: Reading,
    /// The request was a `HEAD`: its answer has no body whatever it says.
    head_request: bool,
    /// The node lets the connection carry another exchange after this one.
    keep_alive: bool,
    /// How long the node may take to its answer's head once it has the request
    /// (`timeouts.response_headers`).
    head_wait: Duration,
    /// The deadline for the answer's head, one timer for all the connection's
    /// exchanges: setting it later again is a read of the coarse clock (the timer
    /// is armed again only if it fires early, see [`Deadline`]), where a timer of
    /// each answer's own was put into the wheel and taken out again every time.
    /// Set once the request is out; `head_due` says whether it is for this exchange. Between exchanges it
    /// keeps the waker of the last request it timed, until its deadline passes or
    /// the next request polls it: a finished student connection's task is freed up
    /// to `response_headers` later than it would be.
    head_timer: Option<Deadline>,
    head_due: bool,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("sent", &self.sent())
            .field("reading", &self.reading)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

/// How the request's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body, or one whose bytes are all written: `Content-Length` says how many
    /// are still due.
    Length(u64),
    /// `Transfer-Encoding: chunked`, for a streamed body of unknown length.
    Chunked,
}

/// Where the answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// No exchange yet, or between exchanges.
    Idle,
    /// Waiting for the response head.
    Head,
    /// Reading the body.
    Body(Decoder),
    /// The answer has been read in full.
    Done,
}

/// How the answer's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    /// `Content-Length`: this many bytes are still due.
    Length(u64),
    /// `Transfer-Encoding: chunked`, at this point of a chunk.
    Chunked(Chunk),
    /// Neither: the body ends when the node closes the connection.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk, with this many bytes of it still due.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last (empty) chunk: the trailer section, discarded, with this
    /// many bytes of it read.
    Trailers(usize),
}

/// Why an exchange with a node failed.
#[derive(Debug)]
pub enum ClientError {
    /// The node closed the connection before the answer's head was complete.
    ClosedBeforeAnswer,
    /// The node closed the connection before the answer's body was complete.
    ClosedMidBody,
    /// The socket failed.
    Io(io::Error),
    /// The answer broke HTTP/1.1 (the reason says how).
    Malformed(&'static str),
    /// The answer's head was larger than [`NODE_BUFFER`].
    HeadTooLarge,
    /// The student's body failed while it was being sent: its own error (a pause,
    /// a crawl, too many bytes) is the source, for the caller to classify.
    Upload(BoxError),
    /// The node had the whole request this long without its answer's head.
    HeadTimeout(Duration),
}

impl ClientError {
    /// Whether the node closed (or reset) the connection before its answer's head
    /// was complete, so that nothing of an answer exists.
    pub fn closed_without_answer(&self) -> bool {
        match self {
            Self::ClosedBeforeAnswer => true,
            Self::Io(error) => closed(error) || error.kind() == io::ErrorKind::UnexpectedEof,
            _ => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ClosedBeforeAnswer => {
                f.write_str("the node closed the connection without an answer")
            }
            Self::ClosedMidBody => {
                f.write_str("the node closed the connection inside its answer's body")
            }
            Self::Io(_) => f.write_str("the connection to the node failed"),
            Self::Malformed(why) => write!(f, "the node's answer is not valid HTTP/1.1: {why}"),
            Self::HeadTooLarge => write!(
                f,
                "the node's answer head is larger than {NODE_BUFFER} bytes"
            ),
            Self::Upload(_) => f.write_str("the request body failed"),
            Self::HeadTimeout(wait) => write!(
                f,
                "no response headers within {}",
                humantime::format_duration(*wait)
            ),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(error) => Some(error),
            Self::Upload(error) => Some(&**error),
            _ => None,
        }
    }
}

impl Connection {
    /// A connection over `io`, ready for its first request.
    pub fn new(io: WriteStall<TcpStream>) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            out: Outgoing::default(),
            body: None,
            request_head: None,
            framing: Framing::Length(0),
            write_failed: None,
            reading: Reading::Idle,
            head_request: false,
            keep_alive: true,
            head_wait: Duration::MAX,
            head_timer: None,
            head_due: false,
        }
    }

    /// Whether the idle connection can no longer carry a request: the node closed
    /// it, reset it, or sent bytes nobody asked for. Costs a system call only when
    /// the socket has something to say.
    pub fn poll_unusable(&mut self, cx: &mut Context<'_>) -> bool {
        if self.io.get_ref().poll_read_ready(cx).is_pending() {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        // A FIN, an error or stray bytes; `Pending` if the readiness was stale.
        Pin::new(&mut self.io).poll_read(cx, &mut probe).is_ready()
    }

    /// Starts `request`: its head is queued, its body framed. Nothing is written
    /// until `poll_head` drives the connection, which gives the node
    /// `head_wait` from the end of the request to the end of its answer's head.
    pub fn start(
        &mut self,
        request: Request<RequestBody>,
        head_wait: Duration,
    ) -> Result<(), ClientError> {
        debug_assert_eq!(self.reading, Reading::Idle);
        self.head_wait = head_wait;
        self.head_due = false;
        let (parts, body) = request.into_parts();
        let headers = &parts.headers;
        let framing = if body.is_end_stream() {
            Framing::Length(0)
        } else if let Some(len) = headers.get(CONTENT_LENGTH) {
            let len = parse_length(len.as_bytes()).ok_or_else(|| {
                ClientError::Upload("the request's Content-Length is not a number".into())
            })?;
            Framing::Length(len)
        } else {
            Framing::Chunked
        };
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let method = parts.method.as_str();
        let head = &mut self.out.head;
        debug_assert!(head.is_empty());
        // Room for a usual head at once; the allocation is kept for the next request.
        head.reserve(method.len() + path.len() + HEAD_ROOM);
        head.extend_from_slice(method.as_bytes());
        head.push(b' ');
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        // The framing is the one chosen above, whatever the map says: a length
        // that disagreed with the body would let the node read the next request
        // on the connection as the rest of this one.
        let mut declared = false;
        for (name, value) in headers {
            if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
                declared |= name == CONTENT_LENGTH;
                continue;
            }
            line(head, name, value);
        }
        match framing {
            Framing::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            Framing::Length(0) if !declared => {}
            Framing::Length(len) => {
                head.extend_from_slice(b"content-length: ");
                head.extend_from_slice(itoa(len, &mut [0; 20]));
                head.extend_from_slice(b"\r\n");
            }
        }
        head.extend_from_slice(b"\r\n");
        self.head_request = parts.method == Method::HEAD;
        self.request_head = Some(parts);
        self.body = (framing != Framing::Length(0)).then_some(body);
        self.framing = framing;
        self.write_failed = None;
        self.reading = Reading::Head;
        Ok(())
    }

    /// The head of the request [`Self::start`] took, as it was written: there
    /// until the answer's head is read, to go again on another connection if the
    /// node closes this one without answering.
    pub fn take_request_head(&mut self) -> Option<Parts> {
        self.request_head.take()
    }

    /// Sends what is left of the request and waits for the answer's head.
    pub(crate) fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<()>, ClientError>> {
        loop {
            // An answer already here comes first: a node that refused the upload
            // (`413`) is heard even if the student's body failed meanwhile.
            if !self.buf.is_empty() {
                if let Some(response) = self.parse_head()? {
                    return Poll::Ready(Ok(response));
                }
                if self.buf.len() >= NODE_BUFFER {
                    return Poll::Ready(Err(ClientError::HeadTooLarge));
                }
            }
            if !self.sent() {
                match self.poll_send(cx) {
                    Poll::Ready(Ok(())) | Poll::Pending => {}
                    // The node closed its side: it may have answered first (a
                    // `413` before it closes), so reading goes on. Any other
                    // failure (a write blocked past `body_idle`) ends the exchange.
                    Poll::Ready(Err(ClientError::Io(error))) if closed(&error) => {
                        self.abandon_request();
                        self.write_failed = Some(error);
                    }
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                }
            }
            // The clock is asked only when there is nothing to read: a node's
            // answer that is already here costs no timer poll.
            let filled = match self.poll_fill(cx) {
                Poll::Ready(filled) => filled,
                // An upload still going out is timed by its own rules, not this one.
                Poll::Pending if self.sent() && self.head_overdue(cx) => {
                    self.keep_alive = false;
                    return Poll::Ready(Err(ClientError::HeadTimeout(self.head_wait)));
                }
                Poll::Pending => return Poll::Pending,
            };
            match filled {
                Ok(0) => {
                    self.keep_alive = false;
                    let error = match self.write_failed.take() {
                        Some(error) => ClientError::Io(error),
                        None => ClientError::ClosedBeforeAnswer,
                    };
                    return Poll::Ready(Err(error));
                }
                Ok(_) => {}
                Err(error) => return Poll::Ready(Err(ClientError::Io(error))),
            }
        }
    }

    /// The answer's next piece of body, `None` at its end. Goes on sending an
    /// upload the node answered before it was complete, as the node may read it
    /// still.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, ClientError>>> {
        if !self.sent() {
            // The answer is what counts now: an upload that fails only costs the
            // connection its reuse.
            if let Poll::Ready(Err(_)) = self.poll_send(cx) {
                self.abandon_request();
            }
        }
        loop {
            let Reading::Body(decoder) = self.reading else {
                return Poll::Ready(None);
            };
            match self.decode(decoder) {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(None) if self.reading == Reading::Done => return Poll::Ready(None),
                Ok(None) => {}
                Err(error) => return Poll::Ready(Some(Err(error))),
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    self.keep_alive = false;
                    if decoder == Decoder::Close {
                        self.reading = Reading::Done;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(ClientError::ClosedMidBody)));
                }
                Ok(_) => {}
                Err(error) => return Poll::Ready(Some(Err(ClientError::Io(error)))),
            }
        }
    }

    /// Whether the body's next bytes can be spliced straight off the socket: a
    /// `Content-Length` body with none of it read into the buffer yet, and the
    /// request all sent (an upload the node answered early is sent by
    /// [`Self::poll_data`]).
    pub fn can_splice(&self) -> bool {
        matches!(self.reading, Reading::Body(Decoder::Length(left)) if left > 0)
            && self.buf.is_empty()
            && self.sent()
    }

    /// Moves up to `max` of the body's next bytes from the socket into `pipe`
    /// (see [`Self::can_splice`]); never past the body's end, so the connection
    /// stays fit for the next exchange.
    pub fn poll_splice(
        &mut self,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, ClientError>> {
        let Reading::Body(Decoder::Length(left)) = self.reading else {
            return Poll::Ready(Ok(0));
        };
        let max = usize::try_from(left).map_or(max, |left| left.min(max));
        let moved = ready!(pipe.poll_fill(cx, self.io.get_ref(), max)).map_err(ClientError::Io)?;
        if moved == 0 && max > 0 {
            self.keep_alive = false;
            return Poll::Ready(Err(ClientError::ClosedMidBody));
        }
        self.reading = match left - moved as u64 {
            0 => Reading::Done,
            left => Reading::Body(Decoder::Length(left)),
        };
        Poll::Ready(Ok(moved))
    }

    /// Whether the answer has been read in full (or has no body).
    pub fn is_done(&self) -> bool {
        self.reading == Reading::Done
    }

    /// The body's bytes still due, when the node said how many.
    pub fn remaining(&self) -> Option<u64> {
        match self.reading {
            Reading::Body(Decoder::Length(left)) => Some(left),
            Reading::Done => Some(0),
            _ => None,
        }
    }

    /// Makes the connection ready for the next request if this exchange left it
    /// clean: the whole request sent, the whole answer read and nothing more, and
    /// the node willing.
    pub fn finish(&mut self) -> bool {
        // A connection that never carried an exchange is as clean as one whose
        // exchange ended well.
        // (A failed write made it unwilling, see `abandon_request`.)
        let clean = matches!(self.reading, Reading::Done | Reading::Idle)
            && self.sent()
            && self.keep_alive
            && self.buf.is_empty();
        self.reading = Reading::Idle;
        // Used up: taken back to its start if nothing holds it (as `poll_fill` would),
        // else let go, so that an idle connection does not keep the memory a slow
        // student's chunks still pin.
        if self.buf.capacity() - self.buf.len() < MIN_READ && !self.buf.try_reclaim(NODE_BUFFER) {
            self.buf = BytesMut::new();
        }
        clean
    }

    /// Stops sending the request: nothing more of it will go, and the connection
    /// can carry nothing else.
    fn abandon_request(&mut self) {
        self.body = None;
        self.out.clear();
        self.keep_alive = false;
    }

    /// Whether `head_wait` has passed since the request was out (the first call
    /// of an exchange starts the clock); if not, `cx` is woken when it does.
    fn head_overdue(&mut self, cx: &mut Context<'_>) -> bool {
        if !std::mem::replace(&mut self.head_due, true) {
            // A wait too long for the clock (a config's "no limit") never ends.
            match &mut self.head_timer {
                Some(timer) => timer.set(self.head_wait),
                None => self.head_timer = Some(Deadline::after(self.head_wait)),
            }
        }
        self.head_timer
            .as_mut()
            .is_some_and(|timer| timer.poll_passed(cx))
    }

    /// Everything of the request has been handed to the socket (or given up).
    fn sent(&self) -> bool {
        self.body.is_none() && self.out.is_empty()
    }

    /// Writes what is queued and feeds the body's frames to the socket until the
    /// request is out, or the socket or the body has to wait.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ClientError>> {
        loop {
            // Queue what the body has ready, so that a head and a body read
            // whole (most uploads) leave in one system call.
            while self.out.room() == BODY_PARTS {
                let Some(body) = self.body.as_mut() else {
                    break;
                };
                let frame = match Pin::new(body).poll_frame(cx) {
                    Poll::Pending => break,
                    Poll::Ready(frame) => frame,
                };
                match frame {
                    None => self.body_ended()?,
                    Some(Err(error)) => {
                        self.body = None;
                        return Poll::Ready(Err(ClientError::Upload(error)));
                    }
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.queue_data(data)?;
                        }
                    }
                }
            }
            if self.out.is_empty() {
                return match self.body {
                    None => Poll::Ready(Ok(())),
                    Some(_) => Poll::Pending,
                };
            }
            let written = {
                let mut slices = [IoSlice::new(&[]); Outgoing::<BODY_PARTS>::SLICES];
                let count = self.out.slices(&mut slices);
                ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count]))
                    .map_err(ClientError::Io)?
            };
            if written == 0 {
                return Poll::Ready(Err(ClientError::Io(io::ErrorKind::WriteZero.into())));
            }
            self.out.advance(written);
        }
    }

    /// Queues one piece of the body with its framing.
    fn queue_data(&mut self, data: Bytes) -> Result<(), ClientError> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.framing {
            Framing::Length(left) => {
                let len = data.len() as u64;
                // Checked for every piece: the error is built only when it is one.
                *left = left.checked_sub(len).ok_or_else(|| {
                    ClientError::Upload("the request body is longer than its Content-Length".into())
                })?;
                self.out.push(data);
                if *left == 0 {
                    // A sized body is complete at its length: not polled again.
                    self.body = None;
                }
            }
            Framing::Chunked => {
                self.out.push(chunk_line(data.len()));
                self.out.push(data);
                self.out.push(Bytes::from_static(b"\r\n"));
            }
        }
        Ok(())
    }

    /// The body said it has no more frames.
    fn body_ended(&mut self) -> Result<(), ClientError> {
        self.body = None;
        match self.framing {
            Framing::Chunked => self.out.push(Bytes::from_static(b"0\r\n\r\n")),
            Framing::Length(0) => {}
            Framing::Length(_) => {
                return Err(ClientError::Upload(
                    "the request body is shorter than its Content-Length".into(),
                ))
            }
        }
        Ok(())
    }

    /// Reads more of the answer into the buffer: `Ok(0)` when the node closed.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.is_empty() {
            // Read from the buffer's start again whenever nothing holds it: the
            // lines the last answer used are still in the CPU's cache, where the
            // kernel's copy into the next 2 KiB on had to fetch them, every
            // answer (a loaded pool's buffers are a megabyte). The last chunks
            // handed out may still be waiting for a slow student: their buffer
            // is reused only once they are gone.
            if !self.buf.try_reclaim(NODE_BUFFER) && self.buf.capacity() < MIN_READ {
                self.buf = BytesMut::with_capacity(NODE_BUFFER);
            }
        } else if self.buf.capacity() - self.buf.len() < MIN_READ {
            self.buf
                .reserve(NODE_BUFFER.saturating_sub(self.buf.len()).max(MIN_READ));
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// The answer's head if the buffer holds all of it; informational answers
    /// before it are dropped on the way.
    fn parse_head(&mut self) -> Result<Option<Response<()>>, ClientError> {
        loop {
            // Left uninitialised, as hyper does: the parser writes what it uses.
            let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
            let mut parsed = httparse::Response::new(&mut []);
            let parsing = httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut parsed,
                &self.buf,
                &mut lines,
            );
            let len = match parsing {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(ClientError::Malformed("more than 100 header lines"))
                }
                Err(_) => return Err(ClientError::Malformed("unreadable status line or header")),
            };
            if len > NODE_BUFFER {
                return Err(ClientError::HeadTooLarge);
            }
            let code = parsed.code.unwrap_or_default();
            if (100..200).contains(&code) && code != 101 {
                self.buf.advance(len);
                continue;
            }
            let status = StatusCode::from_u16(code)
                .map_err(|_| ClientError::Malformed("status code out of range"))?;
            let version = if parsed.version == Some(0) {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            };
            let reason = reason_phrase(parsed.reason, status);
            // Where each line sits, so that the values can be cut from the
            // buffer once the parser lets go of it. The head is at most
            // NODE_BUFFER long (checked above): offsets fit.
            debug_assert!(len <= NODE_BUFFER, "the offsets below are u16s");
            let base = self.buf.as_ptr() as usize;
            let offset = |part: &[u8]| (part.as_ptr() as usize - base) as u16;
            let mut answer = AnswerHead::new(version);
            let mut spans: [LineSpan; MAX_HEADERS] = [(0, 0, 0, 0); MAX_HEADERS];
            let mut count = 0;
            for line in parsed.headers.iter() {
                let name = line.name.as_bytes();
                // The lines about this connection alone are not passed on.
                if answer.note(name, line.value) {
                    let value = line.value;
                    spans[count] = (
                        offset(name),
                        name.len() as u16,
                        offset(value),
                        value.len() as u16,
                    );
                    count += 1;
                }
            }
            let raw = self.buf.split_to(len).freeze();
            let headers = self.request_head.take().map(|parts| parts.headers);
            let mut headers = header_map(&raw, &spans[..count], headers.unwrap_or_default())?;
            let decoder = answer.decoder(status, self.head_request, &mut headers)?;
            self.keep_alive &= answer.keep_alive();
            self.reading = match decoder {
                None => Reading::Done,
                Some(Decoder::Length(0)) => Reading::Done,
                Some(decoder) => Reading::Body(decoder),
            };
            let mut response = Response::new(());
            *response.status_mut() = status;
            *response.version_mut() = version;
            *response.headers_mut() = headers;
            if let Some(reason) = reason {
                response.extensions_mut().insert(reason);
            }
            return Ok(Some(response));
        }
    }

    /// Takes the next piece of body out of the buffer: `Ok(None)` when more must
    /// be read first, or when the body ended (`self.reading` is then `Done`).
    fn decode(&mut self, decoder: Decoder) -> Result<Option<Bytes>, ClientError> {
        match decoder {
            Decoder::Length(left) => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let take = self
                    .buf
                    .len()
                    .min(usize::try_from(left).unwrap_or(usize::MAX));
                let left = left - take as u64;
                self.reading = match left {
                    0 => Reading::Done,
                    _ => Reading::Body(Decoder::Length(left)),
                };
                Ok(Some(self.buf.split_to(take).freeze()))
            }
            Decoder::Close => Ok((!self.buf.is_empty()).then(|| self.buf.split().freeze())),
            Decoder::Chunked(chunk) => self.decode_chunked(chunk),
        }
    }

    /// [`Self::decode`] for a chunked body, at `chunk`.
    fn decode_chunked(&mut self, mut chunk: Chunk) -> Result<Option<Bytes>, ClientError> {
        loop {
            chunk = match chunk {
                Chunk::Size => match self.line()? {
                    None => break,
                    Some(line) => match chunk_size(&line)? {
                        0 => Chunk::Trailers(0),
                        size => Chunk::Data(size),
                    },
                },
                Chunk::Data(left) => {
                    if self.buf.is_empty() {
                        break;
                    }
                    let take = self
                        .buf
                        .len()
                        .min(usize::try_from(left).unwrap_or(usize::MAX));
                    let left = left - take as u64;
                    let next = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                    self.reading = Reading::Body(Decoder::Chunked(next));
                    return Ok(Some(self.buf.split_to(take).freeze()));
                }
                Chunk::DataEnd => {
                    if self.buf.len() < 2 {
                        break;
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(ClientError::Malformed("chunk data not followed by CRLF"));
                    }
                    self.buf.advance(2);
                    Chunk::Size
                }
                Chunk::Trailers(read) => match self.line()? {
                    None => break,
                    Some(line) if line.is_empty() => {
                        self.reading = Reading::Done;
                        return Ok(None);
                    }
                    Some(line) if read + line.len() + 2 > MAX_TRAILERS => {
                        return Err(ClientError::Malformed("trailer section too large"));
                    }
                    Some(line) => Chunk::Trailers(read + line.len() + 2),
                },
            };
        }
        self.reading = Reading::Body(Decoder::Chunked(chunk));
        Ok(None)
    }

    /// The next CRLF-ended line of a chunked body, without its CRLF, if all of it
    /// has arrived.
    fn line(&mut self) -> Result<Option<Bytes>, ClientError> {
        match memchr::memchr(b'\n', &self.buf) {
            Some(end) => {
                if end == 0 || self.buf[end - 1] != b'\r' {
                    return Err(ClientError::Malformed("chunk line not ended by CRLF"));
                }
                let line = self.buf.split_to(end + 1).freeze();
                Ok(Some(line.slice(..end - 1)))
            }
            None if self.buf.len() > MAX_CHUNK_LINE => {
                Err(ClientError::Malformed("chunk line too long"))
            }
            None => Ok(None),
        }
    }
}

/// Where a line of an answer's head sits in the buffer: its name's offset and
/// length, its value's. The head is at most [`NODE_BUFFER`] long: offsets fit.
type LineSpan = (u16, u16, u16, u16);

/// The answer's header map, from the head `raw` and where its lines sit: names
/// matched as nodes spell them, values slices of `raw` (no copy), in `headers`
/// (the request's map, emptied: one map for both, hyper's trick).
fn header_map(
    raw: &Bytes,
    spans: &[LineSpan],
    mut headers: HeaderMap,
) -> Result<HeaderMap, ClientError> {
    headers.clear();
    headers.reserve(spans.len());
    for &(name_at, name_len, value_at, value_len) in spans {
        let (name_at, name_len) = (usize::from(name_at), usize::from(name_len));
        let (value_at, value_len) = (usize::from(value_at), usize::from(value_len));
        let name = &raw[name_at..name_at + name_len];
        let name = match known_name(name) {
            Some(name) => name,
            None => HeaderName::from_bytes(name)
                .map_err(|_| ClientError::Malformed("invalid header name"))?,
        };
        let value = raw.slice(value_at..value_at + value_len);
        let value = HeaderValue::from_maybe_shared(value)
            .map_err(|_| ClientError::Malformed("invalid header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// A reason phrase of the node's own, to travel on as hyper's server writes one
/// (a canonical one costs nothing here).
fn reason_phrase(reason: Option<&str>, status: StatusCode) -> Option<hyper::ext::ReasonPhrase> {
    reason
        .filter(|reason| Some(*reason) != status.canonical_reason())
        .and_then(|reason| hyper::ext::ReasonPhrase::try_from(reason.as_bytes()).ok())
}

known_names! {
    /// The names Moodle's answers carry, spelt as PHP and its web server write
    /// them: matched as they are before the general parse, which folds the case
    /// of every byte and looks the name up, and copies a name it does not know
    /// (`X-Powered-By`) into an allocation of its own, for every answer. Every
    /// line goes into the answer's map, so the usual ones are listed here.
    fn known_name, KNOWN_SPELLINGS;
    b"Date" => header::DATE,
    b"Server" => header::SERVER,
    b"Content-Type" => header::CONTENT_TYPE,
    b"Content-Length" => header::CONTENT_LENGTH,
    b"Set-Cookie" => header::SET_COOKIE,
    b"Cache-Control" => header::CACHE_CONTROL,
    b"Expires" => header::EXPIRES,
    b"Pragma" => header::PRAGMA,
    b"Last-Modified" => header::LAST_MODIFIED,
    b"ETag" => header::ETAG,
    b"Vary" => header::VARY,
    b"Accept-Ranges" => header::ACCEPT_RANGES,
    b"Content-Language" => header::CONTENT_LANGUAGE,
    b"X-Frame-Options" => header::X_FRAME_OPTIONS,
    b"X-Powered-By" => X_POWERED_BY,
    b"Content-Script-Type" => CONTENT_SCRIPT_TYPE,
    b"Content-Style-Type" => CONTENT_STYLE_TYPE,
    b"Content-Encoding" => header::CONTENT_ENCODING,
    b"Content-Disposition" => header::CONTENT_DISPOSITION,
    b"Location" => header::LOCATION,
    b"Referrer-Policy" => header::REFERRER_POLICY,
    b"Strict-Transport-Security" => header::STRICT_TRANSPORT_SECURITY,
    b"X-Content-Type-Options" => header::X_CONTENT_TYPE_OPTIONS,
    b"X-XSS-Protection" => header::X_XSS_PROTECTION,
    b"X-UA-Compatible" => X_UA_COMPATIBLE,
}

const X_POWERED_BY: HeaderName = HeaderName::from_static("x-powered-by");
const CONTENT_SCRIPT_TYPE: HeaderName = HeaderName::from_static("content-script-type");
const CONTENT_STYLE_TYPE: HeaderName = HeaderName::from_static("content-style-type");
const X_UA_COMPATIBLE: HeaderName = HeaderName::from_static("x-ua-compatible");

/// A chunk-size line's size: hexadecimal digits, then perhaps whitespace and
/// extensions after `;` (ignored), nothing else.
fn chunk_size(line: &[u8]) -> Result<u64, ClientError> {
    let invalid = || ClientError::Malformed("invalid chunk size");
    let end = line.iter().position(|&b| b == b';').unwrap_or(line.len());
    let mut digits = &line[..end];
    while let [rest @ .., b' ' | b'\t'] = digits {
        digits = rest;
    }
    if digits.is_empty() {
        return Err(invalid());
    }
    while let [b'0', rest @ ..] = digits {
        if rest.is_empty() {
            break;
        }
        digits = rest;
    }
    if digits.len() > 16 {
        return Err(invalid());
    }
    let mut size = 0u64;
    for &b in digits {
        let digit = (b as char).to_digit(16).ok_or_else(invalid)?;
        size = size << 4 | u64::from(digit);
    }
    Ok(size)
}

/// Leaves one `Content-Length` line in `headers`, spelt as the number `len` is
/// (`5, 5` or two lines of `5`, or `0005`, become `5`), as HAProxy rewrites it: a
/// client or cache behind the gateway must not meet a spelling it may read
/// another way. Lengths that differ never get here (a framing error).
fn one_length(headers: &mut HeaderMap, len: u64) {
    let mut digits = [0; 20];
    let canonical = itoa(len, &mut digits);
    let mut lines = headers.get_all(CONTENT_LENGTH).iter();
    if !matches!((lines.next(), lines.next()), (Some(one), None) if one.as_bytes() == canonical) {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// What an answer's head says about its framing and its connection, gathered
/// while its lines are turned into a `HeaderMap` (one pass, no lookups after).
struct AnswerHead {
    version: Version,
    length: Option<Result<u64, ()>>,
    chunked: Option<bool>,
    close: bool,
    keep_alive: bool,
    /// A `Connection` line names other lines, which the proxy then removes.
    names_lines: bool,
}

impl AnswerHead {
    fn new(version: Version) -> Self {
        Self {
            version,
            length: None,
            chunked: None,
            close: false,
            keep_alive: false,
            names_lines: false,
        }
    }

    /// Takes in one header line; says whether it is passed on. The lines about this
    /// connection alone are not (the proxy would strip them): `Transfer-Encoding`
    /// (the body is decoded here and framed anew for the student), `Keep-Alive`, and
    /// a `Connection` that lists nothing but `close` or `keep-alive`, as nginx's and
    /// Apache's always does. One that lists other headers stays, for the proxy to
    /// remove those too.
    fn note(&mut self, name: &[u8], value: &[u8]) -> bool {
        if name_is(name, b"content-length") {
            let this = parse_length(value).ok_or(());
            self.length = Some(match self.length {
                None => this,
                Some(Ok(seen)) if this == Ok(seen) => this,
                Some(_) => Err(()),
            });
        } else if name_is(name, b"transfer-encoding") {
            // The last coding of the last line is the one that frames the body.
            self.chunked = Some(ends_chunked(value));
            return false;
        } else if name_is(name, b"connection") {
            let mut lists_more = false;
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                let close = token.eq_ignore_ascii_case(b"close");
                let keep_alive = token.eq_ignore_ascii_case(b"keep-alive");
                self.close |= close;
                self.keep_alive |= keep_alive;
                lists_more |= !(close || keep_alive || token.is_empty());
            }
            self.names_lines |= lists_more;
            return lists_more;
        } else if name_is(name, b"keep-alive") {
            return false;
        }
        true
    }

    /// How the body is framed (RFC 9112 6.3), `None` for an answer without one.
    fn decoder(
        &mut self,
        status: StatusCode,
        head_request: bool,
        headers: &mut HeaderMap,
    ) -> Result<Option<Decoder>, ClientError> {
        if status == StatusCode::SWITCHING_PROTOCOLS {
            self.close = true;
            return Ok(None);
        }
        if self.chunked.is_some() && self.length.is_some() {
            // Framed twice: the chunks win, the length is not passed on, and the
            // connection is not trusted with another exchange (9112 6.3).
            headers.remove(CONTENT_LENGTH);
            self.close = true;
        }
        if let (None, Some(Ok(len))) = (self.chunked, self.length) {
            one_length(headers, len);
        }
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        if let Some(chunked) = self.chunked {
            if self.version == Version::HTTP_10 {
                return Err(ClientError::Malformed(
                    "Transfer-Encoding in an HTTP/1.0 answer",
                ));
            }
            if !chunked {
                self.close = true;
                return Ok(Some(Decoder::Close));
            }
            return Ok(Some(Decoder::Chunked(Chunk::Size)));
        }
        match self.length {
            Some(Ok(len)) => Ok(Some(Decoder::Length(len))),
            Some(Err(())) => Err(ClientError::Malformed("invalid Content-Length")),
            None => {
                self.close = true;
                Ok(Some(Decoder::Close))
            }
        }
    }

    fn keep_alive(&self) -> bool {
        !self.close && (self.version == Version::HTTP_11 || self.keep_alive)
    }
}

#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod tests;
