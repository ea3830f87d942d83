//! The connection to Redis: made (and re-made) by `supervise`, read
//! without a lock by every caller.
//!
//! Why not the crate's `ConnectionManager`: it reconnects inside each call, so a
//! request would learn that Redis is down by waiting for it. Here the link is
//! either up, and a call goes straight out on the one multiplexed connection, or
//! known to be down, and a request does not ask at all; and a Sentinel setup must
//! ask the Sentinels again for the primary after every loss, which a manager tied
//! to one address cannot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo,
    RedisError,
};

use crate::config::{RedisConfig, RedisTarget};

/// One live connection, and which one it is: a failure seen on an older
/// connection must not drop a newer one.
#[derive(Debug)]
pub(super) struct Linked {
    pub(super) conn: MultiplexedConnection,
    pub(super) generation: u64,
}

/// The current connection, if any.
#[derive(Debug, Default)]
pub(super) struct Link {
    current: ArcSwapOption<Linked>,
    generations: AtomicU64,
    lost: tokio::sync::Notify,
}

impl Link {
    /// The live connection, or `None` while Redis is away.
    pub(super) fn current(&self) -> Option<Arc<Linked>> {
        self.current.load_full()
    }

    /// Makes `conn` the live connection; returns its generation.
    pub(super) fn set(&self, conn: MultiplexedConnection) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        self.current
            .store(Some(Arc::new(Linked { conn, generation })));
        generation
    }

    /// Drops connection `generation` if it is still the live one, and wakes the
    /// supervisor; `true` if this call dropped it (of callers that saw the same
    /// failure at once, exactly one).
    pub(super) fn drop_if_current(&self, generation: u64) -> bool {
        let current = self.current.load_full();
        if current.as_ref().is_none_or(|l| l.generation != generation) {
            return false;
        }
        let previous = self.current.compare_and_swap(&current, None);
        let dropped = match (&*previous, &current) {
            (Some(previous), Some(current)) => Arc::ptr_eq(previous, current),
            _ => false,
        };
        if dropped {
            self.lost.notify_one();
        }
        dropped
    }

    /// Completes when connection `generation` has been dropped; a wake-up left over
    /// from an older connection is ignored.
    pub(super) async fn lost(&self, generation: u64) {
        loop {
            let live = self.current.load();
            if live.as_ref().is_none_or(|l| l.generation != generation) {
                return;
            }
            drop(live);
            self.lost.notified().await;
        }
    }

    /// Forgets the connection (the supervisor saw it end).
    pub(super) fn clear(&self) {
        self.current.store(None);
    }
}

/// Whether `error` means the connection is gone, rather than one command refused.
pub(super) fn is_broken(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

/// Connects to the primary: the command connection and the subscription.
pub(super) async fn connect(
    config: &RedisConfig,
) -> Result<(MultiplexedConnection, PubSub), String> {
    let client = client(config).await?;
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        // Each caller applies its own deadline; the connection waits as long as told.
        .set_response_timeout(None);
    let conn = client.get_multiplexed_async_connection_with_config(&options);
    let conn = within(config.connect_timeout, conn).await?;
    let pubsub = within(config.connect_timeout, client.get_async_pubsub()).await?;
    Ok((conn, pubsub))
}

/// The client of the primary: the configured URL, or whichever server the
/// Sentinels name now.
async fn client(config: &RedisConfig) -> Result<Client, String> {
    match &config.target {
        RedisTarget::Url(url) => Client::open(url.as_str()).map_err(|e| e.to_string()),
        RedisTarget::Sentinel {
            sentinels,
            master,
            master_password,
            sentinel_password,
        } => {
            let sentinels = with_password(sentinels, sentinel_password.as_deref())?;
            // The primary's own password: Sentinels and data servers each have theirs.
            let primary = master_password.as_ref().map(|password| {
                let auth = RedisConnectionInfo::default().set_password(password);
                SentinelNodeConnectionInfo::default().set_redis_connection_info(auth)
            });
            let mut sentinel = SentinelClient::build(
                sentinels,
                master.clone(),
                primary,
                SentinelServerType::Master,
            )
            .map_err(|e| e.to_string())?;
            let asked = sentinel.async_get_client();
            within(config.connect_timeout, asked)
                .await
                .map_err(|e| format!("asking the Sentinels for {master:?}: {e}"))
        }
    }
}

/// Each Sentinel's address, with `password` (`store.sentinel_password`) unless its
/// URL carries one of its own.
fn with_password(
    sentinels: &[String],
    password: Option<&str>,
) -> Result<Vec<ConnectionInfo>, String> {
    let each = sentinels.iter().map(|url| {
        let info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| e.to_string())?;
        Ok(match password {
            Some(password) if info.redis_settings().password().is_none() => {
                let auth = info.redis_settings().clone().set_password(password);
                info.set_redis_settings(auth)
            }
            _ => info,
        })
    });
    each.collect()
}

async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(limit)
        )),
    }
}

/// The deadline of background calls: a Redis that takes longer is treated as gone.
pub(super) const BACKGROUND: Duration = Duration::from_secs(2);

/// A background call within [`BACKGROUND`]; past it, an I/O error (the caller
/// drops the link).
pub(super) async fn bounded<T>(
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(BACKGROUND, call).await {
        Ok(answer) => answer,
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no answer from Redis in time",
        ))),
    }
}
