//! The admin API: health, the affinity table, eviction; the upstreams, draining
//! and reload live in `nodes`, the gateway's line and waiting room in `surge`, the
//! asset cache's figures and purge in `cache`.
//!
//! Why its own listener: it reads and changes session routing, so it belongs on
//! loopback or a management network behind a firewall, never on the address
//! students reach; and the public listener stays a pure proxy with no reserved
//! paths that could shadow a Moodle URL (Moodle itself owns `/admin/`).
//!
//! Why hashes: session ids are bearer credentials. The table is keyed by a keyed
//! hash of each id ([`SessionKey`]) and that hash is all this API ever shows or
//! accepts as a handle. `lookup` takes a raw id, hashes it on the way in and never
//! echoes it; nothing here logs a query string.
//!
//! Who may call it (the token, the cross-site rules, the brake on guessing) is
//! `guard`'s. The dashboard (`dashboard`, `page`, `login`) serves `/`, `/login` and
//! its forms beside the API, with its own login under the same brake.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRef, Path, Query, State};
use axum::http::header::{AUTHORIZATION, CACHE_CONTROL, COOKIE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::gateway::{Gateway, Settings};
use crate::node_id::NodeId;
use crate::sessions::affinity::{EntryView, SessionKey, SessionState};

mod cache;
mod cluster;
mod export;
mod guard;
mod layers;
mod metrics;
mod nodes;
mod surge;

pub use history::{run as record_history, History};
pub use login::COOKIE_NAME as LOGIN_COOKIE;
pub use nodes::Reload;

// The dashboard at `/`: routes, the page, its Gateways, waiting-room and asset-cache
// panels, its login, escaping, rates.
mod cache_panel;
mod dashboard;
mod gateways_panel;
mod html;
mod limits_panel;
mod login;
mod page;
mod rates;
mod surge_panel;

// The dashboard's last hour: the rings a background task fills, and their charts.
mod history;
mod history_panel;
mod plot;
mod ring;

/// Default page size of `GET /affinity`.
const DEFAULT_LIMIT: usize = 100;
/// Largest page: a million-entry table never becomes one response.
const MAX_LIMIT: usize = 1000;

/// What the handlers share: the gateway, and how to reload its config.
#[derive(Clone)]
struct AdminState {
    gateway: Arc<Gateway>,
    reload: Reload,
}

impl FromRef<AdminState> for Arc<Gateway> {
    fn from_ref(state: &AdminState) -> Self {
        state.gateway.clone()
    }
}

/// The admin router. Every API route but `GET /healthz` requires `token`, as a bearer
/// token or as a Basic password, under the rules of `guard`; the dashboard's routes
/// also take the login cookie (`login`). `reload` re-reads the config file (`POST /reload`).
/// The dashboard draws `history`, which [`record_history`] fills.
pub fn router(gateway: Arc<Gateway>, token: String, reload: Reload, history: History) -> Router {
    let guard = Arc::new(guard::Guard::new(&token));
    let dashboard = dashboard::router(gateway.clone(), guard.clone(), &token, history);
    let protected = Router::new()
        .route("/affinity", get(affinity))
        .route("/affinity/lookup", get(lookup))
        .route("/affinity/{hash}", delete(evict))
        .route("/nodes", get(nodes::list))
        .route("/gateways", get(cluster::list))
        .route("/surge", get(surge::show))
        .route("/surge/page", get(surge::page))
        .route("/cache", get(cache::show))
        .route("/nodes/{name}/{action}", post(nodes::set_state))
        .route("/reload", post(nodes::reload))
        .route("/cache/purge", post(cache::purge))
        .route("/metrics", get(metrics::scrape))
        .fallback(|| async { not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError(StatusCode::METHOD_NOT_ALLOWED, "method not allowed".into())
        })
        // After the fallbacks, so unknown paths are hidden behind the token too.
        .layer(middleware::from_fn_with_state(guard, guard::require_token));
    // tower-http around every admin route, outermost first.
    let http = tower::ServiceBuilder::new()
        // The token travels in Authorization (or a cookie a proxy adds): marked
        // sensitive first, so the trace below prints "Sensitive" in its place.
        .layer(SetSensitiveRequestHeadersLayer::new([
            AUTHORIZATION,
            COOKIE,
        ]))
        // One debug span per request (RUST_LOG=tower_http=debug): method, path
        // without the query (lookup's carries a raw session id), headers, status
        // and latency. Inside the redaction, outside the timeout, so it sees both.
        .layer(TraceLayer::new_for_http().make_span_with(layers::span))
        // A handler stuck on a starved blocking pool answers 503 instead of
        // holding the admin's connection open for ever.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            layers::TIMEOUT,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(nodes::ready))
        // Outside the token layer: the dashboard lets people in by cookie too (`login`).
        .merge(dashboard)
        .merge(protected)
        .layer(http)
        .layer(middleware::map_response(no_store))
        .with_state(AdminState { gateway, reload })
}

/// Admin answers describe live sessions: no browser or proxy may keep a copy.
async fn no_store(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An error answer: a status and `{"error": "<lowercase reason>"}`, nothing internal.
#[derive(Debug)]
struct ApiError(StatusCode, String);

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

fn bad_request(message: &str) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, message.into())
}

