//! What the gateway counts: the Prometheus families behind `/metrics`, and the
//! per-node figures the dashboard shows.
//!
//! Why handles made once: a labelled counter looked up by its label values hashes
//! them and takes a read lock on every call. The request path instead reaches its
//! node's [`NodeMeters`] by the node's stable id, and each counter there is one
//! relaxed atomic add. A node's meters are made the first time a config names it
//! and outlive reloads, as its id does.
//!
//! Why some figures are not counted at all: live sessions, health, admin state and
//! requests in flight already exist (in the table and the upstreams); `/metrics`
//! reads them at scrape time ([`Metrics::render`]), so nothing on the request path
//! keeps a second copy up to date.

use std::sync::OnceLock;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::cluster::slots::{Class, SlotsNow};
use crate::node_id::{NodeId, MAX_NODE_IDS};

mod acme;
mod cache;
mod export;
mod limits;
mod node;
mod spool;
mod store;
mod surge;

pub use acme::AcmeMeters;
use cache::CacheMeters;
pub use export::{ExportMeters, ExportTotals, Fetched};
use limits::LimitMeters;
pub use limits::Limited;
use node::class;
pub use node::{LatencyCounts, LossCause, MoveCause, NodeMeters, NodeTotals};
use spool::SpoolMeters;
pub use store::{Degradation, Fallback, StoreMeters};
pub use surge::RoomNow;
use surge::SurgeMeters;

/// Status classes by the first digit of a status: 1xx to 5xx.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Why the table let sessions go: the `max_sessions` bound, or idleness.
pub const EVICTION_REASONS: [&str; 2] = ["max_sessions", "expired"];

/// The upstream label of answers the gateway gave itself (refusals, error pages).
pub const GATEWAY: &str = "gateway";

/// Upstream latency buckets, seconds: a cached Moodle page takes milliseconds, a
/// course page a few hundred, a report or backup many seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The figures read at scrape time from where they live.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Per upstream: name, whether a PHP node (sessions are counted) or the data
    /// server, up, admin state, live and logged-in sessions.
    pub upstreams: Vec<UpstreamNow>,
    /// Requests between admission and their response head.
    pub in_flight: usize,
    /// Entries in the affinity table.
    pub table_len: usize,
    /// The waiting room.
    pub room: RoomNow,
    /// The site's share of quiz starts.
    pub site_starts: crate::cluster::slots::SiteStartsNow,
    /// The asset cache.
    pub cache: crate::http::upstream::asset_cache::CacheNow,
    /// Whether the file export passes its probes; `None` without `[offload]`.
    pub export_up: Option<bool>,
    /// The upload spool.
    pub spool: crate::http::body::spool::SpoolNow,
}

/// One upstream at scrape time.
#[derive(Debug)]
pub struct UpstreamNow {
    /// Its name, the label of every family.
    pub name: String,
    /// A PHP node (with sessions), not the data server.
    pub node: bool,
    /// Health: up.
    pub up: bool,
    /// Admin state: `active`, `draining` or `disabled`.
    pub state: &'static str,
    /// Live sessions bound to it.
    pub live: u64,
    /// Of those, logged in.
    pub logged_in: u64,
    /// Its cap, the requests holding a slot and those waiting.
    pub slots: SlotsNow,
    /// Of its full share of new sessions, what it gets now: below 1 while it warms
    /// up after coming back (`[session] slow_start`).
    pub share: f64,
}

