//! Stand-ins for the Moodle cluster: PHP nodes with node-local (file) sessions and a
//! data server, each a small HTTP/1.1 server on `127.0.0.1:0`.
//!
//! Why: the gateway exists because one misrouted request logs a student out of every
//! node (MOODLE.md). A real Moodle is too heavy for tests and the demo, so these
//! stand-ins copy exactly the session behaviour that matters: a session lives on the
//! node that issued it; login and logout rotate the id; a request reaching the wrong
//! node *loses* the session (its row is deleted, as Moodle does) and is counted in the
//! cluster's [`Registry`]. Every response carries `X-Upstream: <name>`.
//!
//! # Test directives
//! Request headers that script one response (fixture tests), bypassing all session
//! logic; the request is still recorded in [`StandIn::requests`]:
//! - `x-standin-status: N`: answer status `N` (200..=599) instead of 200.
//! - `x-standin-set-cookie: <raw line>` (may repeat): each value becomes its own
//!   `Set-Cookie` line, byte-identical and in order (the stand-in sets no cookie of
//!   its own on a scripted response).
//! - `x-standin-header: Name: value` (may repeat): adds a response header, e.g.
//!   `Connection: x-foo` plus `X-Foo: 1` to test hop-by-hop stripping.
//! - `x-standin-delay-ms: N`: sleep `N` ms before sending the response head.
//!
//! A malformed directive is answered `500` with the reason in the body.

mod cluster;
mod data;
mod directives;
mod node;
mod registry;
#[cfg(test)]
mod tests;

pub use cluster::Cluster;
pub use registry::Registry;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use directives::scripted;

/// Which Moodle server a stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A PHP node with node-local sessions.
    Node,
    /// The data server: answers SCORM files without checking sessions. The real one
    /// runs `scorm_pluginfile()` after `require_login()`, so it needs a shared session
    /// store; the stand-in skips that check to keep the cluster's sessions node-local.
    Data,
}

/// How one stand-in behaves.
#[derive(Debug, Clone)]
pub struct StandInConfig {
    /// Sent back in `X-Upstream` and recorded as the owner of sessions it issues.
    pub name: String,
    /// The wwwroot sub-path: `""` or like `"/moodle"`.
    pub site_path: String,
    /// The session cookie name: `MoodleSession` plus any `$CFG->sessioncookie` suffix.
    pub cookie: String,
    /// Node or data server.
    pub role: Role,
}

/// One request as the stand-in received it, for assertions on what the gateway sent.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The method.
    pub method: Method,
    /// The request target as received (origin form: path and query).
    pub uri: Uri,
    /// The headers as received, including any directives.
    pub headers: HeaderMap,
    /// The body length in bytes.
    pub body_len: usize,
}

/// What every connection of one stand-in shares.
struct Inner {
    config: StandInConfig,
    upstream: HeaderValue,
    registry: Registry,
    seen: Mutex<Vec<SeenRequest>>,
}

/// One running stand-in. Dropping it (or calling [`StandIn::stop`]) stops accepting
/// and cuts every open connection at once, like a node that died.
pub struct StandIn {
    inner: Arc<Inner>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl StandIn {
    /// Binds `127.0.0.1:0` and serves in the background. Call inside a Tokio runtime.
    pub fn spawn(config: StandInConfig, registry: Registry) -> io::Result<StandIn> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let upstream = HeaderValue::from_str(&config.name).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "name is not a header value")
        })?;
        let seen = Mutex::new(Vec::new());
        let inner = Arc::new(Inner {
            config,
            upstream,
            registry,
            seen,
        });
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept(listener, inner.clone(), stopped));
        Ok(StandIn { inner, addr, stop })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name, as sent in `X-Upstream`.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen().clone()
    }

    /// The most recent request.
    pub fn last_request(&self) -> Option<SeenRequest> {
        self.seen().last().cloned()
    }

    /// How many requests arrived.
    pub fn request_count(&self) -> usize {
        self.seen().len()
    }

    /// Forgets the recorded requests (sessions are kept).
    pub fn clear_requests(&self) {
        self.seen().clear();
    }

    /// Live sessions this node holds.
    pub fn sessions(&self) -> usize {
        self.inner.registry.count(&self.inner.config.name)
    }

    /// Stops serving now, as if the node died; the port stays closed.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    fn seen(&self) -> MutexGuard<'_, Vec<SeenRequest>> {
        self.inner.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Resolves when the stand-in is stopped or dropped (the sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&stopped| stopped).await;
}

async fn accept(listener: TcpListener, inner: Arc<Inner>, stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stopped(stop.clone()) => return,
        };
        let _ = stream.set_nodelay(true);
        let (inner, stop) = (inner.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(inner.clone(), r));
            let http = hyper::server::conn::http1::Builder::new();
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stopped(stop) => {}
            }
        });
    }
}

async fn handle(
    inner: Arc<Inner>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    inner
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(SeenRequest {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body_len: body.len(),
        });
    let mut response = match scripted(&parts.headers) {
        Some(Ok(script)) => script.respond().await,
        Some(Err(reason)) => reply(StatusCode::INTERNAL_SERVER_ERROR, reason),
        None if inner.config.role == Role::Data => inner.file(&parts.uri),
        None => inner.node(&parts, &body),
    };
    response
        .headers_mut()
        .insert("x-upstream", inner.upstream.clone());
    Ok(response)
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let html = HeaderValue::from_static("text/html; charset=utf-8");
    response.headers_mut().insert(CONTENT_TYPE, html);
    response
}
