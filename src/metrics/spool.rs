//! The upload spool's figures, read at scrape time from the spool itself (its
//! accounting is its own atomics, so the request path keeps no second copy).

use prometheus::{IntCounter, IntGauge, Registry};

use super::{counter, gauge, gauge_value};
use crate::http::body::spool::SpoolNow;

/// The handles, made once.
#[derive(Debug, Clone)]
pub(super) struct SpoolMeters {
    spooled: IntCounter,
    full: IntCounter,
    bodies: IntGauge,
    bytes: IntGauge,
}

impl SpoolMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        Self {
            spooled: counter(
                registry,
                "spooled_uploads_total",
                "Uploads kept on disk until whole before they went to a node.",
            ),
            full: counter(
                registry,
                "spool_full_total",
                "Uploads that found limits.spool_max_bytes taken and streamed to their node instead.",
            ),
            bodies: gauge(
                registry,
                "spool_uploads",
                "Uploads on disk now (arriving, or on their way to a node).",
            ),
            bytes: gauge(
                registry,
                "spool_bytes",
                "Disk the spooled uploads reserve now (at most limits.spool_max_bytes).",
            ),
        }
    }

    /// Sets every figure from the spool; a counter only ever moves up to its value.
    pub(super) fn set(&self, now: &SpoolNow) {
        for (counter, value) in [(&self.spooled, now.spooled), (&self.full, now.full)] {
            counter.inc_by(value.saturating_sub(counter.get()));
        }
        self.bodies.set(gauge_value(now.bodies));
        self.bytes.set(gauge_value(now.bytes));
    }
}