/// The gateway's metrics: the registry and the handles that feed it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    dealt: IntCounterVec,
    losses: IntCounterVec,
    moves: IntCounterVec,
    upstream_errors: IntCounterVec,
    rejections: IntCounterVec,
    evictions: IntCounterVec,
    tls_failures: IntCounter,
    sessions: IntGaugeVec,
    up: IntGaugeVec,
    admin_state: IntGaugeVec,
    slow_start: GaugeVec,
    in_flight: IntGauge,
    table_len: IntGauge,
    /// The gateway's own answers, by class.
    own: [IntCounter; 5],
    /// One scrape at a time: a scrape resets and sets the gauges, and two
    /// interleaved (a Prometheus pair) would each gather the other's half-set ones.
    scraping: std::sync::Mutex<()>,
    nodes: Box<[OnceLock<NodeMeters>]>,
    store: OnceLock<StoreMeters>,
    export: OnceLock<ExportMeters>,
    acme: OnceLock<AcmeMeters>,
    surge: SurgeMeters,
    cache: CacheMeters,
    spool: SpoolMeters,
    limits: LimitMeters,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family under the `moodle_gateway_` prefix.
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("moodle_gateway".into()), None).expect("a valid prefix");
        let requests = counters(
            &registry,
            "requests_total",
            "Responses sent, by the upstream that answered (or `gateway`) and status class.",
            &["upstream", "class"],
        );
        let own = CLASSES.map(|c| requests.with_label_values(&[GATEWAY, c]));
        let latency = HistogramOpts::new(
            "upstream_response_seconds",
            "Time from sending a request to an upstream to its response head.",
        )
        .buckets(LATENCY_BUCKETS.to_vec());
        let latency = add(&registry, HistogramVec::new(latency, &["upstream"]));
        Self {
            dealt: counters(
                &registry,
                "sessions_dealt_total",
                "New sessions bound to each node.",
                &["node"],
            ),
            losses: counters(
                &registry,
                "session_losses_total",
                "Logged-in sessions a node replaced outside login and logout: students logged out.",
                &["node", "cause"],
            ),
            moves: counters(
                &registry,
                "session_moves_total",
                "Known sessions sent to another node than their own, by why.",
                &["cause"],
            ),
            upstream_errors: counters(
                &registry,
                "upstream_errors_total",
                "Requests an upstream failed, by kind.",
                &["upstream", "kind"],
            ),
            rejections: counters(
                &registry,
                "rejections_total",
                "Requests and connections turned away by one of the gateway's limits.",
                &["limit"],
            ),
            evictions: counters(
                &registry,
                "table_evictions_total",
                "Sessions removed from the affinity table other than by Moodle, by reason.",
                &["reason"],
            ),
            tls_failures: counter(
                &registry,
                "tls_handshake_failures_total",
                "TLS handshakes that failed or took too long.",
            ),
            sessions: gauges(
                &registry,
                "sessions",
                "Live sessions bound to each node, logged in or anonymous.",
                &["node", "state"],
            ),
            up: gauges(
                &registry,
                "upstream_up",
                "1 while an upstream passes its health checks.",
                &["upstream"],
            ),
            admin_state: gauges(
                &registry,
                "upstream_admin_state",
                "1 for the admin state each upstream is in.",
                &["upstream", "state"],
            ),
            slow_start: add(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "node_slow_start_share",
                        "Of each node's full share of new sessions, what it gets now: \
                         below 1 while it warms up after coming back.",
                    ),
                    &["node"],
                ),
            ),
            in_flight: gauge(
                &registry,
                "in_flight",
                "Requests between admission and their response head.",
            ),
            table_len: gauge(&registry, "table_entries", "Entries in the affinity table."),
            nodes: (0..MAX_NODE_IDS).map(|_| OnceLock::new()).collect(),
            store: OnceLock::new(),
            export: OnceLock::new(),
            acme: OnceLock::new(),
            surge: SurgeMeters::new(&registry),
            cache: CacheMeters::new(&registry),
            spool: SpoolMeters::new(&registry),
            limits: LimitMeters::new(&registry),
            registry,
            requests,
            latency,
            own,
            scraping: std::sync::Mutex::new(()),
        }
        .with_zeroes()
    }

    /// Series of a small fixed label set exist from the start at 0, so that a
    /// dashboard or an alert sees "none yet" rather than "no data".
    fn with_zeroes(self) -> Self {
        for cause in MoveCause::ALL {
            self.moves.with_label_values(&[cause.as_str()]);
        }
        for reason in EVICTION_REASONS {
            self.evictions.with_label_values(&[reason]);
        }
        self
    }

    /// Makes the meters of `id` once, labelled `name` (ids never change name).
    pub fn register(&self, id: NodeId, name: &str) {
        self.nodes[id.index()].get_or_init(|| NodeMeters {
            requests: CLASSES.map(|c| self.requests.with_label_values(&[name, c])),
            latency: self.latency.with_label_values(&[name]),
            dealt: self.dealt.with_label_values(&[name]),
            losses: LossCause::ALL.map(|c| self.losses.with_label_values(&[name, c.as_str()])),
        });
    }

    /// The meters of a node or the data server; `None` only for an id no config named.
    pub fn node(&self, id: NodeId) -> Option<&NodeMeters> {
        self.nodes.get(id.index())?.get()
    }

    /// The shared store's meters, registered on first use: only a gateway with
    /// `[store] kind = "redis"` exports them.
    pub fn store(&self) -> &StoreMeters {
        self.store.get_or_init(|| StoreMeters::new(&self.registry))
    }

    /// The file export's meters, registered on first use: only a gateway with
    /// `[offload]` exports them.
    pub fn export(&self) -> &ExportMeters {
        self.export
            .get_or_init(|| ExportMeters::new(&self.registry))
    }

    /// The ACME client's meters, registered on first use: only a gateway with
    /// `[acme]` exports them.
    pub fn acme(&self) -> &AcmeMeters {
        self.acme.get_or_init(|| AcmeMeters::new(&self.registry))
    }

    /// An answer the gateway gave itself.
    pub fn own_answer(&self, status: u16) {
        self.own[class(status)].inc();
    }

    /// A known session moved off its node.
    pub fn moved(&self, cause: MoveCause) {
        self.moves.with_label_values(&[cause.as_str()]).inc();
    }

    /// A request an upstream failed (`kind` from [`crate::error::GatewayError::kind`]).
    pub fn upstream_error(&self, upstream: &str, kind: &str) {
        self.upstream_errors
            .with_label_values(&[upstream, kind])
            .inc();
    }

    /// A request that got its node slot after `waited` in the gateway's line.
    pub fn waited(&self, class: Class, waited: std::time::Duration) {
        self.surge.waited(class, waited);
    }

    /// A quiz start passed its node's gate after `waited`.
    pub fn quiz_start_waited(&self, waited: std::time::Duration) {
        self.surge.quiz_start_waited(waited);
    }

    /// An attempt's first page took the place its quiz start kept at the gate.
    pub fn first_page_took_its_start(&self) {
        self.surge.first_page_took_its_start();
    }

    /// A request waited for another request of its own session.
    pub fn session_waited(&self) {
        self.surge.session_waited();
    }

    /// A request that got no node slot (`reason`: the error's kind).
    pub fn turned_away(&self, class: Class, reason: &str) {
        self.surge.turned_away(class, reason);
    }

    /// A waiting page served.
    pub fn waiting_page(&self) {
        self.surge.waiting_page();
    }

    /// A visitor let in from the waiting room's line.
    pub fn admitted(&self) {
        self.surge.admitted();
    }

    /// Visitors let in from the waiting room's line, since start.
    pub fn admitted_total(&self) -> u64 {
        self.surge.admitted_total()
    }

    /// The waiting room opened.
    pub fn room_opened(&self) {
        self.surge.opened();
    }

    /// A request or connection one of the gateway's limits turned away.
    pub fn rejected(&self, limit: &str) {
        self.rejections.with_label_values(&[limit]).inc();
    }

    /// A request one of the rate limits answered `429`.
    pub fn rate_limited(&self, kind: Limited) {
        self.limits.refused(kind);
    }

    /// Requests `kind` answered `429`, since start.
    pub fn rate_limited_total(&self, kind: Limited) -> u64 {
        self.limits.total(kind)
    }

    /// `count` sessions removed from the table for `reason`.
    pub fn evicted(&self, reason: &str, count: usize) {
        if count > 0 {
            let count = u64::try_from(count).unwrap_or(u64::MAX);
            self.evictions.with_label_values(&[reason]).inc_by(count);
        }
    }

    /// The counters the public listener feeds itself: connections turned away at
    /// `max_connections`, and failed TLS handshakes.
    pub fn listener_counters(&self) -> (IntCounter, IntCounter) {
        let turned_away = self.rejections.with_label_values(&["max_connections"]);
        (turned_away, self.tls_failures.clone())
    }

    /// The text exposition of every family, with the scrape-time gauges set from `now`.
    pub fn render(&self, now: &Snapshot) -> String {
        let _one = self.scraping.lock().unwrap_or_else(|p| p.into_inner());
        self.in_flight.set(gauge_value(now.in_flight as u64));
        self.table_len.set(gauge_value(now.table_len as u64));
        // Gauges of a node that left the config must not linger at their last value.
        self.sessions.reset();
        self.up.reset();
        self.admin_state.reset();
        self.slow_start.reset();
        self.surge.reset();
        self.surge.room(&now.room);
        self.surge.site_starts(&now.site_starts);
        self.cache.set(&now.cache);
        if let Some(up) = now.export_up {
            self.export().set_up(up);
        }
        self.spool.set(&now.spool);
        for upstream in &now.upstreams {
            let name = upstream.name.as_str();
            self.up
                .with_label_values(&[name])
                .set(i64::from(upstream.up));
            for state in ["active", "draining", "disabled"] {
                let on = i64::from(state == upstream.state);
                self.admin_state.with_label_values(&[name, state]).set(on);
            }
            if upstream.node {
                self.slow_start
                    .with_label_values(&[name])
                    .set(upstream.share);
                self.surge.node(name, &upstream.slots);
                let anonymous = upstream.live.saturating_sub(upstream.logged_in);
                let sessions = |state| self.sessions.with_label_values(&[name, state]);
                sessions("logged_in").set(gauge_value(upstream.logged_in));
                sessions("anonymous").set(gauge_value(anonymous));
            }
        }
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("text encoding of valid families");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

fn gauge_value(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Registers a family just made, and hands back the handle that feeds it. The
/// names and labels are constants of this file, so a failure is a bug here.
fn add<C: Collector + Clone + 'static>(registry: &Registry, made: prometheus::Result<C>) -> C {
    let collector = made.expect("a valid name, help and label set");
    registry
        .register(Box::new(collector.clone()))
        .expect("each family registered once");
    collector
}

fn counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    add(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    add(registry, IntCounter::new(name, help))
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    add(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    add(registry, IntGauge::new(name, help))
}

#[cfg(test)]
mod tests {
    use crate::node_id::node;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_node_counts_under_its_own_name_and_class() {
        let metrics = Metrics::new();
        metrics.register(node(3), "web4");
        let web4 = metrics.node(node(3)).expect("registered");
        web4.answered(200, Duration::from_millis(3));
        web4.answered(303, Duration::from_millis(3));
        web4.answered(502, Duration::from_millis(3));
        web4.lost(LossCause::Dropped);
        let text = metrics.render(&Snapshot::default());
        assert!(text.contains(r#"moodle_gateway_requests_total{class="2xx",upstream="web4"} 1"#));
        assert!(text.contains(r#"moodle_gateway_requests_total{class="5xx",upstream="web4"} 1"#));
        assert!(
            text.contains(r#"moodle_gateway_session_losses_total{cause="dropped",node="web4"} 1"#)
        );
        assert!(
            text.contains(r#"moodle_gateway_upstream_response_seconds_count{upstream="web4"} 3"#)
        );
        let totals = web4.totals();
        assert_eq!(
            (totals.requests, totals.server_errors, totals.losses),
            (3, 1, 1)
        );
        // The dashboard's p95 reads the histogram as counts, cumulative like `le`.
        let counts = web4.latency_counts();
        assert_eq!(counts[..3], [0, 3, 3], "none ≤ 2 ms, three ≤ 5 ms");
        assert_eq!(counts[LATENCY_BUCKETS.len()], 3, "then all of them");
        assert!(
            metrics.node(node(2)).is_none(),
            "an id no config named has no meters"
        );
    }

    /// The shipped Grafana dashboard queries only series the gateway exports.
    #[test]
    fn every_metric_the_grafana_dashboard_queries_exists() {
        let metrics = Metrics::new();
        metrics.register(node(0), "web1");
        let web1 = metrics.node(node(0)).expect("registered");
        web1.answered(200, Duration::from_millis(1));
        web1.dealt();
        metrics.upstream_error("web1", "unreachable");
        metrics.rejected("max_in_flight");
        let (_, tls_failed) = metrics.listener_counters();
        tls_failed.inc();
        // A gateway with a shared store exports these too.
        metrics.store().applied("bound");
        let now = Snapshot {
            upstreams: vec![UpstreamNow {
                name: "web1".into(),
                node: true,
                up: true,
                state: "active",
                live: 1,
                logged_in: 1,
                slots: SlotsNow::default(),
                share: 1.0,
            }],
            ..Snapshot::default()
        };
        let text = metrics.render(&now);
        let dashboard = include_str!("../../docs/grafana/moodle-gateway.json");
        let mut queried = 0;
        for (at, _) in dashboard.match_indices("moodle_gateway_") {
            let name: String = dashboard[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let family = name.strip_suffix("_bucket").unwrap_or(&name);
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "the dashboard queries {name}, which /metrics does not export"
            );
            queried += 1;
        }
        assert!(queried >= 20, "the dashboard has its panels");
    }

    #[test]
    fn the_sites_share_of_quiz_starts_reads_minus_one_until_it_is_narrowed() {
        let metrics = Metrics::new();
        let sample = |text: &str, name: &str| {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("moodle_gateway_{name} ")));
            line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        let before = metrics.render(&Snapshot::default());
        assert_eq!(sample(&before, "quiz_starts_site_limit"), Some(-1.0));
        assert_eq!(sample(&before, "quiz_turns_calm_seconds"), Some(-1.0));
        let narrowed = crate::cluster::slots::SiteStartsNow {
            limit: Some(1),
            running: 1,
            waiting: 3,
            calm: Some(Duration::from_millis(120)),
        };
        let text = metrics.render(&Snapshot {
            site_starts: narrowed,
            ..Snapshot::default()
        });
        assert_eq!(sample(&text, "quiz_starts_site_limit"), Some(1.0));
        assert_eq!(sample(&text, "quiz_starts_site_waiting"), Some(3.0));
        assert_eq!(sample(&text, "quiz_turns_calm_seconds"), Some(0.12));
    }

    #[test]
    fn the_file_export_is_exported_only_with_offload_and_counts_by_result() {
        let metrics = Metrics::new();
        let without = metrics.render(&Snapshot::default());
        assert!(!without.contains("moodle_gateway_export_"), "{without}");
        metrics.export().fetched(Fetched::Served);
        metrics.export().fetched(Fetched::Unreachable);
        let down = Snapshot {
            export_up: Some(false),
            ..Snapshot::default()
        };
        let text = metrics.render(&down);
        assert!(text.contains("moodle_gateway_export_up 0"), "{text}");
        assert!(text.contains(r#"moodle_gateway_export_files_total{result="served"} 1"#));
        assert!(text.contains(r#"moodle_gateway_export_files_total{result="unreachable"} 1"#));
        assert!(text.contains(r#"moodle_gateway_export_files_total{result="not_found"} 0"#));
        let totals = metrics.export().totals();
        assert_eq!((totals.served, totals.not_found, totals.failed), (1, 0, 1));
    }

    #[test]
    fn gauges_of_a_node_that_left_do_not_linger() {
        let metrics = Metrics::new();
        let web1 = |live| UpstreamNow {
            name: "web1".into(),
            node: true,
            up: true,
            state: "active",
            live,
            logged_in: 1,
            slots: SlotsNow::default(),
            share: 0.25,
        };
        let first = metrics.render(&Snapshot {
            upstreams: vec![web1(3)],
            ..Snapshot::default()
        });
        assert!(first.contains(r#"moodle_gateway_sessions{node="web1",state="anonymous"} 2"#));
        assert!(first
            .contains(r#"moodle_gateway_upstream_admin_state{state="active",upstream="web1"} 1"#));
        assert!(first.contains(r#"moodle_gateway_node_slow_start_share{node="web1"} 0.25"#));
        let later = metrics.render(&Snapshot::default());
        assert!(!later.contains(r#"node="web1""#), "{later}");
    }
}
