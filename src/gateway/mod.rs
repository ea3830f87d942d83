//! What happens to one student request: classify it, decide its upstream, forward it,
//! and learn from the node's `Set-Cookie` on the way back.
//!
//! This is the only place where Moodle knowledge ([`crate::moodle`]), the upstreams
//! and their health ([`crate::cluster::upstreams`]) and the affinity table
//! ([`crate::sessions::affinity`]) meet, so the routing rule reads top to bottom in
//! `Gateway::route` and the rule for a known session's node in `Gateway::sticky`.
//! Two parts of the journey have a file of their own: `failover` (the forward loop,
//! and where an attempt that sent nothing may go next) and `learning` (what a
//! node's `Set-Cookie` teaches, and the session-loss detector).
//!
//! Everything a reload may change (the upstreams, failover policy, forwarding
//! settings) sits in one [`Settings`] behind an [`ArcSwap`]: a request takes it
//! once, without a lock, and a reload swaps in a new one without disturbing the
//! requests still using the old. A student connection keeps the generation it last
//! used ([`SettingsCache`]) and takes it again with one compare of a pointer: a
//! load of the swap (a debt slot taken and paid back) cost some 200 instructions,
//! and each request made two.

mod cached;
mod export;
mod failover;
mod first_pages;
mod learning;
pub mod limiter;
mod peers;
pub mod stack;
mod surge;
mod turns;
pub mod waiting_room;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::http::h1::server::StudentBody;
use arc_swap::{ArcSwap, Cache, Guard};
use bytes::Bytes;
use http::header::{HeaderValue, SET_COOKIE, USER_AGENT};
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use ipnet::IpNet;

use crate::cluster::export::Export;
use crate::cluster::slots::{Class, SiteStarts, SiteStartsNow};
use crate::cluster::upstreams::{NodeIds, Upstream, Upstreams};
use crate::config::{Config, HealthConfig, SessionStore, StoreConfig, SurgeConfig};
use crate::error::GatewayError;
use crate::node_id::NodeId;
use failover::Hold;

use crate::http::accept::edge::EdgeRules;
use crate::http::body::compress::Rules;
use crate::http::body::inflate::Inflated;
use crate::http::body::spool::Spool;
use crate::http::body::IdleLimited;
use crate::http::upstream::asset_cache::{AssetCache, Fill, Teed};
use crate::http::upstream::offload::{self, Asked, Offload};
use crate::http::upstream::pool::{NodeBody, Pool};
use crate::http::upstream::proxy::{self, Bounds, Client, Peer};
use crate::logs::Every;
use crate::metrics::{Metrics, MoveCause, RoomNow};
use crate::moodle::{self, IssuedSession, RequestKind, Site};
use crate::sessions::affinity::{AffinityTable, Limits, SessionKey, SessionState};
use crate::sessions::clock::Clock;
use crate::sessions::route_cookie::RouteCookie;
use crate::store::Store;
use cached::Cached;
use waiting_room::{Entry, WaitingRoom};

/// What a student receives: the node's streaming body (copied into the asset cache
/// on its way when it fills an entry, gunzipped after that for a browser that takes
/// no gzip), a kept asset gunzipped for such a browser, or the gateway's own bytes
/// (a short page, a cached asset as it was kept).
pub type ProxyBody =
    Either<Either<Inflated<Teed<IdleLimited<NodeBody>>>, Inflated<Full<Bytes>>>, Full<Bytes>>;

/// A session the table knows: the key of its id, the node that holds it, and
/// what the session-loss detector needs (logged in? idle since when? or only just
/// recovered from its route cookie, so neither is known?).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    key: SessionKey,
    node: NodeId,
    state: SessionState,
    idle: Duration,
    recovered: bool,
}

/// Where one request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A SCORM file: the data server.
    Data,
    /// A session the table knows: its node.
    Sticky(NodeId),
    /// A known session whose node cannot serve it any more: a freshly dealt node.
    Moved(NodeId),
    /// No known session: a freshly dealt node.
    Deal(NodeId),
    /// No known session and none needed: any node, outside the deal.
    Spread(NodeId),
}

impl Route {
    fn node(self) -> Option<NodeId> {
        match self {
            Route::Data => None,
            Route::Sticky(n) | Route::Moved(n) | Route::Deal(n) | Route::Spread(n) => Some(n),
        }
    }
}

/// What the handover gives the gateway to wait on: completes once the previous
/// process has told every session it bound before the call (or has exited).
pub struct CatchUp(
    pub Box<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>,
);

