//! The shared store's counters (`[store] kind = "redis"` only: a gateway with its own
//! table exports none of them, rather than a `store_up 0` that looks like an outage).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use super::{counter, counters, gauge};

/// What a request fell back to doing alone because Redis was down or slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// A session missing from the local table was not looked up in Redis.
    Lookup,
    /// A new session was dealt from this gateway's own counter.
    Deal,
}

/// What this gateway did without Redis since it started, read back for the
/// dashboard (the same counts `/metrics` exports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Degradation {
    /// Missing sessions not looked up in Redis.
    pub lookups: u64,
    /// New sessions dealt from this gateway's own counter.
    pub deals: u64,
    /// Changes not written to Redis when made (written back at the next resync).
    pub unwritten: u64,
    /// Connections to Redis lost.
    pub outages: u64,
}

/// The handles, made once; each count is one relaxed atomic add.
#[derive(Debug, Clone)]
pub struct StoreMeters {
    up: IntGauge,
    fallbacks: [IntCounter; 2],
    found: IntCounter,
    absent: IntCounter,
    unwritten: IntCounter,
    resyncs: IntCounter,
    outages: IntCounter,
    applied: IntCounterVec,
}

impl StoreMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        let fallbacks = counters(
            registry,
            "store_fallbacks_total",
            "Requests served without Redis because it was down or slower than store.timeout, by what was done locally.",
            &["what"],
        );
        let lookups = counters(
            registry,
            "store_lookups_total",
            "Sessions missing from the local table looked up in Redis, by result.",
            &["result"],
        );
        Self {
            up: gauge(registry, "store_up", "1 while this gateway is connected to Redis."),
            fallbacks: ["lookup", "deal"].map(|w| fallbacks.with_label_values(&[w])),
            found: lookups.with_label_values(&["found"]),
            absent: lookups.with_label_values(&["absent"]),
            unwritten: counter(
                registry,
                "store_unwritten_total",
                "Changes that could not be written to Redis when made (down, or the queue full): written back at the next resync.",
            ),
            resyncs: counter(
                registry,
                "store_resyncs_total",
                "Resynchronisations with Redis: at start, and after every lost connection.",
            ),
            outages: counter(
                registry,
                "store_outages_total",
                "Connections to Redis lost.",
            ),
            applied: counters(
                registry,
                "store_changes_applied_total",
                "Changes other gateways made, taken into the local table, by kind.",
                &["change"],
            ),
        }
    }

    /// Connected (`true`) or not.
    pub fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    /// A request did without Redis.
    pub fn fell_back(&self, what: Fallback) {
        self.fallbacks[what as usize].inc();
    }

    /// A lookup answered: the session was in Redis, or not.
    pub fn looked_up(&self, found: bool) {
        if found {
            self.found.inc()
        } else {
            self.absent.inc()
        }
    }

    /// `count` changes did not reach Redis.
    pub fn unwritten(&self, count: usize) {
        self.unwritten.inc_by(count as u64);
    }

    /// A resync finished.
    pub fn resynced(&self) {
        self.resyncs.inc();
    }

    /// The connection was lost.
    pub fn lost(&self) {
        self.outages.inc();
        self.set_up(false);
    }

    /// The degradation counted so far.
    pub fn degradation(&self) -> Degradation {
        Degradation {
            lookups: self.fallbacks[Fallback::Lookup as usize].get(),
            deals: self.fallbacks[Fallback::Deal as usize].get(),
            unwritten: self.unwritten.get(),
            outages: self.outages.get(),
        }
    }

    /// Another gateway's change was applied here.
    pub fn applied(&self, change: &'static str) {
        self.applied.with_label_values(&[change]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn the_dashboard_reads_back_the_counts_metrics_exports() {
        let metrics = Metrics::new();
        let store = metrics.store();
        store.fell_back(Fallback::Deal);
        store.fell_back(Fallback::Deal);
        store.fell_back(Fallback::Lookup);
        store.unwritten(3);
        store.lost();
        let expected = Degradation {
            lookups: 1,
            deals: 2,
            unwritten: 3,
            outages: 1,
        };
        assert_eq!(store.degradation(), expected);
        let text = metrics.render(&Default::default());
        for line in [
            "moodle_gateway_store_fallbacks_total{what=\"deal\"} 2",
            "moodle_gateway_store_fallbacks_total{what=\"lookup\"} 1",
            "moodle_gateway_store_unwritten_total 3",
            "moodle_gateway_store_outages_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }
}
