//! The admin dashboard at `/` on the admin listener: what the JSON API shows, for a
//! person with a browser, and the buttons that drain and enable nodes and purge the
//! asset cache (`cache_panel`).
//!
//! Why server-rendered: the admin network may have no internet and nobody wants a
//! JavaScript build for two pages; HTML forms work with JavaScript off and from a
//! phone. The figures are read when the page is (a handful of viewers, every few
//! seconds), never kept up to date on the request path. A session-table page scans
//! the table on a blocking thread, as `GET /affinity` does.
//!
//! Why the raw session id goes in by `POST` only: a query string lands in browser
//! history, proxy logs and the `Referer`; a form body does not. The id is hashed at
//! once and the answer is a redirect to the entry's hash: it is never shown, kept or
//! logged.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::SET_COOKIE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

use super::guard::Guard;
use super::history::History;
use super::html;
use super::login::{self, Keys, Viewer};
use super::page::{self, Card, Filters, Found, Row, View};
use super::rates::Rates;
use super::{cache, cache_panel, cluster, gateways_panel, history_panel, nodes, parse_key, surge};
use crate::cluster::slow_start::FULL;
use crate::cluster::upstreams::Upstream;
use crate::config::NodeState;
use crate::gateway::{Gateway, Settings};
use crate::node_id::NodeId;
use crate::sessions::affinity::{EntryView, SessionKey, SessionState};

/// Rows per page of the session table.
const PAGE: usize = 50;
/// The cookie that carries a one-line flash across the redirect after a form.
const FLASH: &str = "moodle-gateway-flash";
/// A flash not shown within this long is dropped.
const FLASH_LIFETIME: std::time::Duration = std::time::Duration::from_secs(60);

/// What the dashboard's handlers share.
#[derive(Clone)]
pub(super) struct Dash {
    pub(super) gateway: Arc<Gateway>,
    pub(super) guard: Arc<Guard>,
    pub(super) keys: Arc<Keys>,
    rates: Arc<Rates>,
    history: History,
}

/// The dashboard's routes, each deciding for itself who may see it (`login`).
pub(super) fn router<S>(
    gateway: Arc<Gateway>,
    guard: Arc<Guard>,
    token: &str,
    history: History,
) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let dash = Dash {
        gateway,
        guard,
        keys: Arc::new(Keys::new(token)),
        rates: Arc::default(),
        history,
    };
    // A first reading at start: the first view shows rates since start, not "measuring".
    let (now, settings) = (Instant::now(), dash.gateway.settings());
    for upstream in upstreams(&settings) {
        let totals = dash.gateway.metrics().node(upstream.id).map(|m| m.totals());
        dash.rates
            .read(upstream.id, totals.unwrap_or_default(), now);
    }
    Router::new()
        .route("/", get(show))
        .route("/login", get(login::form).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/ui/nodes/{name}/{action}", post(act))
        .route("/ui/find", post(find))
        .route("/ui/cache/purge", post(cache_panel::purge))
        .with_state(dash)
}

fn upstreams(settings: &Settings) -> impl Iterator<Item = &Arc<Upstream>> {
    let upstreams = &settings.upstreams;
    upstreams.nodes().iter().chain([upstreams.data()])
}

/// `GET /` parameters, taken raw: a bad value is ignored, never an error page.
#[derive(Debug, Default, Deserialize)]
struct ShowQuery {
    node: Option<String>,
    state: Option<String>,
    q: Option<String>,
    after: Option<String>,
    found: Option<String>,
}

