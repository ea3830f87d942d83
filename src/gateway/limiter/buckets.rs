//! The rate limits' buckets: one token bucket (GCRA, from `governor`) per client
//! address or username, in a map that never holds more than `max_keys`.
//!
//! Why `governor`: its keyed limiter is one `AtomicU64` per key updated by
//! compare-and-swap (no lock around a bucket), it knows which keys are as good as
//! new (`retain_recent`), and it is the limiter tower's and actix's ecosystems use.
//! What it lacks is a bound: a botnet, or one IPv6 /48 with its 65,536 /64s, would
//! grow its map without end. [`Capped`] is its store with a bound: past
//! `max_keys`, the idle keys (whose buckets are full again) are dropped, at most
//! once a second; if the map is still full, a new key is judged as a newcomer
//! (a full bucket) and not remembered. That errs towards letting a request
//! through, never towards refusing one whose address was never seen.
//!
//! The keys: an IPv4 address is one key; an IPv6 address is keyed by its /64,
//! the smallest block a site is given (RFC 6177), so one machine cycling through
//! its 2^64 addresses is still one client. A username is keyed by a keyed hash
//! (SipHash-1-3, a per-process secret): fixed size, and no name an attacker
//! guessed is kept in memory.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use governor::clock::{Clock, DefaultClock};
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use siphasher::sip::SipHasher13;

use crate::config::{Rate, RateLimitsConfig};

/// The key of a client address: IPv4 whole, IPv6 by its /64 (see the file's top).
pub fn address_key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: one client.
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u128::from(v4.to_ipv6_mapped()),
            None => u128::from(v6) & !u128::from(u64::MAX),
        },
    }
}

/// Every bucket of the rate limits in force; `None` for a limit that is off.
#[derive(Debug)]
pub struct Buckets {
    /// What they were made from: a reload that keeps it keeps the buckets.
    pub config: RateLimitsConfig,
    /// `login_per_address`.
    pub login_address: Option<Bucket<u128>>,
    /// `login_per_username`.
    pub login_username: Option<Bucket<u64>>,
    /// `pages_per_address`.
    pub pages_address: Option<Bucket<u128>>,
    secret: (u64, u64),
}

impl Buckets {
    /// The buckets of `config`, `None` when no limit is on.
    pub fn new(config: &RateLimitsConfig) -> Option<Self> {
        if !config.is_on() {
            return None;
        }
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).expect("the OS random source is available");
        let half = |i: usize| u64::from_le_bytes(secret[i..i + 8].try_into().expect("8 bytes"));
        let max = config.max_keys;
        Some(Self {
            config: *config,
            login_address: Bucket::new(config.login_per_address, max),
            login_username: Bucket::new(config.login_per_username, max),
            pages_address: Bucket::new(config.pages_per_address, max),
            secret: (half(0), half(8)),
        })
    }

    /// The key of a username, already as Moodle reads it (`moodle::username_in`).
    pub fn username_key(&self, username: &str) -> u64 {
        let mut hasher = SipHasher13::new_with_keys(self.secret.0, self.secret.1);
        username.hash(&mut hasher);
        hasher.finish()
    }
}

/// One limit: a token bucket per key, at most `max_keys` of them.
pub struct Bucket<K: Hash + Eq + Clone> {
    limiter: RateLimiter<K, Capped<K>, DefaultClock>,
    clock: DefaultClock,
    max_keys: usize,
    started: std::time::Instant,
    /// When idle keys were last dropped, in milliseconds since `started` (0: never).
    swept: AtomicU64,
}

impl<K: Hash + Eq + Clone> std::fmt::Debug for Bucket<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({} keys)", self.limiter.len())
    }
}

/// Idle keys are dropped at most this often: a sweep walks the whole map.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl<K: Hash + Eq + Clone> Bucket<K> {
    /// The bucket of `rate`, `None` when it is off.
    pub fn new(rate: Rate, max_keys: usize) -> Option<Self> {
        let per_minute = NonZeroU32::new(rate.per_minute)?;
        let burst = NonZeroU32::new(rate.burst).unwrap_or(per_minute);
        let quota = Quota::per_minute(per_minute).allow_burst(burst);
        let clock = DefaultClock::default();
        let store = Capped::new(max_keys);
        Some(Self {
            limiter: RateLimiter::new(quota, store, clock.clone()),
            clock,
            max_keys,
            started: std::time::Instant::now(),
            swept: AtomicU64::new(0),
        })
    }

    /// Takes a token of `key`'s bucket; `Err` with how long until the next one.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        if self.limiter.len() >= self.max_keys {
            self.sweep();
        }
        (self.limiter.check_key(key)).map_err(|until| until.wait_time_from(self.clock.now()))
    }

    /// The keys remembered now.
    pub fn len(&self) -> usize {
        self.limiter.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.limiter.is_empty()
    }

    /// Drops the keys whose buckets are full again, unless another request did
    /// within [`SWEEP_EVERY`].
    fn sweep(&self) {
        let now = (self.started.elapsed().as_millis() as u64).max(1);
        let last = self.swept.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= SWEEP_EVERY.as_millis() as u64;
        let swept =
            || (self.swept).compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed);
        if due && swept().is_ok() {
            self.limiter.retain_recent();
        }
    }
}

/// `governor`'s map store with a bound on its keys (see the file's top).
pub struct Capped<K: Hash + Eq + Clone> {
    map: DashMapStateStore<K>,
    /// The map's length, kept beside it: `DashMap::len` reads every shard.
    len: AtomicUsize,
    max: usize,
}

impl<K: Hash + Eq + Clone> Capped<K> {
    fn new(max: usize) -> Self {
        Self {
            map: DashMapStateStore::default(),
            len: AtomicUsize::new(0),
            max,
        }
    }
}

impl<K: Hash + Eq + Clone> StateStore for Capped<K> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        if let Some(state) = self.map.get(key) {
            return state.measure_and_replace(&NotKeyed::NonKey, f);
        }
        if self.len.load(Ordering::Relaxed) >= self.max {
            // Full of active keys: a newcomer, judged on a full bucket, not kept.
            return InMemoryState::default().measure_and_replace(&NotKeyed::NonKey, f);
        }
        let state = match self.map.entry(key.clone()) {
            Entry::Occupied(found) => found.into_ref(),
            Entry::Vacant(vacant) => {
                self.len.fetch_add(1, Ordering::Relaxed);
                vacant.insert(InMemoryState::default())
            }
        };
        state.measure_and_replace(&NotKeyed::NonKey, f)
    }
}

impl<K: Hash + Eq + Clone> ShrinkableKeyedStateStore<K> for Capped<K> {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map.retain_recent(drop_below);
        self.map.shrink_to_fit();
        self.len.store(self.map.len(), Ordering::Relaxed);
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
