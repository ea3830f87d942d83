//! `[acme]`: when the served certificate expires, and what came of each renewal.
//!
//! Why registered only with `[acme]`: with `[tls]` files the gateway cannot renew,
//! and a renewal count that stays zero would read as a renewal that never runs.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{IntCounter, IntGauge, Registry};

use super::{counters, gauge};

/// The handles, made once, on the first use; a clone feeds the same families.
#[derive(Debug, Clone)]
pub struct AcmeMeters {
    expiry: IntGauge,
    renewed: IntCounter,
    failed: IntCounter,
}

impl AcmeMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        let renewals = counters(
            registry,
            "acme_renewals_total",
            "Certificate orders to the ACME CA, by result (ok or failed).",
            &["result"],
        );
        Self {
            expiry: gauge(
                registry,
                "tls_certificate_expiry_timestamp_seconds",
                "When the certificate the TLS listener serves expires, in Unix seconds \
                 (alert when it comes within a week: renewal failed for weeks).",
            ),
            renewed: renewals.with_label_values(&["ok"]),
            failed: renewals.with_label_values(&["failed"]),
        }
    }

    /// The served certificate's `notAfter`.
    pub fn expires_at(&self, at: SystemTime) {
        let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.expiry.set(i64::try_from(secs).unwrap_or(i64::MAX));
    }

    /// One order's outcome.
    pub fn renewed(&self, ok: bool) {
        match ok {
            true => self.renewed.inc(),
            false => self.failed.inc(),
        }
    }
}
