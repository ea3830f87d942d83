//! Stand-ins for the Moodle cluster: PHP nodes with node-local (file) sessions and a
//! data server, each a small HTTP/1.1 server on `127.0.0.1:0`.
//!
//! Why: the gateway exists because one misrouted request logs a student out of every
//! node (the book's "Moodle behind a proxy", docs/src/moodle.md). A real Moodle is too heavy for tests and the demo, so these
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
//!
//! # Operations
//! For tests of health checks and failover, a stand-in can be switched at run time:
//! [`StandIn::stop`] and [`StandIn::restart`] (the node dies and comes back on the
//! same address, its sessions intact), [`StandIn::set_maintenance`] (Moodle's
//! climaintenance page), [`StandIn::set_hang`] (requests read, never answered) and
//! [`StandIn::set_workers`] (a few PHP workers, slow pages, a blind backlog).
//! Every request is still recorded in [`StandIn::requests`]; a hang comes first, then
//! maintenance, then the directives and session logic above.

mod assets;
mod cluster;
mod data;
mod directives;
mod files;
mod node;
mod outages;
mod pages;
mod registry;
mod serving;
#[cfg(test)]
mod tests;
mod workers;

pub use assets::REVISION;
pub use cluster::Cluster;
pub use files::{ALIAS, BIG_FILE, SCORM_LAUNCH};
pub use registry::Registry;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::watch;

use directives::scripted;

/// The `User-Agent` of the gateway's health probes (see `crate::cluster::health`).
const HEALTH_PROBE: &str = "moodle-gateway-health";
use serving::Serving;

/// Which Moodle server a stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A PHP node with node-local sessions.
    Node,
    /// The data server: answers SCORM files without checking sessions. The real one
    /// runs `scorm_pluginfile()` after `require_login()`, so it needs a shared session
    /// store; the stand-in skips that check to keep the cluster's sessions node-local.
    /// Everything else it answers as the Moodle it also runs.
    Data,
    /// The data server's file export (`[offload] url`): a plain web server for the
    /// file pool, no PHP, no sessions.
    Export,
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
    /// Node, data server or export.
    pub role: Role,
    /// `$CFG->xsendfile = 'X-Accel-Redirect'` with the alias [`ALIAS`]: a logged-in
    /// student's `pluginfile.php` is answered with the file's headers and its place
    /// in the pool, for the gateway to fetch from the export (`[offload]`).
    pub xsendfile: bool,
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
    probes: AtomicU64,
    /// Site maintenance is on: answer everything with the maintenance page.
    maintenance: AtomicBool,
    /// The node hangs; a watch so hung requests can wait for it to end.
    hang: watch::Sender<bool>,
    /// Its PHP workers, when limited.
    workers: workers::Workers,
}

/// One stand-in. Dropping it (or calling [`StandIn::stop`]) closes its port and cuts
/// every open connection at once, like a node that died.
pub struct StandIn {
    inner: Arc<Inner>,
    addr: SocketAddr,
    /// The current run, `None` while stopped. A mutex so tests can stop and restart a
    /// node they only borrow from a [`Cluster`]; never held across an `.await`.
    serving: Mutex<Option<Serving>>,
}

