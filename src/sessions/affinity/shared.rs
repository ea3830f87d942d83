//! What the shared store (`[store] kind = "redis"`) needs of the table: taking in a
//! binding another gateway made, restarting an idle clock another gateway saw
//! running, and the sessions requests used here since it last asked.
//!
//! Kept apart from the table's own rules so that a gateway without a shared store
//! reads `affinity.rs` alone; nothing here runs on a request's path.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::{AffinityTable, Entry, SessionKey, SessionState};
use crate::node_id::NodeId;

/// One live entry as the store writes it back after an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    /// The session.
    pub key: SessionKey,
    /// Its node.
    pub node: NodeId,
    /// Logged in or anonymous.
    pub state: SessionState,
    /// How long since a request used it.
    pub idle: Duration,
}

impl AffinityTable {
    /// Takes in a binding another gateway made, or that Redis holds: inserted
    /// (idle for `idle` already) when absent or expired here, moved when bound to
    /// another node or state. An entry that already says the same keeps its
    /// counters, and its clock moves up to what Redis knows (a session in use on
    /// another gateway must not expire on this one). Returns whether the binding
    /// changed.
    pub fn adopt(
        &self,
        key: SessionKey,
        node: NodeId,
        state: SessionState,
        idle: Duration,
    ) -> bool {
        let now = self.clock.now();
        let idle = u32::try_from(idle.as_secs()).unwrap_or(u32::MAX);
        let seen = now.saturating_sub(idle);
        if let Some(mut entry) = self.map.get_mut(&key) {
            if !self.expired(&entry, now) {
                entry.last_seen.fetch_max(seen, Ordering::Relaxed);
                if entry.node == node && entry.state == state {
                    return false;
                }
                self.count(&entry, -1);
                (entry.node, entry.state) = (node, state);
                self.count(&entry, 1);
                return true;
            }
        }
        self.put(
            key,
            Entry {
                node,
                state,
                used: AtomicBool::new(false),
                created: seen,
                last_seen: AtomicU32::new(seen),
                requests: AtomicU32::new(0),
            },
        );
        true
    }

    /// Restarts a session's idle clock because another gateway saw it in use. It
    /// does not count as used here, or the gateways would echo it to each other.
    pub fn touch(&self, key: SessionKey) {
        if let Some(entry) = self.map.get(&key) {
            entry
                .last_seen
                .fetch_max(self.clock.now(), Ordering::Relaxed);
        }
    }

    /// The live sessions a request here used since the last call, with their
    /// state: their TTLs in Redis are refreshed and the other gateways told. One
    /// pass over the table, a shard at a time.
    pub fn take_used(&self) -> Vec<(SessionKey, SessionState)> {
        let now = self.clock.now();
        let used = self
            .map
            .iter()
            .filter(|item| item.used.swap(false, Ordering::Relaxed) && !self.expired(item, now));
        used.map(|item| (*item.key(), item.state)).collect()
    }

    /// Every live entry, for writing the table back to Redis after an outage.
    pub fn live_entries(&self) -> Vec<Live> {
        let now = self.clock.now();
        let live = self.map.iter().filter(|item| !self.expired(item, now));
        live.map(|item| Live {
            key: *item.key(),
            node: item.node,
            state: item.state,
            idle: Duration::from_secs(u64::from(
                now.saturating_sub(item.last_seen.load(Ordering::Relaxed)),
            )),
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_id::node;
    use crate::sessions::affinity::Limits;
    use crate::sessions::clock::Clock;

    fn table() -> (AffinityTable, Clock) {
        let limits = Limits {
            max_sessions: 100,
            logged_in_idle: Duration::from_secs(3600),
            anonymous_idle: Duration::from_secs(600),
        };
        let clock = Clock::default();
        (AffinityTable::new(limits, clock.clone()), clock)
    }

    #[test]
    fn an_adopted_binding_is_counted_and_moves_only_when_it_says_something_new() {
        let (table, _) = table();
        let key = table.key("abc");
        assert!(table.adopt(key, node(1), SessionState::LoggedIn, Duration::ZERO));
        assert_eq!((table.live(node(1)), table.logged_in(node(1))), (1, 1));
        assert!(!table.adopt(key, node(1), SessionState::LoggedIn, Duration::ZERO));
        assert!(table.adopt(key, node(2), SessionState::LoggedIn, Duration::ZERO));
        assert_eq!(
            (table.live(node(1)), table.live(node(2)), table.len()),
            (0, 1, 1)
        );
    }

    #[test]
    fn what_redis_knows_revives_an_entry_expired_here_and_moves_its_clock_up() {
        let (table, clock) = table();
        let key = table.key("abc");
        table.adopt(key, node(1), SessionState::Anonymous, Duration::ZERO);
        clock.advance(Duration::from_secs(700));
        assert_eq!(table.find(key), None, "expired here");
        assert!(table.adopt(
            key,
            node(1),
            SessionState::Anonymous,
            Duration::from_secs(5)
        ));
        assert_eq!(
            table.find(key).map(|f| f.node),
            Some(node(1)),
            "in use elsewhere"
        );
        clock.advance(Duration::from_secs(500));
        table.adopt(
            key,
            node(1),
            SessionState::Anonymous,
            Duration::from_secs(10),
        );
        clock.advance(Duration::from_secs(500));
        assert!(table.find(key).is_some(), "the clock moved up to Redis's");
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn an_adopted_session_already_idle_past_its_limit_is_gone() {
        let (table, _) = table();
        let key = table.key("abc");
        table.adopt(
            key,
            node(0),
            SessionState::Anonymous,
            Duration::from_secs(601),
        );
        assert_eq!(table.find(key), None);
    }

    #[test]
    fn only_requests_here_mark_a_session_used_and_each_is_reported_once() {
        let (table, clock) = table();
        let (a, b) = (table.key("a"), table.key("b"));
        table.bind(a, node(0), SessionState::LoggedIn);
        table.bind(b, node(0), SessionState::Anonymous);
        assert!(table.take_used().is_empty(), "a bind is written already");
        table.find(a);
        clock.advance(Duration::from_secs(500));
        table.touch(b);
        assert_eq!(table.take_used(), [(a, SessionState::LoggedIn)]);
        assert!(table.take_used().is_empty());
        clock.advance(Duration::from_secs(200));
        assert!(table.find(b).is_some(), "the touch restarted b's clock");
    }
}
