//! What happens to one student request: classify it, decide its upstream, forward it,
//! and learn from the node's `Set-Cookie` on the way back.
//!
//! This is the only place where Moodle knowledge ([`crate::moodle`]), the deal
//! ([`crate::balancer`]) and the affinity table ([`crate::affinity`]) meet, so the
//! routing rule reads top to bottom in `Gateway::route` and the learning rule in
//! `Gateway::learn`.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use ipnet::IpNet;

use crate::affinity::{AffinityTable, Clock, Limits, SessionKey, SessionState};
use crate::balancer::{Balancer, NodeId};
use crate::body::IdleLimited;
use crate::config::{Balance, Config};
use crate::error::GatewayError;
use crate::moodle::{self, IssuedSession, RequestKind, Site};
use crate::proxy::{self, Deadlines, Peer, UpstreamClient};

/// What a student receives: the node's streaming body, or the gateway's own short page.
pub type ProxyBody = Either<IdleLimited, Full<Bytes>>;

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

/// A session the table knows: the key of its id and the node that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    key: SessionKey,
    node: NodeId,
}

/// Where one request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A SCORM file: the data server.
    Data,
    /// A session the table knows: its node.
    Sticky(NodeId),
    /// No known session: a freshly dealt node.
    Deal(NodeId),
    /// No known session and none needed: any node, outside the deal.
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
    deadlines: Deadlines,
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
            deadlines: Deadlines {
                response_headers: config.timeouts.response_headers,
                body_idle: config.timeouts.body_idle,
            },
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
        if request.method() == Method::CONNECT {
            return GatewayError::MethodNotAllowed.response().map(Either::Right);
        }
        let uri = request.uri();
        let kind = match self.site.classify(uri.path(), uri.query()) {
            Ok(kind) => kind,
            Err(_) => return GatewayError::AmbiguousPath.response().map(Either::Right),
        };
        let known = self.known_session(request.headers());
        let route = self.route(kind, known);
        let is_post = request.method() == Method::POST;
        let upstream = match route {
            Route::Data => &self.data,
            Route::Sticky(node) | Route::Deal(node) | Route::Spread(node) => &self.nodes[node],
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
            self.deadlines,
        );
        match forwarded.await {
            Ok(response) => {
                if let Some(issued) = self.site.issued_session(response.headers()) {
                    self.learn(route, known, issued, kind, is_post);
                }
                response.map(Either::Left)
            }
            Err(error) => error.response().map(Either::Right),
        }
    }

    /// The session the request carries, if one of our nodes issued it and it is live.
    fn known_session(&self, headers: &http::HeaderMap) -> Option<Known> {
        let key = self.table.key(self.site.session_id(headers)?);
        let node = self.table.lookup(key)?;
        Some(Known { key, node })
    }

    /// The routing rule, in full.
    fn route(&self, kind: RequestKind, known: Option<Known>) -> Route {
        match (kind, known) {
            // SCORM content lives on the data server, whoever asks and whatever session.
            (RequestKind::ScormFile, _) => Route::Data,
            // A session one of our nodes issued: only that node has its data. Assets
            // too: a "static" file that is missing is answered by PHP (Moodle 4.5+
            // sends it to r.php, older sites to error/index.php) inside the session,
            // and on another node that would log the student out.
            (_, Some(known)) => Route::Sticky(known.node),
            // Theme, JavaScript and static files without a session start none: any
            // node, and they must not move the deal of new sessions.
            (RequestKind::Sessionless, None) => Route::Spread(self.balancer.spread()),
            // No session, or one no node issued through us (forged, stale, expired):
            // a new visitor as far as we know, dealt the next node.
            (RequestKind::Page(_), None) => Route::Deal(self.pick_new()),
        }
    }

    /// The learning rule: a node's `Set-Cookie` for the session cookie binds the id it
    /// issued to that node; a new id on a request that carried a known one is a
    /// rotation (login, logout, timeout) and replaces it on the same node in one step.
    fn learn(
        &self,
        route: Route,
        known: Option<Known>,
        issued: IssuedSession<'_>,
        kind: RequestKind,
        is_post: bool,
    ) {
        let id = match issued {
            IssuedSession::Id(id) => id,
            IssuedSession::Cleared => {
                known.map(|known| self.table.forget(known.key));
                return;
            }
        };
        let new = self.table.key(id);
        if known.is_some_and(|known| known.key == new) {
            return; // the node re-sent the same id: nothing changed
        }
        let state = if moodle::logged_in_after(kind, is_post, known.is_some()) {
            SessionState::LoggedIn
        } else {
            SessionState::Anonymous
        };
        let node = match (route, known) {
            (Route::Sticky(node) | Route::Deal(node) | Route::Spread(node), _) => node,
            // The data server runs Moodle on the same shared sessions (it could not
            // serve SCORM otherwise): its new id belongs with the student's node, or
            // with a new visitor's dealt one.
            (Route::Data, Some(known)) => known.node,
            (Route::Data, None) => self.pick_new(),
        };
        match known {
            Some(known) => self.table.rotate(known.key, new, node, state),
            None => self.table.bind(new, node, state),
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
