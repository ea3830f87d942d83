//! Whether each upstream is up: active probes on a timer, passive marks from the
//! requests themselves, and a way for a request to wait for its node to come back.
//!
//! Why both: a probe every couple of seconds notices a node that died while nobody
//! was using it, and brings a repaired node back; the requests notice a dead node
//! within a few connection attempts, long before the next probe would. Both feed the
//! same counters, so `fall` failures in a row of either kind take a node down, and
//! only probes (`rise` successes in a row) bring it back: a down node gets no traffic
//! that could vouch for it.
//!
//! What counts as a failure: for a probe, no connection or no answer within
//! `health.timeout`; for a student's request, no connection only (a slow page, such
//! as a course backup, is not a sick node; a hung node fails its probes). Never the
//! gateway's own lack of resources (no socket at the open-file limit, no local port:
//! [`crate::http::upstream::fault`]), which would take every healthy node down at once. A Moodle
//! `500` is the application's answer about one page, not about the node. Moodle's maintenance
//! answer (`503` with `Retry-After`; docs/src/moodle.md, "Health and maintenance") means the *site* is down on purpose:
//! every node says it at once, and ejecting them all would replace Moodle's
//! maintenance page with the gateway's own error, so it counts as alive.
//!
//! The state is one `AtomicU64` per upstream (up bit, streak, last change), so the
//! request path reads it without a lock and only writes it when something changed.
//! What the last probe saw is kept as text for the dashboard's "why": written only
//! by the probe task, once per probe, behind a mutex the request path never takes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, HOST, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;

use crate::cluster::slow_start::CameBack;
use crate::config::HealthConfig;
use crate::http::upstream::fault::{self, ConnectFault};

const UP: u64 = 1 << 63;
const STREAK: u64 = u32::MAX as u64;

/// The health of one upstream. Starts up: a gateway (re)started in term time must
/// serve at once, and a node that is really down is found within `fall` attempts.
#[derive(Debug)]
pub struct Health {
    /// Bit 63: up. Low 32 bits: the current streak (failures while up, successes
    /// while down).
    state: AtomicU64,
    /// Unix seconds of the last up/down change (or of start).
    since: AtomicU64,
    /// Whether the last probe saw Moodle's maintenance answer.
    maintenance: AtomicBool,
    /// When it last came back up, for slow start (never when it was up from start).
    pub came_up_at: CameBack,
    /// Wakes requests waiting for this upstream to come back.
    came_up: Notify,
    /// What the last probe saw, and when.
    last_probe: Mutex<Option<LastProbe>>,
}

/// What one probe saw, in words, for the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastProbe {
    /// When it was recorded, Unix seconds.
    pub at: u64,
    /// What the upstream answered (`answered 200 OK`) or why there was no answer.
    pub said: String,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: AtomicU64::new(UP),
            since: AtomicU64::new(unix_now()),
            maintenance: AtomicBool::new(false),
            came_up_at: CameBack::default(),
            came_up: Notify::new(),
            last_probe: Mutex::new(None),
        }
    }
}

/// What one observation did to an upstream's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing changed state.
    None,
    /// The upstream was just marked up.
    Up,
    /// The upstream was just marked down.
    Down,
}

