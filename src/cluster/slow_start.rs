//! Slow start: a node back in the deal (up again, undrained, enabled, or new to a
//! running gateway) gets a share of new sessions that grows over `[session]
//! slow_start`, instead of its full share at once.
//!
//! Why: a Moodle node that was down or out for maintenance comes back cold. Its
//! OPcache holds no compiled script, its local cache (`$CFG->localcachedir`: the
//! theme's CSS, the JavaScript, the language strings) and MUC's local stores are
//! empty, so its first pages cost several times a warm node's. A full share of a
//! busy morning's logins at once would queue them behind the compiling; a ramp lets
//! it warm on a few students first. Sessions already bound to it are never touched:
//! affinity always wins, only the deal of *new* sessions is shaped here.
//!
//! The rule is HAProxy's `slowstart` and Envoy's `slow_start_config` with its
//! defaults (aggression 1, `min_weight_percent` 10): the node's weight is scaled by
//! `elapsed / window`, linear, never below a tenth, so it gets some students from
//! the first second (a node that gets none never warms) and its full share when the
//! window ends. Like HAProxy, a gateway that starts does not ramp its nodes: they
//! were serving before, and ramping all of them at once would change nothing but
//! each one's floor.
//!
//! How it stays off the hot path's locks: when the node last came back is one
//! atomic timestamp on the coarse monotonic clock, and round robin keeps its deal
//! by skipping the turns a warming node is not yet owed. Which turns it takes is a
//! pure function of its own turn number ([`takes_turn`]), spread evenly as a line
//! is drawn on a grid, so no counter is shared beyond the deal's own ticket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A node's share of its full share of new sessions, in thousandths (1000: all of it).
pub type Share = u32;

/// A node's whole share: not warming.
pub const FULL: Share = 1000;

/// The least share a warming node gets: a tenth, Envoy's `min_weight_percent`.
pub const FLOOR: Share = 100;

/// The share of a node that came back `elapsed` ago, with a ramp over `window`
/// (zero: no slow start).
pub fn share(elapsed: Duration, window: Duration) -> Share {
    if elapsed >= window {
        return FULL;
    }
    let ramp = elapsed.as_millis() * u128::from(FULL) / window.as_millis().max(1);
    Share::try_from(ramp).map_or(FULL, |ramp| ramp.max(FLOOR))
}

/// `share` as a fraction of the whole, for `/metrics` and the admin API.
pub fn fraction(share: Share) -> f64 {
    f64::from(share) / f64::from(FULL)
}

/// Whether a node at `share` takes its `turn`-th turn of the deal: `share` of every
/// thousand of its turns, evenly spread (Bresenham's line), so that at a tenth it
/// takes every tenth turn rather than a hundred in a row.
pub fn takes_turn(turn: u64, share: Share) -> bool {
    let (m, share) = (turn % u64::from(FULL), u64::from(share.min(FULL)));
    (m + 1) * share / u64::from(FULL) > m * share / u64::from(FULL)
}

/// When a node last came back, in milliseconds of the coarse monotonic clock; 0:
/// not since the gateway started.
#[derive(Debug, Default)]
pub struct CameBack(AtomicU64);

impl CameBack {
    /// The node comes back now.
    pub fn now(&self) {
        self.at(now_ms());
    }

    /// The node came back at `ms` (tests move it into the past).
    pub fn at(&self, ms: u64) {
        self.0.store(ms.max(1), Ordering::Relaxed);
    }

    /// When, if it ever did.
    pub fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&ms| ms != 0)
    }
}

/// The coarse monotonic clock in milliseconds: the clock [`CameBack`] is kept on.
pub fn now_ms() -> u64 {
    u64::try_from(crate::clock::coarse().as_millis()).unwrap_or(u64::MAX)
}

/// The share of a node whose latest return is the later of `returns`, now.
pub fn share_now(returns: [&CameBack; 2], window: Duration) -> Share {
    let latest = returns.iter().filter_map(|r| r.get()).max();
    match latest {
        Some(back) if !window.is_zero() => {
            let elapsed = now_ms().saturating_sub(back);
            share(Duration::from_millis(elapsed), window)
        }
        _ => FULL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(seconds: u64) -> Share {
        share(Duration::from_secs(seconds), MINUTE)
    }

    #[test]
    fn the_share_grows_linearly_over_the_window_from_a_floor() {
        assert_eq!(at(0), FLOOR, "some students from the first second");
        assert_eq!(at(3), FLOOR, "5 % is below the floor");
        assert_eq!([at(15), at(30), at(45)], [250, 500, 750]);
        assert_eq!(at(60), FULL);
        assert_eq!(at(3600), FULL, "and stays full");
    }

    #[test]
    fn a_window_of_zero_is_the_full_share_at_once() {
        assert_eq!(share(Duration::ZERO, Duration::ZERO), FULL);
        let back = CameBack::default();
        back.now();
        assert_eq!(
            share_now([&back, &CameBack::default()], Duration::ZERO),
            FULL
        );
    }

    #[test]
    fn a_node_that_never_came_back_is_not_warming() {
        let never = CameBack::default();
        assert_eq!(share_now([&never, &never], MINUTE), FULL);
    }

    #[test]
    fn the_later_return_counts() {
        let (long_ago, just_now) = (CameBack::default(), CameBack::default());
        long_ago.at(now_ms().saturating_sub(3_600_000));
        assert_eq!(share_now([&long_ago, &just_now], MINUTE), FULL);
        just_now.now();
        assert_eq!(share_now([&long_ago, &just_now], MINUTE), FLOOR);
    }

    #[test]
    fn a_share_takes_that_many_turns_in_a_thousand_evenly_spread() {
        for share in [0, 1, FLOOR, 333, 500, 999, FULL] {
            let taken = (0..10_000).filter(|&t| takes_turn(t, share)).count();
            assert_eq!(taken, 10 * share as usize, "share {share}");
        }
        let tenth: Vec<u64> = (0..30).filter(|&t| takes_turn(t, FLOOR)).collect();
        assert_eq!(tenth, [9, 19, 29], "every tenth turn, not ten in a row");
    }
}
