//! The kernel's coarse monotonic clock, for the times every request takes whose
//! milliseconds do not matter: a session's last use, a kept node connection's idle
//! time, and the deadlines each request moves later ([`Deadline`]).
//!
//! Why: `Instant::now()` reads the TSC through the vDSO and scales it, 34 ns a read
//! on the 2-core VM the benchmarks run on, where a small page's whole user-space cost
//! is about 5 µs and it read the clock 9 times. `CLOCK_MONOTONIC_COARSE` is the
//! time the kernel noted at its last tick, read from the vDSO in 6 ns; it runs on the
//! same monotonic base, at most one tick (4 ms at `HZ=250`) behind. Times that are
//! measured (a node's answer time) stay on `Instant`.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use rustix::time::{clock_gettime, ClockId};
use tokio::time::{Instant, Sleep};

/// Time since an arbitrary point (the machine's boot), as of the kernel's last tick.
pub fn coarse() -> Duration {
    let now = clock_gettime(ClockId::MonotonicCoarse);
    // Both fields are non-negative for a monotonic clock.
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A deadline that each request moves later (a request head's, a node answer's),
/// kept on one tokio timer that is not moved with it.
///
/// Why: moving a timer costs a read of the precise clock and a compare-and-swap in
/// tokio's wheel, on every request, for a deadline that almost never passes. Here a
/// move is a coarse read; the timer keeps the deadline it was armed for, and when
/// it fires before the deadline the deadline now stands for, it is armed again for
/// the rest. A deadline moved sooner than the timer (a shorter limit after a
/// reload) re-arms it at once.
///
/// Its due time is on the real clock: under tokio's paused test clock the timer
/// would fire and be armed again until real time caught up, so a test that pauses
/// time must not wait on one (none does).
#[derive(Debug)]
pub struct Deadline {
    timer: Pin<Box<Sleep>>,
    /// The coarse time the timer is armed for.
    armed: Duration,
    /// The coarse time the deadline is; `None`: none (a limit too long to count).
    due: Option<Duration>,
}

impl Deadline {
    /// A deadline `limit` from now.
    pub fn after(limit: Duration) -> Self {
        let due = coarse().checked_add(limit);
        let at = Instant::now().checked_add(limit);
        let timer = match at {
            Some(at) => tokio::time::sleep_until(at),
            // Never fires in practice; `due` is `None` too.
            None => tokio::time::sleep(Duration::from_secs(365 * 24 * 3600)),
        };
        Self {
            timer: Box::pin(timer),
            armed: due.unwrap_or(Duration::MAX),
            due,
        }
    }

    /// Moves the deadline to `limit` from now.
    pub fn set(&mut self, limit: Duration) {
        self.due = coarse().checked_add(limit);
        if let Some(due) = self.due.filter(|&due| due < self.armed) {
            if let Some(at) = Instant::now().checked_add(limit) {
                self.timer.as_mut().reset(at);
                self.armed = due;
            }
        }
    }

    /// Whether the deadline has passed; if not, `cx` is woken by the time it may.
    pub fn poll_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(due) = self.due else {
            return false;
        };
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = coarse();
            if now >= due {
                return true;
            }
            // Fired for an earlier deadline, or the coarse clock is a tick behind.
            let Some(at) = Instant::now().checked_add(due - now) else {
                return false;
            };
            self.timer.as_mut().reset(at);
            self.armed = due;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;

    #[test]
    fn the_coarse_clock_keeps_pace_with_the_monotonic_one_a_tick_behind() {
        let (coarse_start, start) = (coarse(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let (coarse_passed, passed) = (coarse() - coarse_start, start.elapsed());
        let apart = passed.abs_diff(coarse_passed);
        assert!(
            apart < Duration::from_millis(25),
            "{coarse_passed:?} against {passed:?}"
        );
    }

    /// How long until `deadline` passes, on the precise clock.
    async fn passes(deadline: &mut Deadline) -> Duration {
        let start = std::time::Instant::now();
        poll_fn(|cx| match deadline.poll_passed(cx) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await;
        start.elapsed()
    }

    #[tokio::test]
    async fn a_deadline_moved_later_passes_at_its_new_time_not_its_first() {
        let mut deadline = Deadline::after(Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(60)).await;
        deadline.set(Duration::from_millis(150));
        let waited = passes(&mut deadline).await;
        assert!(
            waited >= Duration::from_millis(140),
            "passed after {waited:?}"
        );
        assert!(
            waited < Duration::from_millis(400),
            "passed after {waited:?}"
        );
    }

    #[tokio::test]
    async fn a_deadline_moved_sooner_passes_at_once_its_time_comes() {
        let mut deadline = Deadline::after(Duration::from_secs(60));
        deadline.set(Duration::from_millis(50));
        let waited = passes(&mut deadline).await;
        assert!(
            waited >= Duration::from_millis(40),
            "passed after {waited:?}"
        );
        assert!(waited < Duration::from_secs(5), "passed after {waited:?}");
    }

    #[tokio::test]
    async fn a_deadline_too_far_to_count_never_passes() {
        let mut deadline = Deadline::after(Duration::from_millis(20));
        deadline.set(Duration::MAX);
        let never = tokio::time::timeout(Duration::from_millis(100), passes(&mut deadline));
        assert!(never.await.is_err());
    }
}
