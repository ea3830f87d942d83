//! The data server's file export (`[offload]`) as an admin sees it: its entry in
//! `GET /nodes` and its card on the dashboard, from one reading of its health and
//! its counts.
//!
//! Why its own entry, not a node's row: it takes no sessions, no weight and no
//! admin state, and it cannot be drained (the file pool has no other home), so the
//! fields a node row has would all be lies or nulls; what an admin needs of it is
//! whether it is up, why (the last probe), and what it served and failed.

use serde::Serialize;

use super::html::{duration, figure, html, Markup};
use crate::cluster::export::Export;
use crate::gateway::Gateway;
use crate::metrics::ExportTotals;

/// The export now, as `/nodes` shows it under `"export"`.
#[derive(Debug, Serialize)]
pub(super) struct ExportNow {
    url: String,
    /// The path its probes ask for.
    probe: String,
    health: &'static str,
    /// Unix seconds of the last up/down change (or of start).
    health_since: u64,
    /// What the last probe saw; `null` before the first.
    last_probe: Option<LastProbe>,
    /// Files fetched from it since start, by what came of each.
    files: ExportTotals,
}

#[derive(Debug, Serialize)]
struct LastProbe {
    at: u64,
    said: String,
}

/// The export of the current settings, if `[offload]` names one.
pub(super) fn now(gateway: &Gateway, export: Option<&Export>) -> Option<ExportNow> {
    let export = export?;
    let health = &export.health;
    let last = health.last_probe();
    Some(ExportNow {
        url: export.url(),
        probe: export.probe.clone(),
        health: if health.is_up() { "up" } else { "down" },
        health_since: health.since(),
        last_probe: last.map(|p| LastProbe {
            at: p.at,
            said: p.said,
        }),
        files: gateway.metrics().export().totals(),
    })
}

/// Its card, after the data server's: the same look as an upstream's, with what a
/// student gets while it is down, since that is the question a red card raises.
pub(super) fn card(out: &mut Markup, export: &ExportNow, now: u64) {
    let health = export.health;
    let since = duration(now.saturating_sub(export.health_since));
    html!(
        out,
        "<article class=\"card is-",
        health,
        "\" id=\"export\"><h2>file export<span class=\"badge health ",
        health,
        "\">",
        health,
        "</span><span class=\"badge\">data server</span></h2><p class=\"why\">",
        export.url,
        " · ",
        health,
        " for ",
        since,
        "<br>"
    );
    match &export.last_probe {
        Some(probe) => {
            let ago = duration(now.saturating_sub(probe.at));
            html!(
                out,
                "Last probe of ",
                export.probe,
                " ",
                ago,
                " ago: ",
                probe.said
            );
        }
        None => html!(
            out,
            "No probe yet (the first comes one interval after start)"
        ),
    }
    if health == "down" {
        html!(
            out,
            "<br><b>Students get 502 for every offloaded file until it is back.</b>"
        );
    }
    html!(out, "</p><dl>");
    let files = &export.files;
    for (label, key, value) in [
        ("Files served", "served", files.served),
        ("Not found", "not-found", files.not_found),
        ("Failed", "failed", files.failed),
    ] {
        figure(out, label, key, &value);
    }
    html!(out, "</dl></article>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down(said: &str) -> ExportNow {
        ExportNow {
            url: "http://10.0.0.5:8081".into(),
            probe: "/dataroot/".into(),
            health: "down",
            health_since: 1_000,
            last_probe: Some(LastProbe {
                at: 1_090,
                said: said.into(),
            }),
            files: ExportTotals {
                served: 7,
                not_found: 1,
                failed: 2,
            },
        }
    }

    #[test]
    fn a_down_export_says_what_students_get_and_why_as_text() {
        let mut out = Markup::new();
        card(&mut out, &down("exchange failed: <script>"), 1_100);
        let out = out.into_string();
        assert!(out.contains("id=\"export\""), "{out}");
        assert!(out.contains("badge health down"), "{out}");
        assert!(out.contains("down for 1m"), "{out}");
        assert!(out.contains("Last probe of /dataroot/ 10s ago"), "{out}");
        assert!(
            out.contains("&lt;script&gt;") && !out.contains("<script>"),
            "{out}"
        );
        assert!(out.contains("502 for every offloaded file"), "{out}");
        assert!(out.contains("<dd data-figure=\"served\">7</dd>"), "{out}");
        assert!(out.contains("<dd data-figure=\"failed\">2</dd>"), "{out}");
    }
}
