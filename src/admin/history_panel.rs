//! The dashboard's "Last hour" section: the history (`history`) drawn as charts
//! (`plot`): per upstream its requests a second, its 5xx a second and its p95
//! response time; with a `[surge]` cap each capped node's requests in flight
//! against its cap, the gateway's line by class and the waiting room; unless it is
//! off, the asset cache's hit rate.
//!
//! Why a line per upstream on one chart rather than a chart per upstream: an
//! admin compares nodes (is web3 slower than the others?), and eight nodes would
//! otherwise be forty charts. Why the line summed over nodes per class: the
//! classes say who waits (students at work, or the crowd), and the in-flight chart
//! already says which node is full.

use super::history::{NodePoint, Recorded, POINTS};
use super::html::{html, Markup};
use super::plot::{self, Chart, Series, Unit};
use crate::cluster::slots::Class;

/// Which optional charts the page has, as its panels do: `capped` with a
/// `[surge]` cap on some node, `room` with its waiting room on, `cache` unless
/// the asset cache is off.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shown {
    pub(super) capped: bool,
    pub(super) room: bool,
    pub(super) cache: bool,
}

/// The section, from what was recorded.
pub(super) fn write(out: &mut Markup, recorded: &Recorded, shown: Shown) {
    let span = recorded.every.saturating_mul(POINTS as u32).as_secs();
    let title = match span {
        3600 => "Last hour".to_owned(),
        s if s % 60 == 0 => format!("Last {} minutes", s / 60),
        s => format!("Last {s} seconds"),
    };
    html!(
        out,
        "<section id=\"history\"><h2>",
        title,
        "</h2><p class=\"why\">A point every ",
        format_args!("{:?}", recorded.every),
        ", kept in memory since the gateway started (a restart begins again).</p>"
    );
    if recorded.site.last().is_none() {
        html!(
            out,
            "<p>The first point is taken within seconds of start.</p></section>"
        );
        return;
    }
    html!(out, "<div class=\"plots\">");
    let per_node = |pick: fn(&NodePoint) -> Option<f32>| -> Vec<Series> {
        let nodes = recorded.nodes.iter();
        nodes
            .map(|node| Series {
                name: node.name.clone(),
                points: node.points.iter().map(|p| pick(p).map(f64::from)).collect(),
                current: None,
            })
            .collect()
    };
    let requests = ("requests", "Requests per second", Unit::PerSecond);
    draw(out, recorded, requests, &per_node(|p| p.requests));
    let errors = ("errors", "5xx answers per second", Unit::PerSecond);
    draw(out, recorded, errors, &per_node(|p| p.errors));
    let p95 = ("p95", "p95 response time", Unit::Millis);
    draw(out, recorded, p95, &per_node(|p| p.p95));
    if shown.capped {
        let slots = ("in-flight", "In flight (against each cap)", Unit::Count);
        let caps = recorded.nodes.iter().filter_map(|n| n.points.last());
        let cap = caps.map(|p| f64::from(p.cap)).fold(0.0, f64::max);
        draw_to(out, recorded, slots, &in_flight(recorded), cap);
        let line = ("queued", "Queued in the gateway, by class", Unit::Count);
        draw(out, recorded, line, &queued(recorded));
    }
    if shown.capped && shown.room {
        draw(
            out,
            recorded,
            ("room", "Waiting room", Unit::Count),
            &room(recorded),
        );
    }
    if shown.cache {
        let hits = recorded.site.iter().map(|p| p.hit_rate.map(f64::from));
        let hits = [Series {
            name: "hit rate".into(),
            points: hits.collect(),
            current: None,
        }];
        let cache = ("cache", "Asset cache hit rate", Unit::Percent);
        draw(out, recorded, cache, &hits);
    }
    html!(out, "</div></section>");
}

/// One chart over the history's time axis: its id, title and unit, its lines.
fn draw(
    out: &mut Markup,
    recorded: &Recorded,
    what: (&'static str, &'static str, Unit),
    series: &[Series],
) {
    draw_to(out, recorded, what, series, 0.0);
}

/// [`draw`], with a value axis that reaches at least `at_least`.
fn draw_to(
    out: &mut Markup,
    recorded: &Recorded,
    (id, title, unit): (&'static str, &'static str, Unit),
    series: &[Series],
    at_least: f64,
) {
    let chart = Chart {
        id,
        title,
        unit,
        slots: recorded.site.capacity(),
        every: recorded.every,
        series,
        at_least,
    };
    plot::write(out, &chart);
}

/// Each capped node's requests holding a slot; its legend says "in flight / cap".
fn in_flight(recorded: &Recorded) -> Vec<Series> {
    let capped = recorded
        .nodes
        .iter()
        .filter(|n| n.points.last().is_some_and(|p| p.cap > 0));
    capped
        .map(|node| {
            let last = node.points.last().copied().unwrap_or_default();
            Series {
                name: node.name.clone(),
                points: node
                    .points
                    .iter()
                    .map(|p| Some(f64::from(p.active)))
                    .collect(),
                current: Some(format!("{} / {}", last.active, last.cap)),
            }
        })
        .collect()
}

