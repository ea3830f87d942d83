//! The resync at every connect (the first one included):
//! 1. the logouts, evictions and admin states kept while Redis was away are written;
//! 2. if any bind missed Redis (at start, for what the snapshot restored; after any
//!    lost connection, since Redis may come back empty), every live local entry is
//!    written back with `SET NX`: the first writer wins;
//! 3. the admin states and every session in Redis are read into the local table,
//!    which adopts the winner of any conflict and whatever the others bound
//!    meanwhile (their messages were lost with the connection).
//!
//! The subscription is made before step 1, so no change made during a resync is
//! missed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use super::link::{self, bounded};
use super::wire::{self, Change};
use super::writer::{command, tell};
use super::{Local, Op, Shared, BATCH};
use crate::config::NodeState;

/// The resync at every connect (see the module's doc). A failure drops the
/// connection, and the next connect starts it again.
pub(super) async fn resync(
    shared: Arc<Shared>,
    local: Arc<dyn Local>,
    mut conn: MultiplexedConnection,
    generation: u64,
) {
    let started = std::time::Instant::now();
    let done = async {
        let replayed = replay(&shared, &mut conn).await?;
        let written = if shared.dirty.swap(false, Ordering::Relaxed) {
            // Cancelled (the link broke again) or failed: still to be written.
            let unfinished = Unfinished(&shared);
            let written = write_back(&shared, &*local, &mut conn).await?;
            std::mem::forget(unfinished);
            written
        } else {
            0
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
