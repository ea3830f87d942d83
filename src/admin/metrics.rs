//! `GET /metrics`: the Prometheus text exposition, behind the admin token like
//! everything else here (Prometheus sends it as `authorization` or `basic_auth`).
//!
//! The figures that already live somewhere (sessions in the table, health and admin
//! state in the upstreams, requests in flight) are read here, at scrape time, into a
//! [`Snapshot`]; the request path keeps no copy of them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::cluster::slow_start::fraction;
use crate::cluster::upstreams::Upstream;
use crate::gateway::Gateway;
use crate::metrics::{Snapshot, UpstreamNow};

/// The exposition format's media type, version 0.0.4 (what every scraper reads).
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub(super) async fn scrape(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    let text = gateway.metrics().render(&snapshot(&gateway));
    ([(CONTENT_TYPE, TEXT_FORMAT)], text)
}

/// Every figure `/metrics` reads rather than counts.
pub(super) fn snapshot(gateway: &Gateway) -> Snapshot {
    let settings = gateway.settings();
    let upstreams = &settings.upstreams;
    let window = Some(upstreams.slow_start());
    let nodes = upstreams.nodes().iter().map(|n| now(gateway, n, window));
    Snapshot {
        upstreams: nodes
            .chain([now(gateway, upstreams.data(), None)])
            .collect(),
        in_flight: gateway.in_flight(),
        table_len: gateway.table().len(),
        room: gateway.room_now(),
        site_starts: gateway.site_starts_now(),
        cache: gateway.asset_cache().now(),
        export_up: settings.export.as_ref().map(|e| e.health.is_up()),
        spool: gateway.spool().now(),
    }
}

/// One upstream now; `window`: a PHP node's slow start (`None`: the data server).
fn now(gateway: &Gateway, upstream: &Upstream, window: Option<Duration>) -> UpstreamNow {
    let (table, node) = (gateway.table(), window.is_some());
    UpstreamNow {
        name: upstream.name.clone(),
        node,
        up: upstream.health.is_up(),
        state: upstream.state().as_str(),
        live: if node { table.live(upstream.id) } else { 0 },
        logged_in: if node {
            table.logged_in(upstream.id)
        } else {
            0
        },
        slots: upstream.slots_now(),
        share: window.map_or(1.0, |w| fraction(upstream.share(w))),
    }
}
