//! Several gateways, one truth: the affinity table, the deal and the admin state
//! shared through Redis (`[store] kind = "redis"`). With `kind = "memory"` (the
//! default) [`Store`] is empty and every call returns at once.
//!
//! Why it looks like this:
//! - **The local table stays the hot path.** Every gateway keeps the whole table in
//!   memory, as a single gateway does; Redis is where the gateways meet, never where
//!   a request waits. A lookup only goes to Redis when the local table misses (a
//!   session bound on another gateway a moment ago, or a gateway that just started),
//!   and the deal asks it once per new session, not per request.
//! - **Changes are written through, off the request path.** A bind, rotation,
//!   logout, admin eviction or admin state change is queued to one writer task,
//!   which sends what has gathered as one pipeline: the change, then one `PUBLISH`
//!   that carries all of them. A queue that is full, or a Redis that is down, costs
//!   the change its write, never the request its answer; the next resync writes back
//!   what was missed.
//! - **Pub/sub, not keyspace notifications or streams.** The others must learn a
//!   change within milliseconds and every gateway already holds the state, so a
//!   missed message only needs a resync, never a replay: pub/sub carries exactly
//!   that, on any Redis, without `notify-keyspace-events` (off by default, and
//!   global to the server) and without a stream to trim.
//! - **Expiry is Redis's.** A session's key lives for its idle limit (`PX`); the
//!   sweeper refreshes the TTLs of the sessions used here once a pass, and tells
//!   the others, so a session in use on one gateway never expires on another.
//! - **Redis down never stops a student.** Calls on a request's path wait at most
//!   `store.timeout`, and not at all while the link is known to be down: the local
//!   table and the route cookie route, the local counter deals. When the link comes
//!   back, the gateway resynchronises (see `resync`).
//! - **Conflicts: the first writer wins.** What this gateway bound while Redis was
//!   away is written back with `SET NX`: a session some other gateway wrote first
//!   keeps that gateway's node, and this one adopts it, because the others have
//!   been routing it there all along. A session moving off a node, and an admin
//!   taking a node out, are compare-and-set in Redis for the same reason (see
//!   `agree`).
//!
//! The store knows sessions and node names, never HTTP: what it needs of the
//! gateway is the [`Local`] trait.

mod acme;
mod agree;
mod heartbeat;
mod link;
mod resync;
mod starts;
mod supervise;
mod tickets;
mod wire;
mod writer;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;

use crate::config::{NodeState, RedisConfig};
use crate::metrics::{Fallback, StoreMeters};
use crate::node_id::NodeId;
use crate::sessions::affinity::{AffinityTable, Limits, SessionKey, SessionState};

pub use acme::{AcmeTurn, LEASE as ACME_LEASE};
pub use agree::Checked;
use link::Link;
pub use starts::{Leased, StartLease};
pub use wire::Change;

/// Changes waiting for the writer. A burst of new sessions fits many times over;
/// past it a change is not written at once but at the next resync.
const QUEUE: usize = 65_536;

/// Changes per pipeline, keys per `SCAN` step.
const BATCH: usize = 512;

/// Logouts and admin changes kept while Redis is away, replayed when it returns
/// (binds need no keeping: the local table holds them).
const STASH: usize = 65_536;

/// What the store needs of the gateway it serves.
pub trait Local: Send + Sync + 'static {
    /// The local affinity table.
    fn table(&self) -> &AffinityTable;
    /// The id of the node called `name` in the running config.
    fn node_id(&self, name: &str) -> Option<NodeId>;
    /// The name of node `id` in the running config.
    fn node_name(&self, id: NodeId) -> Option<String>;
    /// Another gateway (`by`) changed a node's admin state.
    fn node_state(&self, name: &str, state: NodeState, by: &str);
    /// The figures this gateway adds to its heartbeat.
    fn beat(&self) -> serde_json::Value;
}

/// A session Redis knows and the local table did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Logged in or anonymous.
    pub state: SessionState,
    /// Its node's name.
    pub node: String,
    /// How long it has been idle, as far as its TTL tells.
    pub idle: Duration,
    /// The gateway that bound it.
    pub bound_by: String,
}