impl Health {
    /// Whether requests may go to this upstream.
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) & UP != 0
    }

    /// When the upstream last went up or down, Unix seconds.
    pub fn since(&self) -> u64 {
        self.since.load(Ordering::Relaxed)
    }

    /// Whether the last probe was answered with Moodle's maintenance page.
    pub fn in_maintenance(&self) -> bool {
        self.maintenance.load(Ordering::Relaxed)
    }

    /// What the last probe saw; `None` before the first one.
    pub fn last_probe(&self) -> Option<LastProbe> {
        self.last_probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn note_probe(&self, probe: &Probe) {
        let said = match probe {
            Probe::Healthy(status) => format!("answered {status}"),
            Probe::Maintenance => "answered 503 with Retry-After: Moodle's maintenance page".into(),
            Probe::Failed(reason) => reason.clone(),
            Probe::NoVerdict(reason) => format!("not sent: {reason}"),
        };
        let note = LastProbe {
            at: unix_now(),
            said,
        };
        *self.last_probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(note);
    }

    /// A probe or a request succeeded: resets the failure streak of an up upstream,
    /// and counts towards `rise` for a down one.
    pub fn success(&self, rise: u32) -> Change {
        self.observe(true, rise)
    }

    /// A probe or a request failed: counts towards `fall` for an up upstream.
    pub fn failure(&self, fall: u32) -> Change {
        self.observe(false, fall)
    }

    /// The request path's success: resets the failure streak of an up upstream. A
    /// single load when nothing needs resetting, so many cores reading the same
    /// upstream do not fight over its cache line. It never counts towards `rise`:
    /// only probes bring a down upstream back (a response still in flight when the
    /// node was marked down says nothing about the node now).
    pub fn request_succeeded(&self) {
        let state = self.state.load(Ordering::Relaxed);
        if state & UP != 0 && state != UP {
            let _ = self
                .state
                .compare_exchange(state, UP, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    fn observe(&self, ok: bool, threshold: u32) -> Change {
        let mut change = Change::None;
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let (up, streak) = (state & UP != 0, state & STREAK);
                change = Change::None;
                Some(match (up, ok) {
                    (true, true) => UP,
                    (false, false) => 0,
                    (true, false) if streak + 1 >= u64::from(threshold) => {
                        change = Change::Down;
                        0
                    }
                    (false, true) if streak + 1 >= u64::from(threshold) => {
                        change = Change::Up;
                        UP
                    }
                    (up, _) => (if up { UP } else { 0 }) | (streak + 1),
                })
            });
        if change != Change::None {
            self.since.store(unix_now(), Ordering::Relaxed);
        }
        if change == Change::Up {
            self.came_up_at.now();
            self.came_up.notify_waiters();
        }
        change
    }

    /// Waits up to `within` for the upstream to be up; returns whether it is.
    pub async fn wait_up(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.came_up.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.is_up() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_up();
            }
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The client probes go out on. No pooling: a probe must prove that the upstream
/// still accepts connections, not that an old one is still open.
pub type ProbeClient = Client<HttpConnector, Empty<Bytes>>;

/// Builds the probe client; each probe's whole time is bounded by `health.timeout`.
pub fn probe_client() -> ProbeClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// What one probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// An accepted status.
    Healthy(StatusCode),
    /// Moodle's maintenance answer: alive, and the site is closed on purpose.
    Maintenance,
    /// Why the upstream is not healthy.
    Failed(String),
    /// The probe could not even be sent for want of the gateway's own resources (no
    /// socket: the open-file limit): it says nothing about the upstream, and counts
    /// neither way.
    NoVerdict(String),
}

/// Probes `authority` once with `GET {health.path}`.
pub async fn probe(client: &ProbeClient, authority: &str, health: &HealthConfig) -> Probe {
    let uri: Uri = match format!("http://{authority}{}", health.path).parse() {
        Ok(uri) => uri,
        Err(error) => return Probe::Failed(format!("invalid probe URI: {error}")),
    };
    let mut request = Request::new(Empty::new());
    *request.uri_mut() = uri;
    request.headers_mut().insert(
        USER_AGENT,
        HeaderValue::from_static("moodle-gateway-health"),
    );
    // Validated by the config as a plain host[:port].
    if let Some(host) = health
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        request.headers_mut().insert(HOST, host);
    }
    let answer = tokio::time::timeout(health.timeout, client.request(request)).await;
    match answer {
        Err(_) => Probe::Failed(format!("no answer within {:?}", health.timeout)),
        Ok(Err(error)) if error.is_connect() => match ConnectFault::in_chain(&error) {
            // No socket for the probe: the gateway's limit, not the upstream's state.
            ConnectFault::Gateway => Probe::NoVerdict(format!(
                "the gateway is out of connections: {}",
                fault::io_in_chain(&error).map_or_else(|| error.to_string(), |io| io.to_string())
            )),
            ConnectFault::Refused | ConnectFault::Upstream => {
                Probe::Failed("connection failed".into())
            }
        },
        Ok(Err(error)) => Probe::Failed(format!("exchange failed: {error}")),
        Ok(Ok(response)) => {
            let status = response.status();
            if crate::moodle::in_maintenance(status.as_u16(), response.headers()) {
                Probe::Maintenance
            } else if health.accepts(status.as_u16()) {
                Probe::Healthy(status)
            } else {
                Probe::Failed(answered(status, response.headers()))
            }
        }
    }
}

