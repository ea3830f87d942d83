//! Keeping the link up: connect, subscribe, resync, take in the other gateways'
//! messages until the connection is lost, and again, with a backoff that only a
//! healthy link resets.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSub};
use tokio::sync::watch;

use super::heartbeat::beat_once;
use super::resync::resync;
use super::wire::{self, Change};
use super::{link, Local, Shared};

/// Reconnect delays: from the first to the longest, doubling.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// A link up this long is healthy: its loss is retried from the first delay.
const HEALTHY: Duration = Duration::from_secs(10);

/// Keeps the link up: connect, subscribe, resync, take in messages until the
/// connection is lost, and again.
pub(super) async fn supervise(
    shared: Arc<Shared>,
    local: Arc<dyn Local>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = RETRY_FIRST;
    let target = shared.config.target.redacted();
    let mut outage = false;
    loop {
        match connected(&shared).await {
            Ok((conn, pubsub)) => {
                let again = if outage {
                    " again: resynchronising"
                } else {
                    ""
                };
                tracing::info!(gateway = %shared.config.name, "connected to Redis at {target}{again}");
                let Some(lasted) = linked(&shared, &local, conn, pubsub, &mut stop).await else {
                    // The link stays for the writer's last changes and the heartbeat's goodbye.
                    return;
                };
                outage = true;
                // Only a link that stayed up a while earns a quick retry: one that
                // breaks at once (a refused subscription) must not spin.
                if lasted >= HEALTHY {
                    delay = RETRY_FIRST;
                }
                tracing::warn!(
                    "lost Redis at {target}: routing from the local table and the route \
                     cookie, dealing locally, until it is back"
                );
            }
            Err(error) => {
                if let Some(held_back) = UNREACHABLE.allow() {
                    tracing::warn!(held_back, "cannot reach Redis at {target}: {error}");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// One connection's life: made the live link, on the roll, resynchronised, and
/// listened to until it is lost (how long it lasted) or the gateway stops (`None`).
async fn linked(
    shared: &Arc<Shared>,
    local: &Arc<dyn Local>,
    conn: MultiplexedConnection,
    pubsub: PubSub,
    stop: &mut watch::Receiver<bool>,
) -> Option<Duration> {
    let since = std::time::Instant::now();
    let generation = shared.link.set(conn.clone());
    shared.meters.set_up(true);
    // On the roll at once, not a beat later.
    if let Some(linked) = shared.link.current() {
        beat_once(shared, &**local, &linked).await;
    }
    let resync = tokio::spawn(resync(shared.clone(), local.clone(), conn, generation));
    let stopped = listen(shared, &**local, pubsub, generation, stop).await;
    resync.abort();
    if stopped {
        return None;
    }
    shared.link.clear();
    shared.meters.lost();
    // Redis may come back empty (a restart without persistence, a failover to a
    // replica that lagged): the table is written back then.
    shared.dirty.store(true, Ordering::Relaxed);
    Some(since.elapsed())
}

/// Failures to connect are logged once a minute: Redis may be away for hours.
static UNREACHABLE: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(60));

/// A connection, subscribed before anything else happens on it: a link that
/// cannot hear the others is no link.
async fn connected(shared: &Shared) -> Result<(MultiplexedConnection, PubSub), String> {
    let (conn, mut pubsub) = link::connect(&shared.config).await?;
    let subscribing = pubsub.subscribe(shared.keys.events());
    match tokio::time::timeout(shared.config.connect_timeout, subscribing).await {
        Ok(Ok(())) => Ok((conn, pubsub)),
        Ok(Err(error)) => Err(format!("cannot subscribe to the store's channel: {error}")),
        Err(_) => Err("no answer to the subscription in time".to_owned()),
    }
}

/// Takes in the other gateways' messages until the connection is lost (`false`)
/// or the gateway stops (`true`).
async fn listen(
    shared: &Shared,
    local: &dyn Local,
    pubsub: PubSub,
    generation: u64,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut messages = pubsub.into_on_message();
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => {
                    let payload = message.get_payload_bytes();
                    // Its own messages come back too: skipped before any parsing.
                    if wire::sent_by(payload, &shared.sender) {
                        continue;
                    }
                    if let Ok(text) = std::str::from_utf8(payload) {
                        apply(shared, local, text);
                    }
                }
                None => return false,
            },
            () = shared.link.lost(generation) => return false,
            _ = stop.changed() => return true,
        }
    }
}

/// One message from the channel, into the local table and upstreams.
fn apply(shared: &Shared, local: &dyn Local, text: &str) {
    let (sender, changes) = wire::parse_message(text);
    if sender == shared.sender {
        return;
    }
    let by = sender.split('/').next().unwrap_or(sender);
    let table = local.table();
    for change in changes {
        let kind = match change {
            Change::Bound { key, state, node } => {
                if let Some(id) = local.node_id(&node) {
                    table.adopt(key, id, state, Duration::ZERO);
                }
                "bound"
            }
            Change::Forgot(key) => {
                table.forget(key);
                "forgot"
            }
            Change::Touched(keys) => {
                keys.into_iter().for_each(|key| table.touch(key));
                "touched"
            }
            Change::NodeState { node, state } => {
                local.node_state(&node, state, by);
                "node_state"
            }
        };
        shared.meters.applied(kind);
    }
}
