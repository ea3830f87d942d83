//! Requests per second and error rate per upstream, for the dashboard: the
//! difference between two readings of a node's running totals.
//!
//! Why sampled when the page is read, not by a background task: the counters
//! already exist ([`NodeMeters::totals`](crate::metrics::NodeMeters::totals), one
//! relaxed add each on the request path), so a rate needs only two readings and
//! the time between them. Taking them when someone looks costs nothing while nobody
//! does, and a task would need stopping at shutdown. A new reading replaces the old
//! one at most every [`MIN_WINDOW`], so several people refreshing at once share one
//! window instead of each seeing the blip since the last refresh. The window is
//! shown beside the figure: after an hour without viewers, the first figure is an
//! hour's average and says so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::metrics::NodeTotals;
use crate::node_id::NodeId;

/// The shortest window a rate is measured over.
pub(super) const MIN_WINDOW: Duration = Duration::from_secs(2);

/// One upstream's traffic over the last window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rate {
    /// Response heads per second.
    pub(super) per_second: f64,
    /// Of those, the share that was 5xx; `None` when there were none at all.
    pub(super) errors: Option<f64>,
    /// What the figures were measured over.
    pub(super) window: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    totals: NodeTotals,
    /// The rate computed when this reading was taken (from the one before).
    rate: Option<Rate>,
}

/// The last reading of each upstream. A `std` mutex never held across an `.await`:
/// the dashboard is read by a handful of people, a few times a minute.
#[derive(Debug, Default)]
pub(super) struct Rates {
    last: Mutex<HashMap<NodeId, Reading>>,
}

impl Rates {
    /// Records `totals` read at `now` for `id` (the first reading is remembered
    /// only), then answers the rate over the current window; `None` until there
    /// are two readings.
    pub(super) fn read(&self, id: NodeId, totals: NodeTotals, now: Instant) -> Option<Rate> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Some(previous) = last.get(&id).copied() else {
            last.insert(
                id,
                Reading {
                    at: now,
                    totals,
                    rate: None,
                },
            );
            return None;
        };
        let window = now.saturating_duration_since(previous.at);
        if window < MIN_WINDOW {
            return previous.rate;
        }
        let requests = totals.requests.saturating_sub(previous.totals.requests);
        let errors = totals
            .server_errors
            .saturating_sub(previous.totals.server_errors);
        let rate = Rate {
            per_second: requests as f64 / window.as_secs_f64(),
            errors: (requests > 0).then(|| errors as f64 / requests as f64),
            window,
        };
        let reading = Reading {
            at: now,
            totals,
            rate: Some(rate),
        };
        last.insert(id, reading);
        Some(rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_id::node;

    fn totals(requests: u64, server_errors: u64) -> NodeTotals {
        NodeTotals {
            requests,
            server_errors,
            losses: 0,
            dealt: 0,
        }
    }

    #[test]
    fn a_rate_is_the_difference_between_two_readings_over_their_window() {
        let (rates, start) = (Rates::default(), Instant::now());
        assert_eq!(
            rates.read(node(0), totals(100, 0), start),
            None,
            "one reading"
        );
        let later = start + Duration::from_secs(4);
        let rate = rates.read(node(0), totals(140, 10), later).unwrap();
        assert_eq!(rate.per_second, 10.0);
        assert_eq!(rate.errors, Some(0.25));
        assert_eq!(rate.window, Duration::from_secs(4));
        // Another viewer a second later shares that window.
        let again = rates.read(node(0), totals(150, 10), later + Duration::from_secs(1));
        assert_eq!(again, Some(rate));
        let quiet = rates.read(node(0), totals(150, 10), later + Duration::from_secs(5));
        let quiet = quiet.unwrap();
        assert_eq!((quiet.per_second, quiet.errors), (2.0, Some(0.0)));
        let idle = rates.read(node(0), totals(150, 10), later + Duration::from_secs(10));
        assert_eq!(idle.unwrap().errors, None, "no requests: no error rate");
    }

    #[test]
    fn each_upstream_has_its_own_window() {
        let (rates, start) = (Rates::default(), Instant::now());
        rates.read(node(0), totals(0, 0), start);
        let later = start + Duration::from_secs(2);
        assert_eq!(rates.read(node(1), totals(50, 0), later), None);
        assert_eq!(
            rates.read(node(0), totals(8, 0), later).unwrap().per_second,
            4.0
        );
    }
}
