//! One node's counters, and the causes they are counted by: what the request path
//! touches, reached by the node's id, one relaxed atomic add per count.

use std::time::Duration;

use prometheus::core::Metric as _;
use prometheus::{Histogram, IntCounter};

use super::LATENCY_BUCKETS;

/// A node's latency histogram as counts: how many answers took at most each of
/// [`LATENCY_BUCKETS`] (cumulative), then all of them (the `+Inf` bucket).
pub type LatencyCounts = [u64; LATENCY_BUCKETS.len() + 1];

/// Why a student lost a logged-in session, as far as the gateway can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCause {
    /// Idle at least Moodle's `sessiontimeout`: Moodle's own rule, not an incident.
    Timeout,
    /// The session had just moved to another node (its own was down, disabled or
    /// removed): the price of failover with node-local sessions.
    Moved,
    /// Neither: the node lost it (a session store failure, NFS locks, a kill by an
    /// admin, a changed password, or a request misrouted around the gateway).
    Dropped,
}

impl LossCause {
    pub(super) const ALL: [LossCause; 3] =
        [LossCause::Timeout, LossCause::Moved, LossCause::Dropped];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::Timeout => "timeout",
            LossCause::Moved => "moved",
            LossCause::Dropped => "dropped",
        }
    }
}

/// Why a known session went to another node than its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveCause {
    /// Its node was down (past `failover_hold` with node-local sessions).
    Down,
    /// Its node left the config.
    Removed,
    /// Its node was disabled by an admin.
    Disabled,
    /// Its node refused the connection and the store is shared.
    Refused,
}

impl MoveCause {
    pub(super) const ALL: [MoveCause; 4] = [
        MoveCause::Down,
        MoveCause::Removed,
        MoveCause::Disabled,
        MoveCause::Refused,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            MoveCause::Down => "down",
            MoveCause::Removed => "removed",
            MoveCause::Disabled => "disabled",
            MoveCause::Refused => "refused",
        }
    }
}

/// One node's (or the data server's) counters, reached by its id on the request path.
#[derive(Debug)]
pub struct NodeMeters {
    pub(super) requests: [IntCounter; 5],
    pub(super) latency: Histogram,
    pub(super) dealt: IntCounter,
    pub(super) losses: [IntCounter; 3],
}

impl NodeMeters {
    /// A response head from this upstream, `elapsed` after the request was sent.
    pub fn answered(&self, status: u16, elapsed: Duration) {
        self.requests[class(status)].inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// A new session bound to this node.
    pub fn dealt(&self) {
        self.dealt.inc();
    }

    /// A logged-in session this node replaced by a new one outside login and logout.
    pub fn lost(&self, cause: LossCause) {
        self.losses[cause as usize].inc();
    }

    /// The latency histogram's counts, for the dashboard's plot of the p95 (read
    /// by its sampler every few seconds, never on the request path).
    pub fn latency_counts(&self) -> LatencyCounts {
        let mut counts = [0; LATENCY_BUCKETS.len() + 1];
        let metric = self.latency.metric();
        let histogram = metric.get_histogram();
        for (count, bucket) in counts.iter_mut().zip(histogram.get_bucket()) {
            *count = bucket.cumulative_count();
        }
        counts[LATENCY_BUCKETS.len()] = histogram.get_sample_count();
        counts
    }

    /// What the dashboard shows of this node.
    pub fn totals(&self) -> NodeTotals {
        NodeTotals {
            requests: self.requests.iter().map(IntCounter::get).sum(),
            server_errors: self.requests[4].get(),
            losses: self.losses.iter().map(IntCounter::get).sum(),
            dealt: self.dealt.get(),
        }
    }
}

/// A node's running totals since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeTotals {
    /// Response heads received from it.
    pub requests: u64,
    /// Of those, 5xx.
    pub server_errors: u64,
    /// Logged-in sessions it lost, every cause.
    pub losses: u64,
    /// New sessions this gateway bound to it.
    pub dealt: u64,
}

pub(super) fn class(status: u16) -> usize {
    usize::from(status / 100).clamp(1, 5) - 1
}
