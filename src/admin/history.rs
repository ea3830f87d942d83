//! The dashboard's last hour: a point every 10 s per upstream and for the site,
//! taken by a background task from the figures `/metrics` reads, kept in rings of
//! [`POINTS`] points that the page draws (`plots`).
//!
//! Why a task and not the page's own readings (as `rates` does for the cards): a
//! history must have its points when nobody looks, at an even pace, so that the
//! morning's surge is on the page when the admin opens it at noon. The task reads
//! counters the request path already keeps (one relaxed add each) and the figures
//! `/metrics` reads at scrape time; it adds no work to any request.
//!
//! Why bounded this way: each upstream's ring and the site's are allocated full at
//! once, [`POINTS`] points of a few dozen bytes, and an upstream that leaves the
//! config takes its ring with it. The memory depends on the number of upstreams
//! only, never on traffic or on how long the gateway has run.
//!
//! Why a `std` mutex: the task writes once per tick and a page reads it a few times
//! a minute, each for microseconds, never across an `.await`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ring::{grown, quantile, Ring};
use crate::cluster::slots::SlotsNow;
use crate::gateway::Gateway;
use crate::metrics::{LatencyCounts, LATENCY_BUCKETS};
use crate::node_id::NodeId;

/// Points kept per ring: an hour at one every [`EVERY`].
pub const POINTS: usize = 360;
/// How often a point is taken.
pub const EVERY: Duration = Duration::from_secs(10);
/// For tests only, not a setting: a point every this many milliseconds instead of
/// [`EVERY`], so a browser test sees a line drawn within seconds. Not in
/// `config.toml` on purpose: an admin has no reason to change it, and the plots'
/// time axis follows it.
pub const EVERY_ENV: &str = "MOODLE_GATEWAY_HISTORY_EVERY_MS";

/// One upstream at one point. Rates are `None` at its first point (nothing to
/// compare with yet); `p95` also when it answered nothing in between.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct NodePoint {
    /// Response heads per second.
    pub(super) requests: Option<f32>,
    /// Of those, 5xx per second.
    pub(super) errors: Option<f32>,
    /// The 95th percentile of its response time, in seconds.
    pub(super) p95: Option<f32>,
    /// Requests holding a slot (counted under a cap only), and the cap (0: none).
    pub(super) active: u32,
    pub(super) cap: u32,
    /// Requests waiting in the gateway for it, per class.
    pub(super) queued: [u32; 4],
}

/// The site at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct SitePoint {
    /// People holding a place in the waiting room's line.
    pub(super) in_line: u32,
    /// People let in from the line, per minute.
    pub(super) admitted: Option<f32>,
    /// The asset cache's hits over its hits and misses since the last point, 0 to 1;
    /// `None` when no revisioned asset was asked for.
    pub(super) hit_rate: Option<f32>,
}

/// One upstream's ring, under its name.
#[derive(Debug)]
pub(super) struct NodeHistory {
    pub(super) id: NodeId,
    pub(super) name: String,
    pub(super) points: Ring<NodePoint>,
}

/// What the page draws: every ring, and the pace they were taken at.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) every: Duration,
    pub(super) site: Ring<SitePoint>,
    /// In config order, the PHP nodes, then the data server.
    pub(super) nodes: Vec<NodeHistory>,
    last: Option<Reading>,
}

/// What one tick reads: running totals and figures of the moment.
#[derive(Debug, Clone)]
pub(super) struct Reading {
    pub(super) at: Instant,
    pub(super) nodes: Vec<NodeReading>,
    pub(super) admitted: u64,
    pub(super) in_line: usize,
    pub(super) hits: u64,
    pub(super) misses: u64,
}

/// One upstream in a [`Reading`].
#[derive(Debug, Clone)]
pub(super) struct NodeReading {
    pub(super) id: NodeId,
    pub(super) name: String,
    pub(super) requests: u64,
    pub(super) server_errors: u64,
    pub(super) latency: LatencyCounts,
    pub(super) slots: SlotsNow,
}

/// The history, a cheap-clone handle shared by the task and the dashboard.
#[derive(Debug, Clone)]
pub struct History(Arc<Mutex<Recorded>>);

impl Default for History {
    fn default() -> Self {
        Self::new(EVERY)
    }
}

impl History {
    /// An empty history taking a point every `every`.
    pub fn new(every: Duration) -> Self {
        Self(Arc::new(Mutex::new(Recorded {
            every,
            site: Ring::new(POINTS),
            nodes: Vec::new(),
            last: None,
        })))
    }

    /// An empty history at [`EVERY`], or at the pace [`EVERY_ENV`] names (tests).
    pub fn from_env() -> Self {
        Self::new(pace(std::env::var(EVERY_ENV).ok().as_deref()))
    }

