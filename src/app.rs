//! Builds the services from a config and runs the listeners until shutdown.
//!
//! `serve` takes listeners that are already bound, so tests run the real server on
//! `127.0.0.1:0` and `main` stays a thin shell. Each listener's accept loop is in
//! [`crate::http::accept::listener`]; this file wires the gateway, the admin API, the background
//! tasks (sweeper, health checks of the nodes and the file export, snapshots) and
//! reloads together.
//!
//! The public listener is not an axum `Router`: every path is proxied, so routing
//! would decide nothing, and the students' path ([`gateway::stack::students`], a
//! tower stack) hands hyper's request body to the upstream client without boxing it
//! (measured: the router, its extension map and the two boxed bodies cost about a
//! tenth of the gateway's CPU per small request). The admin listener, with real
//! routes, is an axum `Router`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::http::h1::server::StudentBody;
use axum::extract::ConnectInfo;
use axum::Router;
use http::{Request, Response};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::access_log::AccessLog;
use crate::config::{Config, StoreConfig};
use crate::gateway::{self, Gateway};
use crate::http::accept::listener::{serve_connections, Listening};
use crate::http::accept::tickets::SharedTickets;
use crate::http::upstream::proxy::{Client, Withheld};
use crate::sessions::clock::Clock;
use crate::sessions::state;

/// How often expired sessions are swept out of the table.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One running gateway: its shared state, the config it runs, and the file that
/// config came from (for reloads). Cheap to clone.
#[derive(Debug, Clone)]
pub struct App {
    gateway: Arc<Gateway>,
    config: Arc<Mutex<Config>>,
    /// The config the process started with: what restart-only settings still are,
    /// however many reloads came since.
    started: Arc<Config>,
    source: Option<Arc<PathBuf>>,
    /// The state file, unless there is none or it is not ours to overwrite.
    save_to: Option<Arc<PathBuf>>,
    /// TLS on the public listener, when configured.
    tls: Option<PublicTls>,
    /// The access log, once `serve_all` opened it (`SIGHUP` reopens its file).
    access_log: Arc<OnceLock<AccessLog>>,
    /// Set when a successor process took over: the state file is its to write from
    /// then on, so this process never saves again.
    handed_over: Arc<tokio::sync::watch::Sender<bool>>,
}

/// The public listener's TLS: the acceptor, and the certificates it serves (re-read
/// on reload; handshakes after that use the new ones).
#[derive(Clone)]
struct PublicTls {
    acceptor: TlsAcceptor,
    certs: Arc<crate::http::accept::tls::Certificates>,
    /// With a shared store: the ticket keys every gateway of the site seals with.
    tickets: Option<Arc<SharedTickets>>,
    /// With `[acme]`: the client that renews `certs` and answers the CA's challenges.
    acme: Option<Arc<crate::acme::Acme>>,
}

/// Every listener the gateway serves.
#[derive(Debug)]
pub struct Listeners {
    /// Students (TLS when the app has certificates).
    pub public: TcpListener,
    /// The admin API, when configured.
    pub admin: Option<TcpListener>,
    /// Plain HTTP that redirects to HTTPS (`tls.redirect_listen`).
    pub redirect: Option<TcpListener>,
}

impl std::fmt::Debug for PublicTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublicTls")
    }
}

impl App {
    /// Builds the gateway with the wall clock, restoring the table from the state
    /// file when there is one.
    pub fn new(config: Config) -> Self {
        Self::with_clock(config, Clock::default())
    }

