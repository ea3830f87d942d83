//! The surge's figures: how long each class waited for a node slot, who was turned
//! away and why, the waiting room's pages and admissions; and, read at scrape
//! time, each node's slots and line and the room's state.

use std::time::Duration;

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use super::{add, counter, counters, gauge, gauge_value, gauges};
use crate::cluster::slots::{Class, SiteStartsNow, SlotsNow};

/// Queue wait buckets, seconds: a free slot costs nothing, a surge seconds, the
/// longest patience minutes.
const WAIT_BUCKETS: [f64; 13] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The waiting room at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoomNow {
    /// Newcomers are being shown the waiting page.
    pub open: bool,
    /// Visitors in line (seen lately).
    pub in_line: usize,
    /// The wait a newcomer joining the nodes' lines now can expect; `None` while
    /// requests wait and none finished lately.
    pub expected_wait: Option<Duration>,
    /// Visitors let in from the line in the last minute.
    pub admitted_last_minute: u64,
}

/// The handles, made once.
#[derive(Debug, Clone)]
pub(super) struct SurgeMeters {
    waits: [Histogram; 4],
    start_waits: Histogram,
    session_waits: IntCounter,
    first_pages: IntCounter,
    starts_waiting: IntGaugeVec,
    turned_away: IntCounterVec,
    waiting_pages: IntCounter,
    admitted: IntCounter,
    openings: IntCounter,
    active: IntGaugeVec,
    cap: IntGaugeVec,
    queued: IntGaugeVec,
    passed_over: IntCounterVec,
    room_open: IntGauge,
    room_line: IntGauge,
    room_wait: Gauge,
    site_starts_limit: IntGauge,
    site_starts_waiting: IntGauge,
    turns_calm: Gauge,
}

impl SurgeMeters {
    pub(super) fn new(registry: &Registry) -> Self {
        let waits = HistogramOpts::new(
            "queue_wait_seconds",
            "Time a request waited in the gateway for a slot on its node (surge.max_active), by class.",
        )
        .buckets(WAIT_BUCKETS.to_vec());
        let waits = add(registry, HistogramVec::new(waits, &["class"]));
        let turned_away = counters(
            registry,
            "queue_turned_away_total",
            "Requests that got no node slot: the line was full or they waited their patience.",
            &["class", "reason"],
        );
        for class in Class::ALL {
            for reason in ["line_full", "waited_too_long"] {
                turned_away.with_label_values(&[class.as_str(), reason]);
            }
        }
        let room_wait = Gauge::with_opts(Opts::new(
            "waiting_room_expected_wait_seconds",
            "The wait a newcomer joining the nodes' lines now can expect (-1: requests wait and none finished lately).",
        ));
        let start_waits = HistogramOpts::new(
            "quiz_start_wait_seconds",
            "Time a quiz start (startattempt.php) waited at its node's gate (surge.quiz_starts), the site's share (surge.quiz_starts_yield_at) and, with Redis, the node's lease.",
        )
        .buckets(WAIT_BUCKETS.to_vec());
        let turns_calm = Gauge::with_opts(Opts::new(
            "quiz_turns_calm_seconds",
            "Students' page turns' median time while no quiz start runs, smoothed: what the site's quiz starts give way by (-1: not seen yet).",
        ));
        Self {
            site_starts_limit: gauge(
                registry,
                "quiz_starts_site_limit",
                "Quiz starts allowed at once across the site by the page turns (surge.quiz_starts_yield_at; 1 at rest, where a wave begins; -1: as many as the nodes' gates let through).",
            ),
            site_starts_waiting: gauge(
                registry,
                "quiz_starts_site_waiting",
                "Quiz starts past their node's gate waiting for the site's share (surge.quiz_starts_yield_at).",
            ),
            turns_calm: add(registry, turns_calm),
            waits: Class::ALL.map(|c| waits.with_label_values(&[c.as_str()])),
            start_waits: add(registry, Histogram::with_opts(start_waits)),
            session_waits: counter(
                registry,
                "session_turn_waits_total",
                "Requests that waited for another request of their own session (surge.session_max_active).",
            ),
            first_pages: counter(
                registry,
                "quiz_first_pages_total",
                "Quiz attempts' first pages that took their start's place at its node's gate (surge.quiz_starts).",
            ),
            starts_waiting: gauges(
                registry,
                "quiz_starts_waiting",
                "Quiz starts waiting at each node's gate (surge.quiz_starts).",
                &["node"],
            ),
            turned_away,
            waiting_pages: counter(
                registry,
                "waiting_room_pages_total",
                "Waiting pages served to newcomers instead of a node's page.",
            ),
            admitted: counter(
                registry,
                "waiting_room_admitted_total",
                "Visitors let in from the waiting room's line.",
            ),
            openings: counter(
                registry,
                "waiting_room_openings_total",
                "Times the waiting room opened.",
            ),
            active: gauges(
                registry,
                "node_active",
                "Requests holding a slot on each capped node.",
                &["node"],
            ),
            cap: gauges(
                registry,
                "node_max_active",
                "Each node's cap (surge.max_active, once per PHP pool of the node; 0: none).",
                &["node"],
            ),
            queued: gauges(
                registry,
                "queue_length",
                "Requests waiting in the gateway for a slot on each node, by class.",
                &["node", "class"],
            ),
            passed_over: counters(
                registry,
                "deal_passed_over_total",
                "New sessions the deal gave another node because this node's line was long.",
                &["node"],
            ),
            room_open: gauge(
                registry,
                "waiting_room_open",
                "1 while newcomers are shown the waiting page.",
            ),
            room_line: gauge(
                registry,
                "waiting_room_line",
                "Visitors in the waiting room's line.",
            ),
            room_wait: add(registry, room_wait),
        }
    }

