//! The store's background work: keeping the link up, writing changes, taking in
//! the other gateways' changes, resynchronising after an outage, and the heartbeat.
//!
//! A resync runs at every connect (the first one included):
//! 1. the logouts, evictions and admin states kept while Redis was away are written;
//! 2. if any bind missed Redis (and at start, for what the snapshot restored), every
//!    live local entry is written back with `SET NX`: the first writer wins;
//! 3. the admin states and every session in Redis are read into the local table,
//!    which adopts the winner of any conflict and whatever the others bound
//!    meanwhile (their messages were lost with the connection).
//!
//! The subscription is made before step 1, so no change made during a resync is
//! missed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::AsyncCommands;
use tokio::sync::{mpsc, watch};

use super::wire::{self, Change};
use super::{link, Local, Op, Shared};
use crate::config::NodeState;

/// Changes per pipeline, keys per `SCAN` step.
pub(super) const BATCH: usize = 512;

/// The deadline of background calls: a Redis that takes longer is treated as gone.
const BACKGROUND: Duration = Duration::from_secs(2);

/// Heartbeat period, and how long a heartbeat outlives a gateway that stopped.
const BEAT: Duration = Duration::from_secs(1);
const BEAT_TTL: Duration = Duration::from_secs(5);

/// Reconnect delays: from the first to the longest, doubling.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// A link up this long is healthy: its loss is retried from the first delay.
const HEALTHY: Duration = Duration::from_secs(10);

/// Most sessions one writer pipeline names: a minute's touches of a busy gateway
/// must not make one pipeline of a quarter million commands under one deadline.
const PIPELINE_KEYS: usize = 4096;

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
                let since = std::time::Instant::now();
                let generation = shared.link.set(conn.clone());
                shared.meters.set_up(true);
                // On the roll at once, not a beat later.
                if let Some(linked) = shared.link.current() {
                    beat_once(&shared, &*local, &linked).await;
                }
                let again = if outage {
                    " again: resynchronising"
                } else {
                    ""
                };
                tracing::info!(gateway = %shared.config.name, "connected to Redis at {target}{again}");
                let resync = tokio::spawn(resync(shared.clone(), local.clone(), conn, generation));
                let stopped = listen(&shared, &*local, pubsub, generation, &mut stop).await;
                resync.abort();
                if stopped {
                    // The link stays for the writer's last changes and the heartbeat's goodbye.
                    return;
                }
                shared.link.clear();
                shared.meters.lost();
                // Redis may come back empty (a restart without persistence, a
                // failover to a replica that lagged): the table is written back then.
                shared.dirty.store(true, Ordering::Relaxed);
                outage = true;
                // Only a link that stayed up a while earns a quick retry: one that
                // breaks at once (a refused subscription) must not spin.
                if since.elapsed() >= HEALTHY {
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

/// Writes queued changes, a pipeline at a time, until `stop`; then what is left.
pub(super) async fn write(
    shared: Arc<Shared>,
    mut queued: mpsc::Receiver<Op>,
    mut stop: watch::Receiver<bool>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            got = queued.recv_many(&mut batch, BATCH) => if got == 0 { return },
            _ = stop.changed() => {
                // The last changes of a gateway that stops still reach the others.
                while queued.try_recv().map(|op| batch.push(op)).is_ok() {}
                if !batch.is_empty() {
                    send(&shared, std::mem::take(&mut batch)).await;
                }
                return;
            }
        }
        for part in by_weight(std::mem::take(&mut batch)) {
            send(&shared, part).await;
        }
        batch.reserve(BATCH);
    }
}

/// `ops` in order, cut into parts of at most [`PIPELINE_KEYS`] sessions.
fn by_weight(ops: Vec<Op>) -> Vec<Vec<Op>> {
    let mut parts = vec![Vec::new()];
    let mut keys = 0;
    for op in ops {
        let weight = match &op {
            Op::Touch(sessions) => sessions.len(),
            _ => 1,
        };
        if keys + weight > PIPELINE_KEYS && !parts.last().is_some_and(Vec::is_empty) {
            parts.push(Vec::new());
            keys = 0;
        }
        keys += weight;
        parts.last_mut().expect("one part at least").push(op);
    }
    parts
}

