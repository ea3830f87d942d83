//! The upstreams as an admin sees and steers them: `GET /nodes` (state, health and
//! sessions of each), `POST /nodes/{name}/drain|undrain|enable|disable`, and
//! `POST /reload`.
//!
//! Why the last active node is guarded: draining or disabling it leaves no node to
//! deal new students to, so every newcomer (and with node-local sessions every
//! student whose node goes) gets a 503. That is one mistyped name away, so it is
//! refused with 409 unless the admin says `?force=true`, and logged either way.
//! "Able to take students" means the admin state `active`, not health: health
//! changes by itself (a node restarting comes back without anyone's help), while a
//! drained node stays out until an admin brings it back; and it is the rule the
//! config file keeps too (at least one node must be active). With a shared store
//! the check and the write are one script in Redis, against the states every
//! gateway wrote, so two admins on two gateways cannot take out the last two
//! active nodes between them; while Redis is away each gateway can only check what
//! it knows itself, and the change reaches the others when Redis is back.
//!
//! Why draining shows `drained`: the point of draining is to patch a node without
//! logging anyone out, and the admin needs to know when that moment has come: the
//! node is draining and no logged-in student is left on it (each logged out,
//! rotated away or expired). Anonymous sessions do not hold it up: Moodle's logout
//! itself starts a fresh anonymous session on the same node, and a guest loses
//! nothing but a half-typed login form.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{bad_request, counts, not_found, ApiError, Counts};
use crate::cluster::slots::{Class, SlotsNow};
use crate::cluster::slow_start::{fraction, FULL};
use crate::cluster::upstreams::Upstream;
use crate::cluster::upstreams::Upstreams;
use crate::config::NodeState;
use crate::gateway::{Gateway, Settings};
use crate::store::Checked;

/// Re-reads the config file and applies it: `Ok` with notes (settings that need a
/// restart), or `Err` with every problem, the running config untouched.
pub type Reload = Arc<dyn Fn() -> Result<Vec<String>, Vec<String>> + Send + Sync>;

/// One upstream as the API shows it.
#[derive(Debug, Serialize)]
pub(super) struct Node {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    weight: Option<u32>,
    state: NodeState,
    health: &'static str,
    /// Unix seconds of the last up/down change.
    health_since: u64,
    /// Moodle answers its probes with the maintenance page.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    maintenance: bool,
    #[serde(flatten)]
    counts: Option<Counts>,
    /// Draining or disabled with no logged-in session left: safe to stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    drained: Option<bool>,
    /// While it warms up after coming back (`[session] slow_start`): the fraction
    /// of its full share of new sessions it gets now.
    #[serde(skip_serializing_if = "Option::is_none")]
    warming: Option<f64>,
    /// Its slots under `[surge]` (`GET /nodes` only, PHP nodes only): of its own
    /// pool, at `url`.
    #[serde(flatten)]
    slots: Option<Slots>,
    /// Its low-priority pool (`low_priority_url`), with that pool's own slots.
    #[serde(skip_serializing_if = "Option::is_none")]
    low_priority: Option<LowPriority>,
}

/// A node's low-priority pool as `GET /nodes` shows it.
#[derive(Debug, Serialize)]
struct LowPriority {
    url: String,
    #[serde(flatten)]
    slots: Slots,
}

/// One node's slots as `GET /nodes` shows them.
#[derive(Debug, Serialize)]
struct Slots {
    /// Requests it works on at once (`[surge] max_active`, or the node's own), the
    /// rest waiting in the gateway; `null`: no cap, every request goes in at once.
    max_active: Option<usize>,
    /// Requests holding one of its slots now, in PHP or streaming their answer;
    /// `null` without a cap (nothing is counted then).
    active: Option<usize>,
    /// Requests waiting in the gateway for one of its slots, by class, in the order
    /// a freed slot goes to them (with aging); all 0 without a cap.
    queued: Queued,
}

/// Waiting requests per [`Class`], named as `/metrics` labels them.
#[derive(Debug, Serialize)]
struct Queued {
    working: usize,
    logged_in: usize,
    anonymous: usize,
    newcomer: usize,
}

fn slots(now: SlotsNow) -> Slots {
    let capped = now.cap > 0;
    let of = |class: Class| now.queued[class.index()];
    Slots {
        max_active: capped.then_some(now.cap),
        active: capped.then_some(now.active),
        queued: Queued {
            working: of(Class::Working),
            logged_in: of(Class::LoggedIn),
            anonymous: of(Class::Anonymous),
            newcomer: of(Class::Newcomer),
        },
    }
}