    /// How often the task takes a point.
    pub fn every(&self) -> Duration {
        self.lock().every
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads what was recorded, under the lock for as long as `read` takes.
    pub(super) fn read<R>(&self, read: impl FnOnce(&Recorded) -> R) -> R {
        read(&self.lock())
    }

    /// Adds a point to every ring from `now` and the reading before it.
    pub(super) fn record(&self, now: Reading) {
        self.lock().record(now);
    }
}

impl Recorded {
    fn record(&mut self, now: Reading) {
        let last = self.last.take();
        let seconds = last
            .as_ref()
            .map(|l| now.at.saturating_duration_since(l.at));
        let seconds = seconds.map(|s| s.as_secs_f64()).filter(|s| *s > 0.0);
        let mut nodes = Vec::with_capacity(now.nodes.len());
        for node in &now.nodes {
            let at = self.nodes.iter().position(|h| h.id == node.id);
            let mut history = match at {
                Some(at) => self.nodes.swap_remove(at),
                None => NodeHistory {
                    id: node.id,
                    name: node.name.clone(),
                    points: Ring::new(POINTS),
                },
            };
            let before = last
                .as_ref()
                .and_then(|l| l.nodes.iter().find(|n| n.id == node.id));
            history.points.push(node_point(before, node, seconds));
            nodes.push(history);
        }
        // An upstream not read this time left the config: its ring goes with it.
        self.nodes = nodes;
        let site = SitePoint {
            in_line: count(now.in_line),
            admitted: last.as_ref().zip(seconds).map(|(last, seconds)| {
                (grown(last.admitted, now.admitted) as f64 * 60.0 / seconds) as f32
            }),
            hit_rate: last.as_ref().and_then(|last| {
                let hits = grown(last.hits, now.hits);
                let asked = hits + grown(last.misses, now.misses);
                (asked > 0).then(|| (hits as f64 / asked as f64) as f32)
            }),
        };
        self.site.push(site);
        self.last = Some(now);
    }
}

/// `now`'s point, with rates from `before` over `seconds`.
fn node_point(before: Option<&NodeReading>, now: &NodeReading, seconds: Option<f64>) -> NodePoint {
    let before = before.zip(seconds);
    let per_second = |pick: fn(&NodeReading) -> u64| {
        before.map(|(b, s)| (grown(pick(b), pick(now)) as f64 / s) as f32)
    };
    NodePoint {
        requests: per_second(|n| n.requests),
        errors: per_second(|n| n.server_errors),
        p95: before
            .and_then(|(b, _)| quantile(0.95, &LATENCY_BUCKETS, &b.latency, &now.latency))
            .map(|p| p as f32),
        active: count(now.slots.active),
        cap: count(now.slots.cap),
        queued: now.slots.queued.map(count),
    }
}

/// The pace [`EVERY_ENV`]'s value names; [`EVERY`] without one, or with a bad one
/// (said in the log: a typo in a test must not go unnoticed).
fn pace(value: Option<&str>) -> Duration {
    let Some(value) = value else {
        return EVERY;
    };
    match value.trim().parse::<u64>() {
        Ok(millis) if millis >= 10 => Duration::from_millis(millis),
        _ => {
            tracing::warn!(
                "{EVERY_ENV}={value:?} is not a number of milliseconds of at least 10: \
                 a point every 10 s"
            );
            EVERY
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What the gateway's figures are now: every upstream in config order, the room
/// and the asset cache.
pub(super) fn read(gateway: &Gateway, at: Instant) -> Reading {
    let settings = gateway.settings();
    let upstreams = &settings.upstreams;
    let nodes = (upstreams.nodes().iter().chain([upstreams.data()]))
        .map(|upstream| {
            let meters = gateway.metrics().node(upstream.id);
            let totals = meters.map(|m| m.totals()).unwrap_or_default();
            NodeReading {
                id: upstream.id,
                name: upstream.name.clone(),
                requests: totals.requests,
                server_errors: totals.server_errors,
                latency: meters.map(|m| m.latency_counts()).unwrap_or_default(),
                slots: upstream.slots_now(),
            }
        })
        .collect();
    let cache = gateway.asset_cache().now();
    Reading {
        at,
        nodes,
        admitted: gateway.metrics().admitted_total(),
        in_line: gateway.room_now().in_line,
        hits: cache.hits,
        misses: cache.misses,
    }
}

/// Takes a point every [`History::every`] until `stop` changes.
pub async fn run(
    gateway: Arc<Gateway>,
    history: History,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(history.every());
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        history.record(read(&gateway, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_id::node;

    fn web(id: usize, requests: u64, server_errors: u64) -> NodeReading {
        NodeReading {
            id: node(id),
            name: format!("web{}", id + 1),
            requests,
            server_errors,
            latency: [0; LATENCY_BUCKETS.len() + 1],
            slots: SlotsNow::default(),
        }
    }

    fn reading(at: Instant, nodes: Vec<NodeReading>) -> Reading {
        Reading {
            at,
            nodes,
            admitted: 0,
            in_line: 0,
            hits: 0,
            misses: 0,
        }
    }

    fn requests(history: &History, name: &str) -> Vec<Option<f32>> {
        history.read(|r| {
            let node = r.nodes.iter().find(|n| n.name == name).unwrap();
            node.points.iter().map(|p| p.requests).collect()
        })
    }

    #[test]
    fn a_rate_is_the_growth_of_a_counter_over_the_time_between_points() {
        let (history, start) = (History::default(), Instant::now());
        let at = |s| start + Duration::from_secs(s);
        history.record(reading(at(0), vec![web(0, 100, 0)]));
        history.record(reading(at(10), vec![web(0, 150, 5)]));
        history.record(reading(at(20), vec![web(0, 150, 5)]));
        assert_eq!(requests(&history, "web1"), [None, Some(5.0), Some(0.0)]);
        let errors = history.read(|r| {
            r.nodes[0]
                .points
                .iter()
                .map(|p| p.errors)
                .collect::<Vec<_>>()
        });
        assert_eq!(errors, [None, Some(0.5), Some(0.0)]);
    }

    #[test]
    fn a_restarted_counter_counts_from_zero_not_backwards() {
        let (history, start) = (History::default(), Instant::now());
        let at = |s| start + Duration::from_secs(s);
        history.record(reading(at(0), vec![web(0, 1_000, 0)]));
        history.record(reading(at(10), vec![web(0, 30, 0)]));
        assert_eq!(requests(&history, "web1"), [None, Some(3.0)]);
    }

    #[test]
    fn memory_stays_bounded_however_long_it_runs() {
        let (history, start) = (History::default(), Instant::now());
        for tick in 0..(3 * POINTS as u64) {
            let at = start + Duration::from_secs(10 * tick);
            history.record(reading(at, vec![web(0, tick * 10, 0), web(1, 0, 0)]));
        }
        history.read(|r| {
            assert_eq!((r.site.len(), r.site.capacity()), (POINTS, POINTS));
            for node in &r.nodes {
                assert_eq!(
                    (node.points.len(), node.points.capacity()),
                    (POINTS, POINTS)
                );
            }
        });
        let web1 = requests(&history, "web1");
        assert!(
            web1.iter().all(|r| *r == Some(1.0)),
            "the first point is long gone"
        );
    }

    #[test]
    fn a_node_that_joins_starts_its_own_line_and_one_that_leaves_takes_its_ring() {
        let (history, start) = (History::default(), Instant::now());
        let at = |s| start + Duration::from_secs(s);
        history.record(reading(at(0), vec![web(0, 0, 0), web(1, 0, 0)]));
        history.record(reading(at(10), vec![web(0, 10, 0), web(2, 7, 0)]));
        let names = history.read(|r| r.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>());
        assert_eq!(names, ["web1", "web3"], "config order; web2 left");
        assert_eq!(
            requests(&history, "web3"),
            [None],
            "no rate at its first point"
        );
        assert_eq!(history.read(|r| r.site.len()), 2);
    }

    #[test]
    fn the_room_and_the_cache_are_rates_between_points_too() {
        let (history, start) = (History::default(), Instant::now());
        let mut first = reading(start, vec![]);
        (first.admitted, first.hits, first.misses) = (10, 90, 10);
        history.record(first.clone());
        let mut second = first;
        second.at = start + Duration::from_secs(30);
        (second.admitted, second.in_line, second.hits, second.misses) = (25, 4, 120, 20);
        history.record(second);
        let site: Vec<SitePoint> = history.read(|r| r.site.iter().copied().collect());
        assert_eq!(site[0], SitePoint::default());
        assert_eq!(site[1].in_line, 4);
        assert_eq!(site[1].admitted, Some(30.0), "15 in 30 s: 30 a minute");
        assert_eq!(site[1].hit_rate, Some(0.75), "30 hits of 40 asked");
    }

    #[test]
    fn the_p95_comes_from_the_latency_counts_between_points() {
        let (history, start) = (History::default(), Instant::now());
        let before = web(0, 0, 0);
        let mut after = web(0, 20, 0);
        // 20 answers, all in the (0.1, 0.25] bucket: the 19th of 20 is at 95 %.
        after.latency[6..].fill(20);
        history.record(reading(start, vec![before]));
        history.record(reading(start + Duration::from_secs(10), vec![after]));
        let p95 = history
            .read(|r| r.nodes[0].points.last().unwrap().p95)
            .unwrap();
        assert!((p95 - 0.2425).abs() < 1e-6, "{p95}");
    }

    #[test]
    fn an_upstream_s_hour_fits_in_twenty_kilobytes() {
        // The book says "about 17 KB per node": 360 points of 48 bytes.
        let hour = std::mem::size_of::<NodePoint>() * POINTS;
        assert!(hour <= 20 * 1024, "{hour} bytes");
    }

    #[test]
    fn the_test_pace_is_milliseconds_and_a_bad_one_is_ten_seconds() {
        assert_eq!(pace(None), EVERY);
        assert_eq!(pace(Some("250")), Duration::from_millis(250));
        for bad in ["soon", "", "5", "-1"] {
            assert_eq!(pace(Some(bad)), EVERY, "{bad:?}");
        }
    }
}