    pub(super) fn waited(&self, class: Class, waited: Duration) {
        self.waits[class.index()].observe(waited.as_secs_f64());
    }

    pub(super) fn quiz_start_waited(&self, waited: Duration) {
        self.start_waits.observe(waited.as_secs_f64());
    }

    pub(super) fn first_page_took_its_start(&self) {
        self.first_pages.inc();
    }

    pub(super) fn session_waited(&self) {
        self.session_waits.inc();
    }

    pub(super) fn turned_away(&self, class: Class, reason: &str) {
        (self.turned_away)
            .with_label_values(&[class.as_str(), reason])
            .inc();
    }

    pub(super) fn waiting_page(&self) {
        self.waiting_pages.inc();
    }

    pub(super) fn admitted(&self) {
        self.admitted.inc();
    }

    pub(super) fn admitted_total(&self) -> u64 {
        self.admitted.get()
    }

    pub(super) fn opened(&self) {
        self.openings.inc();
    }

    /// Clears the per-node figures (a node that left must not linger). The
    /// passed-over count is set again from the node's own monotonic counter, so it
    /// still reads as a counter.
    pub(super) fn reset(&self) {
        self.active.reset();
        self.cap.reset();
        self.queued.reset();
        self.starts_waiting.reset();
        self.passed_over.reset();
    }

    /// Sets one node's gauges from its slots.
    pub(super) fn node(&self, name: &str, slots: &SlotsNow) {
        self.active
            .with_label_values(&[name])
            .set(gauge_value(slots.active as u64));
        self.cap
            .with_label_values(&[name])
            .set(gauge_value(slots.cap as u64));
        for class in Class::ALL {
            let queued = slots.queued[class.index()] as u64;
            (self.queued.with_label_values(&[name, class.as_str()])).set(gauge_value(queued));
        }
        (self.passed_over.with_label_values(&[name])).inc_by(slots.passed_over);
        (self.starts_waiting.with_label_values(&[name]))
            .set(gauge_value(slots.starts_waiting as u64));
    }

    /// Sets the site's share of starts.
    pub(super) fn site_starts(&self, now: &SiteStartsNow) {
        let limit = now.limit.map_or(-1, |l| gauge_value(l as u64));
        self.site_starts_limit.set(limit);
        self.site_starts_waiting
            .set(gauge_value(now.waiting as u64));
        self.turns_calm
            .set(now.calm.map_or(-1.0, |c| c.as_secs_f64()));
    }

    /// Sets the room's gauges.
    pub(super) fn room(&self, room: &RoomNow) {
        self.room_open.set(i64::from(room.open));
        self.room_line.set(gauge_value(room.in_line as u64));
        let wait = room.expected_wait.map_or(-1.0, |w| w.as_secs_f64());
        self.room_wait.set(wait);
    }
}
