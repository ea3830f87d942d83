//! What a request does when its node cannot be reached: the forward loop, and the
//! one rule of where an attempt that sent nothing may go next.
//!
//! Why here and not in `http::upstream::proxy`: whether a request may go to another node
//! depends on its session (a node-local session only lives on its node) and on the
//! store, which only the gateway knows; the proxy only reports whether anything of
//! the request left.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::http::h1::server::StudentBody;
use http::{Request, Response};

use super::{Gateway, Known, Route, Settings};
use crate::cluster::health::Change;
use crate::cluster::slots::Ask;
use crate::config::SessionStore;
use crate::error::GatewayError;
use crate::http::body::IdleLimited;
use crate::http::upstream::pool::NodeBody;
use crate::http::upstream::proxy::{self, Failed, HopByHop, Peer, Target};
use crate::http::upstream::tunnel;
use crate::http::upstream::upload::Upload;
use crate::logs::Every;
use crate::metrics::MoveCause;

/// A node's low-priority pool that fails is said at most once a minute: every
/// request of that kind meets it until an admin looks.
static LOW_PRIORITY_FAILED: Every = Every::new(Duration::from_secs(60));

/// What the forward loop hands back: the route the request took, the node's
/// answer with its body under `body_idle`, and how long it waited for its node.
type Forwarded = (Route, Response<IdleLimited<NodeBody>>, Option<Duration>);