fn row(gateway: &Gateway, upstream: &Upstream, details: bool, sessions: bool) -> Node {
    let table = gateway.table();
    let (live, logged_in) = (table.live(upstream.id), table.logged_in(upstream.id));
    let state = upstream.state();
    let share = sessions.then(|| upstream.share(gateway.settings().upstreams.slow_start()));
    Node {
        name: upstream.name.clone(),
        url: details.then(|| upstream.url()),
        weight: (details && sessions).then_some(upstream.weight),
        state,
        health: if upstream.health.is_up() {
            "up"
        } else {
            "down"
        },
        health_since: upstream.health.since(),
        maintenance: upstream.health.in_maintenance(),
        counts: sessions.then(|| counts(live, logged_in)),
        drained: (sessions && state != NodeState::Active).then_some(logged_in == 0),
        warming: share.filter(|&s| s < FULL).map(fraction),
        slots: (details && sessions).then(|| slots(upstream.slots.now())),
        low_priority: (upstream.low_priority.as_ref())
            .filter(|_| details && sessions)
            .map(|lane| LowPriority {
                url: format!("http://{}", lane.authority),
                slots: slots(lane.slots.now()),
            }),
    }
}

/// Every PHP node in config order with its sessions, and its URL and weight if `details`.
pub(super) fn rows(gateway: &Gateway, settings: &Settings, details: bool) -> Vec<Node> {
    let nodes = settings.upstreams.nodes().iter();
    nodes.map(|n| row(gateway, n, details, true)).collect()
}

#[derive(Debug, Serialize)]
struct NodesBody {
    nodes: Vec<Node>,
    data: Node,
    /// The data server's file export, with `[offload]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    export: Option<super::export::ExportNow>,
}

/// `GET /nodes`: the upstreams in config order, with state, health, sessions and
/// (PHP nodes) their slots: `max_active`, `active`, `queued` per class; and with
/// `[offload]` the file export: health, last probe, files served and failed.
pub(super) async fn list(State(gateway): State<Arc<Gateway>>) -> Response {
    let settings = gateway.settings();
    let nodes = rows(&gateway, &settings, true);
    let data = row(&gateway, settings.upstreams.data(), true, false);
    let export = super::export::now(&gateway, settings.export.as_deref());
    Json(NodesBody {
        nodes,
        data,
        export,
    })
    .into_response()
}

/// Every action `POST /nodes/{name}/{action}` knows, as its errors name them.
const ACTIONS: &str = "drain, undrain, enable or disable";

/// `?force=true`: take the last active node out anyway.
#[derive(Debug, Deserialize)]
pub(super) struct Force {
    force: Option<bool>,
}

/// `POST /nodes/{name}/drain|undrain|enable|disable[?force=true]`: changes what a
/// node may receive, at once and until the next change (a reload keeps it unless the
/// file's `state` for that node changes). Answers the node's row; 409 for the last
/// active node without `force`.
pub(super) async fn set_state(
    State(gateway): State<Arc<Gateway>>,
    path: Result<Path<(String, String)>, PathRejection>,
    force: Result<Query<Force>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (name, action) = path.map_err(|_| bad_request("malformed path"))?.0;
    let force = force.map_err(|_| bad_request("force must be true or false"))?;
    let force = force.0.force.unwrap_or(false);
    Ok(Json(apply(&gateway, &name, &action, force).await?).into_response())
}

/// Applies an admin's `action` (drain, undrain, enable, disable) to node `name` and
/// answers its row: the one place these rules live, for the JSON API and the
/// dashboard's buttons alike (which never force: the 409 is their message).
pub(super) async fn apply(
    gateway: &Gateway,
    name: &str,
    action: &str,
    force: bool,
) -> Result<Node, ApiError> {
    let state = match action {
        "drain" => NodeState::Draining,
        "undrain" | "enable" => NodeState::Active,
        "disable" => NodeState::Disabled,
        _ => return Err(bad_request(&format!("no such action: use {ACTIONS}"))),
    };
    let settings = gateway.settings();
    if settings.upstreams.data().name == name {
        return Err(bad_request(
            "the data server cannot be drained: it is the only home of SCORM files",
        ));
    }
    let node = settings.upstreams.by_name(name);
    node.ok_or_else(|| not_found(format!("no node named {name}")))?;
    // With a shared store the rail is checked in Redis, against every gateway's
    // changes: two admins on two gateways cannot take out the last two active nodes.
    let nodes = settings.upstreams.nodes().iter();
    let here: Vec<(String, NodeState)> = nodes.map(|n| (n.name.clone(), n.state())).collect();
    let store = gateway.store();
    let checked = store.checked_node_state(name, state, force, &here).await;
    // Then one change at a time here, a reload's too: two admins on this gateway
    // cannot both pass the local rail, and the settings read under the lock are the
    // generation the change lands in (a reload may have come during the await).
    let one_change = gateway.lock_node_states();
    let settings = gateway.settings();
    let node = settings.upstreams.by_name(name);
    let node = node.ok_or_else(|| not_found(format!("no node named {name}")))?;
    match checked {
        Some(checked) => agreed(node, state, checked, action)?,
        // Redis away (or no shared store): this gateway's own rail, and the change
        // reaches the others when Redis is back (a drain on one is a drain on all).
        None => {
            change(&settings.upstreams, node, state, force, action)?;
            store.node_state(name, state);
        }
    }
    drop(one_change);
    // A gateway on its own keeps it with the snapshot: on disk now, not in 30 s.
    gateway.save_soon();
    Ok(row(gateway, node, true, true))
}