/// The shared store, or nothing. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Store(Option<Arc<Shared>>);

/// One change for the writer.
#[derive(Debug, Clone)]
enum Op {
    Bind(SessionKey, SessionState, String),
    Forget(SessionKey),
    Touch(Vec<(SessionKey, SessionState)>),
    NodeState(String, NodeState),
}

#[derive(Debug)]
struct Shared {
    config: RedisConfig,
    keys: wire::Keys,
    /// `name/instance`: who sent a message, so a gateway skips its own.
    sender: String,
    limits: Limits,
    link: Link,
    queue: mpsc::Sender<Op>,
    queued: Mutex<Option<mpsc::Receiver<Op>>>,
    /// Some bind did not reach Redis: write the table back at the next connect.
    /// Set at start, for what the snapshot restored.
    dirty: AtomicBool,
    /// Logouts, evictions and admin states that did not reach Redis.
    stash: Mutex<VecDeque<Op>>,
    meters: StoreMeters,
    /// Unix seconds when this gateway started.
    started: u64,
    /// Names `store.secret` without revealing it: gateways whose fingerprints
    /// differ hash sessions differently and share nothing.
    fingerprint: String,
    /// Redis holds the other gateways' fingerprint, not this one's (each beat).
    foreign_secret: AtomicBool,
    /// Until when (milliseconds since `epoch`) requests do without Redis, because a
    /// call just ran past `store.timeout`: one slow answer costs one request the
    /// timeout, not every call of every request until the heartbeat gives up.
    slow_until: AtomicU64,
    epoch: std::time::Instant,
}

impl Store {
    /// No shared store: this gateway's own table.
    pub fn memory() -> Self {
        Self(None)
    }

    /// The store `config` names; nothing is connected until [`run`](Self::run).
    pub fn redis(config: &RedisConfig, limits: Limits, meters: StoreMeters) -> Self {
        let (queue, queued) = mpsc::channel(QUEUE);
        let mut instance = [0u8; 4];
        getrandom::fill(&mut instance).expect("the OS random source is available");
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self(Some(Arc::new(Shared {
            keys: wire::Keys::new(&config.prefix),
            sender: format!("{}/{:08x}", config.name, u32::from_le_bytes(instance)),
            config: config.clone(),
            limits,
            link: Link::default(),
            queue,
            queued: Mutex::new(Some(queued)),
            dirty: AtomicBool::new(true),
            stash: Mutex::new(VecDeque::new()),
            meters,
            started,
            fingerprint: fingerprint(config),
            foreign_secret: AtomicBool::new(false),
            slow_until: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        })))
    }

    /// Whether the gateways share this store.
    pub fn is_shared(&self) -> bool {
        self.0.is_some()
    }

    /// This gateway's name among the others (`None` without a shared store).
    pub fn name(&self) -> Option<&str> {
        self.0.as_ref().map(|s| s.config.name.as_str())
    }

    /// Whether this gateway's `store.secret` is the live gateways' (`None` without
    /// a shared store). With another secret it shares nothing with them: every
    /// session hashes to another key.
    pub fn secret_matches(&self) -> Option<bool> {
        (self.0.as_ref()).map(|s| !s.foreign_secret.load(Ordering::Relaxed))
    }

    /// Whether the link to Redis is up (`None` without a shared store).
    pub fn is_up(&self) -> Option<bool> {
        self.0.as_ref().map(|s| s.link.current().is_some())
    }

    /// A session the local table missed, as Redis knows it; `None` when Redis does
    /// not know it, or is down or slower than `store.timeout` (counted).
    pub async fn lookup(&self, key: SessionKey) -> Option<Stored> {
        let shared = self.0.as_ref()?;
        let stored = shared.read(key, Some(Fallback::Lookup)).await?;
        shared.meters.looked_up(stored.is_some());
        stored
    }

    /// The next ticket of the deal every gateway shares; `None` without a shared
    /// store, or when Redis is down or slow (counted: the caller deals locally).
    pub async fn ticket(&self) -> Option<usize> {
        let shared = self.0.as_ref()?;
        let ticket = shared
            .ask(Some(Fallback::Deal), |mut conn| async move {
                redis::cmd("INCR")
                    .arg(shared.keys.deal())
                    .query_async::<u64>(&mut conn)
                    .await
            })
            .await?;
        usize::try_from(ticket).ok()
    }