impl Gateway {
    /// Forwards to the route's upstream, recording the outcome in its health. A
    /// request whose connection could not even be opened may be sent again (nothing
    /// of it reached the node, so nothing can happen twice; see [`Gateway::again`]
    /// for where), and so may, once, a GET or HEAD whose node closed the connection
    /// before a byte of its answer (a node that died mid-exchange costs a slow page,
    /// not a 502). Anything else is never replayed. Returns the route taken, the
    /// response, and how long the answering node took to its head.
    ///
    /// `hold` is the request's wait for its own node so far (see [`Hold`]): a
    /// request that already waited for a down node waits no longer in all than one
    /// `failover_hold`.
    ///
    /// Each attempt first takes a slot on its node (`[surge] max_active`), noting in
    /// `waited` how long that took; the slot travels in the response body and is
    /// freed when the node's answer has been read. An upgrade takes none: a
    /// WebSocket holds no PHP worker for its life.
    ///
    /// On a node with a `low_priority_url`, a request that is not work in progress
    /// (`in_progress` false: a quiz start, a page view, a login) goes there, to the
    /// node's PHP pool that runs at a lower CPU priority, so that at an exam's start
    /// the node's CPU goes to the page turns and autosaves first, while the starts
    /// still use all that is left. The two are the same node, sharing its sessions.
    /// A low-priority pool that cannot be reached sends the request to the node's
    /// `url` instead: nothing of it was sent, and the node itself is not down.
    ///
    /// Not an `async fn`, which would keep each argument twice (as it came and as
    /// a local) in a future that every request's holds; the block moves them once.
    #[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
    pub(super) fn forward<'a>(
        &'a self,
        mut route: Route,
        known: Option<Known>,
        request: Request<StudentBody>,
        peer: Peer<'a>,
        ask: Ask,
        in_progress: bool,
        waited: &'a mut Option<Duration>,
        hold: Option<Hold>,
        settings: &'a Settings,
    ) -> impl Future<Output = Result<Forwarded, GatewayError>> + 'a {
        async move {
            if tunnel::is_upgrade(&request) {
                let upstream = settings
                    .upstream(route)
                    .ok_or(GatewayError::NoNodeAvailable)?;
                // An upgrade is never replayed, and gets a node connection of its own.
                let target = Target {
                    name: &upstream.name,
                    authority: &upstream.authority,
                    conns: &upstream.conns,
                };
                // Boxed: an upgrade is rare, and every request's future would otherwise
                // keep room for its 1.5 KB.
                let upgraded = tunnel::forward(target, request, peer, settings.bounds);
                let upgraded = Box::pin(upgraded).await;
                if upgraded.as_ref().is_err_and(|e| e.is_upstream_failure()) {
                    upstream.health.failure(settings.health.fall);
                }
                return upgraded.map(|response| (route, response, None));
            }
            let mut request = request.map(|body| Upload::new(body, &settings.bounds));
            // The body is read (into memory, or onto disk) before the node's slot is
            // taken: a student still sending holds no PHP worker, so they must not
            // hold one of the gateway's places for a worker either.
            let upstream = settings.upstream(route).map_or("", |u| u.name.as_str());
            proxy::read_ahead(&mut request, upstream, &settings.bounds, Some(&self.spool)).await?;
            let mut retry = Retry {
                movable: false,
                attempts: settings.upstreams.nodes().len(),
                hold,
                replayed: false,
            };
            let mut hop_by_hop = HopByHop::Due(peer);
            let mut low_priority = !in_progress;
            loop {
                let slot = self.slot(route, known, ask, low_priority, &mut retry.hold, settings);
                let (slotted, permit, took_slot) = slot.await?;
                route = slotted;
                *waited = took_slot.map(|t| t + waited.unwrap_or_default());
                let upstream = settings
                    .upstream(route)
                    .ok_or(GatewayError::NoNodeAvailable)?;
                let sent = Instant::now();
                let lane = upstream.low_priority.as_ref().filter(|_| low_priority);
                let target = match lane {
                    Some(lane) => Target {
                        name: &upstream.name,
                        authority: &lane.authority,
                        conns: &lane.conns,
                    },
                    None => Target {
                        name: &upstream.name,
                        authority: &upstream.authority,
                        conns: &upstream.conns,
                    },
                };
                let forwarded = proxy::forward(
                    &self.pool,
                    target,
                    request,
                    hop_by_hop,
                    settings.bounds,
                    peer.reuse(),
                );
                let Failed {
                    error,
                    unsent,
                    refused,
                    replay,
                } = match forwarded.await {
                    Ok(mut response) => {
                        upstream.health.request_succeeded();
                        let took = sent.elapsed();
                        if let Some(meters) = self.metrics.node(upstream.id) {
                            meters.answered(response.status().as_u16(), took);
                        }
                        if let Some(held) = permit.into_held() {
                            response.body_mut().inner_mut().hold(held);
                        }
                        return Ok((route, response, Some(took)));
                    }
                    Err(failed) => failed,
                };
                // Nothing of the node's is in use any more: the next try waits afresh.
                drop(permit);
                // The node's low-priority pool could not be reached: the node itself
                // may be fine, so the request goes to its `url` at once.
                if let Some(lane) = lane.filter(|_| !replay && error.is_upstream_failure()) {
                    if let Some(unsent) = unsent {
                        if let Some(held_back) = LOW_PRIORITY_FAILED.allow() {
                            tracing::warn!(
                                upstream = %upstream.name, held_back,
                                "low_priority_url {} failed, sent to its url instead: {error}",
                                lane.authority
                            );
                        }
                        (low_priority, request) = (false, unsent);
                        continue;
                    }
                }
                if error.is_upstream_error() {
                    self.metrics.upstream_error(&upstream.name, error.kind());
                }
                // The gateway's own lack of resources is not in here: it says nothing
                // about the node (`GatewayError::is_upstream_failure`).
                if error.is_upstream_failure()
                    && upstream.health.failure(settings.health.fall) == Change::Down
                {
                    tracing::warn!(upstream = %upstream.name, "marked down: {error}");
                }
                // No socket for this node means none for any other: answered at once.
                let Some(unsent) = unsent.filter(|_| error != GatewayError::OutOfConnections)
                else {
                    return Err(error);
                };
                // A node that closes on the same GET twice is not restarting: it fails
                // on this request (a PHP crash on this page), and a third try would
                // only cost it more.
                if replay && std::mem::replace(&mut retry.replayed, true) {
                    return Err(error);
                }
                // A GET that acts (Moodle's sesskey links) may have acted already.
                if replay && !crate::moodle::may_repeat(unsent.uri().query()) {
                    return Err(error);
                }
                // A replay goes as it was sent, prepared once.
                if replay {
                    hop_by_hop = HopByHop::Done;
                }
                // Only a request with no affinity moves: no node holds its session. Its
                // body, if any, is whole in memory, or nothing of it was read.
                let body = unsent.body();
                retry.movable = matches!(route, Route::Deal(_) | Route::Spread(_))
                    && settings.upstreams.nodes().len() > 1
                    && (body.is_empty() || body.whole_len().is_some());
                // A node that closed before answering is treated as one that refused:
                // it is going away or coming back, as while PHP-FPM restarts.
                let refused = refused || replay;
                match self
                    .again(route, known, refused, &mut retry, settings)
                    .await
                {
                    Some(next) => {
                        // Another node's low-priority pool is its own to try.
                        if next.node() != route.node() {
                            low_priority = !in_progress;
                        }
                        (route, request) = (next, unsent);
                    }
                    None => return Err(error),
                }
            }
        }
    }

    /// Where a request goes after an attempt that sent nothing (its connection
    /// could not be opened), if anywhere.
    async fn again(
        &self,
        route: Route,
        known: Option<Known>,
        refused: bool,
        retry: &mut Retry,
        settings: &Settings,
    ) -> Option<Route> {
        let shared = settings.store == SessionStore::Shared;
        retry.attempts = retry.attempts.saturating_sub(1);
        match route {
            // A node that is unreachable rather than refusing, for a session or a
            // SCORM file: answered as it is (502), never a reason to move or wait.
            Route::Sticky(_) | Route::Moved(_) | Route::Data if !refused => None,
            // A new visitor or a sessionless asset, its body whole: the next node.
            Route::Deal(node) if retry.movable && retry.attempts > 0 => {
                self.deal(settings, Some(node)).map(Route::Deal)
            }
            Route::Spread(node) if retry.movable && retry.attempts > 0 => {
                settings.upstreams.spread(Some(node)).map(Route::Spread)
            }
            Route::Deal(_) | Route::Spread(_) => None,
            // A refused session with a shared store: any node can serve it, so it
            // moves at once (a POST too: its body was never read), like a session
            // whose node is down.
            Route::Sticky(node) | Route::Moved(node) if shared && retry.attempts > 0 => {
                let known = Known { node, ..known? };
                self.move_session(known, MoveCause::Refused, settings).await
            }
            Route::Sticky(_) | Route::Moved(_) if shared => None,
            // A refused session only its node holds: nothing reached the node (its
            // web server is restarting), so the same request tries it again, with
            // a backoff, for up to `failover_hold`. A slow page, not a 502 or a
            // logout. After the hold, the rule for a down node: moved if its
            // refusals took it down, else the 502.
            Route::Sticky(node) | Route::Moved(node) => {
                let hold = retry.hold.get_or_insert_with(|| {
                    tracing::info!(
                        %node,
                        "connection refused: retrying the same node within failover_hold"
                    );
                    Hold::start(settings.failover_hold)
                });
                if hold.pause().await {
                    return Some(Route::Sticky(node));
                }
                let down = settings
                    .upstreams
                    .get(node)
                    .is_some_and(|n| !n.health.is_up());
                let known = Known { node, ..known? };
                if down {
                    self.move_session(known, MoveCause::Down, settings).await
                } else {
                    None
                }
            }
            // The data server has no other copy: a refusal (its web server
            // restarting) is waited out like a node's, within `failover_hold`.
            Route::Data => {
                let hold = retry.hold.get_or_insert_with(|| {
                    tracing::info!("the data server refused: retrying it within failover_hold");
                    Hold::start(settings.failover_hold)
                });
                hold.pause().await.then_some(Route::Data)
            }
        }
    }
}