/// Live, logged-in and anonymous session counts.
#[derive(Debug, Clone, Copy, Serialize)]
struct Counts {
    live: u64,
    logged_in: u64,
    anonymous: u64,
}

fn counts(live: u64, logged_in: u64) -> Counts {
    let anonymous = live.saturating_sub(logged_in);
    Counts {
        live,
        logged_in,
        anonymous,
    }
}

/// One bound session as the API shows it: its hash, never its id.
#[derive(Debug, Serialize)]
struct Entry<'a> {
    session: String,
    node: &'a str,
    state: SessionState,
    created: u64,
    last_seen: u64,
    requests: u32,
}

fn entry<'a>(settings: &'a Settings, view: &EntryView) -> Entry<'a> {
    let node = settings.upstreams.get(view.node);
    Entry {
        session: view.key.to_string(),
        // A node removed by a reload keeps its sessions until their next request.
        node: node.map_or("(removed)", |n| n.name.as_str()),
        state: view.state,
        created: view.created,
        last_seen: view.last_seen,
        requests: view.requests,
    }
}

#[derive(Debug, Serialize)]
struct AffinityPage<'a> {
    total: Counts,
    nodes: Vec<nodes::Node>,
    entries: Vec<Entry<'a>>,
    next_cursor: Option<String>,
}

/// `GET /affinity` parameters, taken raw so every mistake gets a JSON answer; an
/// empty value counts as absent.
#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<String>,
    cursor: Option<String>,
    node: Option<String>,
}

/// The validated page request: size, the key to start after, the node filter.
type PageRequest = (usize, Option<SessionKey>, Option<NodeId>);

fn page_request(gateway: &Gateway, query: PageQuery) -> Result<PageRequest, ApiError> {
    let given = |v: Option<String>| v.filter(|v| !v.is_empty());
    let limit = given(query.limit).map_or(Some(DEFAULT_LIMIT), |raw| raw.parse().ok());
    let limit = limit.filter(|n| (1..=MAX_LIMIT).contains(n));
    let limit =
        limit.ok_or_else(|| bad_request(&format!("limit must be between 1 and {MAX_LIMIT}")))?;
    let bad_cursor = || bad_request("cursor must be 16 hex digits");
    let after = given(query.cursor).map(|raw| parse_key(&raw).ok_or_else(bad_cursor));
    let node = given(query.node).map(|name| {
        let found = gateway.settings().upstreams.by_name(&name).map(|n| n.id);
        found.ok_or_else(|| not_found(format!("no node named {name}")))
    });
    Ok((limit, after.transpose()?, node.transpose()?))
}

/// `GET /affinity?limit=&cursor=&node=`: counts, then one page of entries in hash order.
async fn affinity(
    State(gateway): State<Arc<Gateway>>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|_| bad_request("malformed query"))?;
    let (limit, after, node) = page_request(&gateway, query)?;
    // A page scans the whole table (a million entries at most): not on a worker
    // thread that is serving students.
    let table = gateway.table().clone();
    let page = tokio::task::spawn_blocking(move || table.page(after, limit, node))
        .await
        .unwrap_or_default();
    let full = page.len() == limit;
    let next_cursor = page.last().filter(|_| full).map(|e| e.key.to_string());
    let settings = gateway.settings();
    let nodes = nodes::rows(&gateway, &settings, false);
    let table = gateway.table();
    let total = counts(table.len() as u64, table.logged_in_total());
    let entries = page.iter().map(|v| entry(&settings, v)).collect();
    let body = AffinityPage {
        total,
        nodes,
        entries,
        next_cursor,
    };
    Ok(Json(body).into_response())
}

