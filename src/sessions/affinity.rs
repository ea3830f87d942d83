//! The affinity table: which PHP node holds each Moodle session.
//!
//! Why it looks like this:
//! - **Learned, never claimed.** Entries are written only from a node's own
//!   `Set-Cookie`, never from a cookie a client sends. A forged or stale id is simply
//!   unknown and gets a fresh deal, so a flood of random cookies cannot grow the
//!   table or steer anyone onto a chosen node.
//! - **Keyed by a keyed hash, not by the id.** Session ids are bearer credentials.
//!   The key is SipHash-1-3 of the id under a per-process secret: fixed size (no heap
//!   per entry, a million sessions in a few tens of MiB), the process never stores a
//!   raw credential, and the admin view shows the key itself. 64 bits: at a million
//!   live sessions the chance that any two share a key is about 3 in 100 million,
//!   and an outsider cannot aim for a collision without the secret.
//! - **Bounded and expiring.** Moodle drops idle sessions after `sessiontimeout`
//!   (8 h by default) and never tells the gateway, so idle entries expire by
//!   themselves, and `max_sessions` caps the table, shedding the least recently used
//!   anonymous sessions first.
//! - **Kept across restarts.** A node that still holds a session sets no new cookie,
//!   so a gateway that forgot the table could never relearn it, and with node-local
//!   sessions every student would be logged out by a restart. So the table can be
//!   [exported](AffinityTable::export) to a snapshot and [restored](AffinityTable::restore)
//!   with its key secret; timestamps are wall-clock seconds so they mean the same
//!   in the next process.
//! - **Cheap to read.** A lookup takes one shard's read lock for a few nanoseconds
//!   and bumps atomics inside the entry; 64 shards keep the sweeper's write locks
//!   short and contention low. No guard ever lives across an `.await`: every method
//!   here is synchronous.

use std::collections::BinaryHeap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use siphasher::sip::SipHasher13;

use crate::node_id::{NodeId, MAX_NODE_IDS};
use crate::sessions::clock::Clock;
use crate::sessions::snapshot::SnapshotEntry;

mod shared;

/// The table key of one session: a keyed hash of its id, safe to show and log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionKey(u64);

impl SessionKey {
    /// The first and last key whose hex form starts with `prefix` (1 to 16 hex
    /// digits), for a search by the first digits a person copied.
    pub fn prefix_range(prefix: &str) -> Option<(SessionKey, SessionKey)> {
        let hex = prefix.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex || !(1..=16).contains(&prefix.len()) {
            return None;
        }
        let value = u64::from_str_radix(prefix, 16).ok()?;
        // The bits the missing digits stand for: anything from all 0s to all 1s.
        let free = 4 * (16 - prefix.len() as u32);
        let rest = if free == 0 {
            0
        } else {
            u64::MAX >> (64 - free)
        };
        let low = value << free;
        Some((SessionKey(low), SessionKey(low | rest)))
    }

    /// The key just below this one (`None` for the first key), for paging that must
    /// include this key.
    pub fn before(self) -> Option<SessionKey> {
        self.0.checked_sub(1).map(SessionKey)
    }

    /// Appends the 16-hex-digit form to `out`, without the formatting machinery
    /// (the shared store writes one for every new session).
    pub fn push_hex(self, out: &mut String) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for shift in (0..16).rev() {
            out.push(char::from(DIGITS[((self.0 >> (shift * 4)) & 0xf) as usize]));
        }
    }

    /// Parses the 16-hex-digit form the admin API shows.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 16 {
            return None;
        }
        u64::from_str_radix(text, 16).ok().map(Self)
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Whether a session belongs to a logged-in student, as far as the gateway saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionState {
    /// A guest or not-yet-logged-in visitor (login page, crawlers).
    Anonymous,
    /// The id was issued by a login (or another rotation inside a session).
    LoggedIn,
}

/// Idle limits and the size bound, from `[session]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most entries the table keeps.
    pub max_sessions: usize,
    /// Idle time after which a logged-in entry expires.
    pub logged_in_idle: Duration,
    /// Idle time after which an anonymous entry expires.
    pub anonymous_idle: Duration,
}