    /// Builds the gateway with a given clock (tests move it to expire sessions).
    pub fn with_clock(config: Config, clock: Clock) -> Self {
        let file = config.state.file.as_deref();
        let shared_secret = match &config.store {
            StoreConfig::Redis(redis) => Some(crate::store::table_secret(redis)),
            StoreConfig::Memory => None,
        };
        let opened = state::open(file, gateway::limits(&config), clock, shared_secret);
        let mut gateway = Gateway::with_table(&config, opened.table);
        if let Some(snapshot) = opened.snapshot {
            let upstreams = &gateway.settings().upstreams;
            // With a shared store the node states live in Redis, which has the
            // other gateways' newer word: only a gateway on its own takes its back.
            if matches!(config.store, StoreConfig::Memory) {
                take_back_node_states(upstreams, &snapshot.nodes);
            }
            let into = opened.legacy.as_ref().unwrap_or(gateway.table());
            state::restore(into, snapshot, |name| upstreams.by_name(name).map(|n| n.id));
        }
        if let Some(legacy) = opened.legacy {
            gateway.keep_legacy(legacy);
        }
        Self {
            gateway: Arc::new(gateway),
            started: Arc::new(config.clone()),
            config: Arc::new(Mutex::new(config)),
            source: None,
            save_to: opened.save_to.map(Arc::new),
            tls: None,
            access_log: Arc::default(),
            handed_over: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Names the file the config came from, so `SIGHUP` and `POST /reload` can
    /// re-read it.
    pub fn reloading_from(mut self, path: &Path) -> Self {
        self.source = Some(Arc::new(path.to_owned()));
        self
    }

    /// The shared gateway state.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    fn config(&self) -> MutexGuard<'_, Config> {
        self.config.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-reads the config file and applies what can change while running: the
    /// nodes (added, removed, re-weighted, their state), the data server, health
    /// checks, failover and forwarding settings, the shutdown grace. Returns notes
    /// for settings that only a restart applies, or every problem in the file, in
    /// which case the running config stays as it was.
    pub fn reload(&self) -> Result<Vec<String>, Vec<String>> {
        let Some(path) = &self.source else {
            return Err(vec!["the gateway was not started from a config file".into()]);
        };
        let next = Config::load(path).map_err(|errors| {
            let lines = errors.to_string();
            lines.lines().map(str::to_owned).collect::<Vec<_>>()
        })?;
        // One reload at a time (SIGHUP and POST /reload may meet): the stored config
        // must be the one whose settings are applied.
        let mut config = self.config();
        self.gateway.apply(&next).map_err(|e| vec![e])?;
        // More nodes (or connections) need more descriptors: raised now, not at the
        // next restart, so the new nodes' connections do not meet EMFILE.
        if crate::open_files::needed(&next) > crate::open_files::needed(&config) {
            crate::open_files::raise_and_log(&next);
        }
        // Against the start, not the last reload: a second reload of a file that
        // changed `listen` must still say the change is waiting for a restart.
        let mut notes = restart_needed(&self.started, &next);
        // A spool turned on by this reload gets the check the start gives it: a
        // directory it cannot use is said now, once, not per upload.
        if next.limits.spool_body_bytes > 0 && config.limits.spool_body_bytes == 0 {
            if let Err(reason) = self.gateway.spool().prepare() {
                notes.push(format!(
                    "limits.spool_dir: {reason}; uploads stream to their nodes"
                ));
            }
        }
        if let (Some(acme), Some(next)) =
            (self.tls.as_ref().and_then(|t| t.acme.as_ref()), &next.acme)
        {
            acme.set_renew_before(next.renew_before);
        }
        if let Some(tls) = &self.tls {
            // A renewed certificate, same paths: new handshakes get it at once.
            if let Err(error) = tls.certs.reload() {
                tracing::error!("TLS certificate not reloaded, the old one stays: {error}");
                notes.push(format!("TLS certificate not reloaded: {error}"));
            }
        }
        let nodes: Vec<&str> = next.nodes.iter().map(|n| n.name.as_str()).collect();
        let nodes = nodes.join(", ");
        tracing::info!(%nodes, "config reloaded from {}", path.display());
        for note in &notes {
            tracing::warn!("{note}");
        }
        *config = next;
        Ok(notes)
    }

    /// Opens the access log the config names (once: later calls share it), so that
    /// a file the service may not write stops the start before it reports ready.
    pub fn open_access_log(&self) -> std::io::Result<AccessLog> {
        if let Some(log) = self.access_log.get() {
            return Ok(log.clone());
        }
        let config = self.config().access_log.clone();
        let log = AccessLog::open(&config).map_err(|error| {
            let to = match &config.to {
                crate::config::AccessLogTo::File(path) => path.display().to_string(),
                other => format!("{other:?}"),
            };
            std::io::Error::new(
                error.kind(),
                format!("cannot open access_log.to {to}: {error}"),
            )
        })?;
        Ok(self.access_log.get_or_init(|| log).clone())
    }

    /// Creates the upload spool's directory and proves it writable, so that a
    /// directory the service may not use stops the start before it reports ready
    /// (rather than every upload streaming at a deadline). A spool turned off
    /// (`spool_body_bytes = 0`) is not touched.
    pub fn open_spool(&self) -> std::io::Result<()> {
        if self.config().limits.spool_body_bytes == 0 {
            return Ok(());
        }
        self.gateway
            .spool()
            .prepare()
            .map_err(|reason| std::io::Error::other(format!("limits.spool_dir: {reason}")))
    }

    /// Saves the state file for a successor process that takes over now
    /// ([`crate::handover`]), and never again from this process: the successor
    /// loads it before it accepts, and saves it itself from then on. `false` when
    /// there is no state file to write.
    pub async fn save_for_successor(&self) -> bool {
        self.handed_over.send_replace(true);
        let Some(file) = self.save_to.as_deref().cloned() else {
            return false;
        };
        save_in_background(self.gateway.clone(), file).await
    }

    /// The successor [`save_for_successor`](Self::save_for_successor) saved for
    /// never started: this process saves again when it stops.
    pub fn cancel_handover(&self) {
        self.handed_over.send_replace(false);
    }

    /// Reloads and logs the outcome (for `SIGHUP`, which has nobody to answer), and
    /// reopens the access log file (logrotate sends `SIGHUP` after moving it).
    pub fn reload_and_log(&self) {
        if let Some(log) = self.access_log.get() {
            log.reopen();
        }
        if let Err(errors) = self.reload() {
            tracing::error!("config not reloaded, the running one is kept:");
            for error in errors {
                tracing::error!("{error}");
            }
        }
    }

    /// Serves the public listener (and the admin one, when configured) until
    /// `shutdown` completes; then stops accepting, lets in-flight requests finish
    /// for up to `timeouts.shutdown`, and writes the state file.
    pub async fn serve(
        self,
        public: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let listeners = Listeners {
            public,
            admin,
            redirect: None,
        };
        self.serve_all(listeners, shutdown).await
    }

    /// Serves the public listener over TLS with the certificates `certs` (HTTP/2
    /// and HTTP/1.1 by ALPN); a reload re-reads them.
    pub fn with_tls(mut self, certs: Arc<crate::http::accept::tls::Certificates>) -> Self {
        let mut config = crate::http::accept::tls::server_config(certs.clone(), true);
        // With a shared store, a student moved to another gateway resumes there.
        let tickets = match self.gateway.store().is_shared() {
            true => SharedTickets::new()
                .inspect_err(|error| tracing::warn!("no shared TLS tickets: {error}"))
                .ok(),
            false => None,
        };
        if let Some(tickets) = &tickets {
            let mut shared = (*config).clone();
            shared.ticketer = tickets.clone();
            config = Arc::new(shared);
        }
        let (acme, store) = {
            let config = self.config();
            (config.acme.clone(), config.store.clone())
        };
        let acme = acme.map(|acme| {
            let meters = self.gateway.metrics().acme().clone();
            // With a shared store the site orders one certificate and every
            // gateway serves it.
            let sharing = match &store {
                StoreConfig::Redis(redis) => Some(crate::acme::Sharing::new(
                    self.gateway.store().clone(),
                    crate::store::acme_secret(redis),
                )),
                StoreConfig::Memory => None,
            };
            crate::acme::Acme::new(acme, certs.clone(), meters, sharing)
        });
        self.tls = Some(PublicTls {
            acceptor: crate::http::accept::tls::acceptor(config),
            certs,
            tickets,
            acme,
        });
        self
    }

    /// Like [`serve`](Self::serve), with every listener: the plain-HTTP `redirect`
    /// one answers every request with a redirect to the HTTPS public listener.
    pub async fn serve_all(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let Listeners {
            public,
            admin,
            redirect,
        } = listeners;
        let access_log = self.open_access_log()?;
        self.open_spool()?;
        let access_log_for_flush = access_log.clone();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // Only the public listener's turn-aways and handshakes are the students'.
        let (listening, public_listening, save_every) = {
            let config = self.config();
            let (turned_away, tls_failed) = self.gateway.metrics().listener_counters();
            let listening = Listening::plain(&config.limits, &config.timeouts);
            let public = listening.clone().counting(turned_away, tls_failed);
            (listening, public, config.state.save_every)
        };
        let save_to = self.save_to.as_deref().cloned();
        let mut background = tokio::task::JoinSet::new();
        background.spawn(sweep(self.gateway.clone(), stop_rx.clone()));
        let local: Arc<dyn crate::store::Local> = self.gateway.clone();
        let store = self.gateway.store().clone();
        background.spawn(store.run(local, stop_rx.clone()));
        let probed = self.gateway.clone();
        background.spawn(crate::cluster::health::run(
            move || probe_targets(&probed),
            stop_rx.clone(),
        ));
        let watched = self.gateway.clone();
        background.spawn(crate::cluster::export::run(
            move || {
                let settings = watched.settings();
                (settings.health.clone(), settings.export.clone())
            },
            stop_rx.clone(),
        ));
        let tickets = self.tls.as_ref().and_then(|tls| tls.tickets.clone());
        if let (Some(tickets), StoreConfig::Redis(redis)) = (tickets, &self.config().store) {
            let secret = crate::store::ticket_secret(redis);
            let store = self.gateway.store().clone();
            background.spawn(share_ticket_keys(store, tickets, secret, stop_rx.clone()));
        }
        let acme = self.tls.as_ref().and_then(|tls| tls.acme.clone());
        if let Some(acme) = &acme {
            background.spawn(acme.clone().run(stop_rx.clone()));
        }
        if let Some(file) = save_to.clone() {
            let mut handed_over = self.handed_over.subscribe();
            let saving = save_periodically(self.gateway.clone(), file, save_every, stop_rx.clone());
            // Ends when the process hands over: the successor saves from then on.
            let saving = async move {
                tokio::select! {
                    () = saving => {}
                    _ = handed_over.wait_for(|handed| *handed) => {}
                }
            };
            background.spawn(saving);
        }
        let (drained_tx, drained_rx) = tokio::sync::watch::channel(Duration::ZERO);
        let drain = move || {
            let mut grace = drained_rx.clone();
            async move {
                let _ = grace.changed().await;
                let deadline = *grace.borrow();
                deadline
            }
        };
        let admin_task = match (admin, self.config().admin.clone()) {
            (Some(listener), Some(settings)) => {
                let app = self.clone();
                let reload: crate::admin::Reload = Arc::new(move || app.reload());
                // The dashboard's last hour, filled from the counters whether or not
                // anyone looks, so the morning's surge is there at noon.
                let history = crate::admin::History::from_env();
                let recording = crate::admin::record_history(
                    self.gateway.clone(),
                    history.clone(),
                    stop_rx.clone(),
                );
                background.spawn(recording);
                let router =
                    crate::admin::router(self.gateway.clone(), settings.token, reload, history);
                let serving =
                    serve_connections(listener, listening.clone(), drain(), move |peer, _| {
                        admin_service(router.clone(), peer)
                    });
                Some(tokio::spawn(serving))
            }
            _ => None,
        };
        let redirect_task = redirect.map(|listener| {
            let https_port = public.local_addr().map_or(443, |a| a.port());
            let serving = serve_connections(listener, listening.clone(), drain(), move |_, _| {
                let acme = acme.clone();
                tower::service_fn(move |request: Request<StudentBody>| {
                    let acme = acme.clone();
                    async move {
                        // The CA's HTTP-01 fetch is the one request not redirected.
                        let challenge = match &acme {
                            Some(acme) => acme.http01_answer(request.uri().path()).await,
                            None => None,
                        };
                        let answer = challenge.unwrap_or_else(|| {
                            crate::http::accept::tls::redirect_to_https(&request, https_port)
                        });
                        Ok::<_, Infallible>(answer)
                    }
                })
            });
            tokio::spawn(serving)
        });
        let gateway = self.gateway.clone();
        // The dashboard's login cookie: browsers also send it to the site when both
        // share a host name.
        let withheld = Arc::new(Withheld::new(crate::admin::LOGIN_COOKIE));
        let public_task = tokio::spawn(serve_connections(
            public,
            public_listening.with_tls(self.tls.as_ref().map(|t| t.acceptor.clone())),
            drain(),
            move |peer, tls| {
                let (gateway, log, withheld) =
                    (gateway.clone(), access_log.clone(), withheld.clone());
                let client = Client::new(peer.ip(), tls);
                gateway::stack::students(gateway, log, withheld, client)
            },
        ));
        shutdown.await;
        let grace = self.config().timeouts.shutdown;
        let waits = humantime::format_duration(grace);
        tracing::info!("shutting down: finishing in-flight requests for up to {waits}");
        let _ = drained_tx.send(grace);
        for task in admin_task.into_iter().chain(redirect_task) {
            let _ = task.await;
        }
        let _ = public_task.await;
        let log = access_log_for_flush;
        let _ = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(2))).await;
        let _ = stop_tx.send(true);
        // Each task ends at the stop signal; the store's last writes (its final
        // changes, taking its heartbeat off the roll) get a moment to land.
        let ended = async { while background.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(2), ended).await;
        background.shutdown().await;
        let handed_over = *self.handed_over.borrow();
        if let (Some(file), false) = (save_to, handed_over) {
            save_in_background(self.gateway.clone(), file).await;
        }
        Ok(())
    }
}

