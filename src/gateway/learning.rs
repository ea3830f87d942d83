//! What the gateway learns from a node's answer: the session id it issued (bound,
//! rotated or cleared), the route cookie that goes with it, and whether a
//! logged-in student was just logged out (the session-loss detector).

use std::time::Duration;

use http::header::HeaderValue;

use super::{Gateway, Known, Route, Sent, Settings};
use crate::logs::Every;
use crate::metrics::LossCause;
use crate::moodle::{self, IssuedSession};
use crate::node_id::NodeId;
use crate::sessions::affinity::SessionState;

/// Session losses are each worth a warning, but an outage loses thousands at once.
static LOSSES: Every = Every::new(Duration::from_secs(1));

impl Gateway {
    /// The learning rule: a node's `Set-Cookie` for the session cookie binds the id it
    /// issued to that node; a new id on a request that carried a known one is a
    /// rotation (login, logout, timeout) and replaces it on the same node in one step.
    /// Returns the node the issued id is now bound to. With a shared store, the new
    /// binding is in Redis before the student has the id (see `peers`).
    pub(super) async fn learn(
        &self,
        route: Route,
        known: Option<Known>,
        issued: IssuedSession<'_>,
        sent: &Sent,
        settings: &Settings,
    ) -> Option<NodeId> {
        let id = match issued {
            IssuedSession::Id(id) => id,
            IssuedSession::Cleared => {
                if let Some(known) = known {
                    self.table.forget(known.key);
                    self.store.forgot(known.key);
                }
                return None;
            }
        };
        let new = self.table.key(id);
        if known.is_some_and(|known| known.key == new) {
            return None; // the node re-sent the same id: nothing changed
        }
        let state = if moodle::logged_in_after(sent.kind, sent.is_post, known.is_some()) {
            SessionState::LoggedIn
        } else {
            SessionState::Anonymous
        };
        let node = match (route.node(), known) {
            (Some(node), _) => node,
            // The data server runs Moodle on the same shared sessions (it could not
            // serve SCORM otherwise): its new id belongs with the student's node, or
            // with a new visitor's dealt one.
            (None, Some(known)) => known.node,
            (None, None) => self.deal(settings, None)?,
        };
        match known {
            Some(known) => {
                // A student's parallel requests (AJAX, frames) each come back with
                // their own new id after one loss: only the first rotation counts.
                let retired = self.table.rotate(known.key, new, node, state);
                self.tell_bound(new, state, node, &settings.upstreams).await;
                if retired {
                    self.store.forgot(known.key);
                    self.detect_loss(route, known, sent, settings);
                }
            }
            None => {
                self.table.bind(new, node, state);
                self.tell_bound(new, state, node, &settings.upstreams).await;
                if let Some(meters) = self.metrics.node(node) {
                    meters.dealt();
                }
            }
        }
        Some(node)
    }

    /// The session-loss detector. A node that answers a logged-in student's request
    /// with a new session id anywhere but at login and logout has logged the student
    /// out: on Moodle 4.5 a `303 /login/index.php` with a fresh anonymous id, after a
    /// session store failure, NFS lock trouble, a kill, or a request that reached
    /// the wrong node. No other proxy sees this; it is counted per node and cause.
    fn detect_loss(&self, route: Route, known: Known, sent: &Sent, settings: &Settings) {
        // A session recovered from its route cookie is assumed logged in, its
        // idleness unknown: Moodle replacing it says nothing the gateway can judge.
        let judged = known.state == SessionState::LoggedIn && !known.recovered;
        if !judged || moodle::rotates_by_design(sent.kind) {
            return;
        }
        let cause = if known.idle >= settings.sessiontimeout {
            LossCause::Timeout
        } else if matches!(route, Route::Moved(_)) {
            LossCause::Moved
        } else {
            LossCause::Dropped
        };
        let upstream = settings.upstream(route);
        let (id, name) = match upstream {
            Some(upstream) => (upstream.id, upstream.name.as_str()),
            None => return,
        };
        if let Some(meters) = self.metrics.node(id) {
            meters.lost(cause);
        }
        let Some(uri) = &sent.uri else {
            return;
        };
        let path = moodle::masked(uri);
        if cause == LossCause::Timeout {
            return tracing::info!(node = %name, %path, "a logged-in session timed out in Moodle");
        }
        if let Some(held_back) = LOSSES.allow() {
            tracing::warn!(
                node = %name,
                %path,
                cause = cause.as_str(),
                idle = %humantime::format_duration(known.idle),
                held_back,
                "a logged-in student was logged out by the node"
            );
        }
    }

    /// The route cookie line for what was just learnt: a new one naming the node of
    /// a newly bound id, or a deletion when Moodle cleared the session.
    pub(super) fn route_cookie_line(
        &self,
        bound: Option<NodeId>,
        issued: IssuedSession<'_>,
        secure: bool,
        settings: &Settings,
    ) -> Option<HeaderValue> {
        let cookie = self.route_cookie.as_ref()?;
        match (issued, bound) {
            (IssuedSession::Cleared, _) => Some(cookie.clear(secure)),
            (IssuedSession::Id(id), Some(node)) => {
                let node = settings.upstreams.get(node)?;
                Some(cookie.issue(&node.name, id, secure))
            }
            (IssuedSession::Id(_), None) => None,
        }
    }
}