/// `GET /`: the cards, the waiting-room panel (with a `[surge]` cap), the asset-cache
/// panel (unless it is off), the last hour's charts, the Gateways panel (with a shared store), the find box
/// and one page of the session table.
async fn show(
    State(dash): State<Dash>,
    viewer: Viewer,
    headers: HeaderMap,
    query: Result<Query<ShowQuery>, QueryRejection>,
) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let gateway = &dash.gateway;
    // An owned `Arc`, not the swap's guard: it lives across the table scan's `.await`.
    let settings: Arc<Settings> = arc_swap::Guard::into_inner(gateway.settings());
    let now = login::unix_now();
    let flash = login::cookie(&headers, FLASH).and_then(|v| dash.keys.unseal(v));
    let (filters, rows, next) = session_page(gateway, &settings, &query, now).await;
    let found = match query.found.as_deref() {
        Some(hash) => Some(found(gateway, &settings, hash, now).await),
        None => None,
    };
    let names = upstreams(&settings).map(|u| u.name.clone()).collect();
    let gateways = gateways_panel::read(gateway, names).await;
    let (table, data) = (gateway.table(), settings.upstreams.data().id);
    // Without a cap nothing waits: no slot figures, no panel.
    let surge = Some(surge::now(gateway, &settings)).filter(|s| s.capped_nodes > 0);
    let capped = surge.is_some();
    let cache = Some(cache::now(gateway)).filter(cache_panel::shown);
    let shown = history_panel::Shown {
        capped,
        room: settings.surge.waiting_room.is_some(),
        cache: cache.is_some(),
    };
    let mut history = html::Markup::new();
    dash.history
        .read(|r| history_panel::write(&mut history, r, shown));
    let view = View {
        now,
        can_log_out: matches!(viewer.login, login::Login::Cookie { .. }),
        csrf: viewer.csrf,
        flash: flash.clone(),
        cards: (upstreams(&settings))
            .map(|u| card(&dash, u, data, capped))
            .collect(),
        export: super::export::now(gateway, settings.export.as_deref()),
        totals: (table.len() as u64, table.logged_in_total()),
        surge,
        limits: super::limits_panel::now(gateway, settings.rate_limits.as_deref()),
        cache,
        history,
        gateways,
        found,
        paged: query.after.is_some(),
        filters,
        rows,
        next,
    };
    let document = html::document("moodle-gateway", &page::body(&view), true);
    let mut response = html::page(StatusCode::OK, document);
    if flash.is_some() {
        let clear = login::set_cookie(FLASH, None, FLASH_LIFETIME);
        response.headers_mut().insert(SET_COOKIE, clear);
    }
    response
}

/// One upstream's card; `capped`: some node has a cap, so PHP nodes show their slots.
fn card(dash: &Dash, upstream: &Upstream, data: NodeId, capped: bool) -> Card {
    let node = upstream.id != data;
    let table = dash.gateway.table();
    let meters = dash.gateway.metrics().node(upstream.id);
    let totals = meters.map(|m| m.totals()).unwrap_or_default();
    let rate = dash.rates.read(upstream.id, totals, Instant::now());
    Card {
        name: upstream.name.clone(),
        node,
        url: upstream.url(),
        weight: upstream.weight,
        state: upstream.state(),
        up: upstream.health.is_up(),
        since: upstream.health.since(),
        maintenance: upstream.health.in_maintenance(),
        probe: upstream.health.last_probe(),
        live: if node { table.live(upstream.id) } else { 0 },
        logged_in: if node {
            table.logged_in(upstream.id)
        } else {
            0
        },
        rate,
        losses: totals.losses,
        slots: (node && capped).then(|| upstream.slots_now()),
        warming: node
            .then(|| upstream.share(dash.gateway.settings().upstreams.slow_start()))
            .filter(|&share| share < FULL),
    }
}

fn row(settings: &Settings, view: &EntryView, now: u64) -> Row {
    let node = settings.upstreams.get(view.node);
    Row {
        hash: view.key.to_string(),
        // A node removed by a reload keeps its sessions until their next request.
        node: node.map_or("(removed)".into(), |n| n.name.clone()),
        state: view.state,
        age: now.saturating_sub(view.created),
        idle: now.saturating_sub(view.last_seen),
        requests: view.requests,
    }
}

/// The filters that were valid, one page of rows, and the next page's cursor.
async fn session_page(
    gateway: &Gateway,
    settings: &Settings,
    query: &ShowQuery,
    now: u64,
) -> (Filters, Vec<Row>, Option<String>) {
    let node = given(&query.node).and_then(|n| settings.upstreams.by_name(n));
    let node = node.filter(|n| n.id != settings.upstreams.data().id);
    let state = given(&query.state).and_then(state_param);
    let prefix = given(&query.q).map(str::to_ascii_lowercase);
    let range = prefix.as_deref().and_then(SessionKey::prefix_range);
    let cursor = given(&query.after).and_then(parse_key);
    // Start after the cursor or just before the prefix's first key, whichever is later.
    let after = cursor.max(range.and_then(|(low, _)| low.before()));
    let last = range.map(|(_, high)| high);
    let node_id = node.map(|n| n.id);
    let table = gateway.table().clone();
    let page = tokio::task::spawn_blocking(move || {
        table.page_where((after, last), PAGE, |n, s| {
            node_id.is_none_or(|id| id == n) && state.is_none_or(|want| want == s)
        })
    });
    let page = page.await.unwrap_or_default();
    let next = page
        .last()
        .filter(|_| page.len() == PAGE)
        .map(|e| e.key.to_string());
    let filters = Filters {
        node: node.map(|n| n.name.clone()).unwrap_or_default(),
        state: state.map_or("", state_value).into(),
        prefix: range.and(prefix).unwrap_or_default(),
    };
    let rows = page.iter().map(|v| row(settings, v, now)).collect();
    (filters, rows, next)
}

