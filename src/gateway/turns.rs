//! One session's requests at its node at once, under `[surge] session_max_active`;
//! the rest wait here, in the order they came.
//!
//! Why: Moodle locks a session for a whole request, so one student's parallel
//! requests wait for each other inside PHP, each holding a PHP worker while it
//! waits. A tab that reloads in a loop, a script gone wrong or an HTTP/2 page that
//! asks for thirty files at once would take a whole node's workers for one
//! student. Waiting here they hold nothing of the node's. The default lets an
//! ordinary browser's connections through untouched.
//!
//! How: one small first-come-first-served gate per session with requests in
//! flight, made when its first request comes and removed when its last leaves, so
//! the map holds only sessions at work now. The map's shard lock is taken to find
//! the gate and again to remove it; never across an `.await`.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::sessions::affinity::SessionKey;

/// Requests of one session that may wait at once: past this, a session is not a
/// student's browser but a loop, and more waiting would only hold memory.
pub const MAX_WAITING_PER_SESSION: usize = 32;

/// The gates of the sessions with requests in flight.
#[derive(Debug, Default)]
pub struct Turns {
    gates: DashMap<SessionKey, Arc<Gate>>,
}

#[derive(Debug)]
struct Gate {
    turns: Arc<Semaphore>,
    /// Requests holding or waiting for a turn.
    users: std::sync::atomic::AtomicUsize,
}

/// Why a request got no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTurn {
    /// [`MAX_WAITING_PER_SESSION`] requests of the session wait already.
    TooMany,
    /// It waited its patience.
    Timeout,
}

/// A turn held, given back when dropped; `waited` says whether it had to wait.
#[derive(Debug)]
pub struct Turn<'a> {
    turns: &'a Turns,
    key: SessionKey,
    gate: Arc<Gate>,
    permit: Option<OwnedSemaphorePermit>,
    /// Whether the request waited for its turn.
    pub waited: bool,
}

impl Turns {
    /// A turn for a request of `key`, at most `max` of the session at once,
    /// waiting at most `patience`.
    pub async fn take(
        &self,
        key: SessionKey,
        max: usize,
        patience: Duration,
    ) -> Result<Turn<'_>, NoTurn> {
        use std::sync::atomic::Ordering::Relaxed;
        let gate = {
            let entry = self.gates.entry(key).or_insert_with(|| {
                Arc::new(Gate {
                    turns: Arc::new(Semaphore::new(max)),
                    users: 0.into(),
                })
            });
            entry.users.fetch_add(1, Relaxed);
            entry.clone()
        };
        let mut turn = Turn {
            turns: self,
            key,
            gate,
            permit: None,
            waited: false,
        };
        let turns = turn.gate.turns.clone();
        if let Ok(permit) = turns.clone().try_acquire_owned() {
            turn.permit = Some(permit);
            return Ok(turn);
        }
        if turn.gate.users.load(Relaxed) > max + MAX_WAITING_PER_SESSION {
            return Err(NoTurn::TooMany);
        }
        turn.waited = true;
        match tokio::time::timeout(patience, turns.acquire_owned()).await {
            Ok(Ok(permit)) => {
                turn.permit = Some(permit);
                Ok(turn)
            }
            // Never closed; a timeout either way.
            Ok(Err(_)) | Err(_) => Err(NoTurn::Timeout),
        }
    }

    /// Sessions with requests in flight now.
    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.gates.len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.permit.take());
        let left = self
            .gate
            .users
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if left == 1 {
            // The last one out removes the gate, unless another request of the
            // session found it in the meantime (it counted itself under the same
            // shard lock this check takes).
            (self.turns.gates).remove_if(&self.key, |_, gate| {
                gate.users.load(std::sync::atomic::Ordering::Relaxed) == 0
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    fn key(n: u64) -> SessionKey {
        SessionKey::prefix_range(&format!("{n:016x}")).unwrap().0
    }

    #[tokio::test]
    async fn a_session_past_its_cap_waits_and_goes_in_order_while_others_pass() {
        let turns = Arc::new(Turns::default());
        let first = turns.take(key(1), 1, LONG).await.unwrap();
        assert!(!first.waited);
        let other = turns.take(key(2), 1, LONG).await.unwrap();
        assert!(!other.waited, "another session is not held by this one");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for name in ["second", "third"] {
            let (turns, tx) = (turns.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let turn = turns.take(key(1), 1, LONG).await.unwrap();
                assert!(turn.waited);
                tx.send(name).unwrap();
            }));
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        }
        assert!(rx.try_recv().is_err());
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        let order: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, ["second", "third"]);
        drop(other);
        assert_eq!(turns.sessions(), 0, "nothing kept for sessions at rest");
    }

    #[tokio::test]
    async fn a_session_with_too_many_waiting_is_turned_away() {
        let turns = Arc::new(Turns::default());
        let _held = turns.take(key(7), 1, LONG).await.unwrap();
        let mut waiting = Vec::new();
        for _ in 0..MAX_WAITING_PER_SESSION {
            let turns = turns.clone();
            waiting.push(tokio::spawn(async move {
                turns.take(key(7), 1, LONG).await.map(drop)
            }));
        }
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        let more = turns.take(key(7), 1, LONG).await;
        assert_eq!(more.unwrap_err(), NoTurn::TooMany);
        for task in waiting {
            task.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waited_its_patience_ends_and_the_gate_goes_with_the_last() {
        let turns = Turns::default();
        let held = turns.take(key(3), 1, LONG).await.unwrap();
        let ended = turns.take(key(3), 1, Duration::from_secs(2)).await;
        assert_eq!(ended.unwrap_err(), NoTurn::Timeout);
        assert_eq!(turns.sessions(), 1);
        drop(held);
        assert_eq!(turns.sessions(), 0);
    }
}
