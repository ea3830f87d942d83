//! The gateway among its peers (`[store] kind = "redis"`): what it tells the shared
//! store, what it asks it on a request's path, and how the other gateways' changes
//! reach its table and upstreams. Without a shared store every call here returns
//! at once and the gateway is the single gateway it always was.

use std::time::Duration;

use super::{CatchUp, Gateway, Known, Settings};
use crate::cluster::upstreams::Upstreams;
use crate::config::{Balance, NodeState};
use crate::node_id::NodeId;
use crate::sessions::affinity::{AffinityTable, SessionKey, SessionState};
use crate::store::{Local, Store};

impl Gateway {
    /// The shared store (empty without one).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The node for a new session: with round robin and a shared store, the next
    /// ticket of the deal every gateway shares, so N gateways deal like one.
    pub(super) async fn deal_new(&self, settings: &Settings) -> Option<NodeId> {
        let shared = match settings.upstreams.balance() {
            Balance::RoundRobin => self.store.ticket().await,
            // The counts are already cluster-wide: every table holds every session.
            Balance::LeastSessions => None,
        };
        let live = |node| self.table.live(node);
        settings.upstreams.deal_from(shared, live, None)
    }

    /// A session the local table does not know, as the shared store knows it
    /// (bound by another gateway, or before this one started); taken into the table.
    pub(super) async fn stored_session(
        &self,
        key: SessionKey,
        upstreams: &Upstreams,
    ) -> Option<Known> {
        let stored = self.store.lookup(key).await?;
        let node = upstreams.by_name(&stored.node)?;
        self.table.adopt(key, node.id, stored.state, stored.idle);
        // Counted as this request's use, like any other lookup.
        let found = self.table.find(key)?;
        Some(Known {
            key,
            node: found.node,
            state: found.state,
            idle: stored.idle,
            recovered: false,
        })
    }

    /// Has a session the table misses looked for again once `catch_up` completes:
    /// while the previous process finishes its requests, a session it bound a
    /// moment ago (a login) may reach this one before the line that tells of it.
    /// Set once, by the handover.
    pub fn catch_up_with(&self, catch_up: CatchUp) {
        let _ = self.catch_up.set(catch_up);
    }

    /// A session the table missed, found once the previous process has told all it
    /// bound before this request came (see [`catch_up_with`](Self::catch_up_with)).
    pub(super) async fn caught_up(&self, key: SessionKey) -> Option<Known> {
        let catch_up = self.catch_up.get()?;
        (catch_up.0)().await;
        let found = self.table.find(key)?;
        Some(Known {
            key,
            node: found.node,
            state: found.state,
            idle: found.idle,
            recovered: false,
        })
    }

    /// Keeps the table this gateway had before it joined a shared store.
    pub fn keep_legacy(&mut self, legacy: AffinityTable) {
        self.legacy = Some(legacy);
    }

    /// A session of the table this gateway had before it joined the shared store
    /// (its snapshot was keyed under another secret), found by its raw id and
    /// moved into the shared table: switching a running site to Redis moves no
    /// student.
    pub(super) async fn migrated(
        &self,
        id: &str,
        key: SessionKey,
        upstreams: &Upstreams,
    ) -> Option<Known> {
        let legacy = self.legacy.as_ref()?;
        let old = legacy.key(id);
        let found = legacy.find(old)?;
        let node = upstreams.get(found.node)?.id;
        legacy.forget(old);
        self.table.bind(key, node, found.state);
        self.tell_bound(key, found.state, node, upstreams).await;
        let (state, idle) = (found.state, found.idle);
        let recovered = false;
        Some(Known {
            key,
            node,
            state,
            idle,
            recovered,
        })
    }

    /// Tells the others that `key` is bound to `node` now, and waits (up to
    /// `store.timeout`) until Redis has it: the response that carries a new id is
    /// held back until any gateway the student reaches next can route it. One round
    /// trip per new session, never per request.
    pub(super) async fn tell_bound(
        &self,
        key: SessionKey,
        state: SessionState,
        node: NodeId,
        upstreams: &Upstreams,
    ) {
        if let (true, Some(node)) = (self.store.is_shared(), upstreams.get(node)) {
            self.store.bound(key, state, &node.name).await;
        }
    }

    /// Tells the others that `known` moved to `to`, unless one of them moved it
    /// first (compare-and-set in Redis): then its node is taken here too, and
    /// returned, so a student whose requests reached two gateways at once lands on
    /// one node. One round trip, only when a session changes node.
    pub(super) async fn tell_moved(
        &self,
        known: Known,
        to: NodeId,
        upstreams: &Upstreams,
    ) -> NodeId {
        let (Some(from), Some(node)) = (upstreams.get(known.node), upstreams.get(to)) else {
            // Its old node left the config: nobody can route it there, so no race.
            self.tell_bound(known.key, known.state, to, upstreams).await;
            return to;
        };
        let first = self
            .store
            .moved(known.key, known.state, &from.name, &node.name);
        let Some(winner) = first.await.and_then(|name| upstreams.by_name(&name)) else {
            return to;
        };
        self.table
            .adopt(known.key, winner.id, known.state, Duration::ZERO);
        winner.id
    }

    /// An admin evicts a session: here and, with a shared store, everywhere.
    /// `false` if this gateway did not know it.
    pub fn evict(&self, key: SessionKey) -> bool {
        let known = self.table.forget(key);
        self.store.forgot(key);
        known
    }
}

impl Local for Gateway {
    fn table(&self) -> &AffinityTable {
        &self.table
    }

    fn node_id(&self, name: &str) -> Option<NodeId> {
        self.settings.load().upstreams.by_name(name).map(|n| n.id)
    }

    fn node_name(&self, id: NodeId) -> Option<String> {
        self.settings
            .load()
            .upstreams
            .get(id)
            .map(|n| n.name.clone())
    }

    fn node_state(&self, name: &str, state: NodeState, by: &str) {
        // Under the lock of every node-state change: never in the middle of a reload
        // copying states, nor between a local change's rail check and its write.
        let _one_change = self.lock_node_states();
        let settings = self.settings.load();
        let Some(node) = settings.upstreams.by_name(name) else {
            return;
        };
        let previous = node.set_state(state);
        if previous != state {
            tracing::info!(node = %name, %previous, %state, by, "a node's state changed on another gateway");
        }
    }

    fn beat(&self) -> serde_json::Value {
        let settings = self.settings.load();
        let mut served = serde_json::Map::new();
        let mut dealt = serde_json::Map::new();
        let upstreams = &settings.upstreams;
        for upstream in upstreams.nodes().iter().chain([upstreams.data()]) {
            if let Some(meters) = self.metrics.node(upstream.id) {
                let totals = meters.totals();
                served.insert(upstream.name.clone(), totals.requests.into());
                dealt.insert(upstream.name.clone(), totals.dealt.into());
            }
        }
        serde_json::json!({
            "served": served,
            "dealt": dealt,
            "in_flight": self.in_flight(),
            "sessions": self.table.len(),
        })
    }
}