#[derive(Debug, Deserialize)]
struct LookupQuery {
    session: Option<String>,
}

/// `GET /affinity/lookup?session=RAW_ID`: the entry of one raw session id.
async fn lookup(
    State(gateway): State<Arc<Gateway>>,
    query: Result<Query<LookupQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = query.ok().and_then(|Query(q)| q.session);
    let id = id.filter(|id| !id.is_empty());
    let id = id.ok_or_else(|| bad_request("session is required"))?;
    let table = gateway.table();
    let view = table.view(table.key(&id));
    let view = view.ok_or_else(|| not_found("session not bound"))?;
    let bound_by = cluster::bound_by(&gateway, view.key).await;
    let mut body = serde_json::to_value(entry(&gateway.settings(), &view)).unwrap_or_default();
    if let (Some(by), Some(fields)) = (bound_by, body.as_object_mut()) {
        // With a shared store: which gateway bound it.
        fields.insert("bound_by".into(), by.into());
    }
    Ok(Json(body).into_response())
}

/// `DELETE /affinity/{hash}`: forgets a session; its next request gets a fresh deal.
async fn evict(
    State(gateway): State<Arc<Gateway>>,
    hash: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let key = hash.ok().and_then(|Path(raw)| parse_key(&raw));
    let key = key.ok_or_else(|| bad_request("session must be 16 hex digits"))?;
    if !gateway.evict(key) {
        return Err(not_found("session not bound"));
    }
    tracing::info!(session = %key, "admin evicted a session");
    Ok(StatusCode::NO_CONTENT)
}