/// The settings a running gateway cannot change, each named with why a restart is
/// needed when `next` changes it.
fn restart_needed(running: &Config, next: &Config) -> Vec<String> {
    let (r, n) = (running, next);
    let admin = |c: &Config| c.admin.as_ref().map(|a| (a.listen, a.token.clone()));
    let route = |c: &Config| {
        c.route_cookie
            .as_ref()
            .map(|r| (r.name.clone(), r.secret.clone()))
    };
    let tls = |c: &Config| {
        let t = c.tls.as_ref();
        t.map(|t| (t.cert.clone(), t.key.clone(), t.redirect_listen))
    };
    // The accept loop's limits; body, URI and in-flight limits apply at once.
    let accept_limits = |c: &Config| {
        let l = &c.limits;
        (l.max_connections, l.max_headers, l.http2_max_streams)
    };
    let changed = [
        ("listen", r.listen != n.listen),
        ("[admin]", admin(r) != admin(n)),
        ("site.path", r.site.path != n.site.path),
        ("session.cookie", r.session.cookie != n.session.cookie),
        (
            "session.cookie_path",
            r.session.cookie_path != n.session.cookie_path,
        ),
        (
            "session.max_sessions",
            r.session.max_sessions != n.session.max_sessions,
        ),
        (
            "session.logged_in_idle",
            r.session.logged_in_idle != n.session.logged_in_idle,
        ),
        (
            "session.anonymous_idle",
            r.session.anonymous_idle != n.session.anonymous_idle,
        ),
        ("[access_log]", r.access_log != n.access_log),
        ("timeouts.connect", r.timeouts.connect != n.timeouts.connect),
        (
            "timeouts.upstream_idle",
            r.timeouts.upstream_idle != n.timeouts.upstream_idle,
        ),
        (
            "timeouts.request_headers",
            r.timeouts.request_headers != n.timeouts.request_headers,
        ),
        (
            "timeouts.keep_alive",
            r.timeouts.keep_alive != n.timeouts.keep_alive,
        ),
        (
            "[state]",
            r.state.file != n.state.file || r.state.save_every != n.state.save_every,
        ),
        ("[route_cookie]", route(r) != route(n)),
        ("[store]", r.store != n.store),
        ("[tls]", tls(r) != tls(n)),
        (
            "cache.max_bytes or max_entry_bytes",
            (r.cache.max_bytes, r.cache.max_entry_bytes)
                != (n.cache.max_bytes, n.cache.max_entry_bytes),
        ),
        (
            "limits.spool_dir or spool_max_bytes",
            (&r.limits.spool_dir, r.limits.spool_max_bytes)
                != (&n.limits.spool_dir, n.limits.spool_max_bytes),
        ),
        (
            "limits.max_connections, max_headers or http2_max_streams",
            accept_limits(r) != accept_limits(n),
        ),
    ];
    changed
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(key, _)| format!("{key} changed: it takes effect after a restart"))
        .collect()
}