/// One pipeline: every change's command, then one message that carries them all.
async fn send(shared: &Shared, ops: Vec<Op>) {
    let Some(linked) = shared.link.current() else {
        return shared.offline(ops);
    };
    let mut pipe = redis::pipe();
    let mut changes = Vec::with_capacity(ops.len());
    for op in &ops {
        changes.push(command(shared, &mut pipe, op));
    }
    tell(shared, &mut pipe, &changes);
    let mut conn = linked.conn.clone();
    match tokio::time::timeout(BACKGROUND, pipe.query_async::<()>(&mut conn)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            shared.failed(&linked, &error);
            shared.offline(ops);
        }
        Err(_) => {
            shared.link.drop_if_current(linked.generation);
            shared.offline(ops);
        }
    }
}

/// Adds the messages that tell the others `changes` to `pipe`.
fn tell(shared: &Shared, pipe: &mut redis::Pipeline, changes: &[Change]) {
    for message in wire::messages(&shared.sender, changes) {
        pipe.publish(shared.keys.events(), message).ignore();
    }
}

/// The command of one change, added to `pipe`, and the change the others hear.
pub(super) fn command(shared: &Shared, pipe: &mut redis::Pipeline, op: &Op) -> Change {
    let keys = &shared.keys;
    let ttl = |state| shared.idle_limit(state).as_millis() as u64;
    match op {
        Op::Bind(key, state, node) => {
            let value = wire::session_value(*state, node, &shared.config.name);
            pipe.pset_ex(keys.session(*key), value, ttl(*state))
                .ignore();
            let (key, state, node) = (*key, *state, node.clone());
            Change::Bound { key, state, node }
        }
        Op::Forget(key) => {
            pipe.del(keys.session(*key)).ignore();
            Change::Forgot(*key)
        }
        Op::Touch(sessions) => {
            for (key, state) in sessions {
                pipe.pexpire(keys.session(*key), ttl(*state) as i64)
                    .ignore();
            }
            Change::Touched(sessions.iter().map(|(key, _)| *key).collect())
        }
        Op::NodeState(node, state) => {
            pipe.hset(keys.nodes(), node, state.as_str()).ignore();
            let (node, state) = (node.clone(), *state);
            Change::NodeState { node, state }
        }
    }
}

/// The resync at every connect (see the module's doc). A failure drops the
/// connection, and the next connect starts it again.
async fn resync(
    shared: Arc<Shared>,
    local: Arc<dyn Local>,
    mut conn: MultiplexedConnection,
    generation: u64,
) {
    let started = std::time::Instant::now();
    let done = async {
        let replayed = replay(&shared, &mut conn).await?;
        let written = match shared.dirty.swap(false, Ordering::Relaxed) {
            true => {
                // Cancelled (the link broke again) or failed: still to be written.
                let unfinished = Unfinished(&shared);
                let written = write_back(&shared, &*local, &mut conn).await?;
                std::mem::forget(unfinished);
                written
            }
            false => 0,
        };
        let states = read_states(&shared, &*local, &mut conn).await?;
        let adopted = read_sessions(&shared, &*local, &mut conn).await?;
        Ok::<_, redis::RedisError>((replayed, written, states, adopted))
    };
    match done.await {
        Ok((replayed, written, states, adopted)) => {
            shared.meters.resynced();
            let took = humantime::format_duration(Duration::from_millis(
                started.elapsed().as_millis() as u64,
            ));
            tracing::info!(
                replayed, written, states, adopted, %took,
                "resynchronised with Redis"
            );
        }
        Err(error) if link::is_broken(&error) => {
            tracing::warn!(
                "resync with Redis broke off, it starts again at the next connect: {error}"
            );
            shared.link.drop_if_current(generation);
        }
        // Redis refused a command (a key of the wrong type under the prefix, an ACL):
        // the link stays up, and dropping it would only repeat the refusal.
        Err(error) => {
            if let Some(held_back) = super::ERRORS.allow() {
                tracing::warn!(held_back, "resync with Redis stopped short: {error}");
            }
        }
    }
}

/// A write-back that did not finish: the next connect writes the table again.
struct Unfinished<'a>(&'a Shared);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        self.0.dirty.store(true, Ordering::Relaxed);
    }
}

/// Step 1: the kept logouts, evictions and admin states, each taken from the
/// stash only once Redis has it (a resync cut short keeps the rest).
async fn replay(shared: &Shared, conn: &mut MultiplexedConnection) -> redis::RedisResult<usize> {
    let mut replayed = 0;
    loop {
        let chunk: Vec<Op> = {
            let stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            stash.iter().take(BATCH).cloned().collect()
        };
        if chunk.is_empty() {
            return Ok(replayed);
        }
        let mut pipe = redis::pipe();
        let changes: Vec<Change> = chunk
            .iter()
            .map(|op| command(shared, &mut pipe, op))
            .collect();
        tell(shared, &mut pipe, &changes);
        bounded(pipe.query_async::<()>(conn)).await?;
        let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
        let done = chunk.len().min(stash.len());
        stash.drain(..done);
        replayed += chunk.len();
    }
}