    /// A node issued a session, or a session moved: written to Redis and told to
    /// the others before this returns, within `store.timeout`. Past it the writer
    /// tries again in the background; with Redis down, the next resync writes it.
    pub async fn bound(&self, key: SessionKey, state: SessionState, node: &str) {
        let Some(shared) = &self.0 else {
            return;
        };
        let op = Op::Bind(key, state, node.to_owned());
        let mut pipe = redis::pipe();
        let change = writer::command(shared, &mut pipe, &op);
        let message = wire::message(&shared.sender, &[change]);
        pipe.publish(shared.keys.events(), message).ignore();
        let written = shared
            .ask(None, |mut conn| async move {
                pipe.query_async::<()>(&mut conn).await
            })
            .await;
        if written.is_none() {
            self.send(|| op);
        }
    }

    /// A session is gone (Moodle cleared it, an admin evicted it).
    pub fn forgot(&self, key: SessionKey) {
        self.send(|| Op::Forget(key));
    }

    /// An admin changed a node's state here.
    pub fn node_state(&self, node: &str, state: NodeState) {
        self.send(|| Op::NodeState(node.to_owned(), state));
    }

    /// Sessions used here since the last sweep: refresh their TTLs and tell the
    /// others they are still in use.
    pub fn used(&self, sessions: Vec<(SessionKey, SessionState)>) {
        for chunk in sessions.chunks(BATCH) {
            self.send(|| Op::Touch(chunk.to_vec()));
        }
    }

    fn send(&self, op: impl FnOnce() -> Op) {
        let Some(shared) = &self.0 else {
            return;
        };
        if let Err(full) = shared.queue.try_send(op()) {
            shared.offline(vec![full.into_inner()]);
        }
    }

    /// Runs the link, the writer and the heartbeat until `stop` fires.
    pub async fn run(self, local: Arc<dyn Local>, stop: tokio::sync::watch::Receiver<bool>) {
        let Some(shared) = self.0 else {
            return;
        };
        let queued = shared
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(queued) = queued else {
            return; // already running
        };
        tokio::join!(
            supervise::supervise(shared.clone(), local.clone(), stop.clone()),
            writer::write(shared.clone(), queued, stop.clone()),
            heartbeat::heartbeat(shared, local, stop),
        );
    }

    /// What Redis holds for one session, for the admin view (an admin's question,
    /// not a request's: not counted).
    pub async fn describe(&self, key: SessionKey) -> Option<Stored> {
        self.0.as_ref()?.read(key, None).await?
    }

    /// Every live gateway's last heartbeat, by name.
    pub async fn gateways(&self) -> Result<Vec<serde_json::Value>, String> {
        match &self.0 {
            Some(shared) => heartbeat::gateways(shared).await,
            None => Ok(Vec::new()),
        }
    }
}

impl Shared {
    /// A session's value and TTL; the outer `None` when Redis did not answer.
    async fn read(&self, key: SessionKey, fallback: Option<Fallback>) -> Option<Option<Stored>> {
        let (value, pttl) = self
            .ask(fallback, |mut conn| async move {
                let redis_key = self.keys.session(key);
                let asked = redis::pipe().get(&redis_key).pttl(&redis_key).clone();
                asked.query_async::<(Option<String>, i64)>(&mut conn).await
            })
            .await?;
        let Some((state, node, gateway)) = value.as_deref().and_then(wire::parse_session) else {
            return Some(None);
        };
        let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
        Some(Some(Stored {
            state,
            node: node.to_owned(),
            idle: self.idle_limit(state).saturating_sub(left),
            bound_by: gateway.to_owned(),
        }))
    }

