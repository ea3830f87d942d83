//! The open streams of one HTTP/2 connection: when the connection has had none for
//! `timeouts.keep_alive` it is closed, and a stream whose client grants it no
//! flow-control window for `timeouts.body_idle` lets go of its node.
//!
//! Why: the HTTP/1.1 side closes an idle connection itself (its keep-alive
//! deadline), but an HTTP/2 connection with no stream open stays for as long as the
//! client likes, so a few hundred idle ones hold every place under `max_connections`. And a stream's
//! send waits for window without polling its body, so neither the body's idle limit
//! ([`crate::http::body::IdleLimited`]) nor the socket's ([`crate::http::body::stall`])
//! sees a client that reads the connection but never opens the stream's window:
//! the node's connection, and a PHP worker, would wait with it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::http::body::{BodyIdle, BoxError};

/// How many streams of one connection are open (from the request's arrival to the
/// end of its response body). Cheap to clone; a `watch` so the idle watcher sees
/// every change without a lost wake-up.
#[derive(Clone)]
pub(crate) struct Streams {
    open: Arc<watch::Sender<usize>>,
    /// How long a stream's send may wait for window (`timeouts.body_idle`).
    stall: Duration,
}

impl Streams {
    pub(crate) fn new(stall: Duration) -> Self {
        Self {
            open: Arc::new(watch::channel(0).0),
            stall,
        }
    }

    /// Resolves once no stream has been open for `limit`.
    pub(crate) async fn idle(&self, limit: Duration) {
        let mut open = self.open.subscribe();
        loop {
            if *open.borrow_and_update() > 0 {
                let _ = open.wait_for(|&n| n == 0).await;
                continue;
            }
            // Idle now: done unless a stream opens within `limit`.
            if tokio::time::timeout(limit, open.changed()).await.is_err() {
                return;
            }
        }
    }

    /// `service`, counting its streams and watching their sends.
    pub(crate) fn serve<S>(&self, service: S) -> Counting<S> {
        Counting {
            inner: service,
            streams: self.clone(),
        }
    }

    fn opened(&self) -> Open {
        self.open.send_modify(|n| *n += 1);
        Open(self.open.clone())
    }
}

/// One open stream, given back when dropped.
struct Open(Arc<watch::Sender<usize>>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// A service whose every stream counts as open until its response body is gone.
#[derive(Clone)]
pub(crate) struct Counting<S> {
    inner: S,
    streams: Streams,
}

impl<S, B, R> hyper::service::Service<Request<R>> for Counting<S>
where
    S: hyper::service::Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<Watched<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: Request<R>) -> Self::Future {
        let open = self.streams.opened();
        let stall = self.streams.stall;
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Watched::new(body, open, stall)))
        })
    }
}

/// What a response body's send-stall watcher shares with it.
struct Shared<B> {
    /// `None` once the watcher let go of it. Boxed: hyper's bodies need not be
    /// `Unpin`, and only HTTP/2 responses pay for it.
    body: Option<Pin<Box<B>>>,
    /// When the last frame went to hyper while hyper has not asked for another
    /// since: the stream is waiting for window.
    handed_at: Option<Instant>,
}

/// A response body that counts as an open stream, and is dropped (freeing its node)
/// when hyper has not asked for its next frame for `stall` after taking one.
pub(crate) struct Watched<B> {
    shared: Arc<Mutex<Shared<B>>>,
    stall: Duration,
    watching: bool,
    _open: Open,
}

impl<B> Watched<B> {
    fn new(body: B, open: Open, stall: Duration) -> Self {
        let shared = Shared {
            body: Some(Box::pin(body)),
            handed_at: None,
        };
        Self {
            shared: Arc::new(Mutex::new(shared)),
            stall,
            watching: false,
            _open: open,
        }
    }
}

impl<B: Send + 'static> Watched<B> {
    /// The watcher, started at the first frame handed over (most responses end
    /// with it): it wakes at each deadline and lets the body go if hyper still has
    /// not come back for more. It ends with the stream.
    fn watch(&mut self) {
        let (shared, stall) = (Arc::downgrade(&self.shared), self.stall);
        self.watching = true;
        tokio::spawn(async move {
            let mut deadline = Instant::now() + stall;
            loop {
                tokio::time::sleep_until(deadline).await;
                let Some(shared) = Weak::upgrade(&shared) else {
                    return;
                };
                let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
                match shared.handed_at {
                    Some(at) if at + stall <= Instant::now() => {
                        tracing::debug!("an HTTP/2 stream got no window for {stall:?}");
                        shared.body = None;
                        return;
                    }
                    Some(at) => deadline = at + stall,
                    None => deadline = Instant::now() + stall,
                }
            }
        });
    }
}

impl<B> Body for Watched<B>
where
    B: Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = {
            let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            shared.handed_at = None;
            let Some(body) = shared.body.as_mut() else {
                return Poll::Ready(Some(Err(BodyIdle.into())));
            };
            let frame = body.as_mut().poll_frame(cx);
            if matches!(frame, Poll::Ready(Some(Ok(_)))) {
                shared.handed_at = Some(Instant::now());
            }
            frame
        };
        if matches!(frame, Poll::Ready(Some(Ok(_)))) && !self.watching && !self.is_end_stream() {
            self.watch();
        }
        frame.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared
            .body
            .as_ref()
            .is_some_and(|body| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared
            .body
            .as_ref()
            .map_or_else(SizeHint::default, |body| body.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_streams_is_idle_after_the_limit() {
        let streams = Streams::new(Duration::from_secs(60));
        let started = Instant::now();
        let open = streams.opened();
        let idle = tokio::spawn({
            let streams = streams.clone();
            async move { streams.idle(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!idle.is_finished(), "a stream is open");
        drop(open);
        idle.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(40));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_hyper_stops_taking_lets_go_after_the_stall_limit() {
        let streams = Streams::new(Duration::from_secs(60));
        let (mut sender, body) = http_body_util::channel::Channel::<Bytes>::new(1);
        sender.send_data(Bytes::from_static(b"one")).await.unwrap();
        let mut watched = Watched::new(body, streams.opened(), streams.stall);
        assert_eq!(
            watched.frame().await.unwrap().unwrap().into_data().unwrap(),
            "one"
        );
        // hyper waits for window: the body is not polled for 61 s.
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(sender.send_data(Bytes::from_static(b"two")).await.is_err());
        let error = watched.frame().await.unwrap().unwrap_err();
        assert!(error.is::<BodyIdle>());
    }
}