impl std::fmt::Debug for CatchUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CatchUp")
    }
}

/// Everything a reload replaces, swapped as one unit.
#[derive(Debug)]
pub struct Settings {
    /// The nodes and the data server, with their health and admin state.
    pub upstreams: Upstreams,
    /// Active and passive health settings.
    pub health: HealthConfig,
    store: SessionStore,
    failover_hold: Duration,
    trusted_proxies: Box<[IpNet]>,
    bounds: Bounds,
    edge: EdgeRules,
    /// Moodle's `sessiontimeout`: a logged-in session replaced after this much
    /// idleness timed out rather than was lost.
    sessiontimeout: Duration,
    /// The file offload (`[offload]`): SCORM files go to the nodes, and their
    /// `X-Accel-Redirect` answers are served from the data server's export.
    offload: Option<Offload>,
    /// The data server's file export as the probes see it (with `[offload]`): kept
    /// across a reload that names the same export.
    pub export: Option<Arc<Export>>,
    /// The line's patience and aging, and the waiting room (`[surge]`); the caps
    /// live in the upstreams.
    pub surge: SurgeConfig,
    /// `[cache] enabled`: the store itself outlives reloads, in the gateway.
    cache_on: bool,
    /// `Strict-Transport-Security` for the TLS listener's answers (`[tls]
    /// hsts_max_age`); a connection takes the one in force when it opens.
    pub hsts: Option<HeaderValue>,
    /// `[compression]`, when enabled.
    pub compression: Option<Arc<Rules>>,
    /// The rate limits' buckets (`[rate_limits]`), `None` when no limit is on:
    /// kept across a reload that does not change the section.
    pub rate_limits: Option<Arc<limiter::Buckets>>,
}

impl Settings {
    fn new(config: &Config, ids: &NodeIds, previous: Option<&Settings>) -> Result<Self, String> {
        Ok(Self {
            upstreams: Upstreams::build(config, ids, previous.map(|p| &p.upstreams))?,
            health: config.health.clone(),
            store: config.session.store,
            failover_hold: config.session.failover_hold,
            trusted_proxies: config.trusted_proxies.clone().into_boxed_slice(),
            bounds: Bounds {
                max_body_bytes: config.limits.max_body_bytes,
                connect: config.timeouts.connect,
                tunnel_idle: config.timeouts.tunnel_idle,
                response_headers: config.timeouts.response_headers,
                body_idle: config.timeouts.body_idle,
                buffer_body_bytes: config.limits.buffer_body_bytes,
                spool_body_bytes: config.limits.spool_body_bytes,
                upload_min_rate: config.timeouts.upload_min_rate,
                upload_rate_window: config.timeouts.upload_rate_window,
                upload: config.timeouts.upload,
            },
            edge: EdgeRules::new(&config.limits, &config.site.hosts),
            sessiontimeout: config.session.sessiontimeout,
            offload: (config.offload.as_ref())
                .map(|o| Offload::new(o.authority.clone(), o.prefix.clone())),
            export: (config.offload.as_ref())
                .map(|o| Export::new(o, previous.and_then(|p| p.export.as_ref()))),
            surge: config.surge.clone(),
            cache_on: config.cache.enabled,
            hsts: (config.tls.as_ref())
                .and_then(|tls| tls.hsts)
                .and_then(|hsts| HeaderValue::try_from(hsts.value()).ok()),
            compression: compression_rules(&config.compression),
            rate_limits: match previous.and_then(|p| p.rate_limits.as_ref()) {
                Some(kept) if kept.config == config.rate_limits => Some(kept.clone()),
                _ => limiter::Buckets::new(&config.rate_limits).map(Arc::new),
            },
        })
    }

    /// `[cache] enabled`: revisioned assets are answered from memory.
    pub fn cache_on(&self) -> bool {
        self.cache_on
    }

    fn upstream(&self, route: Route) -> Option<&Arc<Upstream>> {
        match route.node() {
            None => Some(self.upstreams.data()),
            Some(node) => self.upstreams.get(node),
        }
    }
}

/// The settings in force, as a student connection keeps them: taken again with a
/// compare of one pointer while no reload has swapped them. Every request gets the
/// settings in force when it comes. A connection on the gateway's own HTTP/1.1 side
/// holds the generation it last used until its next request or its end (at most
/// the request-head timeout for an idle one), as an old nginx worker serves its
/// connections after a reload; one that hyper serves (HTTP/2, a handed-over
/// HTTP/1.1) calls a clone of its stack for each request, so the stack it keeps
/// holds the generation the connection opened with until the connection closes.
pub type SettingsCache = Cache<Arc<ArcSwap<Settings>>, Arc<Settings>>;

