//! Quiz starts paced for the whole site: with several gateways, a node's
//! `quiz_starts` counts the starts every gateway sends it, not each gateway's.
//!
//! Each gateway keeps its own gate (first come, first served among the starts it
//! received); a start through it then takes one of the node's leases in Redis, a
//! sorted set of lease ids scored by when they lapse. A script removes the lapsed
//! ones and adds this one only while fewer than the share are held: check and take
//! with nothing between them, so two gateways never both take the last lease.
//!
//! Why leases that lapse and are renewed: a gateway that dies holding one (the
//! very moment keepalived moves the address) must not block the node's starts for
//! long. A held lease is renewed every `RENEW` and lapses `LAPSE` after the last
//! renewal, so a dead gateway's leases are free again within seconds.
//!
//! Why a poll and not a queue in Redis: the starts waiting for a lease are the one
//! at the head of each gateway's gate, a handful at most, and a start waits for
//! another to finish (hundreds of milliseconds); asking every `POLL` is cheaper to
//! reason about than a Redis list whose waiters can die. Across gateways the order
//! is then the order of the polls, within `POLL`.
//!
//! Redis away or slow: the start goes on with its gateway's own gate, as a site of
//! one gateway would. A start is never refused for want of Redis.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Store;

/// How often a start waiting for a lease asks again.
const POLL: Duration = Duration::from_millis(50);
/// How long a lease lives without renewal.
const LAPSE: Duration = Duration::from_secs(10);
/// How often a held lease is renewed.
const RENEW: Duration = Duration::from_secs(3);

/// Drops the lapsed leases, then takes lease `ARGV[3]` until `ARGV[2]` ms from now
/// if fewer than `ARGV[1]` are held; renews it if it is held already. 1: taken.
///
/// KEYS: the node's lease set. ARGV: share, lapse in ms, lease id.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[3])
if held or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// A start's lease on its node, given back when dropped.
#[derive(Debug)]
pub struct StartLease {
    store: Store,
    key: String,
    id: String,
    renewal: JoinHandle<()>,
    /// Whether the start waited for other gateways' starts.
    pub waited: bool,
}

/// What became of a start's ask for a lease.
#[derive(Debug)]
pub enum Leased {
    /// The site's share allows it: hold this while the start runs.
    Held(StartLease),
    /// No shared store, or Redis away: this gateway's gate is the pace.
    Alone,
    /// Other gateways' starts held the node's share until `deadline`.
    TimedOut,
}

impl Store {
    /// One of `node`'s `share` start leases, waiting until `deadline` for one to be
    /// given back when all are held.
    pub async fn start_lease(&self, node: &str, share: usize, deadline: Instant) -> Leased {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let Some(shared) = self.0.as_ref() else {
            return Leased::Alone;
        };
        let key = shared.keys.starts(node);
        let id = format!("{}#{}", shared.sender, NEXT.fetch_add(1, Ordering::Relaxed));
        let mut waited = false;
        loop {
            match self.take(&key, share, &id).await {
                None => return Leased::Alone,
                Some(true) => {
                    let renewal = tokio::spawn(renew(self.clone(), key.clone(), share, id.clone()));
                    return Leased::Held(StartLease {
                        store: self.clone(),
                        key,
                        id,
                        renewal,
                        waited,
                    });
                }
                Some(false) if Instant::now() + POLL > deadline => return Leased::TimedOut,
                Some(false) => {
                    waited = true;
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    /// The script's answer: `None` without Redis.
    async fn take(&self, key: &str, share: usize, id: &str) -> Option<bool> {
        let shared = self.0.as_ref()?;
        let mut script = redis::cmd("EVAL");
        script.arg(TAKE).arg(1).arg(key);
        script.arg(share).arg(LAPSE.as_millis() as u64).arg(id);
        let taken = shared
            .ask(None, |mut conn| async move {
                script.query_async::<i64>(&mut conn).await
            })
            .await?;
        Some(taken == 1)
    }
}

/// Keeps a lease alive while its start runs (cancelled when the lease drops). A
/// renewal that finds the lease lapsed takes it again if the share allows, and
/// otherwise lets the start finish: it is running already.
async fn renew(store: Store, key: String, share: usize, id: String) {
    loop {
        tokio::time::sleep(RENEW).await;
        let _ = store.take(&key, share, &id).await;
    }
}

impl Drop for StartLease {
    fn drop(&mut self) {
        self.renewal.abort();
        let (store, key, id) = (
            self.store.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.id),
        );
        tokio::spawn(async move {
            let Some(shared) = store.0.as_ref() else {
                return;
            };
            let _ = shared
                .ask(None, |mut conn| async move {
                    redis::cmd("ZREM")
                        .arg(&key)
                        .arg(&id)
                        .query_async::<i64>(&mut conn)
                        .await
                })
                .await;
        });
    }
}