/// A session hash as this API shows it: exactly 16 hex digits, no sign.
fn parse_key(raw: &str) -> Option<SessionKey> {
    let hex = raw.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| SessionKey::from_hex(raw)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_id::node;
    use std::net::{IpAddr, SocketAddr};
    use std::time::Duration;

    use axum::body::{to_bytes, Body};
    use axum::extract::{ConnectInfo, Request};
    use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
    use axum::http::HeaderMap;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use crate::cluster::slots::{Ask, Class};
    use crate::config::Config;
    use crate::config::NodeState;
    use crate::sessions::clock::Clock;
    use guard::{CHALLENGE, FREE_FAILURES};
    use SessionState::{Anonymous, LoggedIn};

    const BEARER: &str = "Bearer s3cret:admin-token-0123456789abcdef";
    const CONFIG: &str = r#"
        [admin]
        listen = "127.0.0.1:9999"
        token = "s3cret:admin-token-0123456789abcdef"
        [[nodes]]
        name = "web1"
        url = "http://10.0.0.1:8001"
        [[nodes]]
        name = "web2"
        url = "http://10.0.0.2"
        [data]
        name = "data"
        url = "http://10.0.0.9"
    "#;

    struct Admin(Arc<Gateway>, Router);

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: String,
    }

    fn admin() -> Admin {
        admin_with(CONFIG)
    }

    fn admin_with(text: &str) -> Admin {
        let config = Config::parse(text, ".".as_ref(), Default::default()).unwrap();
        let token = config.admin.as_ref().unwrap().token.clone();
        let gateway = Arc::new(Gateway::new(&config, Clock::default()));
        let reload: Reload = Arc::new(|| Err(vec!["no config file in this test".into()]));
        Admin(
            gateway.clone(),
            router(gateway, token, reload, History::default()),
        )
    }

    impl Admin {
        fn bind(&self, raw_id: &str, node: NodeId, state: SessionState) -> SessionKey {
            let key = self.0.table().key(raw_id);
            self.0.table().bind(key, node, state);
            key
        }

        async fn call(&self, method: &str, uri: &str, auth: Option<&str>) -> Answer {
            let auth = auth.map(|auth| ("authorization", auth));
            let headers: Vec<_> = auth.into_iter().collect();
            self.call_from("127.0.0.1".parse().unwrap(), method, uri, &headers)
                .await
        }

        /// A request from `peer` with `headers` as given.
        async fn call_from(
            &self,
            peer: IpAddr,
            method: &str,
            uri: &str,
            headers: &[(&str, &str)],
        ) -> Answer {
            let mut request = Request::builder().method(method).uri(uri);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let mut request = request.body(Body::empty()).unwrap();
            let connected = ConnectInfo(SocketAddr::new(peer, 50000));
            request.extensions_mut().insert(connected);
            let (parts, body) = self.1.clone().oneshot(request).await.unwrap().into_parts();
            let body = to_bytes(body, usize::MAX).await.unwrap();
            let body = String::from_utf8(body.to_vec()).unwrap();
            let (status, headers) = (parts.status, parts.headers);
            Answer {
                status,
                headers,
                body,
            }
        }

        async fn get(&self, uri: &str) -> Answer {
            self.call("GET", uri, Some(BEARER)).await
        }

        async fn json(&self, uri: &str) -> Value {
            serde_json::from_str(&self.get(uri).await.body).unwrap()
        }

        async fn status(&self, method: &str, uri: &str) -> StatusCode {
            self.call(method, uri, Some(BEARER)).await.status
        }
    }

    fn sessions(page: &Value) -> Vec<String> {
        let entries = page["entries"].as_array().unwrap();
        entries
            .iter()
            .map(|e| e["session"].as_str().unwrap().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn healthz_answers_ok_without_a_token() {
        let answer = admin().call("GET", "/healthz", None).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.body, "ok");
    }

    #[tokio::test]
    async fn readyz_says_ready_while_a_node_can_take_students_and_503_when_none_can() {
        let admin = admin();
        let answer = admin.call("GET", "/readyz", None).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.body, "ready: 2 of 2 nodes up\n");
        // web1 disabled by its admin, web2's probes failing.
        assert_eq!(
            admin.status("POST", "/nodes/web1/disable").await,
            StatusCode::OK
        );
        let settings = admin.0.settings();
        let web2 = settings.upstreams.by_name("web2").unwrap();
        while web2.health.is_up() {
            web2.health.failure(1);
        }
        let answer = admin.call("GET", "/readyz", None).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(answer.body.contains("none of 2 nodes"), "{}", answer.body);
    }

    #[tokio::test]
    async fn missing_or_wrong_credentials_get_a_bare_401_and_a_basic_challenge() {
        let admin = admin();
        let wrong = [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cret:admin-token-0123456789abcdefx"),
            Some("Bearer s3cret"),
            Some("Token s3cret:admin-token-0123456789abcdef"),
            Some("Basic YWRtaW46d3Jvbmc="), // admin:wrong
            // s3cret:admin-token-0123456789abcdef:
            Some("Basic czNjcmV0OmFkbWluLXRva2VuLTAxMjM0NTY3ODlhYmNkZWY6"),
            Some("Basic !!not-base64"),
        ];
        // Each from its own address, so none is held back for the others' failures.
        for (i, auth) in wrong.into_iter().enumerate() {
            for uri in ["/nodes", "/nope"] {
                let peer = IpAddr::from([192, 0, 2, i as u8]);
                let auth: Vec<_> = auth
                    .map(|auth| ("authorization", auth))
                    .into_iter()
                    .collect();
                let answer = admin.call_from(peer, "GET", uri, &auth).await;
                assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{auth:?}");
                assert_eq!(answer.headers[WWW_AUTHENTICATE], CHALLENGE);
                assert_eq!(answer.body, r#"{"error":"unauthorized"}"#);
            }
        }
    }

    #[tokio::test]
    async fn the_token_opens_the_api_as_bearer_or_as_any_users_basic_password() {
        let admin = admin();
        let good = [
            BEARER,
            "bearer   s3cret:admin-token-0123456789abcdef ",
            // :s3cret:admin-token-0123456789abcdef
            "Basic OnMzY3JldDphZG1pbi10b2tlbi0wMTIzNDU2Nzg5YWJjZGVm",
            // ops:s3cret:admin-token-0123456789abcdef
            "Basic b3BzOnMzY3JldDphZG1pbi10b2tlbi0wMTIzNDU2Nzg5YWJjZGVm",
        ];
        for auth in good {
            let answer = admin.call("GET", "/nodes", Some(auth)).await;
            assert_eq!(answer.status, StatusCode::OK, "{auth}");
            assert_eq!(answer.headers[CONTENT_TYPE], "application/json");
            assert_eq!(answer.headers[CACHE_CONTROL], "no-store");
        }
    }

    #[tokio::test]
    async fn unknown_routes_and_methods_answer_json_errors() {
        let admin = admin();
        let json = admin.json("/no-such-page").await;
        assert_eq!(json, json!({"error": "no such route"}));
        let answer = admin.call("POST", "/nodes", Some(BEARER)).await;
        assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(answer.headers[CONTENT_TYPE], "application/json");
    }

    #[tokio::test]
    async fn affinity_counts_each_node_and_pages_through_every_entry_once() {
        let admin = admin();
        for i in 0..25 {
            let state = if i % 5 == 0 { LoggedIn } else { Anonymous };
            admin.bind(&format!("raw-session-{i:02}"), node(i % 2), state);
        }
        let mut page = admin.json("/affinity?limit=10").await;
        let web1 = &page["nodes"][0];
        assert_eq!(web1["name"], "web1");
        let counts = (&web1["live"], &web1["logged_in"], &web1["anonymous"]);
        assert_eq!(counts, (&json!(13), &json!(3), &json!(10)));
        let total = json!({"live": 25, "logged_in": 5, "anonymous": 20});
        assert_eq!(page["total"], total);
        let mut seen = sessions(&page);
        while let Some(cursor) = page["next_cursor"].as_str().map(str::to_owned) {
            assert_eq!(seen.last(), Some(&cursor));
            page = admin
                .json(&format!("/affinity?limit=10&cursor={cursor}"))
                .await;
            seen.extend(sessions(&page));
        }
        assert_eq!(seen.len(), 25);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "no repeats");
    }

    #[tokio::test]
    async fn the_node_filter_pages_only_that_nodes_sessions() {
        let admin = admin();
        for i in 0..6 {
            admin.bind(&format!("raw-{i}"), node(usize::from(i < 2)), Anonymous);
        }
        let page = admin.json("/affinity?node=web2").await;
        let entries = page["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert!(entries.iter().all(|e| e["node"] == "web2"));
        assert_eq!(page["next_cursor"], Value::Null);
        let unknown = admin.get("/affinity?node=web9").await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
        assert_eq!(unknown.body, r#"{"error":"no node named web9"}"#);
    }

    #[tokio::test]
    async fn limits_and_cursors_outside_the_rules_are_400() {
        let admin = admin();
        for limit in ["0", "1001", "-1", "ten"] {
            let answer = admin.get(&format!("/affinity?limit={limit}")).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{limit}");
            assert_eq!(
                answer.body,
                r#"{"error":"limit must be between 1 and 1000"}"#
            );
        }
        for cursor in ["xyz", "+123456789abcdef", "0123456789abcdef0"] {
            let uri = format!("/affinity?cursor={cursor}");
            let status = admin.status("GET", &uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{cursor}");
        }
        for fine in ["limit=1000", "cursor=0123456789ABCDEF"] {
            let uri = format!("/affinity?{fine}");
            assert_eq!(admin.status("GET", &uri).await, StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn lookup_finds_a_session_by_its_raw_id_and_shows_its_entry() {
        let admin = admin();
        let key = admin.bind("raw-id", node(1), LoggedIn);
        let entry = admin.json("/affinity/lookup?session=raw-id").await;
        assert_eq!(entry["session"], key.to_string());
        assert_eq!(
            (&entry["node"], &entry["state"]),
            (&json!("web2"), &json!("logged-in"))
        );
        assert!(entry["created"].as_u64().unwrap() > 1_600_000_000);
        let missing = admin.get("/affinity/lookup?session=other").await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert_eq!(missing.body, r#"{"error":"session not bound"}"#);
        let no_id = admin.status("GET", "/affinity/lookup").await;
        assert_eq!(no_id, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn delete_evicts_a_session_by_its_hash_once() {
        let admin = admin();
        let uri = format!("/affinity/{}", admin.bind("raw-id", node(0), Anonymous));
        let anonymous = admin.call("DELETE", &uri, None).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        assert_eq!(admin.status("DELETE", &uri).await, StatusCode::NO_CONTENT);
        assert!(admin.0.table().is_empty());
        assert_eq!(admin.status("DELETE", &uri).await, StatusCode::NOT_FOUND);
        let bad = admin.status("DELETE", "/affinity/nothex").await;
        assert_eq!(bad, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn nodes_lists_every_upstream_with_its_url_and_counts() {
        let admin = admin();
        admin.bind("raw-a", node(0), LoggedIn);
        admin.bind("raw-b", node(0), Anonymous);
        let mut body = admin.json("/nodes").await;
        let since = body["nodes"][0]["health_since"].take();
        assert!(since.as_u64().unwrap() > 1_600_000_000, "unix seconds");
        let web1 = json!({"name": "web1", "url": "http://10.0.0.1:8001", "weight": 1,
                          "state": "active", "health": "up", "health_since": null,
                          "live": 2, "logged_in": 1, "anonymous": 1,
                          "max_active": null, "active": null,
                          "queued": {"working": 0, "logged_in": 0, "anonymous": 0, "newcomer": 0}});
        assert_eq!(body["nodes"][0], web1);
        assert_eq!(body["nodes"][1]["url"], "http://10.0.0.2");
        body["data"]["health_since"].take();
        let data = json!({"name": "data", "url": "http://10.0.0.9", "state": "active",
                          "health": "up", "health_since": null});
        assert_eq!(body["data"], data);
    }

    /// [`CONFIG`] with `[surge] max_active = 1`, web2 with its own cap of 3.
    fn capped() -> Admin {
        let text = CONFIG.replace(
            "[[nodes]]\n        name = \"web2\"",
            "[[nodes]]\n        name = \"web2\"\n        max_active = 3",
        );
        admin_with(&format!("[surge]\nmax_active = 1\n{text}"))
    }

    fn ask(class: Class) -> Ask {
        let patience = Duration::from_secs(60);
        let (arrived, aging) = (tokio::time::Instant::now(), Duration::from_secs(10));
        Ask {
            class,
            arrived,
            aging,
            patience,
        }
    }

    #[tokio::test]
    async fn nodes_shows_each_nodes_cap_in_flight_and_line_per_class() {
        let admin = capped();
        let web1 = admin.0.settings().upstreams.nodes()[0].slots.clone();
        let _held = web1.acquire(ask(Class::LoggedIn)).await.unwrap();
        let mut waiters = tokio::task::JoinSet::new();
        for class in [Class::Newcomer, Class::LoggedIn, Class::Newcomer] {
            let web1 = web1.clone();
            waiters.spawn(async move { web1.acquire(ask(class)).await.map(drop) });
        }
        while web1.queued() < 3 {
            tokio::task::yield_now().await;
        }
        let body = admin.json("/nodes").await;
        let slots = |node: &Value| {
            let fields = ["max_active", "active", "queued"];
            fields.map(|f| node[f].clone())
        };
        let queued = json!({"working": 0, "logged_in": 1, "anonymous": 0, "newcomer": 2});
        assert_eq!(slots(&body["nodes"][0]), [json!(1), json!(1), queued]);
        let idle = json!({"working": 0, "logged_in": 0, "anonymous": 0, "newcomer": 0});
        assert_eq!(slots(&body["nodes"][1]), [json!(3), json!(0), idle]);
        assert!(body["data"].get("max_active").is_none(), "{}", body["data"]);
        let surge = admin.json("/surge").await;
        assert_eq!(surge["capped_nodes"], 2);
        assert_eq!(
            (&surge["waiting"], &surge["max_waiting"]),
            (&json!(3), &json!(10_000))
        );
        let room = json!({"open": false, "in_line": 0, "admitted_last_minute": 0,
                          "opens_at_ms": 5000});
        assert_eq!(surge["room"], room);
        // Three wait and none has finished yet: nobody can say how long.
        assert_eq!(surge["expected_wait_ms"], Value::Null);
        waiters.abort_all();
    }

    #[tokio::test]
    async fn surge_without_a_cap_or_a_room_says_so() {
        let surge = admin().json("/surge").await;
        let idle = json!({"capped_nodes": 0, "waiting": 0, "max_waiting": 10_000,
                          "expected_wait_ms": 0, "room": {"open": false, "in_line": 0,
                          "admitted_last_minute": 0, "opens_at_ms": 5000}});
        assert_eq!(surge, idle);
        let off = admin_with(&format!("[surge]\nwaiting_room = false\n{CONFIG}"));
        assert_eq!(off.json("/surge").await["room"], Value::Null);
    }

    #[tokio::test]
    async fn the_waiting_page_can_be_seen_before_any_surge() {
        let admin = admin();
        let page = admin.call("GET", "/surge/page", Some(BEARER)).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            page.body
                .contains("Your place in line: <strong>42</strong>"),
            "{}",
            page.body
        );
        assert!(page.body.contains("noindex"));
        let anonymous = admin.call("GET", "/surge/page", None).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        let off = admin_with(&format!("[surge]\nwaiting_room = false\n{CONFIG}"));
        let none = off.call("GET", "/surge/page", Some(BEARER)).await;
        assert_eq!(none.status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn cache_shows_every_figure_and_no_hit_rate_before_any_request() {
        let admin = admin();
        let cache = admin.json("/cache").await;
        let mut fields: Vec<_> = cache.as_object().unwrap().keys().cloned().collect();
        fields.sort_unstable();
        let mut expected = ["enabled", "entries", "bytes", "max_bytes", "hits", "misses"].to_vec();
        expected.extend(["fills", "evictions", "hit_rate"]);
        expected.sort_unstable();
        assert_eq!(fields, expected);
        for counter in ["entries", "bytes", "hits", "misses", "fills", "evictions"] {
            assert_eq!(cache[counter], 0, "{counter}");
        }
        assert_eq!(cache["hit_rate"], Value::Null, "nothing asked yet");
        let answer = admin.call("GET", "/cache", None).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn purge_answers_how_many_it_forgot_and_only_to_a_post_with_the_token() {
        let admin = admin();
        let purged = admin.call("POST", "/cache/purge", Some(BEARER)).await;
        assert_eq!(purged.status, StatusCode::OK);
        assert_eq!(purged.body, r#"{"purged":0}"#);
        let anonymous = admin.call("POST", "/cache/purge", None).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        let get = admin.status("GET", "/cache/purge").await;
        assert_eq!(get, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn no_admin_answer_ever_contains_a_raw_session_id() {
        let admin = admin();
        let mut uris = vec!["/healthz", "/nodes", "/affinity?node=web1"];
        uris.extend(["/affinity", "/affinity?limit=5", "/nope"]);
        let mut uris: Vec<String> = uris.into_iter().map(String::from).collect();
        for i in 0..12 {
            let key = admin.bind(&format!("rawsecret{i}"), node(i % 2), Anonymous);
            uris.push(format!("/affinity/lookup?session=rawsecret{i}"));
            uris.push(format!("/affinity?limit=5&cursor={key}"));
            uris.push(format!("/affinity/{key}"));
        }
        uris.push("/affinity/lookup?session=rawsecret-unbound".into());
        let mut shown = String::new();
        for uri in &uris {
            for (method, auth) in [
                ("GET", Some(BEARER)),
                ("GET", None),
                ("DELETE", Some(BEARER)),
            ] {
                let answer = admin.call(method, uri, auth).await;
                shown += &format!("{} {:?} {}\n", answer.status, answer.headers, answer.body);
            }
        }
        assert!(admin.0.table().is_empty(), "every session was evicted");
        assert!(shown.contains("logged_in") && shown.contains("\"session\""));
        assert!(!shown.contains("rawsecret"), "{shown}");
    }

    /// Basic `ops:<token>`, as a browser caches it.
    const BASIC: &str = "Basic b3BzOnMzY3JldDphZG1pbi10b2tlbi0wMTIzNDU2Nzg5YWJjZGVm";

    fn web1_state(admin: &Admin) -> NodeState {
        let settings = admin.0.settings();
        settings.upstreams.by_name("web1").unwrap().state()
    }

    #[tokio::test]
    async fn a_cross_site_form_post_changes_nothing_even_with_cached_basic_credentials() {
        let admin = admin();
        let peer = "127.0.0.1".parse().unwrap();
        let host = ("host", "127.0.0.1:9999");
        let form = ("content-type", "application/x-www-form-urlencoded");
        let forged: [&[(&str, &str)]; 4] = [
            // What the browser sent for the page on evil.example.
            &[
                ("authorization", BASIC),
                host,
                form,
                ("origin", "http://evil.example"),
            ],
            &[
                ("authorization", BASIC),
                host,
                form,
                ("sec-fetch-site", "cross-site"),
            ],
            // No Origin (an old browser), but a form.
            &[("authorization", BASIC), host, form],
            // Not a form, but Basic alone: a browser may add it by itself.
            &[("authorization", BASIC), host],
        ];
        for uri in [
            "/nodes/web1/disable",
            "/reload",
            "/cache/purge",
            "/affinity/0123456789abcdef",
        ] {
            let method = if uri.starts_with("/affinity") {
                "DELETE"
            } else {
                "POST"
            };
            for headers in forged {
                let answer = admin.call_from(peer, method, uri, headers).await;
                let refused = [StatusCode::FORBIDDEN, StatusCode::UNSUPPORTED_MEDIA_TYPE];
                assert!(
                    refused.contains(&answer.status),
                    "{uri} {headers:?}: {}",
                    answer.status
                );
            }
        }
        assert_eq!(web1_state(&admin), NodeState::Active);
        // None of them counted as a wrong token.
        let answer = admin
            .call_from(peer, "GET", "/nodes", &[("authorization", BEARER)])
            .await;
        assert_eq!(answer.status, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_script_changes_state_with_a_bearer_token_or_basic_and_x_requested_by() {
        let admin = admin();
        let peer = "127.0.0.1".parse().unwrap();
        let same = [
            ("authorization", BEARER),
            ("host", "127.0.0.1:9999"),
            ("origin", "http://127.0.0.1:9999"),
            ("sec-fetch-site", "same-origin"),
        ];
        let answer = admin
            .call_from(peer, "POST", "/nodes/web1/drain", &same)
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(web1_state(&admin), NodeState::Draining);
        assert_eq!(
            admin.status("POST", "/nodes/web1/disable").await,
            StatusCode::OK
        );
        assert_eq!(web1_state(&admin), NodeState::Disabled);
        let scripted = [("authorization", BASIC), ("x-requested-by", "ops")];
        let answer = admin
            .call_from(peer, "POST", "/nodes/web1/undrain", &scripted)
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(web1_state(&admin), NodeState::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_from_one_address_earn_a_growing_wait() {
        let admin = admin();
        let (guesser, other): (IpAddr, IpAddr) = (
            "198.51.100.7".parse().unwrap(),
            "198.51.100.8".parse().unwrap(),
        );
        let wrong = [("authorization", "Bearer not-the-token")];
        let right = [("authorization", BEARER)];
        for _ in 0..FREE_FAILURES {
            let answer = admin.call_from(guesser, "GET", "/nodes", &wrong).await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        }
        // The clock is paused: the wait cannot pass between these calls.
        for auth in [&wrong, &right] {
            let answer = admin.call_from(guesser, "GET", "/nodes", auth).await;
            assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(answer.headers[RETRY_AFTER], "1");
        }
        let answer = admin.call_from(other, "GET", "/nodes", &right).await;
        assert_eq!(answer.status, StatusCode::OK, "another address is not held");
        tokio::time::advance(Duration::from_secs(1)).await;
        let answer = admin.call_from(guesser, "GET", "/nodes", &wrong).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        let answer = admin.call_from(guesser, "GET", "/nodes", &right).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers[RETRY_AFTER], "2", "the wait doubled");
        tokio::time::advance(Duration::from_secs(2)).await;
        let answer = admin.call_from(guesser, "GET", "/nodes", &right).await;
        assert_eq!(answer.status, StatusCode::OK);
        // The right token starts the address afresh.
        let answer = admin.call_from(guesser, "GET", "/nodes", &wrong).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        let answer = admin.call_from(guesser, "GET", "/nodes", &right).await;
        assert_eq!(answer.status, StatusCode::OK);
    }

    #[tokio::test]
    async fn requests_without_credentials_never_hold_an_address_back() {
        let admin = admin();
        let peer = "127.0.0.1".parse().unwrap();
        for _ in 0..3 * FREE_FAILURES {
            let answer = admin.call_from(peer, "GET", "/nodes", &[]).await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        }
        let answer = admin
            .call_from(peer, "GET", "/nodes", &[("authorization", BEARER)])
            .await;
        assert_eq!(answer.status, StatusCode::OK);
    }
}