/// Keeps `tickets` sealing with the site's shared keys, kept in the store sealed
/// under `secret`.
async fn share_ticket_keys(
    store: crate::store::Store,
    tickets: Arc<SharedTickets>,
    secret: [u8; 32],
    stop: tokio::sync::watch::Receiver<bool>,
) {
    use crate::http::accept::tickets::{fresh_key, period_at, unwrap, wrap};
    let period = || period_at(std::time::SystemTime::now());
    let fresh = || wrap(&secret, &fresh_key()?);
    let install = |found: Vec<(u64, Vec<u8>)>| {
        let keys: Vec<_> = found
            .into_iter()
            .filter_map(|(period, wrapped)| Some((period, unwrap(&secret, &wrapped)?)))
            .collect();
        tickets.install(&keys);
    };
    store.keep_ticket_keys(period, fresh, install, stop).await;
}

/// What the health checker probes this round: every node and the data server of the
/// current settings.
fn probe_targets(
    gateway: &Gateway,
) -> (
    crate::config::HealthConfig,
    Vec<crate::cluster::health::Target>,
) {
    let settings = gateway.settings();
    let upstreams = settings
        .upstreams
        .nodes()
        .iter()
        .chain([settings.upstreams.data()]);
    let targets = upstreams
        .map(|u| (u.name.clone(), u.authority.to_string(), u.health.clone()))
        .collect();
    (settings.health.clone(), targets)
}

