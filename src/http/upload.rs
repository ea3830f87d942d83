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
//! uploads to `timeouts.upload_min_rate` and `timeouts.upload`, so a slow one costs
//! a worker for a bounded time only.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use crate::http::body::{
    is_body_idle, BodyTooLarge, BoxError, ClientBodyError, IdleLimited, UploadTooLong,
    UploadTooSlow,
};
use crate::http::proxy::Bounds;

/// A request body as the gateway holds it before it goes to a node: what has been
/// read of it (`head`) and what has not (`rest`). Nothing of it has left for a node,
/// so a request carrying it may still go to any node (see `proxy::Failed`).
#[derive(Debug, Default)]
pub struct Upload {
    /// Bytes already read from the student: the whole body when `rest` is `None`.
    head: Option<Bytes>,
    rest: Option<Paced>,
}

impl Upload {
    /// No body at all (a GET, or a request the gateway makes itself).
    pub fn empty() -> Self {
        Self::default()
    }

    /// The student's body under the rules of `bounds`; its clocks start now.
    pub fn new(body: Incoming, bounds: &Bounds) -> Self {
        if body.is_end_stream() {
            return Self::empty();
        }
        Self {
            head: None,
            rest: Some(Paced::new(body, bounds)),
        }
    }

    /// Whether there is no body to send.
    pub fn is_empty(&self) -> bool {
        self.rest.is_none() && self.head.as_ref().is_none_or(Bytes::is_empty)
    }

    /// The body's length when it has been read whole.
    pub fn whole_len(&self) -> Option<usize> {
        match (&self.head, &self.rest) {
            (Some(head), None) => Some(head.len()),
            _ => None,
        }
    }

    /// Reads the body into memory when it fits in `bounds.buffer_body_bytes`: by its
    /// `Content-Length`, or (chunked, HTTP/2 without a length) by ending within it.
    /// One that goes past the limit keeps what was read in front of the rest, which
    /// then streams. Every pause is under `body_idle` and the pace rules; a body
    /// already read (a request sent again) is left as it is.
    pub async fn buffer(&mut self, bounds: &Bounds) -> Result<(), BoxError> {
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
    inner: IdleLimited<Incoming>,
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
    fn new(body: Incoming, bounds: &Bounds) -> Self {
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

/// The student's request body on its way to a node, saying when it has been sent in
/// full. The response-header timeout starts only then: PHP reads a whole upload
/// before the script runs, so a 300 MB SCORM package that takes two minutes to
/// arrive must not be cut off by a 60 s wait for the answer.
#[derive(Debug)]
pub struct RequestBody {
    /// Read before the node was contacted, sent first.
    head: Option<Bytes>,
    rest: Option<Paced>,
    sent: Option<oneshot::Sender<()>>,
    /// Bytes still allowed (`limits.max_body_bytes` minus what passed).
    allowed: u64,
}

impl RequestBody {
    /// Sends `upload`, at most `max_bytes` of it; `sent` fires once it has gone out
    /// in full (or failed).
    pub fn new(upload: Upload, max_bytes: u64, sent: Option<oneshot::Sender<()>>) -> Self {
        let head = upload.head.filter(|head| !head.is_empty());
        let read = head.as_ref().map_or(0, |head| head.len() as u64);
        Self {
            head,
            rest: upload.rest,
            sent,
            allowed: max_bytes.saturating_sub(read),
        }
    }

    fn finished(&mut self) {
        if let Some(sent) = self.sent.take() {
            let _ = sent.send(());
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = match (self.head.take(), self.rest.as_mut()) {
            (Some(head), _) => Poll::Ready(Some(Ok(Frame::data(head)))),
            (None, None) => Poll::Ready(None),
            (None, Some(rest)) => match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let len = data.data_ref().map_or(0, |d| d.len() as u64);
                    match self.allowed.checked_sub(len) {
                        Some(left) => {
                            self.allowed = left;
                            Poll::Ready(Some(Ok(data)))
                        }
                        // Chunked bodies have no length to check up front: cut here.
                        None => Poll::Ready(Some(Err(Box::new(BodyTooLarge) as BoxError))),
                    }
                }
                other => other,
            },
        };
        // hyper stops polling once a sized body reports its end, so check after
        // every frame, not only for the final `None`.
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) || self.is_end_stream() {
            self.finished();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.head.as_ref().map_or(0, |head| head.len() as u64);
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