/// The shared state of the public listener. Cheap to share behind an `Arc`; nothing
/// in it is locked for longer than a table shard operation.
#[derive(Debug)]
pub struct Gateway {
    site: Site,
    table: Arc<AffinityTable>,
    pool: Pool,
    ids: NodeIds,
    settings: Arc<ArcSwap<Settings>>,
    route_cookie: Option<RouteCookie>,
    /// Requests between admission and their response head.
    in_flight: AtomicUsize,
    /// `limits.max_in_flight` of the config in force: apart from the settings, so
    /// the in-flight layer reads one atomic, not a generation of everything.
    max_in_flight: AtomicUsize,
    metrics: Metrics,
    /// The table, deal and admin state shared with other gateways, if any.
    store: Store,
    /// The snapshot of this gateway's table from before it joined a shared store,
    /// keyed under its old secret: emptied as its students come back (`peers`).
    legacy: Option<AffinityTable>,
    /// While a previous process hands over (`crate::handover`): waits until every
    /// session it bound before now is in this table.
    catch_up: std::sync::OnceLock<CatchUp>,
    /// Newcomers held while the nodes' lines are long (`[surge]`); its tickets are
    /// signed with the table's secret, so they outlive a restart and every gateway
    /// of a shared store honours them.
    room: WaitingRoom,
    /// Moodle's revisioned assets, answered from memory (`[cache]`).
    cache: Arc<AssetCache>,
    /// Held by every change of a node's admin state (an admin's, and a reload's,
    /// which copies states into the new generation and tells the store what the file
    /// changed): one at a time, so a check such as the last-active-node rail sees
    /// the states it decides on, and the store hears the changes in the order they
    /// were made (a reload that read a state before an admin's change must not
    /// publish it after).
    node_states: std::sync::Mutex<()>,
    /// Asks the snapshot task for a save now, not at the next `save_every`: an
    /// admin's drain is kept with the snapshot, and must be on disk before a crash.
    save_soon: tokio::sync::Notify,
    /// Uploads kept on disk until whole (`limits.spool_*`); its directory and
    /// size are the start's, its accounting outlives reloads.
    spool: Spool,
    /// Each session's requests at its node at once (`[surge] session_max_active`).
    turns: turns::Turns,
    /// Quiz starts' turns at their gates, kept for their attempts' first pages.
    first_pages: first_pages::FirstPages,
    /// The site's share of quiz starts at once, paced by the students at work.
    site_starts: SiteStarts,
}

impl Gateway {
    /// Builds the gateway for a validated config with an empty table.
    pub fn new(config: &Config, clock: Clock) -> Self {
        Self::with_table(config, AffinityTable::new(limits(config), clock))
    }

    /// Builds the gateway around `table` (restored from a snapshot).
    pub fn with_table(config: &Config, table: AffinityTable) -> Self {
        let session = &config.session;
        let ids = NodeIds::default();
        let settings = Settings::new(config, &ids, None)
            .expect("a valid config names far fewer nodes than the id space");
        let route_cookie = config
            .route_cookie
            .as_ref()
            .map(|c| RouteCookie::new(&c.name, &c.secret, &session.cookie_path));
        let metrics = Metrics::new();
        let store = match &config.store {
            StoreConfig::Memory => Store::memory(),
            StoreConfig::Redis(redis) => {
                Store::redis(redis, limits(config), metrics.store().clone())
            }
        };
        let room = WaitingRoom::new(&table.secret());
        Self {
            site: Site::new(&config.site.path, &session.cookie, &session.cookie_path),
            table: Arc::new(table),
            pool: Pool::new(
                config.timeouts.connect,
                config.timeouts.upstream_idle,
                config.timeouts.body_idle,
            ),
            ids,
            settings: Arc::new(ArcSwap::from_pointee(settings)),
            route_cookie,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(config.limits.max_in_flight),
            metrics,
            store,
            legacy: None,
            catch_up: std::sync::OnceLock::new(),
            room,
            cache: AssetCache::new(config.cache.max_bytes, config.cache.max_entry_bytes),
            node_states: std::sync::Mutex::new(()),
            save_soon: tokio::sync::Notify::new(),
            turns: turns::Turns::default(),
            first_pages: first_pages::FirstPages::default(),
            site_starts: SiteStarts::default(),
            spool: Spool::new(
                config.limits.spool_dir.clone(),
                config.limits.spool_max_bytes,
            ),
        }
        .registered()
    }

