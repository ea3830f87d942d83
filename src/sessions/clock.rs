//! Table time: seconds since 2020, read cheaply on every lookup, kept meaningful
//! across processes (snapshots) and movable by tests that must not sleep for hours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Table timestamps count seconds from 2020-01-01 UTC: wall-clock time, so a
/// snapshot means the same to the next process, in 32 bits until 2156.
const EPOCH: u64 = 1_577_836_800;

/// Table time in seconds, cheap to read and movable by tests and the demo. It reads
/// the wall clock once at start and advances with the monotonic clock, so a clock
/// step while running neither expires nor revives sessions.
#[derive(Debug, Clone)]
pub struct Clock(Arc<ClockInner>);

#[derive(Debug)]
struct ClockInner {
    /// The coarse clock ([`crate::clock`]) at start: a lookup reads the time of
    /// every request, and needs its seconds only.
    start: Duration,
    start_at: u64,
    skew: AtomicU64,
}

impl Default for Clock {
    fn default() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(EPOCH, |d| d.as_secs());
        Self(Arc::new(ClockInner {
            start: crate::clock::coarse(),
            start_at: unix.saturating_sub(EPOCH),
            skew: AtomicU64::new(0),
        }))
    }
}

impl Clock {
    /// Table time now.
    pub fn now(&self) -> u32 {
        let secs = self.0.start_at
            + crate::clock::coarse()
                .saturating_sub(self.0.start)
                .as_secs()
            + self.0.skew.load(Ordering::Relaxed);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// Moves the clock forward, for expiry tests that must not sleep for hours.
    pub fn advance(&self, by: Duration) {
        self.0.skew.fetch_add(by.as_secs(), Ordering::Relaxed);
    }

    /// Converts a table timestamp to Unix seconds.
    pub fn to_unix(&self, at: u32) -> u64 {
        EPOCH + u64::from(at)
    }

    /// Converts Unix seconds to a table timestamp (clamped to the table's range).
    pub fn from_unix(&self, unix: u64) -> u32 {
        u32::try_from(unix.saturating_sub(EPOCH)).unwrap_or(u32::MAX)
    }
}
