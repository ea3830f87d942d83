//! `GET /surge`: the gateway's line as a whole and its waiting room; each node's
//! own slots and line are in `GET /nodes`. The dashboard's waiting-room panel reads
//! the same [`SurgeNow`].
//!
//! Why its own route: `/nodes` is one row per upstream, and the room belongs to
//! none of them. It lets newcomers in by the pace every node frees slots at, and
//! the bound on waiters (`max_waiting`) is shared by every node's line.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, StatusCode};
use serde::Serialize;

use crate::gateway::{waiting_room, Gateway, Settings};

/// The surge as the admin sees it, read when asked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(super) struct SurgeNow {
    /// PHP nodes with a cap (`[surge] max_active` or their own). 0: nothing waits
    /// in the gateway and the room never opens; the figures below stay 0.
    pub(super) capped_nodes: usize,
    /// Requests waiting in the gateway for a slot, every node's together.
    pub(super) waiting: usize,
    /// `[surge] max_waiting`: one more waiter and the last of a lower class is
    /// turned away (a 503), or the newcomer itself.
    pub(super) max_waiting: usize,
    /// How long a newcomer joining the lines now can expect to wait, in
    /// milliseconds (the waiters ahead of it over the pace slots free at; 0: none
    /// ahead); `null` while requests wait and none has finished lately.
    #[serde(serialize_with = "millis")]
    pub(super) expected_wait_ms: Option<Duration>,
    /// The waiting room; `null` with `[surge] waiting_room = false`.
    pub(super) room: Option<Room>,
}

/// The waiting room now.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(super) struct Room {
    /// Newcomers asking for a page get the waiting page now.
    pub(super) open: bool,
    /// People holding a place in line, seen within their last few refreshes.
    pub(super) in_line: usize,
    /// People let in from the line in the last minute.
    pub(super) admitted_last_minute: u64,
    /// `[surge] room_opens_at`, in milliseconds: the expected wait that opens it.
    #[serde(serialize_with = "millis_of")]
    pub(super) opens_at_ms: Duration,
}

/// Reads the figures. It also lets the room close when its line emptied and the
/// wait came back under the bound while nobody asked, as `/metrics` does.
pub(super) fn now(gateway: &Gateway, settings: &Settings) -> SurgeNow {
    let upstreams = &settings.upstreams;
    let capped_nodes = upstreams.nodes().iter().filter(|n| n.slots.cap() > 0);
    let room = gateway.room_now();
    SurgeNow {
        capped_nodes: capped_nodes.count(),
        waiting: upstreams.crowd().waiting(),
        max_waiting: settings.surge.max_waiting,
        expected_wait_ms: room.expected_wait,
        room: settings.surge.waiting_room.as_ref().map(|config| Room {
            open: room.open,
            in_line: room.in_line,
            admitted_last_minute: room.admitted_last_minute,
            opens_at_ms: config.opens_at,
        }),
    }
}

/// `GET /surge`: `{"capped_nodes", "waiting", "max_waiting", "expected_wait_ms",
/// "room": {"open", "in_line", "admitted_last_minute", "opens_at_ms"} | null}`.
pub(super) async fn show(State(gateway): State<Arc<Gateway>>) -> Response {
    let settings = gateway.settings();
    Json(now(&gateway, &settings)).into_response()
}

/// `GET /surge/page`: the waiting page in force (`room_page` or the built-in one),
/// filled with example figures, so an admin sees a new template before a crowd does.
pub(super) async fn page(State(gateway): State<Arc<Gateway>>) -> Response {
    let settings = gateway.settings();
    let Some(room) = settings.surge.waiting_room.as_ref() else {
        let off = "no waiting room: [surge] waiting_room = false\n";
        return (StatusCode::NOT_FOUND, off).into_response();
    };
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (headers, waiting_room::preview(room)).into_response()
}

fn millis<S: serde::Serializer>(wait: &Option<Duration>, to: S) -> Result<S::Ok, S::Error> {
    match wait {
        Some(wait) => millis_of(wait, to),
        None => to.serialize_none(),
    }
}

fn millis_of<S: serde::Serializer>(wait: &Duration, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_u64(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}
