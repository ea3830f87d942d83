//! `GET /gateways`: every live gateway of a shared store, from their heartbeats,
//! with what each has served; and what Redis says of one session (which gateway
//! bound it), for the lookup.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::ApiError;
use crate::gateway::Gateway;
use crate::sessions::affinity::SessionKey;

/// `GET /gateways`: `{"store", "this", "connected", "secret_matches", "gateways":
/// [heartbeat…]}`.
/// Each heartbeat names the gateway, its version and start, its table's size,
/// requests in flight, and per upstream the responses it `served` and the
/// sessions it `dealt`; `age_ms` is how old the beat is. A gateway without a
/// shared store lists nothing: it is the whole cluster.
pub(super) async fn list(State(gateway): State<Arc<Gateway>>) -> Result<Response, ApiError> {
    let store = gateway.store();
    let Some(name) = store.name() else {
        return Ok(Json(json!({"store": "memory", "gateways": []})).into_response());
    };
    let beats = store.gateways().await.map_err(|error| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot list the gateways: {error}"),
        )
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let beats: Vec<Value> = beats.into_iter().map(|beat| aged(beat, now)).collect();
    let body = json!({
        "store": "redis",
        "this": name,
        "connected": store.is_up(),
        "secret_matches": store.secret_matches(),
        "gateways": beats,
    });
    Ok(Json(body).into_response())
}

fn aged(mut beat: Value, now: u64) -> Value {
    let at = beat.get("beat_ms").and_then(Value::as_u64).unwrap_or(now);
    if let Some(fields) = beat.as_object_mut() {
        fields.insert("age_ms".into(), now.saturating_sub(at).into());
    }
    beat
}

/// Which gateway bound `key`, as Redis says (`None` without a shared store, or
/// when Redis does not answer).
pub(super) async fn bound_by(gateway: &Gateway, key: SessionKey) -> Option<String> {
    let stored = gateway.store().describe(key).await?;
    Some(stored.bound_by)
}