/// Takes in what Redis decided of an admin's change (it told the others already).
fn agreed(
    node: &Upstream,
    state: NodeState,
    checked: Checked,
    action: &str,
) -> Result<(), ApiError> {
    let name = &node.name;
    if checked == Checked::Refused {
        tracing::warn!(node = %name, %state, "admin refused: the last active node of every gateway");
        return Err(last_active(name, action));
    }
    let previous = node.set_state(state);
    if checked == Checked::Forced {
        tracing::warn!(node = %name, %previous, %state, "admin forced the last active node out: new students get 503");
    } else {
        tracing::info!(node = %name, %previous, %state, "admin changed a node's state, for every gateway");
    }
    Ok(())
}

/// Moves `node` to `state` unless that takes out the last active node without
/// `force`; logs what happened either way. Called under
/// [`Gateway::lock_node_states`].
fn change(
    upstreams: &Upstreams,
    node: &Upstream,
    state: NodeState,
    force: bool,
    action: &str,
) -> Result<(), ApiError> {
    let name = &node.name;
    let last = leaves_none_active(upstreams, node, state);
    if last && !force {
        tracing::warn!(node = %name, %state, "admin refused: the last active node");
        return Err(last_active(name, action));
    }
    let previous = node.set_state(state);
    if last {
        tracing::warn!(node = %name, %previous, %state, "admin forced the last active node out: new students get 503");
    } else {
        tracing::info!(node = %name, %previous, %state, "admin changed a node's state");
    }
    Ok(())
}

/// Whether moving `node` to `state` leaves no active node: it is active now, goes
/// out, and no other node is active.
fn leaves_none_active(upstreams: &Upstreams, node: &Upstream, state: NodeState) -> bool {
    let active = |n: &Upstream| n.state() == NodeState::Active;
    let others = upstreams.nodes().iter().filter(|n| n.id != node.id);
    state != NodeState::Active && active(node) && !others.map(|n| &**n).any(active)
}

/// 409: what would happen, and how to do it anyway.
fn last_active(name: &str, action: &str) -> ApiError {
    ApiError(
        StatusCode::CONFLICT,
        format!(
            "{name} is the last active node: after {action} no node takes new students \
             and they get 503; make another node active first, or repeat with ?force=true"
        ),
    )
}

#[derive(Debug, Serialize)]
struct Reloaded {
    reloaded: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<String>,
}

/// `POST /reload`: like `SIGHUP`. 200 with notes, or 422 with every problem in the
/// file (the running config is kept).
pub(super) async fn reload(State(reload): State<Reload>) -> Response {
    // Reading and checking the file is blocking work.
    let outcome = tokio::task::spawn_blocking(move || reload()).await;
    let outcome = outcome.unwrap_or_else(|_| Err(vec!["reload failed".into()]));
    let (status, body) = match outcome {
        Ok(notes) => (
            StatusCode::OK,
            Reloaded {
                reloaded: true,
                notes,
                errors: Vec::new(),
            },
        ),
        Err(errors) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Reloaded {
                reloaded: false,
                notes: Vec::new(),
                errors,
            },
        ),
    };
    (status, Json(body)).into_response()
}

impl axum::extract::FromRef<super::AdminState> for Reload {
    fn from_ref(state: &super::AdminState) -> Self {
        state.reload.clone()
    }
}

/// `GET /readyz`, without a token: 200 when some node may take students (active
/// and up), else 503 naming why. What keepalived's `vrrp_script` asks through
/// `moodle-gateway ready`: a gateway with no node to send anyone to should not
/// hold the site's address while another could.
pub(super) async fn ready(State(state): State<super::AdminState>) -> Response {
    let settings = state.gateway.settings();
    let nodes = settings.upstreams.nodes();
    let up = nodes.iter().filter(|n| n.takes_new()).count();
    if up > 0 {
        (
            StatusCode::OK,
            format!("ready: {up} of {} nodes up\n", nodes.len()),
        )
            .into_response()
    } else {
        let why = format!(
            "not ready: none of {} nodes is active and up\n",
            nodes.len()
        );
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}
