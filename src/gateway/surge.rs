//! A request's wait for its node's slot under `[surge] max_active`: which class it
//! is in, how patient it is, and what happens when its node goes while it waits.
//!
//! Why here and not in `cluster::slots`: the class comes from the session (the
//! table's logged-in mark), and a node that goes down while a bound request waits
//! for it must follow the failover rule of that session (hold for a node-local
//! session, move a shared one), which only the gateway knows. A busy node is never
//! a reason to move: a bound request waits for its own node, however long its line.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use http::Request;

use super::first_pages::{FirstPages, StartTurn};
use super::turns::{NoTurn, Turn};
use super::waiting_room::{self, Entry};
use super::{Gateway, Hold, Known, Route, Settings};
use crate::cluster::slots::{Ask, Class, Ended, Permit, Slots};
use crate::cluster::upstreams::Upstream;
use crate::config::SurgeConfig;
use crate::error::GatewayError;
use crate::logs::Every;
use crate::moodle::Work;
use crate::sessions::affinity::{SessionKey, SessionState};
use crate::store::Leased;

/// How often a waiting request looks whether its node can still serve it.
const LOOK_AGAIN: Duration = Duration::from_millis(250);

/// Requests turned away by the line are logged at most once every ten seconds:
/// under a surge there may be thousands, and `/metrics` counts each.
static TURNED_AWAY: Every = Every::new(Duration::from_secs(10));

/// The class of a request by the session it carries and, for a logged-in student,
/// by what the request is in the middle of: a session recovered from its route
/// cookie counts as logged in, the safe side (as the table records it).
pub(super) fn class_of(known: Option<Known>, work: Work) -> Class {
    match known.map(|k| k.state) {
        Some(SessionState::LoggedIn) => match work {
            // A start has its own pace, at its node's gate (see `admission`); once
            // through, nothing may hold it up: its student's timer starts with it.
            Work::InProgress | Work::QuizStart => Class::Working,
            Work::New => Class::LoggedIn,
        },
        Some(_) => Class::Anonymous,
        None => Class::Newcomer,
    }
}

/// What a request arriving at `arrived` asks of its node's line.
pub(super) fn ask(surge: &SurgeConfig, class: Class, is_post: bool, arrived: Instant) -> Ask {
    let patience = match class {
        // A logged-in student's POST is the work that must not be lost.
        Class::Working | Class::LoggedIn if is_post => surge.post_patience,
        Class::Working | Class::LoggedIn => surge.patience,
        Class::Anonymous => surge.anonymous_patience,
        Class::Newcomer => surge.newcomer_patience,
    };
    Ask {
        class,
        arrived,
        aging: surge.aging,
        patience,
    }
}

/// What a request holds before it asks for its node's slot, given back with its
/// node's answer head: its session's turn (`[surge] session_max_active`) and, for
/// a quiz start and then its attempt's first page, the start's turn (`[surge]
/// quiz_starts` and the site's share), which a start whose answer opens its
/// attempt keeps for that page instead (`keep_for_first_page`).
pub(super) struct Admission<'a> {
    _turn: Option<Turn<'a>>,
    start: Option<StartTurn>,
    /// Whether its node has a cap, so that starts are paced there.
    capped: bool,
}

impl Admission<'_> {
    /// After a start whose answer opens its attempt: the start's turn is kept
    /// for the attempt's first page (see `first_pages`); the session's turn goes
    /// back now.
    pub(super) fn keep_for_first_page(self, first_pages: &FirstPages, key: SessionKey) {
        if let Some(turn) = self.start.filter(|t| t.permit.holds_a_turn()) {
            first_pages.keep(key, turn);
        }
    }

    /// Whether the request, work in progress, is a page turn the site's share
    /// of starts is paced by: on a capped node, and not a start's own work (a
    /// start, or the first page its turn was kept for).
    pub(super) fn is_a_paced_turn(&self, in_progress: bool) -> bool {
        in_progress && self.capped && self.start.is_none()
    }
}

