//! The student's request body, from the moment it arrives until it has left for a
//! node: small bodies read whole first, larger ones streamed under a minimum rate
//! and a total deadline.
//!
//! Why: each connection to a node is a PHP worker, and PHP takes the worker when the
//! request head arrives, not when the body is complete. A client that trickles its
//! body (slowhttptest `-B`) never pauses long enough for `body_idle`, so without
//! these rules 400 such clients held 304 workers for as long as they liked. nginx
//! answers the same attack by reading the body before it contacts the upstream
//! (`proxy_request_buffering`); the gateway does that for bodies up to
//! `limits.buffer_body_bytes` (nearly every Moodle POST), and holds the few larger
//! uploads to `timeouts.upload_min_rate` and `timeouts.upload`. Bodies up to
//! `limits.spool_body_bytes` (a typical assignment) are kept on disk until whole
//! ([`crate::http::body::spool`]), so only the few larger than that cost a worker while
//! they arrive, and for a bounded time only.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use crate::http::h1::server::StudentBody;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::http::body::spool::{Spool, Spooled};
use crate::http::body::{
    is_body_idle, BodyTooLarge, BoxError, ClientBodyError, IdleLimited, RequestBody, UploadTooLong,
    UploadTooSlow,
};
use crate::http::upstream::proxy::Bounds;

/// A request body as the gateway holds it before it goes to a node: what has been
/// read of it (on disk in `spooled`, then in memory in `head`) and what has not
/// (`rest`). Nothing of it has left for a node, so a request carrying it may still
/// go to any node (see `proxy::Failed`).
#[derive(Debug, Default)]
pub struct Upload {
    /// Bytes already read and kept on disk, sent first.
    spooled: Option<Spooled>,
    /// Bytes already read and kept in memory, sent after `spooled`: the whole body
    /// when both others are `None`.
    head: Option<Bytes>,
    /// What is still to come from the student. Boxed: most requests have no body,
    /// and a request moves by value through every step of its journey (and each
    /// step's future keeps room for it), so 160 bytes inline would be copied for
    /// every GET to spare one allocation per upload.
    rest: Option<Box<Paced>>,
    /// Read as far as it will be before a node is contacted: a request sent again
    /// is not read (nor spooled) twice.
    read_ahead: bool,
}

impl Upload {
    /// No body at all (a GET, or a request the gateway makes itself).
    pub fn empty() -> Self {
        Self::default()
    }

    /// The student's body under the rules of `bounds`; its clocks start now.
    pub fn new(body: StudentBody, bounds: &Bounds) -> Self {
        if body.is_end_stream() {
            return Self::empty();
        }
        Self {
            rest: Some(Box::new(Paced::new(body, bounds))),
            ..Self::default()
        }
    }

    /// Whether there is no body to send.
    pub fn is_empty(&self) -> bool {
        self.rest.is_none()
            && self.head.as_ref().is_none_or(Bytes::is_empty)
            && self.spooled.as_ref().is_none_or(Spooled::is_empty)
    }

    /// The body's length when it has been read whole (into memory, onto disk or
    /// both).
    pub fn whole_len(&self) -> Option<u64> {
        if self.rest.is_some() || (self.head.is_none() && self.spooled.is_none()) {
            return None;
        }
        let head = self.head.as_ref().map_or(0, |head| head.len() as u64);
        Some(head + self.spooled.as_ref().map_or(0, Spooled::len))
    }

    /// Whether any of it is on disk.
    pub fn is_spooled(&self) -> bool {
        self.spooled.is_some()
    }

    /// Reads the body as far as it goes before a node is contacted: whole into
    /// memory up to `buffer_body_bytes` ([`buffer`](Self::buffer)), else whole onto
    /// disk up to `spool_body_bytes` when there is a `spool` with room; a body
    /// larger than that, or one that finds the spool full, streams as it arrives
    /// with what was read in front. Done once: a request sent again is left as is.
    pub async fn read_ahead(
        &mut self,
        bounds: &Bounds,
        spool: Option<&Spool>,
    ) -> Result<(), BoxError> {
        if std::mem::replace(&mut self.read_ahead, true) {
            return Ok(());
        }
        self.buffer(bounds).await?;
        match spool {
            Some(spool) if bounds.spool_body_bytes > 0 => self.spool(bounds, spool).await,
            _ => Ok(()),
        }
    }