/// What a node said to a probe that failed, for the log: a redirect names where it
/// points, because a 303 to wwwroot is how Moodle refuses a probe's `Host` or port.
fn answered(status: StatusCode, headers: &http::HeaderMap) -> String {
    match headers.get(http::header::LOCATION).map(|l| l.to_str()) {
        Some(Ok(location)) => format!("answered {status} with Location: {location}"),
        Some(Err(_)) => format!("answered {status} with a Location that is not text"),
        None => format!("answered {status}"),
    }
}

/// Applies one probe's result to `health`, logging a change of state: coming back
/// is good news (INFO), trouble is WARN.
pub fn record(name: &str, health: &Health, probe: &Probe, config: &HealthConfig) {
    health.note_probe(probe);
    if let Probe::NoVerdict(reason) = probe {
        return tracing::warn!(upstream = %name, "probe not sent, not counted: {reason}");
    }
    let maintenance = *probe == Probe::Maintenance;
    if health.maintenance.swap(maintenance, Ordering::Relaxed) != maintenance && maintenance {
        tracing::warn!(upstream = %name, "Moodle answers with its maintenance page");
    }
    match probe {
        Probe::Healthy(_) | Probe::Maintenance => {
            if health.success(config.rise) == Change::Up {
                let rise = config.rise;
                tracing::info!(upstream = %name, "marked up after {rise} good probes");
            }
        }
        Probe::NoVerdict(_) => {}
        Probe::Failed(reason) => {
            if health.is_up() {
                // At most `fall` lines before the mark: enough to see why it fell.
                tracing::info!(upstream = %name, "probe failed: {reason}");
            }
            if health.failure(config.fall) == Change::Down {
                tracing::warn!(upstream = %name, "marked down: {reason}");
            }
        }
    }
}

/// One upstream to probe: its name (for logs), authority and health.
pub type Target = (String, String, Arc<Health>);

