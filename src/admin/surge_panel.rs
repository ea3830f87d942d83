//! The dashboard's surge figures (`[surge]` with a cap only): each node card's
//! requests in flight against its cap and its line per class, and the waiting-room
//! panel (open or closed, people in line, expected wait, admitted lately, and the
//! gateway's whole line against `max_waiting`).
//!
//! Why only with a cap: without one nothing waits in the gateway and the room never
//! opens, so every figure would be a 0 on every card; a site that does not use
//! `[surge]` keeps the page it always had. With a cap on some nodes only, a node
//! without one says "no cap" rather than a 0 that looks like an idle node.
//!
//! Every figure is a number or a fixed word: nothing here comes from outside, but
//! the config's own values still go in as numbers and text, escaped like any other
//! (`html`'s `Render`); only the fixed `<small>` notes are markup.

use std::time::Duration;

use super::html::{duration, figure, html, markup, Markup, Raw};
use super::surge::SurgeNow;
use crate::cluster::slots::{Class, SlotsNow};

/// A card's figures for one node's slots: label, `data-figure` key, value.
pub(super) fn card_figures(slots: &SlotsNow) -> Vec<(&'static str, &'static str, Markup)> {
    if slots.cap == 0 {
        return vec![("In flight / cap", "slots", markup!("no cap"))];
    }
    let full = if slots.active >= slots.cap {
        " <small>full</small>"
    } else {
        ""
    };
    let in_flight = markup!(slots.active, " / ", slots.cap, Raw(full));
    let mut figures = vec![("In flight / cap", "slots", in_flight)];
    for class in Class::ALL {
        let (label, key) = match class {
            Class::Working => ("Queued: work in progress", "queued-working"),
            Class::LoggedIn => ("Queued: logged in", "queued-logged-in"),
            Class::Anonymous => ("Queued: anonymous", "queued-anonymous"),
            Class::Newcomer => ("Queued: newcomers", "queued-newcomer"),
        };
        figures.push((label, key, markup!(slots.queued[class.index()])));
    }
    if slots.start_share > 0 {
        let starts = markup!(
            slots.starts_waiting,
            " <small>",
            slots.start_share,
            " at once</small>"
        );
        figures.push(("Quiz starts waiting", "starts-waiting", starts));
    }
    figures
}

/// The waiting-room panel's `<section>`.
pub(super) fn write(out: &mut Markup, surge: &SurgeNow) {
    let (badge, state) = match &surge.room {
        Some(room) if room.open => ("<span class=\"badge open\">open</span>", "open"),
        Some(_) => ("<span class=\"badge\">closed</span>", "closed"),
        None => ("<span class=\"badge\">off</span>", "off"),
    };
    html!(
        out,
        "<section id=\"room\" data-room=\"",
        state,
        "\"><h2>Waiting room",
        Raw(badge),
        "</h2>"
    );
    match &surge.room {
        Some(room) => html!(
            out,
            "<p class=\"why\">It opens while a newcomer joining the nodes' lines could \
             expect to wait over ",
            duration(room.opens_at_ms.as_secs()),
            ": newcomers asking for a page get the waiting page, \
             their place kept in a cookie, and are let in first come, first served as \
             slots free.</p>"
        ),
        None => html!(
            out,
            "<p class=\"why\">Off (<code>[surge] waiting_room = false</code>): newcomers \
             wait in the nodes' lines like everyone else.</p>"
        ),
    }
    html!(out, "<dl class=\"narrow\">");
    if let Some(room) = &surge.room {
        figure(out, "Waiting room", "room", state);
        figure(out, "People in line", "in-line", &room.in_line);
    }
    let wait = expected(surge.expected_wait_ms);
    figure(out, "Expected wait", "expected-wait", &wait);
    if let Some(room) = &surge.room {
        let admitted = room.admitted_last_minute;
        figure(out, "Admitted in the last minute", "admitted", &admitted);
    }
    let waiting = markup!(
        surge.waiting,
        " <small>of at most ",
        surge.max_waiting,
        "</small>"
    );
    figure(out, "Requests waiting for a node", "waiting", &waiting);
    html!(
        out,
        "</dl><p class=\"why\">Over its cap a node's requests wait here, in the gateway: \
         logged-in students first, then anonymous sessions, then newcomers, each in \
         order of arrival, and no class waits for ever behind the others (aging).</p>\
         </section>"
    );
}

