//! The dashboard's Gateways panel (`[store] kind = "redis"` only): every live
//! gateway from its heartbeat, what each served and dealt per node, and how this
//! gateway is doing without Redis. A gateway with its own table shows no panel: it
//! is the whole cluster, and its page stays as it always was.
//!
//! Why the heartbeats are read leniently: they come from other processes through
//! Redis, and another version of the gateway (or anything else that can write to
//! that Redis) may put anything there. A missing or mistyped field shows as `?`,
//! never as an error page; every text in a beat is hostile and is written as
//! text (escaped by `html`'s `Render`, the only way a `String` reaches the page),
//! node names included.
//!
//! Why the reading has its own bound: the store allows its background calls 2 s
//! each, and listing the gateways takes two. Someone looking at a stalled Redis
//! should get the page within a second, with the reason where the table would be.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::html::{duration, figure, html, Markup, Raw};
use crate::gateway::Gateway;
use crate::metrics::Degradation;

/// The longest the page waits for the list of gateways.
const READ_LIMIT: Duration = Duration::from_secs(1);

/// Columns for node names that only other gateways' beats name (a config that
/// differs, or a hostile beat): enough to see a mismatch, never a page of columns.
const EXTRA_NODES: usize = 8;

/// The warning while this gateway's link to Redis is down: what still works.
pub(super) const UNREACHABLE: &str = "Redis unreachable: this gateway routes from its own table \
     and the route cookie and deals locally; its changes are written back when Redis returns.";

/// Everything the panel shows.
pub(super) struct Panel {
    /// This gateway's `store.name`.
    pub(super) this: String,
    /// Whether this gateway's link to Redis is up.
    pub(super) connected: bool,
    /// The live gateways by name, or why they could not be listed.
    pub(super) gateways: Result<Vec<Peer>, String>,
    /// What this gateway did without Redis since it started.
    pub(super) degradation: Degradation,
    /// The node columns: this gateway's upstreams, then names only beats know.
    pub(super) nodes: Vec<String>,
}

/// One live gateway, as its last heartbeat tells (`None`: the beat did not say).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Peer {
    pub(super) name: String,
    pub(super) version: Option<String>,
    /// Unix seconds when it started.
    pub(super) started: Option<u64>,
    /// How old its last beat is, in milliseconds.
    pub(super) age_ms: Option<u64>,
    pub(super) sessions: Option<u64>,
    pub(super) in_flight: Option<u64>,
    /// Per node: responses it served.
    pub(super) served: BTreeMap<String, u64>,
    /// Per node: new sessions it dealt.
    pub(super) dealt: BTreeMap<String, u64>,
}

/// The panel, or `None` without a shared store. `nodes` are this gateway's
/// upstream names in config order. Never fails: a Redis that is down or slow
/// leaves its reason in `gateways`.
pub(super) async fn read(gateway: &Gateway, nodes: Vec<String>) -> Option<Panel> {
    let store = gateway.store();
    let this = store.name()?.to_owned();
    let listed = tokio::time::timeout(READ_LIMIT, store.gateways()).await;
    let listed = listed.unwrap_or_else(|_| Err("Redis did not answer within 1 s".into()));
    let now = unix_ms();
    let gateways: Result<Vec<Peer>, String> =
        listed.map(|beats| beats.iter().map(|beat| peer(beat, now)).collect());
    let nodes = columns(nodes, gateways.as_deref().unwrap_or_default());
    Some(Panel {
        this,
        connected: store.is_up() == Some(true),
        gateways,
        // Registered at start by every gateway with a shared store (and only by those).
        degradation: gateway.metrics().store().degradation(),
        nodes,
    })
}

/// One heartbeat as the panel shows it; `now` in Unix milliseconds.
pub(super) fn peer(beat: &Value, now: u64) -> Peer {
    let number = |key: &str| beat.get(key).and_then(Value::as_u64);
    let text = |key: &str| beat.get(key).and_then(Value::as_str).map(str::to_owned);
    let per_node = |key: &str| -> BTreeMap<String, u64> {
        let fields = beat
            .get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten();
        fields
            .filter_map(|(node, count)| Some((node.clone(), count.as_u64()?)))
            .collect()
    };
    Peer {
        name: text("name").unwrap_or_else(|| "(unnamed)".into()),
        version: text("version"),
        started: number("started"),
        age_ms: number("beat_ms").map(|at| now.saturating_sub(at)),
        sessions: number("sessions"),
        in_flight: number("in_flight"),
        served: per_node("served"),
        dealt: per_node("dealt"),
    }
}

/// This gateway's nodes, then the first few names only other beats mention.
fn columns(mut nodes: Vec<String>, peers: &[Peer]) -> Vec<String> {
    let named = peers
        .iter()
        .flat_map(|p| p.served.keys().chain(p.dealt.keys()));
    let mut extra: Vec<&String> = named.filter(|n| !nodes.contains(n)).collect();
    extra.sort();
    extra.dedup();
    nodes.extend(extra.into_iter().take(EXTRA_NODES).cloned());
    nodes
}

