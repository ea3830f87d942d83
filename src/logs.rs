//! Logs that repeat under load: said at most once per interval, with the count of
//! what was held back in between.
//!
//! Why: the events an operator must hear about (refused requests, lost sessions,
//! evictions, failed admin logins) come in floods exactly when something is wrong,
//! and a log that writes a line per event then costs more than the traffic it
//! describes and buries everything else. The exact counts are in `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A gate for one kind of log line: open at most once per interval.
#[derive(Debug)]
pub struct Every {
    interval_ms: u64,
    /// Milliseconds since [`start`] at which the gate opens again.
    next: AtomicU64,
    /// Events since the last line that was let through.
    held: AtomicU64,
}

/// The process's time origin for every gate.
fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl Every {
    /// A gate that opens once per `interval` (a `const fn`, for statics).
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval_ms: interval.as_millis() as u64,
            next: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last line)` when this event may be logged;
    /// `None` (counted) while the gate is shut. Lock-free: one racer wins.
    pub fn allow(&self) -> Option<u64> {
        let now = u64::try_from(start().elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next.load(Ordering::Relaxed);
        let won = now >= next
            && (self.next)
                .compare_exchange(
                    next,
                    now + self.interval_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if won {
            Some(self.held.swap(0, Ordering::Relaxed))
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_one_line_then_the_count_of_the_rest() {
        let gate = Every::new(Duration::from_secs(3600));
        assert_eq!(gate.allow(), Some(0), "the first event is logged");
        for _ in 0..999 {
            assert_eq!(gate.allow(), None);
        }
        assert_eq!(gate.held.load(Ordering::Relaxed), 999);
    }

    #[test]
    fn the_gate_opens_again_after_its_interval() {
        // A second apart: a busy machine may pause this thread, not for that long.
        let gate = Every::new(Duration::from_secs(1));
        assert_eq!(gate.allow(), Some(0));
        assert_eq!(gate.allow(), None);
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(gate.allow(), Some(1), "the line says one was held back");
    }
}