    /// Puts what `buffer` left streaming onto disk, if it fits the limit and the
    /// spool; otherwise leaves it to stream.
    async fn spool(&mut self, bounds: &Bounds, spool: &Spool) -> Result<(), BoxError> {
        let Some(rest) = self.rest.as_mut() else {
            return Ok(());
        };
        // Past max_body_bytes a body streams, to be cut there as it always was.
        let limit = bounds.spool_body_bytes.min(bounds.max_body_bytes);
        let read = self.head.as_ref().map_or(0, |head| head.len() as u64);
        let hint = rest.size_hint();
        // A chunked body could be as large as the limit: it reserves all of it.
        let size = hint.exact().map_or(limit, |rest| rest + read);
        if size > limit || hint.lower() + read > limit {
            return Ok(());
        }
        let Some(reservation) = spool.reserve(size) else {
            return Ok(());
        };
        let Some(file) = reservation.open().await else {
            return Ok(());
        };
        let filled = file.fill(self.head.take(), rest, limit).await?;
        self.spooled = Some(filled.spooled);
        self.head = filled.after;
        if filled.ended {
            self.rest = None;
        }
        Ok(())
    }

    /// Reads the body into memory when it fits in `bounds.buffer_body_bytes`: by its
    /// `Content-Length`, or (chunked, HTTP/2 without a length) by ending within it.
    /// One that goes past the limit keeps what was read in front of the rest, which
    /// then streams. Every pause is under `body_idle` and the pace rules.
    async fn buffer(&mut self, bounds: &Bounds) -> Result<(), BoxError> {
        let limit = bounds.buffer_body_bytes;
        let Some(rest) = self.rest.as_mut().filter(|_| self.head.is_none()) else {
            return Ok(());
        };
        if rest.size_hint().lower() > limit {
            return Ok(());
        }
        let exact = rest.size_hint().exact().unwrap_or(0);
        let mut read = BytesMut::with_capacity(exact as usize);
        loop {
            let Some(frame) = rest.frame().await.transpose()? else {
                break;
            };
            // Trailers are dropped: a body with a Content-Length cannot carry them,
            // and PHP never reads them.
            if let Ok(data) = frame.into_data() {
                read.extend_from_slice(&data);
            }
            if read.len() as u64 > bounds.max_body_bytes {
                return Err(BodyTooLarge.into());
            }
            if read.len() as u64 > limit {
                self.head = Some(read.freeze());
                return Ok(());
            }
            if rest.is_end_stream() {
                break;
            }
        }
        self.head = Some(read.freeze());
        self.rest = None;
        Ok(())
    }
}

/// The student's body with its limits: pauses of at most `body_idle`, an average of
/// at least `upload_min_rate` over each `upload_rate_window`, and all of it within
/// `timeouts.upload`. Only time spent waiting for the student counts towards the
/// rate: while the node (or the gateway's lease of it) is not asking for more, the
/// window is held open, so a slow node never gets its student a 408.
#[derive(Debug)]
pub struct Paced {
    inner: IdleLimited<StudentBody>,
    /// Bytes each window must bring; 0 means no floor.
    min_bytes: u64,
    window: std::time::Duration,
    window_end: Instant,
    deadline: Instant,
    /// Bytes in the current window.
    got: u64,
    /// When the last frame was handed on, until the next poll asks for more.
    handed: Option<Instant>,
    /// Armed at the nearer of `window_end` and `deadline`, once the body waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Paced {
    fn new(body: StudentBody, bounds: &Bounds) -> Self {
        let now = Instant::now();
        let window = bounds.upload_rate_window;
        let per_window = u128::from(bounds.upload_min_rate) * window.as_millis() / 1000;
        Self {
            inner: IdleLimited::new(body, bounds.body_idle),
            min_bytes: u64::try_from(per_window).unwrap_or(u64::MAX),
            window,
            window_end: now + window,
            deadline: now + bounds.upload,
            got: 0,
            handed: None,
            timer: None,
        }
    }

    /// The rules at `now`: past the deadline, or at a window's end short of bytes,
    /// the upload fails; a window that brought enough starts the next.
    fn check(&mut self, now: Instant) -> Result<(), BoxError> {
        if now >= self.deadline {
            return Err(UploadTooLong.into());
        }
        if self.min_bytes > 0 && now >= self.window_end {
            if self.got < self.min_bytes {
                return Err(UploadTooSlow.into());
            }
            self.got = 0;
            self.window_end = now + self.window;
        }
        Ok(())
    }