/// A session state as the table's filter spells it.
fn state_param(value: &str) -> Option<SessionState> {
    match value {
        "logged-in" => Some(SessionState::LoggedIn),
        "anonymous" => Some(SessionState::Anonymous),
        _ => None,
    }
}

fn state_value(state: SessionState) -> &'static str {
    match state {
        SessionState::LoggedIn => "logged-in",
        SessionState::Anonymous => "anonymous",
    }
}

/// A query value that says something: trimmed, not empty.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// The entry a find led to, by its hash, and with a shared store which gateway
/// bound it; or why there is none.
async fn found(
    gateway: &Gateway,
    settings: &Settings,
    hash: &str,
    now: u64,
) -> Result<Found, String> {
    let key = parse_key(hash).ok_or("That is not a session hash.")?;
    let view = gateway.table().view(key);
    let view = view.ok_or("That session is no longer bound (it expired or was forgotten).")?;
    let row = row(settings, &view, now);
    let bound_by = cluster::bound_by(gateway, key).await;
    Ok(Found { row, bound_by })
}

/// A redirect to the dashboard with `flash` shown once there.
pub(super) fn back_with(dash: &Dash, to: &str, flash: &str) -> Response {
    let mut response = login::see_other(to);
    let sealed = dash.keys.seal(flash);
    let cookie = login::set_cookie(FLASH, Some(&sealed), FLASH_LIFETIME);
    response.headers_mut().insert(SET_COOKIE, cookie);
    response
}

/// `POST /ui/nodes/{name}/{action}`: a card's button, by the same rules as
/// `POST /nodes/{name}/{action}`.
async fn act(
    State(dash): State<Dash>,
    viewer: Viewer,
    path: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<ActForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return login::stale_form();
    };
    if !dash.keys.csrf_ok(viewer.login, &form.csrf) {
        return login::stale_form();
    }
    let Ok(Path((name, action))) = path else {
        return back_with(&dash, "/", "That button names no node.");
    };
    if let Some(students) = unconfirmed_disable(&dash, &name, &action, &form) {
        let flash = format!(
            "{name}: not changed: disabling it moves its logged-in students ({students}) at once, \
             and with node-local sessions each must log in again. Drain it instead, or tick \
             the box beside Disable to confirm."
        );
        return back_with(&dash, "/", &flash);
    }
    let flash = match nodes::apply(&dash.gateway, &name, &action, false).await {
        Ok(_) => {
            let settings = dash.gateway.settings();
            let state = settings.upstreams.by_name(&name).map(|n| n.state());
            let state = state.map_or("changed", NodeState::as_str);
            format!("{name} is now {state}.")
        }
        Err(refusal) => format!("{name}: not changed: {}.", refusal.1),
    };
    back_with(&dash, "/", &flash)
}

/// A card's button: the CSRF token, and for Disable the admin's confirmation.
#[derive(Deserialize)]
struct ActForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
}

/// Disabling a node that still holds logged-in students logs them out (with
/// node-local sessions) in one click: it needs the confirm box ticked. Returns how
/// many students it would move when unconfirmed.
fn unconfirmed_disable(dash: &Dash, name: &str, action: &str, form: &ActForm) -> Option<u64> {
    if action != "disable" || form.confirm == "yes" {
        return None;
    }
    let settings = dash.gateway.settings();
    let node = settings.upstreams.by_name(name)?;
    let students = dash.gateway.table().logged_in(node.id);
    (students > 0).then_some(students)
}

#[derive(Deserialize)]
struct FindForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    session: String,
}

/// `POST /ui/find`: a raw session id in, a redirect to its hash out.
async fn find(
    State(dash): State<Dash>,
    viewer: Viewer,
    form: Result<Form<FindForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return login::stale_form();
    };
    if !dash.keys.csrf_ok(viewer.login, &form.csrf) {
        return login::stale_form();
    }
    let id = form.session.trim();
    if id.is_empty() {
        return back_with(
            &dash,
            "/#find",
            "Paste the student's MoodleSession cookie value.",
        );
    }
    let table = dash.gateway.table();
    let key = table.key(id);
    match table.view(key) {
        Some(_) => login::see_other(&format!("/?found={key}#find")),
        None => back_with(
            &dash,
            "/#find",
            "No bound session has that id: it expired, was never seen by this gateway, \
             or was copied from another site's cookie.",
        ),
    }
}