/// The admin service of one connection: the router, told who is asking.
fn admin_service(
    router: Router,
    peer: SocketAddr,
) -> impl tower::Service<
    Request<StudentBody>,
    Response = Response<axum::body::Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<axum::body::Body>, Infallible>> + Send,
> + Clone
       + Send {
    tower::service_fn(move |mut request: Request<StudentBody>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let router = router.clone();
        async move { Ok(router.oneshot(request).await.unwrap_or_else(|e| match e {})) }
    })
}

/// Keeps the table in shape in the background: expires idle sessions every
/// [`SWEEP_EVERY`], and sheds the least recently used ones as soon as a bind takes it
/// over `max_sessions`. The same pass closes upstream connections that idled too long. Both scan the table, so they run on a blocking thread, never
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
        let swept = gateway.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let kept = swept.prune_connections();
            if swept.store().is_shared() {
                // The sessions used here live on in Redis and on the other gateways.
                swept.store().used(table.take_used());
            }
            (table.shed(), table.sweep(), table.len(), kept)
        });
        if let Ok((shed, expired, live, kept)) = pass.await {
            if shed + expired > 0 {
                tracing::debug!(shed, expired, live, "swept the affinity table");
            }
            let metrics = gateway.metrics();
            metrics.evicted("max_sessions", shed);
            metrics.evicted("expired", expired);
            if shed > 0 {
                if let Some(held_back) = EVICTIONS.allow() {
                    tracing::warn!(
                        shed,
                        live,
                        held_back,
                        "the affinity table was full (session.max_sessions): the least \
                         recently used sessions were forgotten; their students may be \
                         sent to another node"
                    );
                }
            }
            tracing::trace!(kept, "idle upstream connections after the sweep");
        }
    }
}

