//! The bodies that stream through the gateway, the ways they fail, and the one
//! thing the gateway must know about them while they move: when either side has
//! paused for too long. (The upload's own rules are in [`crate::http::upstream::upload`].)
//!
//! Both wrappers hand hyper's frames on untouched (no copy, no boxing of the body);
//! the idle timer is armed only while a body is actually waiting for data, so a
//! small response that arrives in one piece never touches the timer wheel.

pub mod compress;
pub mod inflate;
pub(crate) mod splice;
pub mod spool;
pub mod stall;

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::http::body::splice::{Pipe, Splice};

/// A body error as hyper wants it.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A request's body on its way to a node, as the node side sends it: whatever the
/// upstream side made of the student's body (read ahead, spooled, paced: see
/// `upstream::upload`), so that the node side knows bodies and nothing of uploads.
///
/// One pointer wide, as it moves with the request through its futures: a request
/// without a body (most of them) allocates nothing, one with a body one box.
pub struct RequestBody(Option<Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send + Sync>>>);

impl RequestBody {
    /// No body at all.
    pub fn empty() -> Self {
        Self(None)
    }

    /// `body`, boxed.
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        Self(Some(Box::pin(body)))
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("empty", &self.0.is_none())
            .finish()
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.0 {
            Some(body) => body.as_mut().poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|body| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .as_ref()
            .map_or(SizeHint::with_exact(0), |body| body.size_hint())
    }
}

/// The node connection's read buffer, so also the largest response head a node may
/// send (twice nginx's and Apache's default) and the largest chunk of a body held
/// for a student who reads slowly.
pub const NODE_BUFFER: usize = 16 * 1024;

/// A body paused longer than `timeouts.body_idle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyIdle;

impl std::fmt::Display for BodyIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("body paused longer than timeouts.body_idle")
    }
}

impl StdError for BodyIdle {}

/// The student's body went over `limits.max_body_bytes` while streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTooLarge;

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body larger than limits.max_body_bytes")
    }
}

impl StdError for BodyTooLarge {}

/// The student's body could not be read: broken chunked framing, a connection cut
/// halfway. The student's fault (or network's), never the node's.
#[derive(Debug)]
pub struct ClientBodyError(pub BoxError);

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the client's request body failed: {}", self.0)
    }
}

impl StdError for ClientBodyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// A streamed upload averaged less than `timeouts.upload_min_rate` over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadTooSlow;

impl std::fmt::Display for UploadTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("upload slower than timeouts.upload_min_rate")
    }
}

impl StdError for UploadTooSlow {}

/// An upload still arriving after `timeouts.upload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadTooLong;

impl std::fmt::Display for UploadTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("upload took longer than timeouts.upload")
    }
}

impl StdError for UploadTooLong {}

/// Whether `error`, or anything it wraps, is a [`BodyIdle`].
pub fn is_body_idle(error: &(dyn StdError + 'static)) -> bool {
    wraps::<BodyIdle>(error)
}

/// Whether `error`, or anything it wraps, is a `T`.
pub fn wraps<T: StdError + 'static>(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<T>() {
            return true;
        }
        current = error.source();
    }
    false
}

/// hyper's body with a limit on how long it may wait for its next frame. When the
/// limit passes, the body fails: hyper then drops the upstream connection instead of
/// pooling it, and cuts the student's connection rather than end a truncated body as
/// if it were complete.
#[derive(Debug)]
pub struct IdleLimited<B> {
    inner: B,
    idle: Duration,
    /// Kept between waits and reset, so a long download allocates it once.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl<B> IdleLimited<B> {
    /// Limits `inner` to pauses of at most `idle`.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
            waiting: false,
        }
    }

    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// The wrapped body, to hand it something to hold.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + self.idle;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl<B> Body for IdleLimited<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.waiting = false;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => match self.poll_idle(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyIdle.into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Splice for IdleLimited<B>
where
    B: Splice + Unpin,
{
    fn can_splice(&self) -> bool {
        self.inner.can_splice()
    }

    /// A splice waits for the node like a frame does, under the same limit.
    fn poll_splice(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        match Pin::new(&mut self.inner).poll_splice(cx, pipe, max) {
            Poll::Ready(moved) => {
                self.waiting = false;
                Poll::Ready(moved)
            }
            Poll::Pending => match self.poll_idle(cx) {
                Poll::Ready(()) => Poll::Ready(Err(BodyIdle.into())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    /// A body that yields one frame, then waits for ever, like a stalled node.
    struct OneThenStall(bool);

    impl Body for OneThenStall {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Pending
            } else {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first")))))
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_after_the_idle_limit() {
        let mut body = IdleLimited::new(OneThenStall(false), Duration::from_secs(60));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "first");
        let started = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(is_body_idle(error.as_ref()));
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_moving_is_never_cut() {
        let full = http_body_util::Full::new(Bytes::from_static(b"whole"));
        let mut body = IdleLimited::new(full, Duration::from_millis(1));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "whole");
        assert!(body.frame().await.is_none());
    }
}
