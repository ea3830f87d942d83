//! Who is alive: each gateway's heartbeat every second, its name on the roll of
//! live gateways, the checks that two gateways do not share a name or differ in
//! secret, and the roll as the admin view reads it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::sync::watch;

use super::link::{self, bounded};
use super::{Local, Shared};

/// Heartbeat period, and how long a heartbeat outlives a gateway that stopped.
const BEAT: Duration = Duration::from_secs(1);
const BEAT_TTL: Duration = Duration::from_secs(5);

/// Says every second that this gateway is alive, with its figures; a failed beat
/// drops the connection (a Redis that stopped answering is found out within a
/// second even when no student is asking). At stop, the beat is taken away.
pub(super) async fn heartbeat(
    shared: Arc<Shared>,
    local: Arc<dyn Local>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(BEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let key = shared.keys.gateway(&shared.config.name);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => break,
        }
        if let Some(linked) = shared.link.current() {
            beat_once(&shared, &*local, &linked).await;
        }
    }
    if let Some(linked) = shared.link.current() {
        let mut conn = linked.conn.clone();
        let mut pipe = redis::pipe();
        pipe.del(&key).ignore();
        pipe.zrem(shared.keys.gateway_roll(), &shared.config.name)
            .ignore();
        let _ = bounded(pipe.query_async::<()>(&mut conn)).await;
    }
}

/// One heartbeat: the gateway's figures under its name, and its name on the roll
/// of live gateways (a sorted set by last beat, so the admin view never scans the
/// keyspace, where a million sessions live too).
pub(super) async fn beat_once(shared: &Shared, local: &dyn Local, linked: &link::Linked) {
    let (beat, now) = beat(shared, local);
    let set = redis::cmd("SET")
        .arg(shared.keys.gateway(&shared.config.name))
        .arg(beat.to_string())
        .arg("PX")
        .arg(BEAT_TTL.as_millis() as u64)
        .arg("GET")
        .clone();
    let mut pipe = redis::pipe();
    pipe.add_command(set);
    let roll = shared.keys.gateway_roll();
    pipe.zadd(&roll, &shared.config.name, now).ignore();
    let gone = now.saturating_sub(BEAT_TTL.as_millis() as u64);
    pipe.zrembyscore(&roll, "-inf", gone).ignore();
    // The live gateways' secret, by fingerprint: whoever beats first sets it, and
    // it lasts as long as a beat, so a site that changed its secret everywhere
    // is not held to the old one.
    let fingerprint = shared.keys.fingerprint();
    let ttl = BEAT_TTL.as_millis() as u64;
    pipe.cmd("SET")
        .arg(&fingerprint)
        .arg(&shared.fingerprint)
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .ignore();
    pipe.get(&fingerprint);
    let mut conn = linked.conn.clone();
    match bounded(pipe.query_async::<(Option<String>, Option<String>)>(&mut conn)).await {
        Ok((previous, first)) => {
            same_name(shared, previous.as_deref());
            same_secret(shared, first.as_deref(), &mut conn, &fingerprint).await;
        }
        Err(error) => shared.failed(linked, &error),
    }
}

/// A gateway with another `store.secret` hashes every session to another key:
/// it would share nothing with the others, and say nothing.
async fn same_secret(
    shared: &Shared,
    first: Option<&str>,
    conn: &mut MultiplexedConnection,
    key: &str,
) {
    let foreign = first.is_some_and(|first| first != shared.fingerprint);
    shared.foreign_secret.store(foreign, Ordering::Relaxed);
    if !foreign {
        let _ = bounded(conn.pexpire::<_, ()>(key, BEAT_TTL.as_millis() as i64)).await;
    } else if let Some(held_back) = SAME_NAME.allow() {
        tracing::error!(
            held_back,
            "store.secret differs from the other gateways' on this Redis and prefix: this \
             gateway shares no session with them. Give every gateway the same store.secret"
        );
    }
}

/// This gateway's heartbeat, and when it was made (Unix milliseconds).
fn beat(shared: &Shared, local: &dyn Local) -> (serde_json::Value, u64) {
    let mut beat = local.beat();
    let now = unix_ms();
    if let Some(fields) = beat.as_object_mut() {
        fields.insert("name".into(), shared.config.name.clone().into());
        fields.insert("instance".into(), shared.sender.clone().into());
        fields.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        fields.insert("started".into(), shared.started.into());
        fields.insert("beat_ms".into(), now.into());
    }
    (beat, now)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Two gateways under one name would each overwrite the other's heartbeat and
/// skip the other's messages as their own.
fn same_name(shared: &Shared, previous: Option<&str>) {
    let Some(previous) = previous.and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
    else {
        return;
    };
    let other = previous.get("instance").and_then(|i| i.as_str());
    if other.is_some_and(|other| other != shared.sender) {
        if let Some(held_back) = SAME_NAME.allow() {
            tracing::error!(
                held_back,
                name = %shared.config.name,
                "another gateway runs under this store.name: give each gateway its own"
            );
        }
    }
}

static SAME_NAME: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(60));

/// Every live gateway's last heartbeat, sorted by name.
pub(super) async fn gateways(shared: &Shared) -> Result<Vec<serde_json::Value>, String> {
    let linked = shared
        .link
        .current()
        .ok_or_else(|| "Redis is unreachable".to_owned())?;
    let mut conn = linked.conn.clone();
    let fresh = unix_ms().saturating_sub(BEAT_TTL.as_millis() as u64);
    let roll = conn.zrangebyscore(shared.keys.gateway_roll(), fresh, "+inf");
    let names: Vec<String> = bounded(roll).await.map_err(|e| e.to_string())?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<String> = names.iter().map(|n| shared.keys.gateway(n)).collect();
    let beats: Vec<Option<String>> = bounded(conn.mget(&keys)).await.map_err(|e| e.to_string())?;
    let mut beats: Vec<serde_json::Value> = (beats.into_iter().flatten())
        .filter_map(|b| serde_json::from_str(&b).ok())
        .collect();
    let name = |b: &serde_json::Value| b.get("name").and_then(|n| n.as_str()).map(str::to_owned);
    beats.sort_by_key(name);
    Ok(beats)
}
