//! The data server's file export (`[offload]`): whether it passes its probes, read at
//! scrape time, and what came of each file fetched from it, counted as it happens.
//!
//! Why registered only with `[offload]`: a gateway without an export would show a
//! permanent `export_up 0` (or 1) for something it does not have, and an alert on it
//! would fire or lie.

use prometheus::{IntCounter, IntGauge, Registry};

use super::{counters, gauge};

/// What came of one fetch from the export, as `export_files_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The export sent the file (`200`, `206`, or `416` for a range beyond it).
    Served,
    /// It has no file at the path the node named (`404`).
    NotFound,
    /// No connection, or it broke off.
    Unreachable,
    /// No answer within `timeouts.response_headers`.
    Timeout,
    /// Any other answer (a `5xx`, a `403`): the export's own failure.
    Failed,
}

impl Fetched {
    const ALL: [Fetched; 5] = [
        Fetched::Served,
        Fetched::NotFound,
        Fetched::Unreachable,
        Fetched::Timeout,
        Fetched::Failed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Fetched::Served => "served",
            Fetched::NotFound => "not_found",
            Fetched::Unreachable => "unreachable",
            Fetched::Timeout => "timeout",
            Fetched::Failed => "failed",
        }
    }
}

/// The handles, made once, on the first use.
#[derive(Debug)]
pub struct ExportMeters {
    up: IntGauge,
    files: [IntCounter; 5],
}

/// The export's running totals since start, for `/nodes` and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportTotals {
    /// Files it sent.
    pub served: u64,
    /// Paths it had no file for.
    pub not_found: u64,
    /// Fetches it failed: unreachable, too slow, or any other answer.
    pub failed: u64,
}

impl ExportMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        let files = counters(
            registry,
            "export_files_total",
            "Files fetched from the data server's file export for a node's \
             X-Accel-Redirect, by what came of it.",
            &["result"],
        );
        Self {
            up: gauge(
                registry,
                "export_up",
                "1 while the data server's file export passes its probes ([offload] only).",
            ),
            files: Fetched::ALL.map(|f| files.with_label_values(&[f.as_str()])),
        }
    }

    /// One fetch and what came of it.
    pub fn fetched(&self, result: Fetched) {
        self.files[result as usize].inc();
    }

    pub(super) fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    /// The totals `/nodes` and the dashboard show.
    pub fn totals(&self) -> ExportTotals {
        let of = |f: Fetched| self.files[f as usize].get();
        ExportTotals {
            served: of(Fetched::Served),
            not_found: of(Fetched::NotFound),
            failed: of(Fetched::Unreachable) + of(Fetched::Timeout) + of(Fetched::Failed),
        }
    }
}
