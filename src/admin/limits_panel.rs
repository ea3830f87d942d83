//! The dashboard's Rate limits panel (`[rate_limits]` with a limit on): each
//! limit's rate, the requests it answered `429` since start, and how many
//! addresses or usernames it remembers, beside the waiting room's figures.
//!
//! Every figure is a number or a fixed word, escaped like any other (`html`'s
//! `Render`).

use super::html::{figure, html, markup, Markup};
use crate::config::Rate;
use crate::gateway::limiter::Buckets;
use crate::gateway::Gateway;
use crate::metrics::Limited;

/// One limit as the panel shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LimitNow {
    pub(super) kind: Limited,
    pub(super) rate: Rate,
    pub(super) refused: u64,
    pub(super) keys: usize,
}

/// The limits in force now; `None` while none is on.
pub(super) fn now(gateway: &Gateway, buckets: Option<&Buckets>) -> Option<Vec<LimitNow>> {
    let buckets = buckets?;
    let c = &buckets.config;
    let keys = [
        buckets.login_address.as_ref().map(|b| b.len()),
        buckets.login_username.as_ref().map(|b| b.len()),
        buckets.pages_address.as_ref().map(|b| b.len()),
    ];
    let rates = [
        c.login_per_address,
        c.login_per_username,
        c.pages_per_address,
    ];
    let limits = (Limited::ALL.into_iter().zip(rates).zip(keys))
        .filter(|(_, keys)| keys.is_some())
        .map(|((kind, rate), keys)| LimitNow {
            kind,
            rate,
            refused: gateway.metrics().rate_limited_total(kind),
            keys: keys.unwrap_or(0),
        });
    Some(limits.collect())
}

/// The panel's `<section>`.
pub(super) fn write(out: &mut Markup, limits: &[LimitNow]) {
    html!(
        out,
        "<section id=\"rate-limits\"><h2>Rate limits</h2><p class=\"why\">Login attempts and \
         page views without a logged-in session past their limit get a 429; a logged-in \
         student is never limited.</p><dl class=\"narrow\">"
    );
    for limit in limits {
        let (label, key) = match limit.kind {
            Limited::LoginPerAddress => ("Logins per address: refused", "login_per_address"),
            Limited::LoginPerUsername => ("Logins per username: refused", "login_per_username"),
            Limited::PagesPerAddress => {
                ("Anonymous pages per address: refused", "pages_per_address")
            }
        };
        let shown = markup!(
            limit.refused,
            " <small>",
            limit.rate.per_minute,
            " a minute, bursts of ",
            limit.rate.burst,
            "; ",
            limit.keys,
            " remembered</small>"
        );
        figure(out, label, key, &shown);
    }
    html!(out, "</dl></section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_in_force_shows_its_refusals_its_rate_and_its_keys() {
        let limit = LimitNow {
            kind: Limited::LoginPerUsername,
            rate: Rate {
                per_minute: 5,
                burst: 10,
            },
            refused: 42,
            keys: 7,
        };
        let mut out = Markup::new();
        write(&mut out, &[limit]);
        let html = out.into_string();
        assert!(html.contains("<h2>Rate limits</h2>"), "{html}");
        assert!(
            html.contains("data-figure=\"login_per_username\""),
            "{html}"
        );
        assert!(
            html.contains("42 <small>5 a minute, bursts of 10; 7 remembered</small>"),
            "{html}"
        );
        assert!(!html.contains("pages_per_address"), "{html}");
    }
}