/// An admin's drain or disable from before the restart, kept with the snapshot, is
/// taken back unless the config file's `state` for that node changed meanwhile (the
/// rule is [`Upstream::take_back`](crate::cluster::upstreams::Upstream::take_back)'s).
fn take_back_node_states(
    upstreams: &crate::cluster::upstreams::Upstreams,
    saved: &[state::SnapshotNode],
) {
    for node in saved {
        let (Some(saved), Some(upstream)) = (node.state, upstreams.by_name(&node.name)) else {
            continue;
        };
        let name = &node.name;
        if upstream.take_back(saved.now, saved.configured) {
            tracing::info!(node = %name, state = %saved.now, "an admin's change from before the restart is kept");
        } else if saved.now != upstream.state() {
            tracing::info!(
                node = %name,
                state = %upstream.state(),
                was = %saved.now,
                "the config file changed this node's state since the last run: the file's state applies"
            );
        }
    }
}

/// A save every `save_every` is routine: said once an hour, that it still works.
static SAVES: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(3600));

/// Shedding at `max_sessions` can happen on every bind of a flood: one warning a minute.
static EVICTIONS: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(60));

/// Saves the table on a blocking thread (a million sessions take a moment to write),
/// naming the nodes of the config running at that moment, and logs the outcome.
async fn save_in_background(gateway: Arc<Gateway>, path: PathBuf) -> bool {
    let written = tokio::task::spawn_blocking(move || {
        let nodes: Vec<_> = (gateway.settings().upstreams.nodes().iter())
            .map(|n| {
                let state = Some(state::SavedState {
                    now: n.state(),
                    configured: n.configured(),
                });
                let name = n.name.clone();
                (n.id, state::SnapshotNode { name, state })
            })
            .collect();
        (state::save(gateway.table(), &nodes, &path), path)
    })
    .await;
    match written {
        Ok((Ok(count), path)) => {
            if let Some(held_back) = SAVES.allow() {
                let saves_since = held_back;
                tracing::info!(
                    sessions = count,
                    saves_since,
                    "state saved to {}",
                    path.display()
                );
            }
            true
        }
        Ok((Err(error), path)) => {
            tracing::warn!("cannot write the state file {}: {error}", path.display());
            false
        }
        Err(error) => {
            tracing::warn!("state save did not finish: {error}");
            false
        }
    }
}

/// Saves the table every `every` until `stop` fires.
async fn save_periodically(
    gateway: Arc<Gateway>,
    path: PathBuf,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                save_in_background(gateway.clone(), path.clone()).await;
            }
            () = gateway.save_asked() => {
                save_in_background(gateway.clone(), path.clone()).await;
            }
            _ = stop.changed() => return,
        }
    }
}
