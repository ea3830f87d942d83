//! The arithmetic of the dashboard's history: a ring of a fixed number of points,
//! a counter's growth between two readings, and a quantile from a histogram's
//! bucket counts.
//!
//! Why a ring made full-size at once: the history must cost the same on a quiet
//! night and on exam day. Its memory is decided when a node first appears, and a
//! new point overwrites the oldest; nothing grows with traffic or with time.
//!
//! Why a counter that went down counts from zero: that is Prometheus's rule for a
//! reset (`rate()`), and the only safe reading of it: the counter started again,
//! so what it holds now is what happened since. A plot never shows the huge
//! negative-turned-positive step a plain subtraction would make.

/// The last `capacity` points pushed, oldest first, in memory allocated once.
#[derive(Debug, Clone)]
pub(super) struct Ring<T> {
    points: Vec<T>,
    /// Where the next point goes once the ring is full (the oldest point).
    next: usize,
}

impl<T: Copy> Ring<T> {
    /// An empty ring that will hold `capacity` points (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            points: Vec::with_capacity(capacity.max(1)),
            next: 0,
        }
    }

    /// Adds `point` as the newest, forgetting the oldest when full.
    pub(super) fn push(&mut self, point: T) {
        if self.points.len() < self.points.capacity() {
            self.points.push(point);
        } else {
            self.points[self.next] = point;
            self.next = (self.next + 1) % self.points.len();
        }
    }

    /// The points held, oldest first.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        let (newer, older) = self.points.split_at(self.next);
        older.iter().chain(newer)
    }

    /// The newest point.
    pub(super) fn last(&self) -> Option<&T> {
        self.iter().next_back()
    }

    pub(super) fn len(&self) -> usize {
        self.points.len()
    }

    /// The most points it holds.
    pub(super) fn capacity(&self) -> usize {
        self.points.capacity()
    }
}

/// How much a running counter grew from `before` to `now`; a counter that went
/// down was restarted, and counts from zero.
pub(super) fn grown(before: u64, now: u64) -> u64 {
    now.checked_sub(before).unwrap_or(now)
}

/// The `q` quantile (0 to 1) of the observations a histogram counted between two
/// readings, as Prometheus's `histogram_quantile` estimates it: linear within
/// the bucket the rank falls in. `bounds` are the buckets' upper bounds; `before`
/// and `now` the cumulative counts, one more than `bounds` (the last: all of
/// them). `None` when nothing was observed. A rank in the last bucket (above every
/// bound) answers the highest bound: the histogram knows no more.
pub(super) fn quantile(q: f64, bounds: &[f64], before: &[u64], now: &[u64]) -> Option<f64> {
    // A histogram whose counts went down started again: every count is new.
    let restarted = before.iter().zip(now).any(|(b, n)| n < b);
    let count = |i: usize| match restarted {
        true => now[i],
        false => now[i] - before[i],
    };
    let total = count(now.len().checked_sub(1)?);
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let (mut lower_bound, mut lower_count) = (0.0, 0);
    for (i, &bound) in bounds.iter().enumerate() {
        let upto = count(i);
        if upto as f64 >= rank {
            let inside = (upto - lower_count) as f64;
            let share = if inside > 0.0 {
                (rank - lower_count as f64) / inside
            } else {
                1.0
            };
            return Some(lower_bound + (bound - lower_bound) * share);
        }
        (lower_bound, lower_count) = (bound, upto);
    }
    Some(lower_bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_points_in_order_and_never_grows() {
        let mut ring = Ring::new(3);
        assert_eq!(ring.iter().count(), 0);
        assert_eq!(ring.last(), None);
        for n in 1..=2 {
            ring.push(n);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [1, 2]);
        for n in 3..=1000 {
            ring.push(n);
            assert_eq!(ring.capacity(), 3, "no growth at point {n}");
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [998, 999, 1000]);
        assert_eq!((ring.len(), ring.last()), (3, Some(&1000)));
    }

    #[test]
    fn each_wrap_of_the_ring_keeps_oldest_first() {
        let mut ring = Ring::new(4);
        for n in 0..4 {
            ring.push(n);
        }
        for n in 4..13 {
            ring.push(n);
            let held: Vec<_> = ring.iter().copied().collect();
            assert_eq!(held, [n - 3, n - 2, n - 1, n], "after pushing {n}");
        }
    }

    #[test]
    fn a_counter_s_growth_and_its_restart() {
        assert_eq!(grown(100, 140), 40);
        assert_eq!(grown(140, 140), 0);
        assert_eq!(grown(140, 25), 25, "restarted: 25 since");
        assert_eq!(grown(u64::MAX - 1, u64::MAX), 1, "no overflow at the top");
    }

    #[test]
    fn the_quantile_falls_in_the_bucket_of_its_rank() {
        let bounds = [0.1, 0.5, 1.0];
        // 100 answers since the last reading: 50 ≤ 0.1 s, 40 ≤ 0.5 s, 10 ≤ 1 s.
        let before = [10, 20, 20, 20];
        let now = [60, 110, 120, 120];
        let p50 = quantile(0.5, &bounds, &before, &now).unwrap();
        assert!((p50 - 0.1).abs() < 1e-9, "{p50}");
        // Rank 95 is the 5th of 10 in (0.5, 1.0]: halfway.
        let p95 = quantile(0.95, &bounds, &before, &now).unwrap();
        assert!((p95 - 0.75).abs() < 1e-9, "{p95}");
        assert_eq!(quantile(0.95, &bounds, &now, &now), None, "nothing new");
    }

    #[test]
    fn a_quantile_above_every_bound_is_the_highest_bound() {
        let bounds = [0.1, 0.5];
        let p95 = quantile(0.95, &bounds, &[0, 0, 0], &[1, 1, 20]);
        assert_eq!(p95, Some(0.5));
    }

    #[test]
    fn a_restarted_histogram_is_read_from_zero() {
        let bounds = [0.1, 0.5];
        // Before: 1000 answers; now the counts are lower: they started again.
        let p95 = quantile(0.95, &bounds, &[900, 1000, 1000], &[0, 10, 10]);
        assert!((p95.unwrap() - 0.48).abs() < 1e-9, "{p95:?}");
    }
}