/// A live session as [`AffinityTable::find`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The node it is bound to.
    pub node: NodeId,
    /// Anonymous or logged in.
    pub state: SessionState,
    /// How long it had been idle before this request.
    pub idle: Duration,
}

/// One bound session: 16 bytes, next to its 8-byte key.
#[derive(Debug)]
struct Entry {
    node: NodeId,
    state: SessionState,
    /// A request here used it since the shared store last refreshed it (the byte
    /// after `state` was padding).
    used: AtomicBool,
    created: u32,
    last_seen: AtomicU32,
    requests: AtomicU32,
}

/// A copy of one entry for the admin view.
#[derive(Debug, Clone, Copy)]
pub struct EntryView {
    /// The session's key (never its id).
    pub key: SessionKey,
    /// The node it is bound to.
    pub node: NodeId,
    /// Anonymous or logged in.
    pub state: SessionState,
    /// When it was bound, Unix seconds.
    pub created: u64,
    /// When a request last used it, Unix seconds.
    pub last_seen: u64,
    /// Requests routed by it.
    pub requests: u32,
}

/// Live and logged-in counts of one node, kept in step with the table.
#[derive(Debug, Default)]
struct NodeCounts {
    live: AtomicU64,
    logged_in: AtomicU64,
}

/// The keys are already uniform hashes: hashing them again would only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const SHARDS: usize = 64;

/// The session → node map. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct AffinityTable {
    map: DashMap<SessionKey, Entry, BuildHasherDefault<PassThrough>>,
    secret: (u64, u64),
    nodes: Box<[NodeCounts]>,
    len: AtomicUsize,
    limits: Limits,
    clock: Clock,
    evicting: AtomicBool,
    over_bound: tokio::sync::Notify,
    /// Set once, by a process handing over to its successor: every change from then
    /// on is also sent there (see [`follow`](Self::follow)).
    followed: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Change>>,
}

/// One change to the table, as a successor process must repeat it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The session is (now) bound to this node.
    Bound(SessionKey, NodeId, SessionState),
    /// The session is gone.
    Forgotten(SessionKey),
}