impl Gateway {
    /// The turns a request waits for before its node's line, on a capped node
    /// only: its session's (a request on its session's node), then (a quiz start)
    /// the node's start gate, the site's share of starts and, with Redis, the
    /// node's lease. A start that waited at any of them stands in the line from
    /// the moment it passed: the gates were its wait, and students already
    /// answering go first. An attempt's page (`attempt_page`) takes the turn its
    /// start kept for it, if one is kept: it never waits at the gate; so does a
    /// second start of the same session.
    pub(super) async fn admission(
        &self,
        route: Route,
        known: Option<Known>,
        (work, attempt_page): (Work, bool),
        ask: &mut Ask,
        settings: &Settings,
    ) -> Result<Admission<'_>, GatewayError> {
        let mut admission = Admission {
            _turn: None,
            start: None,
            capped: false,
        };
        let Some(upstream) = settings.upstream(route).filter(|u| u.slots.cap() > 0) else {
            return Ok(admission);
        };
        admission.capped = true;
        let max = settings.surge.session_max_active;
        // Only a request on its session's own node reads the session and waits for
        // its lock; a sessionless asset (theme, JavaScript) does not.
        let in_session = matches!(route, Route::Sticky(_) | Route::Moved(_));
        if let Some(known) = known.filter(|_| max > 0 && in_session) {
            let turn = (self.turns).take(known.key, max, ask.patience).await;
            let turn = turn.map_err(|no| {
                let ended = match no {
                    NoTurn::TooMany => Ended::Full,
                    NoTurn::Timeout => Ended::Timeout,
                };
                self.turned_away(upstream, ask.class, ended)
            })?;
            if turn.waited {
                self.metrics.session_waited();
            }
            admission._turn = Some(turn);
        }
        // The turn a start of this session kept: its first page's, or a second
        // start's (a double click, a second tab), which would otherwise wait at the
        // gate behind it while its student's timer runs.
        let kept = known
            .filter(|_| attempt_page || work == Work::QuizStart)
            .and_then(|k| self.first_pages.take(k.key));
        if let Some(kept) = kept {
            admission.start = Some(kept);
            if attempt_page {
                self.metrics.first_page_took_its_start();
            }
        } else if work == Work::QuizStart {
            // A start is new work: its gate is the pool's it runs on.
            let starts = upstream.new_work_slots().starts();
            let asked = Instant::now();
            let patience = settings.surge.post_patience;
            let start = starts.enter(patience).await;
            let permit = start.map_err(|ended| self.turned_away(upstream, ask.class, ended))?;
            let mut waited = permit.waited;
            let deadline = asked + patience;
            let mut turn = StartTurn {
                permit,
                lease: None,
                site: None,
            };
            if turn.permit.holds_a_turn() {
                // Then the site's share of starts at once, which narrows while the
                // students at work slow down (`cluster::slots::site_starts`).
                let yield_at = settings.surge.quiz_starts_yield_at;
                let site = self.site_starts.enter(yield_at, asked, patience).await;
                let site = site.map_err(|ended| self.turned_away(upstream, ask.class, ended))?;
                waited |= site.waited;
                turn.site = Some(site);
            }
            // Then, with several gateways, the node's lease: its `quiz_starts`
            // counts every gateway's starts. Taken last, so that a start held
            // at this gateway's share keeps no other gateway's start waiting.
            if turn.permit.holds_a_turn() && starts.share() > 0 {
                let lease = (self.store).start_lease(&upstream.name, starts.share(), deadline);
                match lease.await {
                    Leased::Held(lease) => {
                        waited |= lease.waited;
                        turn.lease = Some(lease);
                    }
                    Leased::Alone => {}
                    Leased::TimedOut => {
                        return Err(self.turned_away(upstream, ask.class, Ended::Timeout))
                    }
                }
            }
            admission.start = Some(turn);
            self.metrics.quiz_start_waited(asked.elapsed());
            if waited {
                ask.arrived = Instant::now();
            }
        }
        Ok(admission)
    }

    /// The waiting room's word on a newcomer's request: held only when the room is
    /// on, some node taking newcomers has a cap, and it is a page view.
    pub(super) fn waiting_room<B>(
        &self,
        request: &Request<B>,
        secure: bool,
        settings: &Settings,
    ) -> Entry {
        let Some(room) = &settings.surge.waiting_room else {
            return Entry::Go(None);
        };
        let upstreams = &settings.upstreams;
        let capacity: usize = (upstreams.nodes().iter())
            .filter(|n| n.takes_new())
            .map(|n| n.new_work_slots().cap())
            .sum();
        if capacity == 0 || !waiting_room::is_page_view(request) {
            return Entry::Go(None);
        }
        let cookie = (self.site.cookie_path(), secure);
        let load = upstreams.load();
        let headers = request.headers();
        (self.room).enter(headers, room, load, capacity, cookie, &self.metrics)
    }

    /// A slot on the route's node, of its low-priority pool when `low_priority`
    /// and it has one, waiting in that pool's line when it is at its cap; the
    /// route may change only if the node stops serving the request meanwhile (see
    /// [`rerouted`](Self::rerouted)). Returns the route, the slot and how long it
    /// waited (`None` on a node without a cap).
    pub(super) async fn slot(
        &self,
        mut route: Route,
        known: Option<Known>,
        mut ask: Ask,
        low_priority: bool,
        hold: &mut Option<Hold>,
        settings: &Settings,
    ) -> Result<(Route, Permit, Option<Duration>), GatewayError> {
        // The clock is read, and the timer set, only for a request that has to wait:
        // most find a slot free at once, and a precise read costs some 34 ns.
        let mut timing: Option<(Instant, Instant)> = None;
        let mut made_room = false;
        loop {
            let upstream = settings
                .upstream(route)
                .ok_or(GatewayError::NoNodeAvailable)?;
            let slots = upstream.slots_for(low_priority);
            if slots.cap() == 0 {
                // No cap, no line: no timer, no lock, nothing to wait for.
                return match slots.acquire(ask).await {
                    Ok(permit) => Ok((route, permit, None)),
                    // A reload put a cap on the node in this very instant.
                    Err(ended) => Err(self.turned_away(upstream, ask.class, ended)),
                };
            }
            let got = match slots.try_acquire() {
                Some(permit) => Ok(permit),
                None => {
                    let now = Instant::now();
                    let (_, deadline) = *timing.get_or_insert((now, now + ask.patience));
                    ask.patience = deadline.saturating_duration_since(now);
                    tokio::select! {
                        // First, so that a slot freed meanwhile starts no timer.
                        biased;
                        got = slots.acquire(ask) => got,
                        () = unable(upstream, slots, route) => {
                            route = self.rerouted(route, known, hold, settings).await?;
                            continue;
                        }
                    }
                }
            };
            let waited = timing.map_or(Duration::ZERO, |(started, _)| started.elapsed());
            return match got {
                Ok(permit) => {
                    self.metrics.waited(ask.class, waited);
                    settings.upstreams.crowd().served(ask.class);
                    if ask.class == Class::Newcomer {
                        settings.upstreams.crowd().newcomer_waited(waited);
                    }
                    Ok((route, permit, Some(waited)))
                }
                // The gateway's line is full, and this request's pool line had
                // nobody below it to displace: the node's other pool may.
                Err(Ended::Full) if !made_room && give_way(upstream, low_priority, ask.class) => {
                    made_room = true;
                    continue;
                }
                Err(ended) => Err(self.turned_away(upstream, ask.class, ended)),
            };
        }
    }

    /// Where a waiting request goes when its node can no longer serve it: a bound
    /// session by the failover rule (held for a node-local store, moved for a
    /// shared one), a new visitor or a sessionless asset to the next node.
    async fn rerouted(
        &self,
        route: Route,
        known: Option<Known>,
        hold: &mut Option<Hold>,
        settings: &Settings,
    ) -> Result<Route, GatewayError> {
        let rerouted = match route {
            Route::Sticky(node) | Route::Moved(node) => match known {
                Some(known) => return self.sticky(Known { node, ..known }, hold, settings).await,
                None => None,
            },
            Route::Deal(node) => self.deal(settings, Some(node)).map(Route::Deal),
            Route::Spread(node) => settings.upstreams.spread(Some(node)).map(Route::Spread),
            Route::Data => Some(Route::Data),
        };
        rerouted.ok_or(GatewayError::NoNodeAvailable)
    }

    /// The end of a wait that got no slot: counted, logged now and then, a 503.
    fn turned_away(&self, upstream: &Upstream, class: Class, ended: Ended) -> GatewayError {
        let (error, why) = match ended {
            Ended::Full => (
                GatewayError::LineFull,
                "the line is full (surge.max_waiting)",
            ),
            Ended::Timeout => (GatewayError::WaitedTooLong, "it waited its patience"),
        };
        self.metrics.turned_away(class, error.kind());
        if let Some(held_back) = TURNED_AWAY.allow() {
            tracing::warn!(
                node = %upstream.name,
                class = class.as_str(),
                held_back,
                "a request waiting for a node slot was turned away: {why}"
            );
        }
        error
    }
}

/// Room made in the node's other pool's line for a request of `class` that found
/// the gateway's line full (see [`Slots::give_way`]).
fn give_way(upstream: &Upstream, low_priority: bool, class: Class) -> bool {
    let other = upstream.slots_for(!low_priority);
    !Arc::ptr_eq(other, upstream.slots_for(low_priority)) && other.give_way(class)
}

/// Resolves once `upstream` can no longer serve a request on `route`: down, or
/// disabled (a bound session), or no longer taking new ones (a new visitor or an
/// asset). Pending for ever on a pool without a cap (its `slots`), where nobody waits.
async fn unable(upstream: &Upstream, slots: &Slots, route: Route) {
    if slots.cap() == 0 {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(LOOK_AGAIN).await;
        let serves = match route {
            Route::Sticky(_) | Route::Moved(_) => upstream.keeps_sessions(),
            Route::Deal(_) | Route::Spread(_) => upstream.takes_new(),
            Route::Data => true,
        };
        if !serves || !upstream.health.is_up() {
            return;
        }
    }
}
