//! The asset cache's figures, read at scrape time from the cache itself (its
//! counters are its own atomics, so the request path keeps no second copy).

use prometheus::{IntCounter, IntGauge, Registry};

use super::{counter, gauge, gauge_value};
use crate::http::upstream::asset_cache::CacheNow;

/// The handles, made once.
#[derive(Debug, Clone)]
pub(super) struct CacheMeters {
    hits: IntCounter,
    misses: IntCounter,
    fills: IntCounter,
    evictions: IntCounter,
    entries: IntGauge,
    bytes: IntGauge,
}

impl CacheMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        Self {
            hits: counter(
                registry,
                "asset_cache_hits_total",
                "Revisioned Moodle assets answered from the gateway's memory.",
            ),
            misses: counter(
                registry,
                "asset_cache_misses_total",
                "Revisioned Moodle assets that had to be asked of a node.",
            ),
            fills: counter(
                registry,
                "asset_cache_fills_total",
                "Node answers kept in the asset cache.",
            ),
            evictions: counter(
                registry,
                "asset_cache_evictions_total",
                "Entries let go to keep the cache under cache.max_bytes.",
            ),
            entries: gauge(
                registry,
                "asset_cache_entries",
                "Answers kept in the asset cache.",
            ),
            bytes: gauge(
                registry,
                "asset_cache_bytes",
                "Bytes of the answers kept in the asset cache.",
            ),
        }
    }

    /// Sets every figure from the cache; a counter only ever moves up to its value.
    pub(super) fn set(&self, now: &CacheNow) {
        for (counter, value) in [
            (&self.hits, now.hits),
            (&self.misses, now.misses),
            (&self.fills, now.fills),
            (&self.evictions, now.evictions),
        ] {
            counter.inc_by(value.saturating_sub(counter.get()));
        }
        self.entries.set(gauge_value(now.entries as u64));
        self.bytes.set(gauge_value(now.bytes));
    }
}
