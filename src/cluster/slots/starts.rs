//! Quiz starts paced per node: at most a share of the node's slots runs starts at
//! once, the other starts waiting in the gateway in the order they came.
//!
//! Why a share, not a rate: a start's cost is the node's own (creating an attempt,
//! then its first page, the heaviest of the quiz), and it changes with the quiz,
//! the site and the hour. A fixed number of starts at once paces them at whatever
//! speed the node really finishes them (Little's law), with no figure to guess,
//! and it leaves the rest of the node's slots to students already answering, who
//! then find a worker free instead of waiting behind the class's starts. Nobody is
//! refused: a start is a POST, so it is never replayed nor shown the waiting page;
//! it waits, with the longest patience, and Moodle's timer only starts when the
//! attempt is created, after the wait.
//!
//! A `tokio::sync::Semaphore` is first come, first served, which is the order the
//! class clicked in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Ended;

/// One node's gate for quiz starts.
#[derive(Debug)]
pub struct Starts {
    /// Starts at once; 0: no gate.
    share: AtomicUsize,
    /// The gate of the current share. A reload that changes the share puts a new
    /// one in and closes the old, whose waiters then line up at the new one.
    gate: Mutex<Arc<Semaphore>>,
    /// Starts waiting at the gate now.
    waiting: AtomicUsize,
}

/// A start's turn on its node, given back when dropped.
#[derive(Debug)]
pub struct StartPermit {
    _permit: Option<OwnedSemaphorePermit>,
    /// Whether the start waited at the gate.
    pub waited: bool,
}

impl StartPermit {
    /// Whether it holds a place at a gate (not a start on a node without one).
    pub fn holds_a_turn(&self) -> bool {
        self._permit.is_some()
    }
}

impl Starts {
    /// A gate letting `share` starts run at once (0: none).
    pub fn new(share: usize) -> Self {
        Self {
            share: AtomicUsize::new(share),
            gate: Mutex::new(Arc::new(Semaphore::new(share))),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The share (0: no gate).
    pub fn share(&self) -> usize {
        self.share.load(Ordering::Relaxed)
    }

    /// Starts waiting at the gate now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Applies a reloaded share: those waiting line up again at the new gate, in
    /// the order they wake; starts already running finish outside its count.
    pub fn set_share(&self, share: usize) {
        if self.share.swap(share, Ordering::Relaxed) == share {
            return;
        }
        let new = Arc::new(Semaphore::new(share));
        let old = std::mem::replace(&mut *self.lock(), new);
        old.close();
    }

    /// The start's turn: at once while fewer than the share run, else in the order
    /// the starts came, for at most `patience`. Dropping the future gives the place up.
    pub async fn enter(&self, patience: Duration) -> Result<StartPermit, Ended> {
        let deadline = Instant::now() + patience;
        loop {
            if self.share() == 0 {
                return Ok(StartPermit {
                    _permit: None,
                    waited: false,
                });
            }
            let gate = self.lock().clone();
            if let Ok(permit) = gate.clone().try_acquire_owned() {
                return Ok(StartPermit {
                    _permit: Some(permit),
                    waited: false,
                });
            }
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let _counted = Counted(&self.waiting);
            match tokio::time::timeout_at(deadline, gate.acquire_owned()).await {
                Ok(Ok(permit)) => {
                    return Ok(StartPermit {
                        _permit: Some(permit),
                        waited: true,
                    })
                }
                // A reload replaced the gate: line up at the new one.
                Ok(Err(_closed)) => continue,
                Err(_) => return Err(Ended::Timeout),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<Semaphore>> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes one off a count when dropped.
pub(super) struct Counted<'a>(pub(super) &'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn starts_past_the_share_wait_and_go_in_the_order_they_came() {
        let starts = Arc::new(Starts::new(1));
        let first = starts.enter(LONG).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for name in ["second", "third", "fourth"] {
            let (starts, tx) = (starts.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let permit = starts.enter(LONG).await.unwrap();
                tx.send(name).unwrap();
                drop(permit);
            }));
            // Each joins the gate before the next one comes.
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(starts.waiting(), 3);
        assert!(rx.try_recv().is_err(), "nobody passes the running start");
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        let order: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, ["second", "third", "fourth"]);
        assert_eq!(starts.waiting(), 0);
    }

    #[tokio::test]
    async fn without_a_share_every_start_goes_at_once() {
        let starts = Starts::new(0);
        let _a = starts.enter(LONG).await.unwrap();
        let _b = starts.enter(LONG).await.unwrap();
        assert_eq!(starts.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_waited_its_patience_ends_and_leaves_no_place() {
        let starts = Arc::new(Starts::new(1));
        let _running = starts.enter(LONG).await.unwrap();
        let ended = starts.enter(Duration::from_secs(5)).await;
        assert_eq!(ended.unwrap_err(), Ended::Timeout);
        assert_eq!(starts.waiting(), 0);
    }

    #[tokio::test]
    async fn a_reload_that_raises_the_share_lets_the_waiting_starts_in() {
        let starts = Arc::new(Starts::new(1));
        let _running = starts.enter(LONG).await.unwrap();
        let waiter = {
            let starts = starts.clone();
            tokio::spawn(async move { starts.enter(LONG).await.map(drop) })
        };
        while starts.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        starts.set_share(2);
        waiter.await.unwrap().unwrap();
        starts.set_share(0);
        let _free = starts.enter(LONG).await.unwrap();
    }
}
