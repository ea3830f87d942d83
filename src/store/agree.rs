//! Where the gateways must agree, not just hear of each other: a session moved off
//! a node that is down, and an admin taking a node out. Each is one Lua script
//! that Redis runs whole, the check and the write with nothing between them.
//!
//! Why scripts and not the writer's pipeline: a plain `SET` or `HSET` is last
//! writer wins. Two gateways moving one session at the same moment would each
//! bind it to its own pick and then adopt the other's message, so the student's
//! two requests land on two nodes and the tables end crossed; two admins draining
//! the last two active nodes on two gateways would each pass their own gateway's
//! check. A script is compare-and-set: the second caller sees what the first
//! wrote, so it adopts the winner's node, or gets the same 409 the local rail
//! gives.
//!
//! Why `EVAL` and not `EVALSHA`: both run rarely (a move only when a node goes,
//! an admin click), Redis caches the script's compilation either way, and `EVAL`
//! needs no second round trip after a restart flushed the script cache.
//!
//! Why the hot path stays as it was: a session's use, bind or rotation is never
//! compared; only a bound session changing node is.

use redis::aio::MultiplexedConnection;

use super::link::bounded;
use super::wire::{self, Change};
use super::{Shared, Store};
use crate::config::NodeState;
use crate::sessions::affinity::{SessionKey, SessionState};

/// Moves a session from node `ARGV[1]` unless someone moved it first: then its
/// value as it is now. A session Redis no longer holds is written (nothing to
/// compare with; the first writer wins from there).
///
/// KEYS: session, channel. ARGV: expected node, new value, TTL in ms, message.
const MOVE: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  local node = string.match(current, '^%S+ (%S+)')
  if node ~= ARGV[1] then return current end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return false
";

/// Sets node `ARGV[1]` to state `ARGV[2]` unless that leaves no node active and
/// `ARGV[3]` is not `1` (force). The nodes are the caller's config (`ARGV[5..]`:
/// name, state here), each node's state the one Redis holds when it holds one:
/// a node an admin never touched is as its gateway's file says.
///
/// KEYS: states hash, channel. ARGV: node, state, force, message, then the pairs.
/// Returns `refused`, `forced` (the last active node went out by force) or `changed`.
const NODE_STATE: &str = r"
local target, state = ARGV[1], ARGV[2]
local was_active, any_active = false, false
for i = 5, #ARGV, 2 do
  local name = ARGV[i]
  local now = redis.call('HGET', KEYS[1], name) or ARGV[i + 1]
  if name == target then
    was_active = now == 'active'
    now = state
  end
  if now == 'active' then any_active = true end
end
local last = state ~= 'active' and was_active and not any_active
if last and ARGV[3] ~= '1' then return 'refused' end
redis.call('HSET', KEYS[1], target, state)
redis.call('PUBLISH', KEYS[2], ARGV[4])
if last then return 'forced' end
return 'changed'
";

/// What Redis said of an admin's state change, checked against every gateway's
/// changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Made, and told to the others.
    Changed,
    /// Made by force although it took out the last active node.
    Forced,
    /// Not made: it would leave no node active (some other gateway's change may
    /// have taken the others out a moment ago).
    Refused,
}

impl Store {
    /// A bound session moves from node `from` to `to` (its node is down, gone or
    /// disabled): compare-and-set in Redis, within `store.timeout`. `Some(node)`
    /// when another gateway moved it first: the caller adopts `node` instead. `None`
    /// when this move won, or without a shared store; with Redis down or slow the
    /// move is queued as a plain bind (the book's "Limits today", docs/src/limits.md).
    pub async fn moved(
        &self,
        key: SessionKey,
        state: SessionState,
        from: &str,
        to: &str,
    ) -> Option<String> {
        let shared = self.0.as_ref()?;
        let ttl = shared.idle_limit(state).as_millis() as u64;
        let value = wire::session_value(state, to, &shared.config.name);
        let node = to.to_owned();
        let message = wire::message(&shared.sender, &[Change::Bound { key, state, node }]);
        let mut script = redis::cmd("EVAL");
        script.arg(MOVE).arg(2).arg(shared.keys.session(key));
        script.arg(shared.keys.events()).arg(from).arg(value);
        script.arg(ttl.max(1)).arg(message);
        let answer = shared
            .ask(None, |mut conn| async move {
                script.query_async::<Option<String>>(&mut conn).await
            })
            .await;
        let Some(current) = answer else {
            self.send(|| super::Op::Bind(key, state, to.to_owned()));
            return None;
        };
        let winner = current.as_deref().and_then(wire::parse_session)?.1;
        shared.meters.applied("moved_first");
        Some(winner.to_owned())
    }

    /// An admin moves `node` to `state`, checked in Redis against every gateway's
    /// changes: `nodes` is each of this gateway's PHP nodes with its state here.
    /// `None` without a shared store or while Redis is away (the caller applies
    /// its own rail and queues the change).
    pub async fn checked_node_state(
        &self,
        node: &str,
        state: NodeState,
        force: bool,
        nodes: &[(String, NodeState)],
    ) -> Option<Checked> {
        let shared = self.0.as_ref()?;
        let linked = shared.link.current()?;
        let mut conn = linked.conn.clone();
        match node_state(shared, &mut conn, node, state, force, nodes).await {
            Ok(checked) => Some(checked),
            Err(error) => {
                shared.failed(&linked, &error);
                None
            }
        }
    }
}

async fn node_state(
    shared: &Shared,
    conn: &mut MultiplexedConnection,
    node: &str,
    state: NodeState,
    force: bool,
    nodes: &[(String, NodeState)],
) -> redis::RedisResult<Checked> {
    let (target, name) = (node.to_owned(), state.as_str());
    let change = Change::NodeState {
        node: target,
        state,
    };
    let message = wire::message(&shared.sender, &[change]);
    let mut script = redis::cmd("EVAL");
    script.arg(NODE_STATE).arg(2).arg(shared.keys.nodes());
    script.arg(shared.keys.events()).arg(node).arg(name);
    script.arg(if force { "1" } else { "0" }).arg(message);
    for (name, state) in nodes {
        script.arg(name).arg(state.as_str());
    }
    let answer: String = bounded(script.query_async(conn)).await?;
    Ok(match answer.as_str() {
        "refused" => Checked::Refused,
        "forced" => Checked::Forced,
        _ => Checked::Changed,
    })
}
