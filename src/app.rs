//! Builds the services from a config and runs the listeners until shutdown.
//!
//! `serve` takes listeners that are already bound, so tests run the real server on
//! `127.0.0.1:0` and `main` stays a thin shell. Connections are served by hyper
//! directly rather than `axum::serve`, because a public proxy needs what that helper
//! does not give: a deadline for the request head (a slowloris client must not hold a
//! connection forever), `TCP_NODELAY`, and a graceful drain of in-flight requests.
//!
//! The public listener is not an axum `Router`: every path is proxied, so routing
//! would decide nothing, and calling [`Gateway::handle`] straight from the hyper
//! service hands hyper's request body to the upstream client without boxing it
//! (measured: the router, its extension map and the two boxed bodies cost about a
//! tenth of the gateway's CPU per small request). The admin listener, with real
//! routes, is an axum `Router`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::affinity::Clock;
use crate::config::Config;
use crate::gateway::{Gateway, ProxyBody};

/// How often expired sessions are swept out of the table.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long in-flight requests may take to finish once shutdown starts.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// One running gateway: its shared state and the config it was built from.
#[derive(Debug, Clone)]
pub struct App {
    gateway: Arc<Gateway>,
    config: Arc<Config>,
}

impl App {
    /// Builds the gateway with the wall clock.
    pub fn new(config: Config) -> Self {
        Self::with_clock(config, Clock::default())
    }

    /// Builds the gateway with a given clock (tests move it to expire sessions).
    pub fn with_clock(config: Config, clock: Clock) -> Self {
        Self {
            gateway: Arc::new(Gateway::new(&config, clock)),
            config: Arc::new(config),
        }
    }

    /// The shared gateway state.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Serves the public listener (and the admin one, when configured) until
    /// `shutdown` completes, then drains in-flight requests.
    pub async fn serve(
        self,
        public: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let sweeper = tokio::spawn(sweep(self.gateway.clone(), stop_rx.clone()));
        let timeout = self.config.timeouts.request_headers;
        let admin_task = match (admin, &self.config.admin) {
            (Some(listener), Some(settings)) => {
                let router = crate::admin::router(self.gateway.clone(), settings.token.clone());
                let serving =
                    serve_connections(listener, timeout, stopped(stop_rx.clone()), move |peer| {
                        admin_service(router.clone(), peer)
                    });
                Some(tokio::spawn(serving))
            }
            _ => None,
        };
        let gateway = self.gateway.clone();
        let public_task = tokio::spawn(serve_connections(
            public,
            timeout,
            stopped(stop_rx),
            move |peer| public_service(gateway.clone(), peer),
        ));
        shutdown.await;
        let _ = stop_tx.send(true);
        sweeper.abort();
        if let Some(task) = admin_task {
            let _ = task.await;
        }
        let _ = public_task.await;
        Ok(())
    }
}

async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|&stopped| stopped).await;
}

/// The public service of one connection: every request goes to the gateway.
fn public_service(
    gateway: Arc<Gateway>,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<ProxyBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send,
> + Send {
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let gateway = gateway.clone();
        async move { Ok(gateway.handle(request, peer.ip()).await) }
    })
}

/// The admin service of one connection: the router, told who is asking.
fn admin_service(
    router: Router,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<axum::body::Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<axum::body::Body>, Infallible>> + Send,
> + Send {
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let router = router.clone();
        async move { Ok(router.oneshot(request).await.unwrap_or_else(|e| match e {})) }
    })
}

/// Keeps the table in shape in the background: expires idle sessions every
/// [`SWEEP_EVERY`], and sheds the least recently used ones as soon as a bind takes it
/// over `max_sessions`. Both scan the table, so they run on a blocking thread, never
/// on a worker that is serving students; each locks one shard at a time.
async fn sweep(gateway: Arc<Gateway>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.tick().await;
    loop {
        let table = gateway.table().clone();
        tokio::select! {
            _ = every.tick() => {}
            () = table.over_bound() => {}
            _ = stop.changed() => return,
        }
        let pass = tokio::task::spawn_blocking(move || (table.shed(), table.sweep(), table.len()));
        if let Ok((shed, expired, live)) = pass.await {
            if shed + expired > 0 {
                tracing::debug!(shed, expired, live, "swept the affinity table");
            }
        }
    }
}

/// Accepts connections and serves each with the service `service_for(peer)` builds,
/// HTTP/1.1 with keep-alive, until `shutdown`; then waits up to [`DRAIN_DEADLINE`]
/// for open requests to finish.
async fn serve_connections<S, B>(
    listener: TcpListener,
    request_headers: Duration,
    shutdown: impl Future<Output = ()>,
    service_for: impl Fn(SocketAddr) -> S,
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(request_headers)
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors or a connection reset while queued: the
                    // listener itself is fine, so pause briefly and keep accepting.
                    tracing::warn!("accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection = http.serve_connection(TokioIo::new(stream), service_for(peer));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, "connection ended: {error}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_DEADLINE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with requests still in flight");
    }
}