    /// Makes the meters of every upstream of the current settings.
    fn registered(self) -> Self {
        self.register(&self.settings.load());
        self
    }

    fn register(&self, settings: &Settings) {
        let upstreams = &settings.upstreams;
        for upstream in upstreams.nodes().iter().chain([upstreams.data()]) {
            self.metrics.register(upstream.id, &upstream.name);
        }
        // Its series exist from the start at 0, so "no file yet" is not "no data".
        if settings.export.is_some() {
            self.metrics.export();
        }
    }

    /// Applies a reloaded config's upstreams and policies. In-flight requests finish
    /// on the settings they started with.
    pub fn apply(&self, config: &Config) -> Result<(), String> {
        let _one_change = self.lock_node_states();
        let current = self.settings.load();
        let before: Vec<_> = (current.upstreams.nodes().iter())
            .map(|n| (n.name.clone(), n.state()))
            .collect();
        let next = Settings::new(config, &self.ids, Some(&current))?;
        self.register(&next);
        // A state the file changed is the newest word on that node: every gateway's.
        for (name, was) in before {
            let now = next.upstreams.by_name(&name).map(|n| n.state());
            if let Some(now) = now.filter(|&now| now != was) {
                self.store.node_state(&name, now);
            }
        }
        self.settings.store(Arc::new(next));
        let max_in_flight = config.limits.max_in_flight;
        self.max_in_flight.store(max_in_flight, Ordering::Relaxed);
        Ok(())
    }

