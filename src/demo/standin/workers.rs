//! A stand-in node's PHP workers: at most so many requests worked on at once, each
//! taking a set time, the rest waiting in the node's own backlog, first come first
//! served and blind, as PHP-FPM's listen queue is. Off (no limit, no delay) unless a
//! test or the demo turns it on, to show what the gateway's `[surge]` line changes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;

/// The pool, when set: its workers and how long one page takes.
#[derive(Debug, Default)]
pub(super) struct Workers {
    pool: Mutex<Option<(Arc<Semaphore>, Duration)>>,
    /// Requests a worker is on now (health probes not counted).
    busy: AtomicUsize,
    /// The most that were ever worked on at once (probes not counted).
    busiest: AtomicUsize,
}

/// A worker on one request; the count goes down when it is dropped.
pub(super) struct Working<'a> {
    counted: Option<&'a AtomicUsize>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        if let Some(busy) = self.counted {
            busy.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Workers {
    /// `count` workers, each page taking `page`; `None` lifts the limit.
    pub(super) fn set(&self, pool: Option<(usize, Duration)>) {
        let pool = pool.map(|(count, page)| (Arc::new(Semaphore::new(count)), page));
        *self.pool.lock().unwrap_or_else(PoisonError::into_inner) = pool;
    }

    /// Waits for a worker, then for the page's time; holds the worker until the
    /// returned guard drops. A probe takes a worker like any request, as the real
    /// one does, but is not counted.
    pub(super) async fn work(&self, probe: bool) -> Working<'_> {
        let pool = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some((semaphore, page)) = pool else {
            return Working {
                counted: None,
                _permit: None,
            };
        };
        let permit = semaphore.acquire_owned().await.ok();
        let counted = (!probe).then(|| {
            let now = self.busy.fetch_add(1, Ordering::Relaxed) + 1;
            self.busiest.fetch_max(now, Ordering::Relaxed);
            &self.busy
        });
        tokio::time::sleep(page).await;
        Working {
            counted,
            _permit: permit,
        }
    }

    /// The most requests worked on at once so far.
    pub(super) fn busiest(&self) -> usize {
        self.busiest.load(Ordering::Relaxed)
    }
}