impl AffinityTable {
    /// An empty table with a fresh random key secret.
    pub fn new(limits: Limits, clock: Clock) -> Self {
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).expect("the OS random source is available");
        Self::with_secret(secret, limits, clock)
    }

    /// An empty table keyed with `secret`: a snapshot's keys are only valid under
    /// the secret they were made with.
    pub fn with_secret(secret: [u8; 16], limits: Limits, clock: Clock) -> Self {
        let half = |i: usize| u64::from_le_bytes(secret[i..i + 8].try_into().expect("8 bytes"));
        Self {
            map: DashMap::with_hasher_and_shard_amount(BuildHasherDefault::default(), SHARDS),
            secret: (half(0), half(8)),
            nodes: (0..MAX_NODE_IDS).map(|_| NodeCounts::default()).collect(),
            len: AtomicUsize::new(0),
            limits,
            clock,
            evicting: AtomicBool::new(false),
            over_bound: tokio::sync::Notify::new(),
            followed: std::sync::OnceLock::new(),
        }
    }

    /// From now on, every bind, move and forget is also sent to the receiver: a
    /// process handing its students to a successor keeps it told of what the
    /// requests it still finishes learn (a login in flight), so no session it binds
    /// after its last save is unknown there. Unbounded because the table must never
    /// wait on a request's path; it lives only for the old process's drain. `None`
    /// when the table is already followed.
    pub fn follow(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Change>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.followed.set(tx).ok()?;
        Some(rx)
    }

    fn tell(&self, change: impl FnOnce() -> Change) {
        if let Some(follower) = self.followed.get() {
            let _ = follower.send(change());
        }
    }

    /// The table's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The key secret, for the snapshot.
    pub fn secret(&self) -> [u8; 16] {
        let mut secret = [0u8; 16];
        secret[..8].copy_from_slice(&self.secret.0.to_le_bytes());
        secret[8..].copy_from_slice(&self.secret.1.to_le_bytes());
        secret
    }

    /// The key of a raw session id.
    pub fn key(&self, session_id: &str) -> SessionKey {
        let mut hasher = SipHasher13::new_with_keys(self.secret.0, self.secret.1);
        session_id.as_bytes().hash(&mut hasher);
        SessionKey(hasher.finish())
    }

    /// The node of a live session, counting this request as activity on it.
    /// An entry idle past its limit is treated as gone even before the sweeper runs.
    pub fn lookup(&self, key: SessionKey) -> Option<NodeId> {
        self.find(key).map(|found| found.node)
    }

    /// [`lookup`](Self::lookup), with what the entry said before this request: the
    /// session-loss detector needs to know whether the student was logged in, and
    /// for how long the session had been idle.
    pub fn find(&self, key: SessionKey) -> Option<Found> {
        let now = self.clock.now();
        let entry = self.map.get(&key)?;
        if self.expired(&entry, now) {
            return None;
        }
        // Seconds: all but a session's first request in a second leave it as it
        // is, without the locked instruction a swap costs every time.
        let last_seen = entry.last_seen.load(Ordering::Relaxed);
        if last_seen != now {
            entry.last_seen.store(now, Ordering::Relaxed);
        }
        entry.requests.fetch_add(1, Ordering::Relaxed);
        if !entry.used.load(Ordering::Relaxed) {
            entry.used.store(true, Ordering::Relaxed);
        }
        Some(Found {
            node: entry.node,
            state: entry.state,
            idle: Duration::from_secs(u64::from(now.saturating_sub(last_seen))),
        })
    }

    /// Whether `key` is a live, logged-in session, without counting this as a use
    /// of it (the request's own lookup does that): the rate limits never touch a
    /// logged-in student, and ask before the journey does.
    pub fn is_logged_in(&self, key: SessionKey) -> bool {
        let Some(entry) = self.map.get(&key) else {
            return false;
        };
        entry.state == SessionState::LoggedIn && !self.expired(&entry, self.clock.now())
    }

    /// Binds a session a node just issued to that node.
    pub fn bind(&self, key: SessionKey, node: NodeId, state: SessionState) {
        let now = self.clock.now();
        let entry = Entry {
            node,
            state,
            used: AtomicBool::new(false),
            created: now,
            last_seen: AtomicU32::new(now),
            requests: AtomicU32::new(0),
        };
        self.put(key, entry);
    }

    /// Inserts or replaces one entry, keeping the counts and waking the sweeper
    /// when the table goes over its bound.
    fn put(&self, key: SessionKey, entry: Entry) {
        self.tell(|| Change::Bound(key, entry.node, entry.state));
        // Counted before the insert, so a concurrent forget of this very entry can
        // never take a counter below zero.
        self.count(&entry, 1);
        let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(replaced) = self.map.insert(key, entry) {
            self.count(&replaced, -1);
            self.len.fetch_sub(1, Ordering::Relaxed);
        } else if len > self.limits.max_sessions {
            // Shedding scans the table: never on a request's path. The sweeper wakes.
            self.over_bound.notify_one();
        }
    }

    /// Completes when a bind took the table over `max_sessions` (the sweeper waits here).
    pub async fn over_bound(&self) {
        self.over_bound.notified().await;
    }

    /// Moves a session from `from` to `to` (its node left, or is down and the
    /// session store lets another node serve it), unless a concurrent request moved it
    /// first; returns the node it is bound to now, so concurrent requests of one
    /// student all land on the same new node. `None` if the session is gone.
    pub fn rebind(&self, key: SessionKey, from: NodeId, to: NodeId) -> Option<NodeId> {
        let mut entry = self.map.get_mut(&key)?;
        if entry.node == from {
            self.count(&entry, -1);
            entry.node = to;
            self.count(&entry, 1);
            self.tell(|| Change::Bound(key, to, entry.state));
        }
        Some(entry.node)
    }

    /// The node rotated a session id (login, logout, timeout): the new id lives on
    /// the same node. The new entry goes in before the old one leaves, so a request
    /// still carrying the old id meanwhile finds its node either way. `true` when
    /// this call retired the old id (of concurrent requests that each saw the same
    /// rotation, exactly one gets `true`).
    pub fn rotate(
        &self,
        old: SessionKey,
        new: SessionKey,
        node: NodeId,
        state: SessionState,
    ) -> bool {
        self.bind(new, node, state);
        self.forget(old)
    }

    /// Drops a session (the node cleared its cookie, or an admin evicted it).
    pub fn forget(&self, key: SessionKey) -> bool {
        match self.map.remove(&key) {
            Some((_, entry)) => {
                self.tell(|| Change::Forgotten(key));
                self.count(&entry, -1);
                self.len.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Removes every expired entry; returns how many. Each shard is locked once for a
    /// pass over its own entries (a sixty-fourth of the table).
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.remove_where(|entry| self.expired(entry, now))
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live sessions bound to `node`.
    pub fn live(&self, node: NodeId) -> u64 {
        self.nodes[node.index()].live.load(Ordering::Relaxed)
    }

    /// Logged-in sessions bound to `node`.
    pub fn logged_in(&self, node: NodeId) -> u64 {
        self.nodes[node.index()].logged_in.load(Ordering::Relaxed)
    }

    /// Logged-in sessions on every node, including nodes no longer configured.
    pub fn logged_in_total(&self) -> u64 {
        let each = self
            .nodes
            .iter()
            .map(|c| c.logged_in.load(Ordering::Relaxed));
        each.sum()
    }

    /// One entry, for the admin lookup.
    pub fn view(&self, key: SessionKey) -> Option<EntryView> {
        self.map.get(&key).map(|entry| self.view_of(key, &entry))
    }

    /// Up to `limit` entries with keys above `after`, in key order, optionally only
    /// those of one node. Key order stays stable while the table changes, so paging
    /// never repeats or skips a session that stayed bound.
    pub fn page(
        &self,
        after: Option<SessionKey>,
        limit: usize,
        node: Option<NodeId>,
    ) -> Vec<EntryView> {
        self.page_where((after, None), limit, |n, _| {
            node.is_none_or(|node| n == node)
        })
    }

    /// Like [`page`](Self::page), with the entries `wanted(node, state)` chooses and
    /// keys up to `last` only (the end of a hash-prefix search), for the dashboard's
    /// filters: one scan however few entries match.
    pub fn page_where(
        &self,
        (after, last): (Option<SessionKey>, Option<SessionKey>),
        limit: usize,
        wanted: impl Fn(NodeId, SessionState) -> bool,
    ) -> Vec<EntryView> {
        let mut smallest: BinaryHeap<SessionKey> = BinaryHeap::with_capacity(limit + 1);
        for item in self.map.iter() {
            let key = *item.key();
            let wanted = after.is_none_or(|a| key > a)
                && last.is_none_or(|l| key <= l)
                && wanted(item.node, item.state);
            if wanted && (smallest.len() < limit || smallest.peek().is_some_and(|&max| key < max)) {
                smallest.push(key);
                if smallest.len() > limit {
                    smallest.pop();
                }
            }
        }
        let mut keys = smallest.into_vec();
        keys.sort_unstable();
        keys.into_iter().filter_map(|key| self.view(key)).collect()
    }

    /// Every live entry as a snapshot record, its node given by `node_index` (an
    /// index into the snapshot's node list; `None` leaves the entry out). Locks one
    /// shard at a time, briefly: requests keep flowing while a snapshot is written.
    pub fn export<'a>(
        &'a self,
        node_index: impl Fn(NodeId) -> Option<u16> + 'a,
    ) -> impl Iterator<Item = SnapshotEntry> + 'a {
        let now = self.clock.now();
        self.map.iter().filter_map(move |item| {
            let entry = item.value();
            if self.expired(entry, now) {
                return None;
            }
            Some(SnapshotEntry {
                key: item.key().0,
                node: node_index(entry.node)?,
                logged_in: entry.state == SessionState::LoggedIn,
                created: self.clock.to_unix(entry.created),
                last_seen: self.clock.to_unix(entry.last_seen.load(Ordering::Relaxed)),
                requests: entry.requests.load(Ordering::Relaxed),
            })
        })
    }

    /// Loads snapshot records made under this table's secret, their node given by
    /// `node_id` (`None` for a node no longer configured: that session is left out
    /// and will be dealt afresh). Entries that expired meanwhile are skipped.
    /// Returns how many were restored.
    pub fn restore(
        &self,
        entries: impl IntoIterator<Item = SnapshotEntry>,
        node_id: impl Fn(u16) -> Option<NodeId>,
    ) -> usize {
        let now = self.clock.now();
        let mut restored = 0;
        for record in entries {
            let Some(node) = node_id(record.node) else {
                continue;
            };
            let state = if record.logged_in {
                SessionState::LoggedIn
            } else {
                SessionState::Anonymous
            };
            let entry = Entry {
                node,
                state,
                used: AtomicBool::new(false),
                created: self.clock.from_unix(record.created),
                last_seen: AtomicU32::new(self.clock.from_unix(record.last_seen)),
                requests: AtomicU32::new(record.requests),
            };
            if self.expired(&entry, now) {
                continue;
            }
            self.count(&entry, 1);
            self.len.fetch_add(1, Ordering::Relaxed);
            if let Some(replaced) = self.map.insert(SessionKey(record.key), entry) {
                self.count(&replaced, -1);
                self.len.fetch_sub(1, Ordering::Relaxed);
            } else {
                restored += 1;
            }
        }
        restored
    }

    fn view_of(&self, key: SessionKey, entry: &Entry) -> EntryView {
        EntryView {
            key,
            node: entry.node,
            state: entry.state,
            created: self.clock.to_unix(entry.created),
            last_seen: self.clock.to_unix(entry.last_seen.load(Ordering::Relaxed)),
            requests: entry.requests.load(Ordering::Relaxed),
        }
    }

    fn expired(&self, entry: &Entry, now: u32) -> bool {
        let idle = now.saturating_sub(entry.last_seen.load(Ordering::Relaxed));
        let limit = match entry.state {
            SessionState::Anonymous => self.limits.anonymous_idle,
            SessionState::LoggedIn => self.limits.logged_in_idle,
        };
        u64::from(idle) > limit.as_secs()
    }

    fn count(&self, entry: &Entry, delta: i64) {
        let counts = &self.nodes[entry.node.index()];
        let add = |counter: &AtomicU64| {
            if delta > 0 {
                counter.fetch_add(1, Ordering::Relaxed);
            } else {
                counter.fetch_sub(1, Ordering::Relaxed);
            }
        };
        add(&counts.live);
        if entry.state == SessionState::LoggedIn {
            add(&counts.logged_in);
        }
    }

    fn remove_where(&self, doomed: impl Fn(&Entry) -> bool) -> usize {
        let removed = AtomicUsize::new(0);
        self.map.retain(|_, entry| {
            let drop = doomed(entry);
            if drop {
                self.count(entry, -1);
                removed.fetch_add(1, Ordering::Relaxed);
            }
            !drop
        });
        let removed = removed.into_inner();
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Over the bound: drop the least recently used twentieth of the table, anonymous
    /// sessions first, so one pass pays for many inserts. A pass scans the whole
    /// table, so the fraction sets what a flood of new visitors costs at the bound:
    /// with a hundredth, a pass every 10,000 binds of a million-entry table cost W2
    /// 14 % more CPU per request; a twentieth makes passes five times rarer. One shedder at a time; the
    /// table may exceed the bound by the inserts made until the sweeper has run.
    /// Run by the sweeper, off the request path; returns how many entries went.
    pub fn shed(&self) -> usize {
        if self.len() <= self.limits.max_sessions || self.evicting.swap(true, Ordering::Acquire) {
            return 0;
        }
        let target = (self.limits.max_sessions / 20).max(1)
            + self.len().saturating_sub(self.limits.max_sessions);
        let mut left = target;
        for state in [SessionState::Anonymous, SessionState::LoggedIn] {
            if left == 0 {
                break;
            }
            left -= self.shed_oldest(state, left);
        }
        tracing::debug!(shed = target - left, "affinity table at its bound");
        self.evicting.store(false, Ordering::Release);
        target - left
    }

    /// Drops up to `count` of the least recently seen entries in `state`.
    fn shed_oldest(&self, state: SessionState, count: usize) -> usize {
        let mut seen: Vec<u32> = self
            .map
            .iter()
            .filter(|e| e.state == state)
            .map(|e| e.last_seen.load(Ordering::Relaxed))
            .collect();
        if seen.is_empty() {
            return 0;
        }
        let nth = count.min(seen.len()) - 1;
        let (_, &mut cutoff, _) = seen.select_nth_unstable(nth);
        let strictly_older = seen.iter().filter(|&&t| t < cutoff).count();
        let at_cutoff = AtomicUsize::new(count.min(seen.len()) - strictly_older);
        self.remove_where(|entry| {
            let last = entry.last_seen.load(Ordering::Relaxed);
            entry.state == state
                && (last < cutoff
                    || (last == cutoff
                        && at_cutoff
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_ok()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_id::node;

    fn table(max_sessions: usize) -> AffinityTable {
        let limits = Limits {
            max_sessions,
            logged_in_idle: Duration::from_secs(8 * 3600),
            anonymous_idle: Duration::from_secs(3600),
        };
        AffinityTable::new(limits, Clock::default())
    }

    #[test]
    fn keys_are_keyed_hashes_not_ids() {
        let (a, b) = (table(10), table(10));
        let id = "abcdefghijklmnopqrstuvwxyz";
        assert_eq!(a.key(id), a.key(id));
        assert_ne!(a.key(id), b.key(id), "each process has its own secret");
        // Hex only, so no run of the id's letters past `f`: a hash, not the id.
        // ("abc" would turn up in one random key in a few hundred.)
        let shown = a.key(id).to_string();
        assert!(shown.chars().all(|c| c.is_ascii_hexdigit()), "{shown}");
        assert!(!shown.contains("ghij"), "{shown}");
        assert_eq!(
            SessionKey::from_hex(&a.key(id).to_string()),
            Some(a.key(id))
        );
    }

    #[test]
    fn a_bound_session_is_found_and_counted() {
        let t = table(10);
        let key = t.key("session-one-xxxxxxxxxxxxxx");
        assert_eq!(t.lookup(key), None);
        t.bind(key, node(2), SessionState::Anonymous);
        assert_eq!(t.lookup(key), Some(node(2)));
        assert_eq!(t.view(key).unwrap().requests, 1);
        assert_eq!((t.len(), t.live(node(2)), t.logged_in(node(2))), (1, 1, 0));
    }

    #[test]
    fn login_rotation_moves_the_session_to_its_new_id_on_the_same_node() {
        let t = table(10);
        let (a, b) = (
            t.key("anonymous-id-xxxxxxxxxxxxx"),
            t.key("logged-in-id-xxxxxxxxxxxxx"),
        );
        t.bind(a, node(1), SessionState::Anonymous);
        t.rotate(a, b, node(1), SessionState::LoggedIn);
        assert_eq!((t.lookup(a), t.lookup(b)), (None, Some(node(1))));
        assert_eq!((t.len(), t.live(node(1)), t.logged_in(node(1))), (1, 1, 1));
    }

    #[test]
    fn idle_entries_expire_by_state() {
        let t = table(10);
        let (anon, user) = (
            t.key("anon-xxxxxxxxxxxxxxxxxxxxx"),
            t.key("user-xxxxxxxxxxxxxxxxxxxxx"),
        );
        t.bind(anon, node(0), SessionState::Anonymous);
        t.bind(user, node(1), SessionState::LoggedIn);
        t.clock().advance(Duration::from_secs(3601));
        assert_eq!(t.lookup(anon), None, "anonymous idle limit passed");
        assert_eq!(t.lookup(user), Some(node(1)));
        assert_eq!(t.sweep(), 1);
        t.clock().advance(Duration::from_secs(8 * 3600 + 1));
        assert_eq!(t.sweep(), 1);
        assert!(t.is_empty());
        assert_eq!(
            (t.live(node(0)), t.live(node(1)), t.logged_in(node(1))),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_session_in_use_never_idles_out_however_old_it_is() {
        let t = table(10);
        let key = t.key("busy-xxxxxxxxxxxxxxxxxxxxx");
        t.bind(key, node(3), SessionState::Anonymous);
        for _ in 0..3 {
            t.clock().advance(Duration::from_secs(3000));
            assert_eq!(t.lookup(key), Some(node(3)), "used within the idle limit");
        }
        assert_eq!(t.sweep(), 0, "9,000 s old, just used: kept");
        t.clock().advance(Duration::from_secs(3601));
        assert_eq!(
            t.lookup(key),
            None,
            "idle past the limit since its last use"
        );
    }

    #[test]
    fn at_the_bound_the_oldest_anonymous_sessions_go_first() {
        let t = table(100);
        let ids = |prefix: &str, n: usize| -> Vec<SessionKey> {
            (0..n)
                .map(|i| t.key(&format!("{prefix}-{i:022}")))
                .collect()
        };
        let (users, old_guests, new_guests) = (ids("user", 50), ids("old", 30), ids("new", 30));
        for &k in &users {
            t.bind(k, node(0), SessionState::LoggedIn);
        }
        for &k in &old_guests {
            t.bind(k, node(1), SessionState::Anonymous);
        }
        t.clock().advance(Duration::from_secs(10));
        for &k in &new_guests {
            t.bind(k, node(2), SessionState::Anonymous);
        }
        assert_eq!(t.len(), 110, "binding never scans the table");
        assert_eq!(t.shed(), 15, "the overflow plus a twentieth of the bound");
        assert_eq!(t.len(), 95);
        let alive = |keys: &[SessionKey]| keys.iter().filter(|&&k| t.view(k).is_some()).count();
        assert_eq!(alive(&users), 50, "no logged-in session was shed");
        assert_eq!(alive(&new_guests), 30, "the recently seen guests stay");
        assert_eq!(
            alive(&old_guests),
            15,
            "the least recently seen guests went"
        );
        assert_eq!(
            t.live(node(0)) + t.live(node(1)) + t.live(node(2)),
            t.len() as u64
        );
        assert_eq!(t.shed(), 0, "under the bound nothing more goes");
    }

    #[test]
    fn the_hex_written_by_hand_is_the_hex_shown() {
        for raw in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut hex = String::new();
            SessionKey(raw).push_hex(&mut hex);
            assert_eq!(hex, SessionKey(raw).to_string());
        }
    }

    #[test]
    fn a_hash_prefix_names_the_range_of_keys_that_start_with_it() {
        let range =
            |p: &str| SessionKey::prefix_range(p).map(|(l, h)| (l.to_string(), h.to_string()));
        let pair = |l: &str, h: &str| Some((l.to_owned(), h.to_owned()));
        assert_eq!(range("ab"), pair("ab00000000000000", "abffffffffffffff"));
        assert_eq!(
            range("0123456789abcdef"),
            pair("0123456789abcdef", "0123456789abcdef")
        );
        for bad in ["", "+1", "xyz", "0123456789abcdef0"] {
            assert_eq!(range(bad), None, "{bad:?}");
        }
        assert_eq!(SessionKey(0).before(), None);
        assert_eq!(SessionKey(5).before(), Some(SessionKey(4)));
    }

    #[test]
    fn a_filtered_page_holds_only_what_matches_within_the_range() {
        let table = table(100);
        for i in 0..40u64 {
            let state = if i % 4 == 0 {
                SessionState::LoggedIn
            } else {
                SessionState::Anonymous
            };
            table.bind(SessionKey(i << 56), node((i % 2) as usize), state);
        }
        let logged_in = table.page_where((None, None), 100, |_, s| s == SessionState::LoggedIn);
        assert_eq!(logged_in.len(), 10);
        let (low, high) = SessionKey::prefix_range("1").unwrap();
        let prefixed = table.page_where((low.before(), Some(high)), 100, |_, _| true);
        let keys: Vec<_> = prefixed.iter().map(|v| v.key.to_string()).collect();
        assert_eq!(
            keys,
            [
                "1000000000000000",
                "1100000000000000",
                "1200000000000000",
                "1300000000000000",
                "1400000000000000",
                "1500000000000000",
                "1600000000000000",
                "1700000000000000",
                "1800000000000000",
                "1900000000000000",
                "1a00000000000000",
                "1b00000000000000",
                "1c00000000000000",
                "1d00000000000000",
                "1e00000000000000",
                "1f00000000000000"
            ]
        );
    }

    #[test]
    fn pages_walk_the_table_in_key_order_without_repeats() {
        let t = table(1000);
        for i in 0..25 {
            t.bind(
                t.key(&format!("id-{i:024}")),
                node(i % 4),
                SessionState::Anonymous,
            );
        }
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = t.page(cursor, 10, None);
            seen.extend(page.iter().map(|e| e.key));
            if page.len() < 10 {
                break;
            }
            cursor = page.last().map(|e| e.key);
        }
        assert_eq!(seen.len(), 25);
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert!(t
            .page(None, 100, Some(node(3)))
            .iter()
            .all(|e| e.node == node(3)));
    }
}
