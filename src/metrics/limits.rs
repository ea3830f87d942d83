//! The rate limits' refusals (`[rate_limits]`), by the limit that refused: one
//! handle per limit, made once, so a refusal is one atomic add.

use prometheus::{IntCounter, Registry};

use super::counters;

/// Which limit refused a request: named as its key in `[rate_limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// Login attempts from one address.
    LoginPerAddress,
    /// Login attempts against one username, from any address.
    LoginPerUsername,
    /// Page views without a logged-in session from one address.
    PagesPerAddress,
}

impl Limited {
    /// Every limit, in the order of `/metrics` and the dashboard.
    pub const ALL: [Limited; 3] = [
        Self::LoginPerAddress,
        Self::LoginPerUsername,
        Self::PagesPerAddress,
    ];

    /// The `kind` label, the config key.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoginPerAddress => "login_per_address",
            Self::LoginPerUsername => "login_per_username",
            Self::PagesPerAddress => "pages_per_address",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The handles, made once.
#[derive(Debug, Clone)]
pub(super) struct LimitMeters {
    refused: [IntCounter; 3],
}

impl LimitMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        let family = counters(
            registry,
            "rate_limited_total",
            "Requests answered 429 by one of the rate limits ([rate_limits]), by the limit.",
            &["kind"],
        );
        Self {
            refused: Limited::ALL.map(|kind| family.with_label_values(&[kind.as_str()])),
        }
    }

    pub(super) fn refused(&self, kind: Limited) {
        self.refused[kind.index()].inc();
    }

    pub(super) fn total(&self, kind: Limited) -> u64 {
        self.refused[kind.index()].get()
    }
}