/// The panel's `<section>`; `now` in Unix seconds.
pub(super) fn write(out: &mut Markup, panel: &Panel, now: u64) {
    html!(out, "<section id=\"gateways\"><h2>Gateways</h2>");
    if panel.connected {
        html!(
            out,
            "<p class=\"why\" data-store=\"connected\">This gateway is <b>",
            panel.this,
            "</b>, connected to Redis: the gateways below share one session table, one \
             deal and the node states.</p>"
        );
    } else {
        html!(
            out,
            "<p class=\"flash\" id=\"store-down\" role=\"alert\" data-store=\"unreachable\">",
            UNREACHABLE,
            "</p>"
        );
    }
    degradation(out, &panel.degradation);
    match &panel.gateways {
        Ok(peers) if peers.is_empty() => {
            html!(
                out,
                "<p>No gateway has sent a heartbeat in the last 5 s.</p>"
            );
        }
        Ok(peers) => table(out, panel, peers, now),
        Err(why) if panel.connected => html!(
            out,
            "<p class=\"flash\" role=\"alert\">The gateways could not be listed: ",
            why,
            "</p>"
        ),
        // The warning above already says why.
        Err(_) => {}
    }
    html!(out, "</section>");
}

fn degradation(out: &mut Markup, counted: &Degradation) {
    html!(
        out,
        "<p class=\"why\">What this gateway did without Redis since it started:</p>\
         <dl class=\"narrow\">"
    );
    let figures = [
        (
            "Sessions not looked up in Redis",
            "fallback-lookup",
            counted.lookups,
        ),
        ("New sessions dealt locally", "fallback-deal", counted.deals),
        (
            "Changes not written at once",
            "unwritten",
            counted.unwritten,
        ),
        ("Connections to Redis lost", "outages", counted.outages),
    ];
    for (label, key, value) in figures {
        figure(out, label, key, &value);
    }
    html!(out, "</dl>");
}

fn table(out: &mut Markup, panel: &Panel, peers: &[Peer], now: u64) {
    html!(
        out,
        "<div class=\"scroll\"><table><thead><tr><th>Gateway</th><th>Version</th>\
         <th>Up for</th><th>Last beat</th><th>Sessions</th><th>In flight</th>"
    );
    for node in &panel.nodes {
        html!(out, "<th>", node, "<br><small>served / dealt</small></th>");
    }
    html!(out, "</tr></thead><tbody>");
    for peer in peers {
        row(out, panel, peer, now);
    }
    html!(out, "</tbody></table></div>");
}

fn row(out: &mut Markup, panel: &Panel, peer: &Peer, now: u64) {
    let this = if peer.name == panel.this {
        "<span class=\"badge\">this gateway</span>"
    } else {
        ""
    };
    let up = peer.started.map(|s| duration(now.saturating_sub(s)));
    html!(
        out,
        "<tr data-gateway=\"",
        peer.name,
        "\"><td>",
        peer.name,
        Raw(this),
        "</td><td>",
        peer.version.as_deref().unwrap_or("?"),
        "</td><td>",
        up.as_deref().unwrap_or("?"),
        "</td><td>",
        peer.age_ms.map_or("?".into(), age),
        "</td><td data-figure=\"sessions\">",
        known(peer.sessions),
        "</td><td>",
        known(peer.in_flight),
        "</td>"
    );
    for node in &panel.nodes {
        let count = |per_node: &BTreeMap<String, u64>| known(per_node.get(node).copied());
        html!(
            out,
            "<td data-node=\"",
            node,
            "\">",
            count(&peer.served),
            " / ",
            count(&peer.dealt),
            "</td>"
        );
    }
    html!(out, "</tr>");
}

/// A figure a beat may not have given.
fn known(value: Option<u64>) -> String {
    value.map_or("?".into(), |v| v.to_string())
}

/// A beat's age: in tenths of a second while that tells something (a gateway
/// beats every second and leaves the roll 5 s after its last beat), then in the
/// usual units.
fn age(ms: u64) -> String {
    match ms {
        ms if ms < 10_000 => format!("{:.1}s ago", ms as f64 / 1000.0),
        ms => format!("{} ago", duration(ms / 1000)),
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_heartbeat_with_missing_or_mistyped_fields_is_read_for_what_it_says() {
        let beat = json!({
            "name": "gw-b", "beat_ms": 9_000, "started": "yesterday", "sessions": -1,
            "served": {"web1": 12, "web2": "many"}, "dealt": [1, 2],
        });
        let peer = peer(&beat, 10_500);
        assert_eq!(
            peer,
            Peer {
                name: "gw-b".into(),
                age_ms: Some(1_500),
                served: [("web1".to_owned(), 12)].into(),
                ..Peer::default()
            }
        );
        assert_eq!(super::peer(&json!("not an object"), 0).name, "(unnamed)");
    }

    #[test]
    fn node_columns_are_this_gateways_then_a_few_only_other_beats_name() {
        let mut peer = Peer::default();
        for n in 0..20 {
            peer.served.insert(format!("x{n:02}"), 1);
        }
        peer.dealt.insert("web1".into(), 1);
        let nodes = columns(vec!["web1".into(), "data".into()], &[peer]);
        assert_eq!(nodes.len(), 2 + EXTRA_NODES);
        assert_eq!(&nodes[..3], ["web1", "data", "x00"]);
    }

    #[test]
    fn a_beat_reads_in_tenths_of_a_second_while_it_is_fresh() {
        assert_eq!(age(400), "0.4s ago");
        assert_eq!(age(9_940), "9.9s ago");
        assert_eq!(age(12_000), "12s ago");
        assert_eq!(age(120_000), "2m ago");
    }
}
