//! The compression layer of the students' path: an answer the node left
//! uncompressed goes out in gzip or brotli when the client accepts it and the rules
//! in force allow it ([`crate::http::body::compress::rules`]); every other answer
//! goes out untouched, at the cost of a read of the request's `Accept-Encoding`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::gateway::{Gateway, SettingsCache};
use crate::http::body::compress::rules::compressed_headers;
use crate::http::body::compress::{Coding, Compressed, Rules};

/// Compresses answers under the `[compression]` settings in force.
#[derive(Debug, Clone)]
pub struct CompressLayer {
    gateway: Arc<Gateway>,
}

impl CompressLayer {
    /// Under the settings of `gateway` (a reload applies to the next request).
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self { gateway }
    }
}

impl<S> Layer<S> for CompressLayer {
    type Service = Compress<S>;

    fn layer(&self, inner: S) -> Compress<S> {
        Compress {
            inner,
            settings: self.gateway.settings_cache(),
        }
    }
}

/// The service [`CompressLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct Compress<S> {
    inner: S,
    settings: SettingsCache,
}

impl<S, R, B> Service<Request<R>> for Compress<S>
where
    S: Service<Request<R>, Response = Response<B>>,
{
    type Response = Response<Compressed<B>>;
    type Error = S::Error;
    type Future = Compressing<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        // The request decides first: most answers need nothing more than this read.
        let wanted = Rules::asked(request.method(), request.headers()).and_then(|coding| {
            let rules = self.settings.load().compression.clone()?;
            Some((coding, rules))
        });
        Compressing {
            inner: self.inner.call(request),
            wanted,
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, compressed if it may be.
    pub struct Compressing<F> {
        #[pin]
        inner: F,
        wanted: Option<(Coding, Arc<Rules>)>,
    }
}

impl<F, B, E> Future for Compressing<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Compressed<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = std::task::ready!(this.inner.poll(cx))?;
        let compress = this
            .wanted
            .take()
            .filter(|(_, rules)| rules.applies(response.status(), response.headers()));
        let Some((coding, rules)) = compress else {
            return Poll::Ready(Ok(response.map(Compressed::plain)));
        };
        compressed_headers(response.headers_mut(), coding);
        Poll::Ready(Ok(
            response.map(|body| Compressed::new(body, coding, rules.level))
        ))
    }
}
