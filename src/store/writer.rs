//! Writing changes behind the request path: the queue's changes, a pipeline at a
//! time, each ending with the messages that tell the other gateways.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::link::BACKGROUND;
use super::wire::{self, Change};
use super::{Op, Shared, BATCH};

/// Most sessions one writer pipeline names: a minute's touches of a busy gateway
/// must not make one pipeline of a quarter million commands under one deadline.
const PIPELINE_KEYS: usize = 4096;

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
pub(super) fn tell(shared: &Shared, pipe: &mut redis::Pipeline, changes: &[Change]) {
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