/// The expected wait as the panel says it. Zero is nobody ahead of a newcomer
/// (page turns may still wait at nodes' own pools beside low-priority ones).
fn expected(wait: Option<Duration>) -> Markup {
    match wait {
        None => markup!("unknown <small>requests wait and none finished lately</small>"),
        Some(wait) if wait.is_zero() => {
            markup!("none <small>nobody waits ahead of a newcomer</small>")
        }
        Some(wait) if wait < Duration::from_secs(1) => markup!("under 1s"),
        Some(wait) => markup!(duration(wait.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::surge::Room;

    fn surge(room: Option<Room>, expected: Option<Duration>, waiting: usize) -> SurgeNow {
        SurgeNow {
            capped_nodes: 2,
            waiting,
            max_waiting: 10_000,
            expected_wait_ms: expected,
            room,
        }
    }

    fn room(open: bool) -> Room {
        Room {
            open,
            in_line: 3,
            admitted_last_minute: 4,
            opens_at_ms: Duration::from_secs(5),
        }
    }

    fn shown(surge: &SurgeNow) -> String {
        let mut out = Markup::new();
        write(&mut out, surge);
        out.into_string()
    }

    #[test]
    fn an_open_room_shows_its_line_its_wait_and_who_it_let_in() {
        let html = shown(&surge(Some(room(true)), Some(Duration::from_secs(12)), 7));
        assert!(html.contains("data-room=\"open\"><h2>Waiting room<span class=\"badge open\">"));
        for (key, value) in [
            ("room", "open"),
            ("in-line", "3"),
            ("expected-wait", "12s"),
            ("admitted", "4"),
            ("waiting", "7 <small>of at most 10000</small>"),
        ] {
            let figure = format!("data-figure=\"{key}\">{value}</dd>");
            assert!(html.contains(&figure), "{figure} in {html}");
        }
        assert!(html.contains("expect to wait over 5s"));
    }

    #[test]
    fn the_expected_wait_says_when_it_cannot_be_known_or_nobody_waits() {
        let closed = Some(room(false));
        let stuck = shown(&surge(closed, None, 2));
        assert!(stuck.contains("data-room=\"closed\""));
        assert!(stuck.contains("data-figure=\"expected-wait\">unknown <small>"));
        let idle = shown(&surge(Some(room(false)), Some(Duration::ZERO), 0));
        assert!(idle.contains("data-figure=\"expected-wait\">none <small>"));
        // Page turns waiting at nodes' own pools are not ahead of a newcomer.
        let turns_only = shown(&surge(Some(room(false)), Some(Duration::ZERO), 2));
        assert!(turns_only.contains("data-figure=\"expected-wait\">none <small>"));
        let quick = shown(&surge(
            Some(room(false)),
            Some(Duration::from_millis(300)),
            1,
        ));
        assert!(quick.contains("data-figure=\"expected-wait\">under 1s</dd>"));
    }

    #[test]
    fn a_room_turned_off_says_so_and_shows_only_the_line() {
        let html = shown(&surge(None, Some(Duration::ZERO), 0));
        assert!(html.contains("data-room=\"off\"") && html.contains("waiting_room = false"));
        assert!(!html.contains("data-figure=\"in-line\"") && !html.contains("admitted"));
        assert!(html.contains("data-figure=\"waiting\">0 <small>"));
    }

    #[test]
    fn a_capped_card_shows_in_flight_against_its_cap_and_each_class_s_line() {
        let slots = SlotsNow {
            cap: 2,
            active: 2,
            queued: [3, 5, 1, 9],
            passed_over: 0,
            start_share: 1,
            starts_waiting: 40,
        };
        let figures = card_figures(&slots);
        let keys: Vec<_> = figures.iter().map(|f| (f.1, f.2.as_str())).collect();
        assert_eq!(
            keys,
            [
                ("slots", "2 / 2 <small>full</small>"),
                ("queued-working", "3"),
                ("queued-logged-in", "5"),
                ("queued-anonymous", "1"),
                ("queued-newcomer", "9"),
                ("starts-waiting", "40 <small>1 at once</small>"),
            ]
        );
        let uncapped = card_figures(&SlotsNow::default());
        assert_eq!(uncapped.len(), 1);
        assert_eq!((uncapped[0].1, uncapped[0].2.as_str()), ("slots", "no cap"));
    }
}