/// The requests waiting for a slot, every node's together, one line per class.
fn queued(recorded: &Recorded) -> Vec<Series> {
    let slots = recorded.site.len();
    Class::ALL
        .into_iter()
        .map(|class| {
            let mut sums: Vec<Option<f64>> = vec![None; slots];
            for node in &recorded.nodes {
                // A node's ring ends at the newest point, as the site's does.
                let offset = slots.saturating_sub(node.points.len());
                for (i, point) in node.points.iter().enumerate() {
                    let sum = sums.get_mut(offset + i);
                    let queued = f64::from(point.queued[class.index()]);
                    if let Some(sum) = sum {
                        *sum = Some(sum.unwrap_or(0.0) + queued);
                    }
                }
            }
            let name = match class {
                Class::Working => "work in progress",
                Class::LoggedIn => "logged in",
                Class::Anonymous => "anonymous",
                Class::Newcomer => "newcomers",
            };
            Series {
                name: name.into(),
                points: sums,
                current: None,
            }
        })
        .collect()
}

/// People in the waiting room's line, and those let in a minute.
fn room(recorded: &Recorded) -> Vec<Series> {
    let site = &recorded.site;
    let admitted = site.last().and_then(|p| p.admitted);
    vec![
        Series {
            name: "in line".into(),
            points: site.iter().map(|p| Some(f64::from(p.in_line))).collect(),
            current: None,
        },
        Series {
            name: "let in a minute".into(),
            points: site.iter().map(|p| p.admitted.map(f64::from)).collect(),
            current: Some(admitted.map_or("–".into(), |a| format!("{a:.0}/min"))),
        },
    ]
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::history::{History, NodeReading, Reading};
    use super::*;
    use crate::cluster::slots::SlotsNow;
    use crate::metrics::LATENCY_BUCKETS;
    use crate::node_id::node;

    fn reading(at: Instant, nodes: &[(&str, u64, SlotsNow)]) -> Reading {
        let nodes = nodes
            .iter()
            .enumerate()
            .map(|(i, (name, requests, slots))| NodeReading {
                id: node(i),
                name: (*name).into(),
                requests: *requests,
                server_errors: 0,
                latency: [0; LATENCY_BUCKETS.len() + 1],
                slots: *slots,
            });
        Reading {
            at,
            nodes: nodes.collect(),
            admitted: 0,
            in_line: 0,
            hits: 0,
            misses: 0,
        }
    }

    fn page(history: &History, shown: Shown) -> Markup {
        let mut out = Markup::new();
        history.read(|r| write(&mut out, r, shown));
        out
    }

    #[test]
    fn before_the_first_point_the_section_says_so() {
        let out = page(&History::default(), Shown::default());
        assert!(out.contains("<h2>Last hour</h2>"));
        assert!(out.contains("first point"));
        assert!(!out.contains("<figure"));
    }

    #[test]
    fn every_node_has_a_line_and_its_current_rate_on_each_chart() {
        let (history, start) = (History::default(), Instant::now());
        let nodes = |n| {
            [
                ("web1", n, SlotsNow::default()),
                ("<b>web2</b>", 2 * n, SlotsNow::default()),
            ]
        };
        history.record(reading(start, &nodes(0)));
        history.record(reading(start + Duration::from_secs(10), &nodes(50)));
        let out = page(&history, Shown::default());
        for id in ["requests", "errors", "p95"] {
            assert!(out.contains(&format!("id=\"plot-{id}\"")), "{id}");
        }
        assert!(!out.contains("plot-in-flight"), "no cap: no slots drawn");
        assert!(!out.contains("plot-cache"), "the cache is off");
        assert!(
            out.contains("<b data-current=\"web1\">5/s</b>"),
            "{}",
            &*out
        );
        assert!(out.contains(
            "&lt;b&gt;web2&lt;/b&gt; <b data-current=\"&lt;b&gt;web2&lt;/b&gt;\">10/s</b>"
        ));
    }

    #[test]
    fn with_a_cap_the_slots_and_the_line_by_class_are_drawn() {
        let (history, start) = (History::default(), Instant::now());
        let busy = SlotsNow {
            cap: 8,
            active: 8,
            queued: [1, 2, 0, 5],
            ..SlotsNow::default()
        };
        let free = SlotsNow::default();
        history.record(reading(start, &[("web1", 0, busy), ("web2", 0, free)]));
        history.record(reading(
            start + Duration::from_secs(10),
            &[("web1", 0, busy), ("web2", 0, busy)],
        ));
        let shown = Shown {
            capped: true,
            room: true,
            cache: true,
        };
        let out = page(&history, shown);
        assert!(out.contains("<b data-current=\"web1\">8 / 8</b>"));
        assert!(
            out.contains("<b data-current=\"newcomers\">10</b>"),
            "5 at each node"
        );
        assert!(out.contains("id=\"plot-room\""));
        assert!(out.contains("id=\"plot-cache\""));
    }
}