    /// The lock every change of a node's admin state holds, from the check that
    /// allows it to its word to the store (see the field's comment).
    pub fn lock_node_states(&self) -> std::sync::MutexGuard<'_, ()> {
        self.node_states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for the table and the node states to be saved now (after an admin's
    /// change), rather than at the next `save_every`.
    pub fn save_soon(&self) {
        self.save_soon.notify_one();
    }

    /// Completes when a save was asked for by [`save_soon`](Self::save_soon).
    pub async fn save_asked(&self) {
        self.save_soon.notified().await;
    }

    /// The current settings (upstreams, health, policies).
    pub fn settings(&self) -> Guard<Arc<Settings>> {
        self.settings.load()
    }

    /// The current settings, for one student connection to take again and again.
    pub fn settings_cache(&self) -> SettingsCache {
        Cache::new(self.settings.clone())
    }

    /// The affinity table, for the admin API, the sweeper and snapshots.
    pub fn table(&self) -> &Arc<AffinityTable> {
        &self.table
    }

    /// What the gateway counts, for `/metrics` and the dashboard.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Requests between admission and their response head.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the request carries a live, logged-in session this gateway bound:
    /// the rate limits never touch one.
    fn logged_in(&self, headers: &http::HeaderMap) -> bool {
        let Some(id) = self.site.session_id(headers) else {
            return false;
        };
        self.table.is_logged_in(self.table.key(id))
    }

    /// The upload spool: its directory, and its figures for `/metrics`.
    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// The site's share of quiz starts now, for `/metrics`.
    pub fn site_starts_now(&self) -> SiteStartsNow {
        self.site_starts.now()
    }

    /// The waiting room now, for the dashboard and `/metrics`.
    pub fn room_now(&self) -> RoomNow {
        let settings = self.settings.load();
        let room = settings.surge.waiting_room.as_ref();
        self.room.now(room, settings.upstreams.load())
    }

    /// Closes the upstream connections that idled past `timeouts.upstream_idle` or
    /// that their node closed; returns how many are kept.
    pub fn prune_connections(&self) -> usize {
        let settings = self.settings.load();
        let upstreams = &settings.upstreams;
        upstreams
            .nodes()
            .iter()
            .map(|upstream| &upstream.conns)
            .chain([&upstreams.data().conns])
            .chain(settings.offload.as_ref().map(Offload::conns))
            .map(|conns| conns.prune(self.pool.idle()))
            .sum()
    }

    /// One admitted request's journey (the layers of [`stack::students`] come
    /// first): classified, routed, forwarded, learnt from; the streaming response or
    /// an error page. Notes in `served` where it went, for the access log.
    ///
    /// Not an `async fn`, which would keep the request twice (as it came and as a
    /// local) in the future every request boxes; the block moves it once.
    #[allow(clippy::manual_async_fn)]
    fn journey<'a>(
        &'a self,
        mut request: Request<StudentBody>,
        client: &'a Client,
        served: &'a mut Served,
        settings: &'a Settings,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + 'a {
        async move {
            let arrived = tokio::time::Instant::now();
            let uri = request.uri();
            let kind = match self.site.classify(uri.path(), uri.query()) {
                Ok(kind) => kind,
                Err(_) => return self.refused(GatewayError::AmbiguousPath, &request, client),
            };
            // A revisioned asset in memory needs no node, no slot, no deal and no session.
            let fill = if kind == RequestKind::Sessionless && settings.cache_on {
                match self.cached(&request).await {
                    Cached::Hit(answer) => {
                        served.cached = true;
                        return answer.map(|body| match body {
                            Either::Left(kept) => Either::Right(kept),
                            Either::Right(gunzipped) => Either::Left(Either::Right(gunzipped)),
                        });
                    }
                    Cached::Fill(fill) => Some(fill),
                    Cached::Node => None,
                }
            } else {
                None
            };
            let known = (self.known_session(request.headers(), &settings.upstreams)).await;
            served.session = known.map(|k| k.key);
            let asked_for = Sent {
                kind,
                is_post: request.method() == Method::POST,
                // Only a logged-in student's request can be a loss worth a warning.
                uri: known
                    .filter(|k| k.state == SessionState::LoggedIn)
                    .map(|_| request.uri().clone()),
            };
            let peer = client.peer(
                settings
                    .trusted_proxies
                    .iter()
                    .any(|net| net.contains(&client.ip)),
            );
            let secure = self.route_cookie.is_some() && proxy::is_https(request.headers(), peer);
            // The node will ignore how the student asked for a file; the export must not.
            let asked = settings.offload.as_ref().map(|_| Asked::of(&request));
            // What a logged-in student is in the middle of orders the students'
            // line, and a quiz start waits at its node's gate.
            let work = moodle::work(kind, asked_for.is_post);
            let class = surge::class_of(known, work);
            served.class = Some(class);
            let mut ask = surge::ask(&settings.surge, class, asked_for.is_post, arrived);
            // The Moodle app reads JSON: the gateway's own answers to it are JSON too.
            // Only a request the gateway answers itself asks which it is, so its
            // target and user agent are kept aside (two reference counts), not
            // searched on every request.
            let asker = Asker {
                uri: uri.clone(),
                user_agent: request.headers().get(USER_AGENT).cloned(),
            };
            // In a surge a newcomer's page view may be shown the waiting room instead;
            // one let in from it stands in line by its first arrival.
            if known.is_none() && matches!(kind, RequestKind::Page(_)) {
                let https = proxy::is_https(request.headers(), peer);
                match self.waiting_room(&request, https, settings) {
                    Entry::Go(Some(first_arrival)) => {
                        ask.arrived = waiting_room::instant_of(first_arrival)
                    }
                    Entry::Go(None) => {}
                    Entry::Wait(page) => return page.map(Either::Right),
                }
            }
            // The one copy the cache keeps is the node's gzip answer.
            if let Some(fill) = &fill {
                fill.ask(request.headers_mut());
            }
            // The request's wait for its own node, if it has to: one for all its tries.
            let mut hold = None;
            let waited = &mut served.waited;
            let forwarded = async {
                let route = self.route(kind, known, &mut hold, settings).await?;
                let attempt_page = moodle::is_attempt_page(kind, asked_for.is_post);
                let admission = self
                    .admission(route, known, (work, attempt_page), &mut ask, settings)
                    .await?;
                // A logged-in student's work in progress, not a start (whose own
                // pace is its gate) nor anyone's login.
                let in_progress = class == Class::Working && work == moodle::Work::InProgress;
                let forward = self.forward(
                    route,
                    known,
                    request,
                    peer,
                    ask,
                    in_progress,
                    waited,
                    hold,
                    settings,
                );
                let paced_turn = admission.is_a_paced_turn(in_progress);
                let forwarded = forward.await;
                // Timed whatever its end: a turn that waited out its patience is
                // the slowest of all.
                if paced_turn {
                    let yield_at = settings.surge.quiz_starts_yield_at;
                    self.site_starts.turn_took(yield_at, arrived.elapsed());
                }
                // The turns go back with the node's answer head: the node is done with
                // the session's lock and the start by then. A start's turn is kept
                // for its attempt's first page, the heavier half of starting.
                match (&forwarded, known) {
                    (Ok((_, answer, _)), Some(known))
                        if work == moodle::Work::QuizStart
                            && moodle::opens_first_page(answer.status(), answer.headers()) =>
                    {
                        admission.keep_for_first_page(&self.first_pages, known.key)
                    }
                    _ => drop(admission),
                }
                forwarded
            };
            let forwarded = forwarded.await;
            let (route, mut response, took) = match forwarded {
                Ok(forwarded) => forwarded,
                Err(error) => return self.failed_for(error, &asker),
            };
            served.upstream = settings.upstream(route).map(|u| u.id);
            served.upstream_time = took;
            let route_cookie = match self.site.issued_session(response.headers()) {
                Some(issued) => {
                    if let IssuedSession::Id(id) = issued {
                        served.session.get_or_insert_with(|| self.table.key(id));
                    }
                    let bound = (self.learn(route, known, issued, &asked_for, settings)).await;
                    self.route_cookie_line(bound, issued, secure, settings)
                }
                None => None,
            };
            if let Some(line) = route_cookie {
                response.headers_mut().append(SET_COOKIE, line);
            }
            let Some(redirect) = offload::take_accel(response.headers_mut()) else {
                return sent(response, fill);
            };
            // Boxed: the export's request is 3.6 KB of future, and the journey keeps
            // room for its largest step in every request, offloaded or not.
            let offloaded = self.offloaded(route, &redirect, response, asked, peer, settings);
            match Box::pin(offloaded).await {
                // The bytes and headers the student gets are what the cache keeps.
                Ok(file) => sent(file, fill),
                Err(error) => self.failed(error),
            }
        }
    }

    /// The gateway's own answer to a request it would not take, counted and
    /// logged (at most every few seconds: a scanner sends thousands).
    fn refused<B>(
        &self,
        error: GatewayError,
        request: &Request<B>,
        client: &Client,
    ) -> Response<ProxyBody> {
        if let Some(held_back) = REFUSALS.allow() {
            tracing::info!(
                status = error.status().as_u16(),
                method = %request.method(),
                target = %moodle::masked(request.uri()),
                client = %client.ip,
                held_back,
                "request refused: {error}"
            );
        }
        self.failed(error)
    }

    /// The gateway's own answer to a request that could not be proxied, counted: in
    /// JSON for the Moodle app (`app`), else the error page.
    fn failed_for(&self, error: GatewayError, asker: &Asker) -> Response<ProxyBody> {
        let user_agent = asker.user_agent.as_ref().map(HeaderValue::as_bytes);
        if !self.site.is_app_request(asker.uri.path(), user_agent) {
            return self.failed(error);
        }
        self.count_failure(error);
        error.app_response().map(Either::Right)
    }

    fn count_failure(&self, error: GatewayError) {
        self.metrics.own_answer(error.status().as_u16());
        if let Some(limit) = error.limit() {
            self.metrics.rejected(limit);
        }
    }

    /// The gateway's own error page, counted.
    fn failed(&self, error: GatewayError) -> Response<ProxyBody> {
        self.count_failure(error);
        error.response().map(Either::Right)
    }

    /// A node named a file with `X-Accel-Redirect`: its bytes come from the data
    /// server's export, under the node's headers (its `Set-Cookie` included, already
    /// learnt). Honoured only from a PHP node and only with `[offload]`: the data
    /// server, or a node whose Moodle accelerates files the gateway was not told
    /// about, would otherwise send the student an empty file.
    async fn offloaded(
        &self,
        route: Route,
        redirect: &HeaderValue,
        response: Response<IdleLimited<NodeBody>>,
        asked: Option<Asked>,
        peer: Peer<'_>,
        settings: &Settings,
    ) -> Result<Response<IdleLimited<NodeBody>>, GatewayError> {
        match (&settings.offload, route.node(), asked) {
            (Some(offload), Some(_), Some(asked)) => {
                let bounds = settings.bounds;
                let served = offload.serve(&self.pool, redirect, response, asked, peer, bounds);
                self.watched(settings, offload.prefix(), redirect, served.await)
            }
            (None, ..) => {
                tracing::error!(
                    value = redirect.to_str().unwrap_or("(not text)"),
                    "a node answered X-Accel-Redirect, but there is no [offload] section: \
                     configure it, or turn off $CFG->xsendfile"
                );
                Err(GatewayError::UnusableAccelRedirect)
            }
            _ => {
                tracing::warn!(
                    value = redirect.to_str().unwrap_or("(not text)"),
                    "X-Accel-Redirect from the data server ignored"
                );
                Err(GatewayError::UnusableAccelRedirect)
            }
        }
    }

    /// The session the request carries, if one of our nodes issued it and it is live:
    /// from the table, else from the shared store, else from a valid route cookie
    /// (after a restart without a snapshot, or on another gateway), which binds it again.
    async fn known_session(
        &self,
        headers: &http::HeaderMap,
        upstreams: &Upstreams,
    ) -> Option<Known> {
        let id = self.site.session_id(headers)?;
        let key = self.table.key(id);
        if let Some(found) = self.table.find(key) {
            let (node, state, idle) = (found.node, found.state, found.idle);
            let recovered = false;
            return Some(Known {
                key,
                node,
                state,
                idle,
                recovered,
            });
        }
        if let Some(known) = self.migrated(id, key, upstreams).await {
            return Some(known);
        }
        if let Some(known) = self.caught_up(key).await {
            return Some(known);
        }
        if let Some(known) = self.stored_session(key, upstreams).await {
            return Some(known);
        }
        let node = upstreams.by_name(self.route_cookie.as_ref()?.node(headers, id)?)?;
        // The cookie does not say whether the student logged in: assume so, the
        // longer idle limit is the safe side.
        let state = SessionState::LoggedIn;
        self.table.bind(key, node.id, state);
        self.tell_bound(key, state, node.id, upstreams).await;
        tracing::debug!(node = %node.name, "session recovered from its route cookie");
        let (idle, recovered) = (Duration::ZERO, true);
        Some(Known {
            key,
            node: node.id,
            state,
            idle,
            recovered,
        })
    }

    /// The routing rule, in full.
    async fn route(
        &self,
        kind: RequestKind,
        known: Option<Known>,
        hold: &mut Option<Hold>,
        settings: &Settings,
    ) -> Result<Route, GatewayError> {
        match (kind, known) {
            // With the file offload, the student's own node authorises a SCORM file and
            // the data server's export sends it: a file is routed like the session it
            // carries. Without a session (the token forms carry their own credential,
            // and a cookie form will be sent to log in) any node will do, outside the deal.
            (RequestKind::ScormFile, Some(known)) if settings.offload.is_some() => {
                self.sticky(known, hold, settings).await
            }
            (RequestKind::ScormFile, None) if settings.offload.is_some() => settings
                .upstreams
                .spread(None)
                .map(Route::Spread)
                .ok_or(GatewayError::NoNodeAvailable),
            // Otherwise SCORM content lives on the data server, whoever asks and whatever
            // session; there is no other copy to fail over to.
            (RequestKind::ScormFile, _) => {
                if settings.upstreams.data().health.is_up() {
                    Ok(Route::Data)
                } else {
                    Err(GatewayError::DataServerDown)
                }
            }
            // A session one of our nodes issued: only that node has its data. Assets
            // too: a "static" file that is missing is answered by PHP (Moodle 4.5+
            // sends it to r.php, older sites to error/index.php) inside the session,
            // and on another node that would log the student out.
            (_, Some(known)) => self.sticky(known, hold, settings).await,
            // Theme, JavaScript and static files without a session start none: any
            // node, and they must not move the deal of new sessions.
            (RequestKind::Sessionless, None) => settings
                .upstreams
                .spread(None)
                .map(Route::Spread)
                .ok_or(GatewayError::NoNodeAvailable),
            // No session, or one no node issued through us (forged, stale, expired):
            // a new visitor as far as we know, dealt the next node.
            (RequestKind::Page(_), None) => (self.deal_new(settings).await)
                .map(Route::Deal)
                .ok_or(GatewayError::NoNodeAvailable),
        }
    }

    /// The failover rule for a known session: its node while it can serve it; when
    /// it is down, at once another node if the session store is shared, or after
    /// `failover_hold` if only that node has the session (a restart usually takes
    /// seconds, and a new node means logging in again). A node that left the config
    /// or was disabled hands its sessions over at once.
    ///
    /// The wait is the request's [`Hold`]: started here, it is the same wait that a
    /// refusal of the node, once it is up again, goes on with.
    async fn sticky(
        &self,
        known: Known,
        hold: &mut Option<Hold>,
        settings: &Settings,
    ) -> Result<Route, GatewayError> {
        let cause = match settings.upstreams.get(known.node) {
            None => MoveCause::Removed,
            Some(node) if !node.keeps_sessions() => MoveCause::Disabled,
            Some(node) => {
                if node.health.is_up() {
                    return Ok(Route::Sticky(node.id));
                }
                if settings.store == SessionStore::NodeLocal {
                    let hold = hold.get_or_insert_with(|| Hold::start(settings.failover_hold));
                    let waiting = tokio::time::Instant::now();
                    let up = node.health.wait_up(hold.left()).await;
                    hold.spend(waiting.elapsed());
                    if up {
                        return Ok(Route::Sticky(node.id));
                    }
                }
                MoveCause::Down
            }
        };
        (self.move_session(known, cause, settings).await).ok_or(GatewayError::NoNodeAvailable)
    }

    /// Binds a known session to a freshly dealt node other than its own.
    async fn move_session(
        &self,
        known: Known,
        cause: MoveCause,
        settings: &Settings,
    ) -> Option<Route> {
        let to = self.deal(settings, Some(known.node))?;
        // Concurrent requests of the same student agree on one new node.
        let to = self.table.rebind(known.key, known.node, to).unwrap_or(to);
        // And so do the gateways: another one that moved it first wins.
        let to = self.tell_moved(known, to, &settings.upstreams).await;
        self.metrics.moved(cause);
        tracing::debug!(from = %known.node, %to, "session moved to another node");
        Some(Route::Moved(to))
    }

    /// The node for a new session among those taking new sessions, other than `except`.
    fn deal(&self, settings: &Settings, except: Option<NodeId>) -> Option<NodeId> {
        settings
            .upstreams
            .deal(|node| self.table.live(node), except)
    }
}

/// The node's answer on its way to the student, filling the asset cache if this
/// request fills an entry (and the answer may be kept).
fn sent(response: Response<IdleLimited<NodeBody>>, fill: Option<Fill>) -> Response<ProxyBody> {
    match fill {
        Some(fill) => fill
            .keep(response)
            .map(|body| Either::Left(Either::Left(body))),
        None => response.map(|body| Either::Left(Either::Left(Inflated::plain(Teed::plain(body))))),
    }
}

/// The rules `[compression]` sets, or none when it is off.
fn compression_rules(config: &crate::config::CompressionConfig) -> Option<Arc<Rules>> {
    config.enabled.then(|| {
        Arc::new(Rules {
            level: config.level,
            min_length: config.min_length,
            types: config.types.iter().map(|t| Box::from(t.as_str())).collect(),
            honour_no_transform: config.honour_no_transform,
        })
    })
}

/// Where one request went, for the access log: cheap to fill whether or not a
/// line is written.
#[derive(Debug, Clone, Copy, Default)]
struct Served {
    /// The upstream that answered; `None` when the gateway answered itself.
    pub upstream: Option<NodeId>,
    /// From sending the request to the node that answered to its response head
    /// (`None` for a WebSocket upgrade, which is timed by nobody).
    pub upstream_time: Option<Duration>,
    /// The key of the session it carried, or else of the one its node issued.
    pub session: Option<SessionKey>,
    /// How long it waited in the gateway for a slot on its node (`None` when the
    /// node has no cap).
    pub waited: Option<Duration>,
    /// The class it stood in line in.
    pub class: Option<Class>,
    /// Answered from the asset cache.
    pub cached: bool,
}

/// What the learning rule needs of a request after it was forwarded.
struct Sent {
    kind: RequestKind,
    is_post: bool,
    /// Kept for the session-loss warning, for logged-in students only (a shared
    /// buffer: no copy).
    uri: Option<http::Uri>,
}

/// Refused requests are logged at most once every ten seconds: a scanner sends
/// thousands, and the counts are in `/metrics`.
static REFUSALS: Every = Every::new(Duration::from_secs(10));

/// The table's bounds from `[session]`.
pub fn limits(config: &Config) -> Limits {
    Limits {
        max_sessions: config.session.max_sessions,
        logged_in_idle: config.session.logged_in_idle,
        anonymous_idle: config.session.anonymous_idle,
    }
}

/// The request's `User-Agent`.
/// Who asked, as far as an answer of the gateway's own needs to know: the app or
/// a browser.
struct Asker {
    uri: http::Uri,
    user_agent: Option<HeaderValue>,
}

#[cfg(test)]
mod tests;