    /// One call on a request's path: at once `None` when the link is down, else
    /// the answer within `store.timeout`; what went wrong is counted as `fallback`.
    async fn ask<T, F>(
        &self,
        fallback: Option<Fallback>,
        call: impl FnOnce(MultiplexedConnection) -> F,
    ) -> Option<T>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let fell_back = || fallback.map(|f| self.meters.fell_back(f));
        let now = self.epoch.elapsed().as_millis() as u64;
        let linked = self.link.current();
        let Some(linked) = linked.filter(|_| now >= self.slow_until.load(Ordering::Relaxed)) else {
            fell_back();
            return None;
        };
        let asked = call(linked.conn.clone());
        match tokio::time::timeout(self.config.timeout, asked).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(error)) => {
                self.failed(&linked, &error);
                fell_back();
                None
            }
            Err(_slow) => {
                let pause = SLOW_PAUSE.as_millis() as u64;
                self.slow_until.store(now + pause, Ordering::Relaxed);
                if let Some(held_back) = SLOW.allow() {
                    tracing::warn!(
                        held_back,
                        "Redis answered slower than store.timeout: requests do without it for a second"
                    );
                }
                fell_back();
                None
            }
        }
    }

    /// A call failed: a broken connection is dropped (the supervisor reconnects);
    /// anything else (a wrong password, a full server) is only logged.
    fn failed(&self, linked: &link::Linked, error: &redis::RedisError) {
        if link::is_broken(error) {
            if self.link.drop_if_current(linked.generation) {
                tracing::warn!("lost the connection to Redis: {error}");
            }
        } else if let Some(held_back) = ERRORS.allow() {
            tracing::warn!(held_back, "Redis refused a command: {error}");
        }
    }

    /// A session's TTL: its idle limit.
    fn idle_limit(&self, state: SessionState) -> Duration {
        match state {
            SessionState::LoggedIn => self.limits.logged_in_idle,
            SessionState::Anonymous => self.limits.anonymous_idle,
        }
    }

    /// Changes that did not reach Redis: binds and touches are written back from
    /// the local table at the next connect, logouts and admin changes are kept.
    fn offline(&self, ops: Vec<Op>) {
        self.meters.unwritten(ops.len());
        self.dirty.store(true, Ordering::Relaxed);
        let mut stash = self.stash.lock().unwrap_or_else(|p| p.into_inner());
        for op in ops {
            if matches!(op, Op::Forget(_) | Op::NodeState(..)) {
                if stash.len() >= STASH {
                    stash.pop_front();
                }
                stash.push_back(op);
            }
        }
    }
}

/// How long requests do without Redis after one of its answers ran late.
const SLOW_PAUSE: Duration = Duration::from_secs(1);

/// A slow Redis is said once a minute: it may be slow for hours.
static SLOW: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(60));

/// Redis refusing commands (not a lost connection) is logged at most every ten seconds.
static ERRORS: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(10));

/// The first 8 bytes of an HMAC of `store.secret`, in hex: enough to tell two
/// secrets apart, nothing to guess one from.
fn fingerprint(config: &RedisConfig) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&config.secret)
        .expect("HMAC takes a key of any length");
    mac.update(b"moodle-gateway store fingerprint v1");
    let digest = mac.finalize().into_bytes();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The table's key secret for a shared store: every gateway derives the same one
/// from `store.secret`, so a session hashes to the same key on all of them.
pub fn table_secret(config: &RedisConfig) -> [u8; 16] {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&config.secret)
        .expect("HMAC takes a key of any length");
    mac.update(b"moodle-gateway affinity table key v1");
    let digest = mac.finalize().into_bytes();
    let mut secret = [0u8; 16];
    secret.copy_from_slice(&digest[..16]);
    secret
}

/// The secret the site's TLS ticket keys are sealed under in Redis: every gateway
/// derives the same one from `store.secret`, and reading Redis alone opens none.
pub fn ticket_secret(config: &RedisConfig) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&config.secret)
        .expect("HMAC takes a key of any length");
    mac.update(b"moodle-gateway tls ticket keys v1");
    mac.finalize().into_bytes().into()
}

/// The secret the site's ACME certificate, key and account are sealed under in
/// Redis, derived from `store.secret` as [`ticket_secret`] is, for another use.
pub fn acme_secret(config: &RedisConfig) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&config.secret)
        .expect("HMAC takes a key of any length");
    mac.update(b"moodle-gateway acme certificate v1");
    mac.finalize().into_bytes().into()
}
