//! `GET /cache` and `POST /cache/purge`: the asset cache's figures and the way to
//! empty it. The dashboard's Asset cache panel reads the same [`CacheView`] and its
//! Purge button calls the same [`purge_all`].
//!
//! Why a purge exists although nothing kept can go stale: the gateway keeps only
//! URLs that carry Moodle's theme or JavaScript revision, and Moodle bumps that
//! revision whenever the bytes change. A purge is for when that promise was broken
//! behind Moodle's back (theme files edited on disk, or an upgrade, without
//! "Purge all caches"), or to give the memory back now. It is harmless: the next
//! request for each asset asks a node once and fills the entry again.
//!
//! Why the counters are the cache's own: they are its atomics, read when asked, so
//! this view, `/metrics` and the dashboard can never disagree.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::gateway::Gateway;
use crate::http::upstream::asset_cache::CacheNow;

/// The asset cache as the admin sees it, read when asked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(super) struct CacheView {
    /// `[cache] enabled`: revisioned assets are answered from memory.
    pub(super) enabled: bool,
    /// Answers kept now (each `Accept-Encoding` variant of a URL counts).
    pub(super) entries: usize,
    /// Their bodies' bytes.
    pub(super) bytes: u64,
    /// `[cache] max_bytes` as the running cache has it (a change needs a restart):
    /// the bound on `bytes`, the least recently used entry let go first.
    pub(super) max_bytes: u64,
    /// Revisioned requests answered from memory, since start.
    pub(super) hits: u64,
    /// Revisioned requests that had to ask a node, since start.
    pub(super) misses: u64,
    /// Node answers kept, since start (a purge does not reset it).
    pub(super) fills: u64,
    /// Entries let go to stay under `max_bytes`, since start (a purge is not one).
    pub(super) evictions: u64,
    /// `hits / (hits + misses)`, from 0 to 1; `null` before any revisioned request.
    pub(super) hit_rate: Option<f64>,
}

/// Reads the figures.
pub(super) fn now(gateway: &Gateway) -> CacheView {
    let CacheNow {
        entries,
        bytes,
        hits,
        misses,
        fills,
        evictions,
    } = gateway.asset_cache().now();
    let asked = hits + misses;
    CacheView {
        enabled: gateway.settings().cache_on(),
        entries,
        bytes,
        max_bytes: gateway.asset_cache().max_bytes(),
        hits,
        misses,
        fills,
        evictions,
        hit_rate: (asked > 0).then(|| hits as f64 / asked as f64),
    }
}

/// Forgets every kept answer; how many there were. Logged at info with the count,
/// for the API and the dashboard alike.
pub(super) fn purge_all(gateway: &Gateway) -> usize {
    let purged = gateway.asset_cache().purge();
    tracing::info!(purged, "admin purged the asset cache");
    purged
}

/// `GET /cache`: `{"enabled", "entries", "bytes", "max_bytes", "hits", "misses",
/// "fills", "evictions", "hit_rate"}` (see [`CacheView`]).
pub(super) async fn show(State(gateway): State<Arc<Gateway>>) -> Response {
    Json(now(&gateway)).into_response()
}

#[derive(Debug, Serialize)]
struct Purged {
    /// Entries forgotten (0 for an empty cache: not an error).
    purged: usize,
}

/// `POST /cache/purge`: forgets every kept answer at once, `{"purged": n}`. The
/// counters keep counting; the next request for each asset asks a node again.
/// Under the API's rules for changes (`guard`): a bearer token, or Basic with
/// `X-Requested-By`, and nothing from another site.
pub(super) async fn purge(State(gateway): State<Arc<Gateway>>) -> Response {
    let purged = purge_all(&gateway);
    Json(Purged { purged }).into_response()
}