impl StandIn {
    /// Binds `127.0.0.1:0` and serves in the background. Call inside a Tokio runtime.
    pub fn spawn(config: StandInConfig, registry: Registry) -> io::Result<StandIn> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
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
            probes: AtomicU64::new(0),
            maintenance: AtomicBool::new(false),
            hang: watch::Sender::new(false),
            workers: workers::Workers::default(),
        });
        let serving = Mutex::new(Some(Serving::start(listener, inner.clone())?));
        Ok(StandIn {
            inner,
            addr,
            serving,
        })
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

    /// How many gateway health probes arrived. Probes are counted here and not in
    /// [`requests`](Self::requests), so tests about routing never see them.
    pub fn probes(&self) -> u64 {
        self.inner.probes.load(Ordering::Relaxed)
    }

    /// Forgets the recorded requests (sessions are kept).
    pub fn clear_requests(&self) {
        self.seen().clear();
    }

    /// Live sessions this node holds.
    pub fn sessions(&self) -> usize {
        self.inner.registry.count(&self.inner.config.name)
    }

    /// Stops serving now, as if the node died: the port is closed when this returns
    /// (connecting is refused) and open connections are cut as soon as their tasks run,
    /// so a client's pooled keep-alive connection is dead even after a quick restart.
    /// It stays closed until [`StandIn::restart`]. Stopping a stopped stand-in does
    /// nothing.
    pub fn stop(&self) {
        drop(self.serving_now().take());
    }

    /// Serves again on the same address after [`StandIn::stop`], like a node whose web
    /// server comes back: a gateway's config still points at it. Its sessions survive
    /// (they live in the cluster's [`Registry`], as session files on a node's disk
    /// survive a web server restart) and so do the recorded requests and the
    /// maintenance and hang switches. Restarting a running stand-in does nothing, so
    /// tests may call it unconditionally. Call inside a Tokio runtime.
    ///
    /// Fails if the address cannot be bound again: while stopped the port is free, so
    /// the OS may hand it to another socket; `AddrInUse` is retried for about 200 ms,
    /// blocking the calling thread, then returned.
    pub fn restart(&self) -> io::Result<()> {
        let mut serving = self.serving_now();
        if serving.is_none() {
            let listener = serving::rebind(self.addr)?;
            *serving = Some(Serving::start(listener, self.inner.clone())?);
        }
        Ok(())
    }

    /// Whether it is serving (not stopped).
    pub fn is_running(&self) -> bool {
        self.serving_now().is_some()
    }

    /// Switches Moodle's site maintenance (`climaintenance.html`) on or off for this
    /// stand-in: while on, every request is recorded and then answered
    /// `503 Moodle under maintenance` with `Retry-After: 300`, before any directive or
    /// session logic, so a test can check that the gateway passes it on rather than
    /// marking the node dead. Maintenance is site-wide in Moodle: see
    /// [`Cluster::set_maintenance`] to switch every stand-in at once.
    pub fn set_maintenance(&self, on: bool) {
        self.inner.maintenance.store(on, Ordering::SeqCst);
    }

    /// Makes the node hang (or stop hanging), to test the gateway's timeouts on probes
    /// and requests: while on, connections are accepted and requests read and recorded,
    /// but never answered. Turning it off answers new requests normally and releases
    /// the hung ones, which are then answered as if they had just arrived (unless their
    /// client gave up). [`StandIn::stop`] cuts hung requests like any other.
    pub fn set_hang(&self, on: bool) {
        self.inner.hang.send_replace(on);
    }

    /// Gives the node `count` PHP workers, each page taking `page` (`None`: no
    /// limit and no delay, the default): more requests than workers wait in the
    /// node's own backlog, first come first served, like PHP-FPM's listen queue.
    pub fn set_workers(&self, workers: Option<(usize, std::time::Duration)>) {
        self.inner.workers.set(workers);
    }

    /// The most requests (health probes aside) its workers were ever on at once.
    pub fn busiest(&self) -> usize {
        self.inner.workers.busiest()
    }

    fn seen(&self) -> MutexGuard<'_, Vec<SeenRequest>> {
        self.inner.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serving_now(&self) -> MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(|p| p.into_inner())
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
    let probe = parts
        .headers
        .get(USER_AGENT)
        .is_some_and(|ua| ua == HEALTH_PROBE);
    if probe {
        inner.probes.fetch_add(1, Ordering::Relaxed);
    } else {
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
    }
    inner.unless_hung().await;
    let _worker = inner.workers.work(probe).await;
    let mut response = match scripted(&parts.headers) {
        _ if inner.maintenance.load(Ordering::SeqCst) => outages::maintenance_page(),
        Some(Ok(script)) => script.respond().await,
        Some(Err(reason)) => reply(StatusCode::INTERNAL_SERVER_ERROR, reason),
        None => match inner.config.role {
            Role::Data => inner.file(&parts, &body),
            Role::Export => files::exported(parts.uri.path(), &inner.config.site_path),
            Role::Node => inner.node(&parts, &body),
        },
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