/// What one request may still do after a failed attempt that sent nothing.
struct Retry {
    /// No affinity, its body whole or absent: it may go to the next node.
    movable: bool,
    /// Nodes it may still be tried on (new visitors, sessionless assets, moves).
    attempts: usize,
    /// The request's wait for its own node, once it started: for a node that was
    /// down when it arrived, for a slot, or after a refusal; one for all of them.
    hold: Option<Hold>,
    /// It was sent again once already after its node closed without answering.
    replayed: bool,
}

/// The first pause after a refused connect: a web server restart takes about a
/// second, so the first retries come quickly.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two tries: a node back after 3.1 s is tried by 4 s.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// A bound request's wait for its own node, down or refusing: at most
/// `failover_hold` of waiting in all, however the wait went on (the node down when
/// the request came, then refusing once up, say), with pauses of 100 ms doubling to
/// 1 s between tries of a refusing node. A budget, not a deadline: only the waits
/// for the node spend it, so a request that then spends minutes reading its upload
/// or standing in a node's line still has the rest of its hold when it is refused.
pub(super) struct Hold {
    left: Duration,
    pause: Duration,
}

impl Hold {
    pub(super) fn start(hold: Duration) -> Self {
        Self {
            left: hold,
            pause: FIRST_PAUSE,
        }
    }

