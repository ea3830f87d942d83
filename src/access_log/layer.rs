//! The access log as a tower layer: the outermost of the students' path, so every
//! request gets its line, the gateway's own refusals included.
//!
//! What the gateway learnt of a request (its node, its session's hash) travels back
//! in the response's extensions as a [`Trail`], put there by the service that knows
//! it; a response without one (a refusal, an error page) is logged with none. The
//! line itself is written when the body is done ([`Logged`]), or with status 499
//! when the request is dropped before its answer ([`Begun`]).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};

use super::{AccessLog, Begun, Logged, Trail};

/// Logs every request that passes through it, from the connection of `client`.
#[derive(Debug, Clone)]
pub struct AccessLogLayer {
    log: AccessLog,
    client: IpAddr,
}

impl AccessLogLayer {
    /// The layer for one connection: `client` is its peer.
    pub fn new(log: AccessLog, client: IpAddr) -> Self {
        Self { log, client }
    }
}

impl<S> tower::Layer<S> for AccessLogLayer {
    type Service = AccessLogged<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AccessLogged {
            inner,
            log: self.log.clone(),
            client: self.client,
        }
    }
}

/// The service [`AccessLogLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct AccessLogged<S> {
    inner: S,
    log: AccessLog,
    client: IpAddr,
}

impl<S, B, R> tower::Service<Request<B>> for AccessLogged<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<Logged<R>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let begun = self.log.begin(&request, self.client);
        ResponseFuture {
            inner: self.inner.call(request),
            begun,
            log: self.log.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, given a body that writes the line when done.
    /// Dropped before the answer, it drops the [`Begun`], which logs a 499.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        begun: Option<Begun>,
        log: AccessLog,
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<Logged<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        let trail = response.extensions_mut().remove::<Trail>();
        let (begun, trail) = (this.begun.take(), trail.unwrap_or_default());
        Poll::Ready(Ok(this.log.finish(begun, trail, response)))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::access_log::tests::file_log;

    #[tokio::test]
    async fn the_trail_in_the_response_reaches_the_line_and_leaves_the_response() {
        let (log, path) = file_log("layer-trail");
        let inner = tower::service_fn(|_request: Request<()>| async {
            let mut response = Response::new(());
            response.extensions_mut().insert(Trail {
                upstream: Some("web2".into()),
                ..Trail::default()
            });
            Ok::<_, Infallible>(response)
        });
        let service = AccessLogLayer::new(log.clone(), "192.0.2.9".parse().unwrap()).layer(inner);
        let request = Request::get("/course/view.php?id=2").body(()).unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert!(response.extensions().get::<Trail>().is_none());
        drop(response);
        let other = Request::get("/login/index.php").body(()).unwrap();
        let bare = tower::service_fn(|_request: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        });
        let service = AccessLogLayer::new(log.clone(), "192.0.2.9".parse().unwrap()).layer(bare);
        drop(service.oneshot(other).await.unwrap());
        log.flush(Duration::from_secs(5));
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("upstream=web2 "), "{}", lines[0]);
        assert!(lines[1].contains("upstream=- "), "{}", lines[1]);
    }
}