/// Step 2: every live local entry, unless Redis holds the session already.
async fn write_back(
    shared: &Shared,
    local: &dyn Local,
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<usize> {
    let live = local.table().live_entries();
    let mut written = 0;
    for chunk in live.chunks(BATCH) {
        let mut pipe = redis::pipe();
        let mut sent = Vec::with_capacity(chunk.len());
        for entry in chunk {
            let Some(node) = local.node_name(entry.node) else {
                continue;
            };
            let left = shared.idle_limit(entry.state).saturating_sub(entry.idle);
            let value = wire::session_value(entry.state, &node, &shared.config.name);
            let set = redis::cmd("SET")
                .arg(shared.keys.session(entry.key))
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(left.as_millis().max(1) as u64)
                .clone();
            pipe.add_command(set);
            sent.push((entry.key, entry.state, node));
        }
        let replies: Vec<Option<String>> = bounded(pipe.query_async(conn)).await?;
        let bound: Vec<Change> = (sent.into_iter().zip(replies))
            .filter(|(_, reply)| reply.is_some())
            .map(|((key, state, node), _)| Change::Bound { key, state, node })
            .collect();
        written += bound.len();
        if !bound.is_empty() {
            let message = wire::message(&shared.sender, &bound);
            bounded(conn.publish::<_, _, ()>(shared.keys.events(), message)).await?;
        }
    }
    Ok(written)
}

/// Step 3a: the admin states Redis holds; returns how many changed here.
async fn read_states(
    shared: &Shared,
    local: &dyn Local,
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<usize> {
    let states: Vec<(String, String)> = match bounded(conn.hgetall(shared.keys.nodes())).await {
        Ok(states) => states,
        Err(error) if link::is_broken(&error) => return Err(error),
        Err(error) => {
            tracing::warn!(
                "the admin states in Redis cannot be read, left as they are here: {error}"
            );
            return Ok(0);
        }
    };
    let mut read = 0;
    for (node, state) in states {
        if let Some(state) = NodeState::from_name(&state) {
            local.node_state(&node, state, "redis");
            read += 1;
        }
    }
    Ok(read)
}

/// Step 3b: every session Redis holds, adopted by the local table; returns how
/// many changed it.
async fn read_sessions(
    shared: &Shared,
    local: &dyn Local,
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<usize> {
    let mut cursor: u64 = 0;
    let mut adopted = 0;
    loop {
        let step = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(shared.keys.sessions())
            .arg("COUNT")
            .arg(BATCH)
            .clone();
        let (next, names): (u64, Vec<String>) = bounded(step.query_async(conn)).await?;
        adopted += adopt_all(shared, local, conn, &names).await?;
        if next == 0 {
            return Ok(adopted);
        }
        cursor = next;
    }
}

/// The values and TTLs of `names`, adopted by the local table.
async fn adopt_all(
    shared: &Shared,
    local: &dyn Local,
    conn: &mut MultiplexedConnection,
    names: &[String],
) -> redis::RedisResult<usize> {
    if names.is_empty() {
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    // A key of another type under the prefix is skipped, not a reason to stop.
    pipe.ignore_errors();
    for name in names {
        pipe.get(name).pttl(name);
    }
    let answers: Vec<redis::Value> = bounded(pipe.query_async(conn)).await?;
    let mut adopted = 0;
    for (name, pair) in names.iter().zip(answers.chunks(2)) {
        let value: Option<String> = redis::from_redis_value_ref(&pair[0]).unwrap_or(None);
        let pttl: i64 = redis::from_redis_value_ref(&pair[1]).unwrap_or(-2);
        let (Some(key), Some(value)) = (shared.keys.session_of(name), value) else {
            continue;
        };
        if let Some((state, node, _)) = wire::parse_session(&value) {
            let Some(id) = local.node_id(node) else {
                continue;
            };
            let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
            let idle = shared.idle_limit(state).saturating_sub(left);
            adopted += usize::from(local.table().adopt(key, id, state, idle));
        }
    }
    Ok(adopted)
}

async fn bounded<T>(
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
async fn beat_once(shared: &Shared, local: &dyn Local, linked: &link::Linked) {
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