    /// What is left of it.
    pub(super) fn left(&self) -> Duration {
        self.left
    }

    /// Counts a wait for the node that took `waited`.
    pub(super) fn spend(&mut self, waited: Duration) {
        self.left = self.left.saturating_sub(waited);
    }

    /// Waits before the next try; `false` (at once) once the hold is spent.
    async fn pause(&mut self) -> bool {
        if self.left.is_zero() {
            return false;
        }
        let pause = self.pause.min(self.left);
        tokio::time::sleep(pause).await;
        self.spend(pause);
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::sessions::affinity::SessionState;
    use crate::sessions::clock::Clock;

    /// One node-local site, web1's address closed (nothing here connects to it: the
    /// rules under test decide, the clock is tokio's paused one).
    fn gateway() -> Gateway {
        let text = "session.store = \"node-local\"\nsession.failover_hold = \"10s\"\n\
                    health.fall = 1\nhealth.rise = 1\n\
                    [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:1\"\n\
                    [[nodes]]\nname = \"web2\"\nurl = \"http://127.0.0.1:2\"\n\
                    [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n";
        let config = Config::parse(text, std::path::Path::new("."), Default::default()).unwrap();
        Gateway::new(&config, Clock::default())
    }

    /// A student bound to web1 finds it down, waits, sees it come back after 9 s, then
    /// spends a minute on its upload and is refused by web1: the wait goes on from the
    /// 9 s already spent, so the request waits one `failover_hold` (10 s) for its node
    /// in all, not 9 s plus another 10 s, and not nothing because a minute went by.
    #[tokio::test(start_paused = true)]
    async fn a_request_held_for_a_down_node_then_refused_waits_one_failover_hold_in_all() {
        let gateway = gateway();
        let settings = gateway.settings();
        let web1 = settings.upstreams.by_name("web1").unwrap().clone();
        web1.health.failure(1);
        assert!(!web1.health.is_up());
        let known = Known {
            key: gateway.table().key("q1w2e3r4t5y6u7i8o9p0a1s2d3"),
            node: web1.id,
            state: SessionState::LoggedIn,
            idle: Duration::ZERO,
            recovered: false,
        };
        let started = tokio::time::Instant::now();
        let back = {
            let web1 = web1.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(9)).await;
                web1.health.success(1);
            })
        };
        let mut hold = None;
        let route = gateway.sticky(known, &mut hold, &settings).await.unwrap();
        assert_eq!(route, Route::Sticky(web1.id), "it waited for its node");
        back.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(9));
        // Then a minute reading its upload (or in the node's line): not a wait for
        // the node, so it spends none of the hold.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let refused = tokio::time::Instant::now();

        // Refused on every try from now on.
        let mut retry = Retry {
            movable: false,
            attempts: 2,
            hold,
            replayed: false,
        };
        while let Some(again) = (gateway)
            .again(route, Some(known), true, &mut retry, &settings)
            .await
        {
            assert_eq!(again, Route::Sticky(web1.id), "the same node, again");
        }
        assert_eq!(
            refused.elapsed(),
            Duration::from_secs(1),
            "one failover_hold of waiting in all: 9 s down, 1 s refused"
        );
    }
}