    /// While the body waits for the student: the pace clock, until a rule fails.
    fn poll_clock(&mut self, cx: &mut Context<'_>) -> Poll<BoxError> {
        loop {
            let at = match self.min_bytes {
                0 => self.deadline,
                _ => self.window_end.min(self.deadline),
            };
            let timer = match &mut self.timer {
                Some(timer) => {
                    if timer.deadline() != at {
                        timer.as_mut().reset(at);
                    }
                    timer
                }
                None => self.timer.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            ready!(timer.as_mut().poll(cx));
            if let Err(error) = self.check(Instant::now()) {
                return Poll::Ready(error);
            }
        }
    }
}

impl Body for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(at) = this.handed.take() {
            this.window_end += at.elapsed();
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.got += frame.data_ref().map_or(0, |d| d.len() as u64);
                let now = Instant::now();
                if let Err(error) = this.check(now) {
                    return Poll::Ready(Some(Err(error)));
                }
                this.handed = Some(now);
                Poll::Ready(Some(Ok(frame)))
            }
            // The student's own failure (broken chunked framing, a cut connection),
            // never the node's.
            Poll::Ready(Some(Err(error))) if !is_body_idle(&*error) => {
                Poll::Ready(Some(Err(Box::new(ClientBodyError(error)))))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => this.poll_clock(cx).map(|error| Some(Err(error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An upload on its way to a node: what was read ahead goes first, then the rest
/// as the student sends it.
#[derive(Debug)]
struct Sending {
    /// Read onto disk before the node was contacted, sent first.
    spooled: Option<Spooled>,
    /// Read into memory before the node was contacted, sent next.
    head: Option<Bytes>,
    /// Still arriving from the student.
    rest: Option<Box<Paced>>,
    /// Bytes still allowed (`limits.max_body_bytes` minus what passed).
    allowed: u64,
}

impl Upload {
    /// The body as it goes to a node, at most `max_bytes` of it. The node connection
    /// starts the response-header timeout only once this has gone out in full: PHP
    /// reads a whole upload before the script runs, so a 300 MB SCORM package that
    /// takes two minutes to arrive must not be cut off by a 60 s wait for the answer.
    pub fn into_request_body(self, max_bytes: u64) -> RequestBody {
        if self.is_empty() {
            return RequestBody::empty();
        }
        let head = self.head.filter(|head| !head.is_empty());
        let spooled = self.spooled.filter(|spooled| !spooled.is_empty());
        let read = head.as_ref().map_or(0, |head| head.len() as u64)
            + spooled.as_ref().map_or(0, Spooled::len);
        RequestBody::new(Sending {
            spooled,
            head,
            rest: self.rest,
            allowed: max_bytes.saturating_sub(read),
        })
    }
}

impl Body for Sending {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = match this.spooled.as_mut().filter(|s| !s.is_end_stream()) {
            Some(spooled) => Pin::new(spooled).poll_frame(cx),
            None => match (this.head.take(), this.rest.as_mut()) {
                (Some(head), _) => Poll::Ready(Some(Ok(Frame::data(head)))),
                (None, None) => Poll::Ready(None),
                (None, Some(rest)) => match Pin::new(rest).poll_frame(cx) {
                    Poll::Ready(Some(Ok(data))) => {
                        let len = data.data_ref().map_or(0, |d| d.len() as u64);
                        match this.allowed.checked_sub(len) {
                            Some(left) => {
                                this.allowed = left;
                                Poll::Ready(Some(Ok(data)))
                            }
                            // Chunked bodies have no length to check up front: cut here.
                            None => Poll::Ready(Some(Err(Box::new(BodyTooLarge) as BoxError))),
                        }
                    }
                    other => other,
                },
            },
        };
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.spooled.as_ref().is_none_or(Body::is_end_stream)
            && self.head.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.head.as_ref().map_or(0, |head| head.len() as u64)
            + self.spooled.as_ref().map_or(0, |s| s.size_hint().lower());
        let Some(rest) = &self.rest else {
            return SizeHint::with_exact(read);
        };
        let hint = rest.size_hint();
        let mut sum = SizeHint::new();
        sum.set_lower(hint.lower() + read);
        if let Some(upper) = hint.upper() {
            sum.set_upper(upper + read);
        }
        sum
    }
}
