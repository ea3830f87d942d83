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
use std::sync::OnceLock;
use std::task::Context;
use std::time::Duration;

use rustix::time::{clock_getres, clock_gettime, ClockId};
use tokio::time::{Instant, Sleep};

/// Time since an arbitrary point (the machine's boot), as of the kernel's last tick.
pub fn coarse() -> Duration {
    let now = clock_gettime(ClockId::MonotonicCoarse);
    // Both fields are non-negative for a monotonic clock.
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// How far the coarse clock may trail the precise one: its resolution, a tick.
fn tick() -> Duration {
    static TICK: OnceLock<Duration> = OnceLock::new();
    *TICK.get_or_init(|| {
        let res = clock_getres(ClockId::MonotonicCoarse);
        Duration::new(res.tv_sec as u64, res.tv_nsec as u32)
    })
}

/// `limit` from now on the coarse clock, a tick added: a time that has come on the
/// coarse clock has come on the precise one (`None`: too far to count).
fn due_after(limit: Duration) -> Option<Duration> {
    coarse().checked_add(limit)?.checked_add(tick())
}

/// A deadline that each request moves later (a request head's, a node answer's),
/// kept on one tokio timer that is not moved with it. It passes no sooner than its
/// limit, and at most a tick (4 ms at `HZ=250`) later.
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
    timer: Timer,
    /// The coarse time the timer is armed for.
    armed: Duration,
    /// The coarse time the deadline is; `None`: none (a limit too long to count).
    due: Option<Duration>,
    /// Who the timer wakes, as far as known: the address and vtable of the waker it
    /// took at its last poll (a clone would cost two reference counts a request on
    /// a node connection, which each request polls from its own task).
    registered: Option<(usize, usize)>,
}

/// A tokio timer in a box of its own: a deadline's, or a parked connection's.
pub type Timer = Pin<Box<Sleep>>;

/// More than two ticks of the coarse clock (4 ms each at `HZ=250`, 10 ms at
/// `HZ=100`), with room to spare: see [`Deadline::poll_passed`].
const LAG: Duration = Duration::from_secs(1);

impl Deadline {
    /// A deadline `limit` from now.
    pub fn after(limit: Duration) -> Self {
        let due = due_after(limit);
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
            registered: None,
        }
    }

    /// The timer alone, armed for `limit` from now: all a parked connection keeps of
    /// its deadline (a parked connection is woken once, so the bookkeeping that spares
    /// each request's move a timer reset is not worth its room in every idle task).
    pub fn into_timer(mut self, limit: Duration) -> Timer {
        if let Some(at) = Instant::now().checked_add(limit) {
            self.timer.as_mut().reset(at);
        }
        self.timer
    }

    /// A deadline again, at the time a parked connection's timer is armed for.
    pub fn from_timer(timer: Timer) -> Self {
        let due = due_after(timer.deadline().saturating_duration_since(Instant::now()));
        Self {
            timer,
            armed: due.unwrap_or(Duration::MAX),
            due,
            registered: None,
        }
    }

    /// Moves the deadline to `limit` from now.
    pub fn set(&mut self, limit: Duration) {
        self.due = due_after(limit);
        if let Some(due) = self.due.filter(|&due| due < self.armed) {
            if let Some(at) = Instant::now().checked_add(limit) {
                self.timer.as_mut().reset(at);
                self.armed = due;
                self.registered = None;
            }
        }
    }

    /// Whether the deadline has passed; if not, `cx` is woken by the time it may.
    ///
    /// The timer is not polled while it cannot have fired and already holds this
    /// waker: a poll of tokio's timer (its waker registered again, the task's budget
    /// spent) cost some 90 instructions, on every wake of a connection waiting for a
    /// head. It cannot have fired while the coarse clock is more than [`LAG`] short
    /// of the time it is armed for: it fires on the precise clock no sooner than a
    /// tick before that time (the tick [`due_after`] adds), and the coarse clock
    /// trails the precise one by at most another tick. A timer that has not fired
    /// keeps the waker it took, so no other task can be at that address meanwhile.
    pub fn poll_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(due) = self.due else {
            return false;
        };
        let waker = cx.waker();
        let waker = (waker.data() as usize, waker.vtable() as *const _ as usize);
        if self.registered == Some(waker) && coarse().saturating_add(LAG) < self.armed {
            return false;
        }
        let passed = self.poll_timer(cx, due);
        // A task out of tokio's budget is told to yield, and the timer does not
        // take its waker; with budget left after the poll, it did.
        self.registered = (!passed && tokio::task::coop::has_budget_remaining()).then_some(waker);
        passed
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>, due: Duration) -> bool {
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
    use std::task::{Poll, Waker};

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
    async fn a_deadline_never_passes_before_its_limit() {
        // The coarse clock trails the precise one by up to a tick: a deadline kept
        // on it alone would pass up to a tick early, one time in a few, when its
        // timer fires for an earlier deadline and is armed again for the rest (as
        // on a kept connection, whose each request moves it later).
        for (first, limit) in [
            (1, 23),
            (2, 31),
            (5, 37),
            (6, 41),
            (7, 43),
            (9, 47),
            (10, 53),
        ]
        .into_iter()
        .chain([
            (11, 59),
            (13, 61),
            (14, 67),
            (15, 71),
            (17, 73),
            (18, 79),
            (19, 83),
        ]) {
            let (first, limit) = (Duration::from_millis(first), Duration::from_millis(limit));
            let start = std::time::Instant::now();
            let mut deadline = Deadline::after(first);
            deadline.set(limit);
            passes(&mut deadline).await;
            let waited = start.elapsed();
            assert!(waited >= limit, "{limit:?} passed after {waited:?}");
        }
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
    async fn a_deadline_polled_while_far_off_still_wakes_its_task_when_it_passes() {
        let mut deadline = Deadline::after(LAG + Duration::from_millis(200));
        // First polled from elsewhere (another waker), then repeatedly by the task
        // that waits: each poll while the time is far off leaves the timer alone.
        let mut elsewhere = Context::from_waker(Waker::noop());
        assert!(!deadline.poll_passed(&mut elsewhere));
        let polls = std::cell::Cell::new(0);
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            let start = std::time::Instant::now();
            poll_fn(|cx| {
                polls.set(polls.get() + 1);
                match deadline.poll_passed(cx) {
                    true => Poll::Ready(()),
                    false => {
                        // Polled again at once for the first few: as a busy task would.
                        if polls.get() < 5 {
                            cx.waker().wake_by_ref();
                        }
                        Poll::Pending
                    }
                }
            })
            .await;
            start.elapsed()
        });
        // A task the timer never wakes is polled again only by the 10 s timeout.
        let waited = waited.await.expect("the deadline's task was never woken");
        assert!(waited >= LAG, "passed after {waited:?}");
        assert!(waited < Duration::from_secs(5), "passed after {waited:?}");
        assert!(polls.get() >= 5);
    }

    #[tokio::test]
    async fn a_deadline_too_far_to_count_never_passes() {
        let mut deadline = Deadline::after(Duration::from_millis(20));
        deadline.set(Duration::MAX);
        let never = tokio::time::timeout(Duration::from_millis(100), passes(&mut deadline));
        assert!(never.await.is_err());
    }
}
