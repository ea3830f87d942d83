//! What happens to one student request: classify it, decide its upstream, forward it,
//! and learn from the node's `Set-Cookie` on the way back.
//!
//! This is the only place where Moodle knowledge ([`crate::moodle`]), the deal
//! ([`crate::balancer`]) and the affinity table ([`crate::affinity`]) meet, so the
//! routing rule reads top to bottom in [`Gateway::route`] and the learning rule in
//! [`Gateway::learn`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use ipnet::IpNet;

use crate::affinity::{AffinityTable, Clock, Limits, SessionKey, SessionState};
use crate::balancer::{Balancer, NodeId};
use crate::config::{Balance, Config};
use crate::error::GatewayError;
use crate::moodle::{IssuedSession, PageKind, RequestKind, Site};
use crate::proxy::{self, Peer, UpstreamClient};

/// What a student receives: the node's streaming body, or the gateway's own short page.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// One upstream as the request path needs it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The configured name (`web1`, `data`).
    pub name: String,
    /// Where it listens.
    pub authority: http::uri::Authority,
    /// Its share of new sessions (always 1 for the data server).
    pub weight: u32,
}

/// Where one request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A SCORM file: the data server.
    Data,
    /// A session the table knows: its node.
    Sticky(NodeId, SessionKey),
    /// No known session: a freshly dealt node.
    Deal(NodeId),
    /// Needs no session: any node, outside the deal.
    Spread(NodeId),
}

/// The shared state of the public listener. Cheap to share behind an `Arc`; nothing
/// in it is locked for longer than a table shard operation.
#[derive(Debug)]
pub struct Gateway {
    site: Site,
    balance: Balance,
    balancer: Balancer,
    table: Arc<AffinityTable>,
    client: UpstreamClient,
    nodes: Box<[Upstream]>,
    data: Upstream,
    trusted_proxies: Box<[IpNet]>,
    response_timeout: Duration,
}

impl Gateway {
    /// Builds the gateway for a validated config; `clock` drives session expiry.
    pub fn new(config: &Config, clock: Clock) -> Self {
        let session = &config.session;
        let limits = Limits {
            max_sessions: session.max_sessions,
            logged_in_idle: session.logged_in_idle,
            anonymous_idle: session.anonymous_idle,
        };
        let upstream = |u: &crate::config::UpstreamConfig| Upstream {
            name: u.name.clone(),
            authority: u.authority.clone(),
            weight: u.weight,
        };
        let weights: Vec<u32> = config.nodes.iter().map(|n| n.weight).collect();
        Self {
            site: Site::new(&config.site.path, &session.cookie, &session.cookie_path),
            balance: session.balance,
            balancer: Balancer::new(&weights),
            table: Arc::new(AffinityTable::new(config.nodes.len(), limits, clock)),
            client: proxy::client(&config.timeouts),
            nodes: config.nodes.iter().map(upstream).collect(),
            data: upstream(&config.data),
            trusted_proxies: config.trusted_proxies.clone().into_boxed_slice(),
            response_timeout: config.timeouts.response_headers,
        }
    }

    /// The affinity table, for the admin API and the sweeper.
    pub fn table(&self) -> &Arc<AffinityTable> {
        &self.table
    }

    /// The PHP nodes in config order; a [`NodeId`] indexes this slice.
    pub fn nodes(&self) -> &[Upstream] {
        &self.nodes
    }

    /// The data server.
    pub fn data(&self) -> &Upstream {
        &self.data
    }

    /// Proxies one request and returns the streaming response or an error page.
    pub async fn handle(&self, request: Request<Incoming>, peer: IpAddr) -> Response<ProxyBody> {
        let uri = request.uri();
        let kind = match self.site.classify(uri.path(), uri.query()) {
            Ok(kind) => kind,
            Err(_) => return GatewayError::AmbiguousPath.response().map(Either::Right),
        };
        let session = self
            .site
            .session_id(request.headers())
            .map(|id| self.table.key(id));
        let route = self.route(kind, session);
        let login_post =
            kind == RequestKind::Page(PageKind::Login) && request.method() == Method::POST;
        let upstream = match route {
            Route::Data => &self.data,
            Route::Sticky(node, _) | Route::Deal(node) | Route::Spread(node) => &self.nodes[node],
        };
        let peer = Peer {
            ip: peer,
            trusted: self.trusted_proxies.iter().any(|net| net.contains(&peer)),
        };
        let forwarded = proxy::forward(
            &self.client,
            &upstream.authority,
            request,
            peer,
            self.response_timeout,
        );
        match forwarded.await {
            Ok(response) => {
                if let Some(issued) = self.site.issued_session(response.headers()) {
                    self.learn(route, kind, login_post, issued);
                }
                response.map(Either::Left)
            }
            Err(error) => error.response().map(Either::Right),
        }
    }

    /// The routing rule, in full.
    fn route(&self, kind: RequestKind, session: Option<SessionKey>) -> Route {
        let known = session.and_then(|key| self.table.lookup(key).map(|node| (node, key)));
        match (kind, known) {
            // SCORM content lives on the data server, whoever asks and whatever session.
            (RequestKind::ScormFile, _) => Route::Data,
            // Theme, JavaScript and static files never touch a session: any node, and
            // they must not move the deal of new sessions.
            (RequestKind::Sessionless, _) => Route::Spread(self.balancer.spread()),
            // A session one of our nodes issued: only that node has its data.
            (RequestKind::Page(_), Some((node, key))) => Route::Sticky(node, key),
            // No session, or one no node issued through us (forged, stale, expired):
            // a new visitor as far as we know, dealt the next node.
            (RequestKind::Page(_), None) => Route::Deal(self.pick_new()),
        }
    }

    /// The learning rule: a node's `Set-Cookie` for the session cookie binds the id it
    /// issued to that node; a new id on a request that carried a known one is a
    /// rotation (login, logout, timeout) and replaces it in one step.
    fn learn(&self, route: Route, kind: RequestKind, login_post: bool, issued: IssuedSession<'_>) {
        let old = match route {
            Route::Sticky(_, key) => Some(key),
            _ => None,
        };
        let id = match issued {
            IssuedSession::Id(id) => id,
            IssuedSession::Cleared => {
                old.map(|key| self.table.forget(key));
                return;
            }
        };
        let new = self.table.key(id);
        if old == Some(new) {
            return; // the node re-sent the same id: nothing changed
        }
        let state = match (kind, old) {
            _ if login_post => SessionState::LoggedIn,
            (RequestKind::Page(PageKind::Logout), _) => SessionState::Anonymous,
            // Moodle regenerates a live id only at login (any auth plugin's URL), or
            // when it times out or kills a session. Calling it logged in keeps the
            // longer idle limit: the safe mistake for node-local sessions.
            (_, Some(_)) => SessionState::LoggedIn,
            (_, None) => SessionState::Anonymous,
        };
        match route {
            Route::Sticky(node, old) => self.table.rotate(old, new, node, state),
            Route::Deal(node) | Route::Spread(node) => self.table.bind(new, node, state),
            // The data server runs Moodle too and may start a session (its sessions are
            // shared, or it could not serve SCORM): bind it like a new visitor's.
            Route::Data => self.table.bind(new, self.pick_new(), state),
        }
    }

    /// The node for a new session, per `[session] balance`.
    fn pick_new(&self) -> NodeId {
        match self.balance {
            Balance::RoundRobin => self.balancer.deal(),
            Balance::LeastSessions => self.balancer.least_sessions(|node| self.table.live(node)),
        }
    }
}
