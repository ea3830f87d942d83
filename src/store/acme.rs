//! The site's ACME certificate in Redis, so that several gateways order one
//! certificate and serve the same: who orders now (a lease), the newest
//! certificate and the CA account (kept as given, sealed under `store.secret` by
//! the caller), and the answers to open HTTP-01 challenges, which any gateway's
//! redirect listener may be asked for. The store knows nothing of certificates.
//!
//! Why a lease that lapses and is renewed, not a lock held for good: a gateway
//! that dies while ordering (keepalived moving the address at that very moment)
//! must not keep the others from ordering for more than [`LEASE`]. The orderer
//! renews it while its order runs; a failed order keeps it for the back-off, so
//! the next gateway does not try the same broken name at once (a CA counts the
//! failures per name, not per gateway).

use std::time::Duration;

use super::Store;

/// How long a lease lasts without renewal: an order's answers and polls take
/// seconds; the orderer renews every third of it.
pub const LEASE: Duration = Duration::from_secs(60);

/// How long an open HTTP-01 answer stays in Redis if its orderer never takes it
/// down (it died): longer than any CA takes to validate.
const HTTP01_KEEP: Duration = Duration::from_secs(600);

/// Takes the lease for `ARGV[1]`, or renews it when it is `ARGV[1]`'s already,
/// for `ARGV[2]` ms; else the holder's id.
///
/// KEYS: the lease. ARGV: this gateway's id, how long.
const TAKE: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
";

/// Gives the lease back if `ARGV[1]` still holds it. KEYS: the lease.
const GIVE_BACK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// Who may order the site's certificate, as Redis says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcmeTurn {
    /// This gateway: it holds the lease (taken or renewed).
    Ours,
    /// Another gateway, by its `name/instance`.
    Theirs(String),
}

impl Store {
    /// Takes or renews the ordering lease for `hold`; `None` without a shared
    /// store, or with Redis away.
    pub async fn acme_turn(&self, hold: Duration) -> Option<AcmeTurn> {
        let shared = self.0.as_ref()?;
        let mut script = redis::cmd("EVAL");
        script.arg(TAKE).arg(1).arg(shared.keys.acme_lease());
        script.arg(&shared.sender).arg(hold.as_millis() as u64);
        let holder = shared
            .ask(None, |mut conn| async move {
                script.query_async::<Option<String>>(&mut conn).await
            })
            .await?;
        Some(holder.map_or(AcmeTurn::Ours, AcmeTurn::Theirs))
    }

    /// Gives the lease back, if this gateway still holds it.
    pub async fn end_acme_turn(&self) {
        let Some(shared) = self.0.as_ref() else {
            return;
        };
        let mut script = redis::cmd("EVAL");
        script.arg(GIVE_BACK).arg(1).arg(shared.keys.acme_lease());
        script.arg(&shared.sender);
        let _ = shared
            .ask(None, |mut conn| async move {
                script.query_async::<i64>(&mut conn).await
            })
            .await;
    }

    /// The sealed certificate Redis holds: the outer `None` when Redis did not
    /// answer, the inner when it holds none.
    pub async fn acme_certificate(&self) -> Option<Option<Vec<u8>>> {
        self.get(|keys| keys.acme_certificate()).await
    }

    /// Keeps `sealed` as the site's certificate; `None` when Redis did not take it.
    pub async fn set_acme_certificate(&self, sealed: Vec<u8>) -> Option<()> {
        self.set(|keys| keys.acme_certificate(), sealed, None).await
    }

    /// The sealed CA account, as [`acme_certificate`](Self::acme_certificate).
    pub async fn acme_account(&self) -> Option<Option<Vec<u8>>> {
        self.get(|keys| keys.acme_account()).await
    }

    /// Keeps `sealed` as the site's CA account.
    pub async fn set_acme_account(&self, sealed: Vec<u8>) -> Option<()> {
        self.set(|keys| keys.acme_account(), sealed, None).await
    }

    /// Puts up an HTTP-01 answer for every gateway's redirect listener.
    pub async fn open_http01(&self, token: &str, answer: &str) -> Option<()> {
        let answer = answer.as_bytes().to_vec();
        let keep = Some(HTTP01_KEEP);
        self.set(|keys| keys.acme_http01(token), answer, keep).await
    }

    /// Takes it down.
    pub async fn close_http01(&self, token: &str) {
        let Some(shared) = self.0.as_ref() else {
            return;
        };
        let key = shared.keys.acme_http01(token);
        let _ = shared
            .ask(None, |mut conn| async move {
                redis::cmd("DEL")
                    .arg(key)
                    .query_async::<i64>(&mut conn)
                    .await
            })
            .await;
    }

    /// The answer some gateway put up for `token`, if Redis has one.
    pub async fn http01(&self, token: &str) -> Option<String> {
        let answer = self.get(|keys| keys.acme_http01(token)).await??;
        String::from_utf8(answer).ok()
    }

    async fn get(&self, key: impl Fn(&super::wire::Keys) -> String) -> Option<Option<Vec<u8>>> {
        let shared = self.0.as_ref()?;
        let key = key(&shared.keys);
        shared
            .ask(None, |mut conn| async move {
                redis::cmd("GET").arg(key).query_async(&mut conn).await
            })
            .await
    }

    async fn set(
        &self,
        key: impl Fn(&super::wire::Keys) -> String,
        value: Vec<u8>,
        keep: Option<Duration>,
    ) -> Option<()> {
        let shared = self.0.as_ref()?;
        let mut set = redis::cmd("SET");
        set.arg(key(&shared.keys)).arg(value);
        if let Some(keep) = keep {
            set.arg("PX").arg(keep.as_millis() as u64);
        }
        shared
            .ask(None, |mut conn| async move {
                set.query_async::<()>(&mut conn).await
            })
            .await
    }
}