/// Probes every upstream each `health.interval` until `stop` fires. `targets` gives
/// the current settings and upstreams; it is called every round, so a reload takes
/// effect on the next one.
pub async fn run(
    targets: impl Fn() -> (HealthConfig, Vec<Target>),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let client = probe_client();
    // Upstreams start up, so the first round waits one interval: a restarted
    // gateway serves at once instead of first probing every node at the same time.
    let first = targets().0.interval;
    tokio::select! {
        () = tokio::time::sleep(first) => {}
        _ = stop.changed() => return,
    }
    loop {
        let (config, upstreams) = targets();
        let mut round = tokio::task::JoinSet::new();
        for (name, authority, health) in upstreams {
            let (client, config) = (client.clone(), config.clone());
            round.spawn(async move {
                let result = probe(&client, &authority, &config).await;
                record(&name, &health, &result, &config);
            });
        }
        let next = tokio::time::sleep(config.interval);
        tokio::select! {
            () = async { while round.join_next().await.is_some() {} ; next.await } => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fall_failures_in_a_row_take_an_upstream_down() {
        let health = Health::default();
        assert_eq!(health.failure(3), Change::None);
        assert_eq!(health.failure(3), Change::None);
        assert!(health.is_up());
        assert_eq!(health.failure(3), Change::Down);
        assert!(!health.is_up());
        assert_eq!(health.failure(3), Change::None);
    }

    #[test]
    fn a_success_between_failures_starts_the_count_again() {
        let health = Health::default();
        health.failure(3);
        health.failure(3);
        health.request_succeeded();
        health.failure(3);
        health.failure(3);
        assert!(health.is_up());
    }

    #[test]
    fn rise_successes_in_a_row_bring_it_back() {
        let health = Health::default();
        health.failure(1);
        assert_eq!(health.success(2), Change::None);
        health.failure(1);
        assert_eq!(health.success(2), Change::None);
        assert_eq!(health.success(2), Change::Up);
        assert!(health.is_up());
    }

    #[test]
    fn a_request_success_never_brings_a_down_upstream_back() {
        let health = Health::default();
        health.failure(1);
        health.request_succeeded();
        health.request_succeeded();
        assert!(!health.is_up());
        assert_eq!(health.success(2), Change::None, "nor counts towards rise");
        assert_eq!(health.success(2), Change::Up);
    }

    /// An upstream that answers 200 only to `Host: moodle.example.edu`, 303 otherwise
    /// (what Moodle's full setup does for another host than wwwroot's), and 503 with
    /// `Retry-After` to `/maintenance`.
    async fn moodle_like() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|request: Request<_>| async move {
                    let host = request.headers().get(HOST).cloned();
                    let mut response = http::Response::new(Empty::<Bytes>::new());
                    *response.status_mut() = if request.uri().path() == "/maintenance" {
                        response
                            .headers_mut()
                            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("300"));
                        StatusCode::SERVICE_UNAVAILABLE
                    } else if host.is_some_and(|h| h == "moodle.example.edu") {
                        StatusCode::OK
                    } else {
                        StatusCode::SEE_OTHER
                    };
                    Ok::<_, std::convert::Infallible>(response)
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(io, service),
                );
            }
        });
        addr.to_string()
    }

    fn settings(path: &str, host: Option<&str>) -> HealthConfig {
        HealthConfig {
            path: path.into(),
            host: host.map(str::to_owned),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            rise: 1,
            fall: 1,
            statuses: vec![crate::config::StatusRange {
                low: 200,
                high: 200,
            }],
        }
    }

    #[tokio::test]
    async fn probes_name_the_configured_host_and_see_maintenance_as_alive() {
        let (client, upstream) = (probe_client(), moodle_like().await);
        let own_address = probe(
            &client,
            &upstream,
            &settings("/admin/tool/heartbeat/", None),
        )
        .await;
        assert_eq!(own_address, Probe::Failed("answered 303 See Other".into()));
        let wwwroot = settings("/admin/tool/heartbeat/", Some("moodle.example.edu"));
        let healthy = Probe::Healthy(StatusCode::OK);
        assert_eq!(probe(&client, &upstream, &wwwroot).await, healthy);
        let closed = probe(&client, &upstream, &settings("/maintenance", None)).await;
        assert_eq!(closed, Probe::Maintenance);
        let nobody = probe(&client, "127.0.0.1:1", &settings("/", None)).await;
        assert_eq!(nobody, Probe::Failed("connection failed".into()));
    }

    #[test]
    fn a_probe_the_gateway_could_not_send_counts_neither_way() {
        let (health, config) = (Health::default(), settings("/", None));
        let no_socket = Probe::NoVerdict("Too many open files (os error 24)".into());
        record("web1", &health, &no_socket, &config);
        assert!(health.is_up(), "not a failure");
        health.failure(1);
        record("web1", &health, &no_socket, &config);
        assert!(!health.is_up(), "not a success either");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_wakes_when_its_node_comes_back() {
        let health = Arc::new(Health::default());
        health.failure(1);
        let waiter = tokio::spawn({
            let health = health.clone();
            async move { health.wait_up(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        health.success(1);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_gives_up_after_its_hold() {
        let health = Health::default();
        health.failure(1);
        let started = tokio::time::Instant::now();
        assert!(!health.wait_up(Duration::from_secs(10)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn a_failed_probe_says_what_the_node_answered_and_where_it_pointed() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(
            answered(StatusCode::NOT_FOUND, &headers),
            "answered 404 Not Found"
        );
        headers.insert(
            http::header::LOCATION,
            HeaderValue::from_static("https://moodle.example.edu/"),
        );
        assert_eq!(
            answered(StatusCode::SEE_OTHER, &headers),
            "answered 303 See Other with Location: https://moodle.example.edu/"
        );
    }

    #[test]
    fn the_last_probe_is_kept_in_words_for_the_dashboard() {
        let (health, config) = (Health::default(), settings("/", None));
        assert_eq!(health.last_probe(), None, "no probe yet");
        let moved = "answered 303 See Other with Location: https://moodle.example.edu/";
        record("web1", &health, &Probe::Failed(moved.into()), &config);
        assert_eq!(health.last_probe().unwrap().said, moved);
        record("web1", &health, &Probe::Healthy(StatusCode::OK), &config);
        let last = health.last_probe().unwrap();
        assert_eq!(last.said, "answered 200 OK");
        assert!(last.at > 1_600_000_000, "unix seconds");
        record("web1", &health, &Probe::Maintenance, &config);
        assert!(health.last_probe().unwrap().said.contains("maintenance"));
    }
}
