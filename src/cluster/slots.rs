//! Each node's slots: at most `max_active` requests inside a node's PHP at once, the
//! rest waiting here, in the gateway, in an order that knows who is asking.
//!
//! Why the gateway queues instead of PHP: PHP-FPM's listen queue and Apache's accept
//! queue are first come, first served and blind, so on exam day a logged-in
//! student's quiz autosave waits behind hundreds of newcomers' login pages. Held
//! here, the next request a freed slot goes to is chosen by [`Class`] first, then by
//! arrival.
//!
//! The order (why students are never outranked, and nobody starves): the classes
//! stand in two tiers. Students (a logged-in session: work in progress, then other
//! pages) always go before the crowd (sessions that have not logged in, then
//! newcomers), however long the crowd has waited: a student who waits behind the
//! crowd is a student whose exam stalls, and a crowd of any size would otherwise
//! outrank them once it had waited long enough. The crowd cannot starve for long,
//! because students are people who read before they click: their own requests
//! cannot fill the nodes for ever, and while they do, the waiting room holds the
//! crowd on its page rather than in this line. Within a tier the aging rule keeps
//! either class from starving the other: a waiter's place is its arrival, plus one
//! `aging` for the tier's second class (other pages behind work in progress,
//! newcomers behind sessions on their way to log in). The smallest place goes first.
//!
//! Why a mutex: a slot is handed from the request that frees it straight to the
//! first waiter, and "is anyone waiting, else give the slot back" must be one step,
//! or a slot could be freed while a waiter sleeps. One short lock per request and
//! node, uncontended but under a surge; a node without a cap takes no lock at all.
//!
//! A slot is held from before the request is sent until the node's response has
//! been read to its end or dropped (the PHP worker is busy until then), which the
//! [`Held`](crate::http::upstream::pool::Held) in the node's body does. It knows nothing of
//! sessions or HTTP: the gateway says which class a request is in.
//!
//! Quiz starts have a gate of their own in front of the line ([`Starts`]): a share
//! of the node's slots that starts may hold at once, the rest of them waiting in
//! the order they came. See `starts`.

mod site_starts;
mod starts;

pub use site_starts::{SitePermit, SiteStarts, SiteStartsNow};
pub use starts::{StartPermit, Starts};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::http::upstream::pool::Held;

/// Who is asking, in the order a freed slot goes to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// A logged-in student in the middle of work: an open quiz attempt's pages,
    /// autosave and finish, SCORM tracking, any other write.
    Working,
    /// A logged-in student's other requests: a course page, the dashboard.
    LoggedIn,
    /// A session the nodes issued that has not logged in: the login form, the login
    /// POST of someone already let in.
    Anonymous,
    /// No session the gateway knows: a first visit.
    Newcomer,
}

impl Class {
    /// Every class, first to last.
    pub const ALL: [Class; 4] = [
        Class::Working,
        Class::LoggedIn,
        Class::Anonymous,
        Class::Newcomer,
    ];

    /// The label in `/metrics`, the dashboard and the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Working => "working",
            Class::LoggedIn => "logged_in",
            Class::Anonymous => "anonymous",
            Class::Newcomer => "newcomer",
        }
    }

    /// Its position in [`ALL`](Self::ALL).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether it belongs to the students' tier, which the crowd never outranks.
    pub fn is_student(self) -> bool {
        matches!(self, Class::Working | Class::LoggedIn)
    }

    /// Its tier: 0 for students, 1 for the crowd.
    fn tier(self) -> u8 {
        u8::from(!self.is_student())
    }

    /// How far back in line its requests stand within their tier: one `aging` for
    /// the tier's second class.
    fn handicap(self, aging: Duration) -> Duration {
        match self {
            Class::Working | Class::Anonymous => Duration::ZERO,
            Class::LoggedIn | Class::Newcomer => aging,
        }
    }
}

/// What one request asks of its node's slots.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// Its class.
    pub class: Class,
    /// When it arrived, for its place in line: the request's own arrival, or a
    /// waiting-room visitor's first arrival, so an admitted visitor keeps its turn.
    pub arrived: Instant,
    /// The step of the aging rule within a tier.
    pub aging: Duration,
    /// The longest it waits, from now.
    pub patience: Duration,
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `max_waiting` requests were waiting already, none of a lower class.
    Full,
    /// It waited its class's patience.
    Timeout,
}

/// What every node's line shares: the bound on waiters across the gateway, and the
/// pace slots free at, which the waiting room's estimate reads.
#[derive(Debug)]
pub struct Crowd {
    max_waiting: AtomicUsize,
    waiting: AtomicUsize,
    /// Newcomers among `waiting`: each brings a login's worth of requests after it.
    newcomers: AtomicUsize,
    /// Capped slots handed back since the start (a finished request).
    freed: AtomicU64,
    /// Slots given since the start, per [`Class`].
    served: [AtomicU64; 4],
    pace: Mutex<Pace>,
}

/// The recent pace slots free at, sampled at most once a second, and how long
/// newcomers have lately waited.
#[derive(Debug)]
struct Pace {
    at: Instant,
    freed: u64,
    /// Slots freed per second, smoothed.
    per_second: f64,
    /// Whether requests waited in the newcomers' line at the last sample.
    waited: bool,
    /// `served` at the last sample.
    served: [u64; 4],
    /// Requests of the crowd per newcomer's first request, smoothed: how many
    /// requests a newcomer makes before logging in.
    per_newcomer: f64,
    /// Newcomers' waits for a slot, smoothed, and when the last one got its slot.
    newcomers: Option<(Duration, Instant)>,
}

/// A newcomers' wait older than this says nothing about now.
const NEWCOMERS_FORGOTTEN: Duration = Duration::from_secs(5);

/// How much of the last pace a new sample replaces: a few seconds' memory.
const PACE_WEIGHT: f64 = 0.5;

/// A pace below this (one slot freed in 100 s) is no pace: nothing finishes. The
/// smoothing halves the pace every second in which nothing is freed while someone
/// waits, so without a floor a minute of a stuck node leaves a pace of 10⁻²⁰, and
/// the work ahead over it a wait no `Duration` holds.
const PACE_FLOOR: f64 = 0.01;

/// Requests a newcomer makes before logging in, until the crowd has shown its own
/// figure: the login page, the login POST, its redirect, the first page.
const LOGIN_REQUESTS: f64 = 4.0;

/// Bounds on the measured figure: a guest who reads pages without logging in makes
/// many, a crawler one.
const PER_NEWCOMER: std::ops::RangeInclusive<f64> = 1.0..=16.0;

impl Crowd {
    /// A crowd that lets at most `max_waiting` requests wait.
    pub fn new(max_waiting: usize) -> Self {
        Self {
            max_waiting: AtomicUsize::new(max_waiting),
            waiting: AtomicUsize::new(0),
            newcomers: AtomicUsize::new(0),
            freed: AtomicU64::new(0),
            served: Default::default(),
            pace: Mutex::new(Pace {
                at: Instant::now(),
                freed: 0,
                per_second: 0.0,
                waited: false,
                served: [0; 4],
                per_newcomer: LOGIN_REQUESTS,
                newcomers: None,
            }),
        }
    }

    /// Applies a reloaded `max_waiting`; those already waiting stay.
    pub fn set_max_waiting(&self, max: usize) {
        self.max_waiting.store(max, Ordering::Relaxed);
    }

    /// Requests waiting for a slot now, every node's.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Counts a slot given to a request of `class` (at once or after a wait).
    pub fn served(&self, class: Class) {
        self.served[class.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The pace, sampled anew when the last sample is a second old, with `waiting`
    /// requests in the newcomers' line now; the lock held.
    ///
    /// Only a second in which requests waited throughout (at this sample and the
    /// one before) measures how fast the pools go. In any other the slots freed
    /// are the work that came, a floor under the pace: it may raise the pace,
    /// never lower it. Let quiet seconds lower it, a morning of a few logins left
    /// next to no pace by the time a class came, and the first newcomers to wait
    /// read as stuck nodes: the waiting room opened for them. A wait in which
    /// nothing is freed lowers the pace from its second sample on, and a stuck
    /// node fades it to none as before, a second later than it used to.
    fn sampled(&self, waiting: usize) -> MutexGuard<'_, Pace> {
        let mut pace = self.pace.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.duration_since(pace.at).as_secs_f64();
        if elapsed >= 1.0 {
            let freed = self.freed.load(Ordering::Relaxed);
            let sample = (freed - pace.freed) as f64 / elapsed;
            let smoothed = match pace.per_second {
                0.0 => sample,
                last => last * (1.0 - PACE_WEIGHT) + sample * PACE_WEIGHT,
            };
            let measured = waiting > 0 && pace.waited;
            pace.per_second = match measured {
                true => smoothed,
                false => smoothed.max(pace.per_second),
            };
            pace.waited = waiting > 0;
            if pace.per_second < PACE_FLOOR {
                pace.per_second = 0.0;
            }
            (pace.at, pace.freed) = (now, freed);
            let served = self.served.each_ref().map(|n| n.load(Ordering::Relaxed));
            let since = |class: Class| served[class.index()] - pace.served[class.index()];
            let newcomers = since(Class::Newcomer);
            if newcomers > 0 {
                let crowd = (newcomers + since(Class::Anonymous)) as f64 / newcomers as f64;
                let smoothed = pace.per_newcomer * (1.0 - PACE_WEIGHT) + crowd * PACE_WEIGHT;
                pace.per_newcomer = smoothed.clamp(*PER_NEWCOMER.start(), *PER_NEWCOMER.end());
            }
            pace.served = served;
        }
        pace
    }

    /// A newcomer got its slot after `waited`: what the next newcomer can expect,
    /// as seen rather than reckoned.
    pub fn newcomer_waited(&self, waited: Duration) {
        let mut pace = self.pace.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let smoothed = match pace.newcomers {
            Some((last, at)) if now.duration_since(at) < NEWCOMERS_FORGOTTEN => {
                last.mul_f64(1.0 - PACE_WEIGHT) + waited.mul_f64(PACE_WEIGHT)
            }
            _ => waited,
        };
        pace.newcomers = Some((smoothed, now));
    }

    /// The crowd now, with `waiting` requests in the newcomers' line: the waiters
    /// of the pools whose freed slots make the pace, which
    /// [`Upstreams::load`](crate::cluster::upstreams::Upstreams::load) counts (this
    /// crowd's own count, [`waiting`](Self::waiting), is every pool's).
    pub fn load(&self, waiting: usize) -> Load {
        let pace = self.sampled(waiting);
        let newcomers = (pace.newcomers).filter(|(_, at)| at.elapsed() < NEWCOMERS_FORGOTTEN);
        Load {
            waiting,
            newcomers_waiting: self.newcomers.load(Ordering::Relaxed),
            per_newcomer: pace.per_newcomer,
            pace: pace.per_second,
            newcomers_waited: newcomers.map(|(waited, _)| waited),
        }
    }

    fn join(&self, class: Class) -> bool {
        let max = self.max_waiting.load(Ordering::Relaxed);
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= max {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        self.count_newcomer(class, true);
        true
    }

    fn leave(&self, class: Class) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.count_newcomer(class, false);
    }

    /// A place in the line passes from a waiter of class `from` to one of `to`.
    fn pass(&self, from: Class, to: Class) {
        self.count_newcomer(from, false);
        self.count_newcomer(to, true);
    }

    fn count_newcomer(&self, class: Class, joins: bool) {
        match (class, joins) {
            (Class::Newcomer, true) => self.newcomers.fetch_add(1, Ordering::Relaxed),
            (Class::Newcomer, false) => self.newcomers.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

/// The crowd at one moment: requests waiting, and the pace slots free at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Requests waiting in the newcomers' line: for the slots of each node's pool
    /// for new work, and new work fallen back to a node's own pool
    /// ([`Upstreams::load`](crate::cluster::upstreams::Upstreams::load)).
    pub waiting: usize,
    /// Newcomers among them.
    pub newcomers_waiting: usize,
    /// Requests a newcomer makes before logging in, as the crowd lately showed.
    pub per_newcomer: f64,
    /// Slots freed per second lately.
    pub pace: f64,
    /// How long newcomers waited for their slots in the last few seconds, smoothed.
    pub newcomers_waited: Option<Duration>,
}

impl Load {
    /// How long a newcomer joining the line now can expect to wait: the longer of
    /// what newcomers have just waited and of the reckoning below. `None` when
    /// requests wait and none has finished lately (the nodes are stuck).
    pub fn expected_wait(&self) -> Option<Duration> {
        let seen = self.newcomers_waited.unwrap_or_default();
        (self.reckoned_wait()).map(|reckoned| {
            if self.waiting == 0 {
                reckoned
            } else {
                reckoned.max(seen)
            }
        })
    }

    /// The work ahead over the pace it is done at (Little's law), alone: what
    /// admitting one more newcomer adds to the line now, which the waiting room
    /// opens and paces admissions by. The work ahead is every waiter in the
    /// newcomers' line (a newcomer is last in line), and for each newcomer among
    /// them the rest of a login (the form's POST, its redirect, the first page),
    /// which will come back to stand ahead of any newcomer arriving now: counting
    /// requests alone, a crowd arriving within two seconds is all in line before
    /// it looks long.
    pub fn reckoned_wait(&self) -> Option<Duration> {
        if self.waiting == 0 {
            return Some(Duration::ZERO);
        }
        let rest_of_logins = self.newcomers_waiting as f64 * (self.per_newcomer - 1.0).max(0.0);
        let ahead = self.waiting as f64 + rest_of_logins;
        // `try_`: a figure no `Duration` holds is as good as none, never a panic.
        let wait = (self.pace > 0.0).then(|| Duration::try_from_secs_f64(ahead / self.pace));
        wait.and_then(Result::ok)
    }
}

/// One node's slots and the requests waiting for them.
#[derive(Debug)]
pub struct Slots {
    /// `max_active`; 0: no cap.
    cap: AtomicUsize,
    line: Mutex<Line>,
    /// Waiters, readable without the lock (the deal asks on every new session).
    queued: AtomicUsize,
    /// Waiters other than work in progress, readable without the lock: on a node's
    /// own pool beside a low-priority one, the new work that fell back to it when
    /// that pool could not be reached (the waiting room counts it).
    queued_new_work: AtomicUsize,
    /// New sessions the deal gave another node because this one's line was long.
    passed_over: AtomicU64,
    crowd: Arc<Crowd>,
    /// Whether its freed slots count in the crowd's pace: the pace newcomers are
    /// let in at. Not a node's own pool when it has a low-priority one, where the
    /// newcomers wait (its page turns are quick, and would make the pace look
    /// faster than the newcomers' line moves).
    paces: AtomicBool,
    /// The gate quiz starts pass before they join the line.
    starts: Starts,
}

#[derive(Debug, Default)]
struct Line {
    /// Requests holding a slot.
    active: usize,
    waiters: BTreeMap<Place, Waiter>,
    per_class: [usize; 4],
    next_seq: u64,
}

/// A place in line: the tier, the aged arrival, then who came first among equals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    tier: u8,
    due: Instant,
    seq: u64,
}

#[derive(Debug)]
struct Waiter {
    class: Class,
    answer: oneshot::Sender<Answer>,
}

/// What a waiter is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A slot is its own now.
    Slot,
    /// A request of a higher class took its place in a full line.
    Displaced,
}

/// One node's slots as the dashboard and `/metrics` show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotsNow {
    /// `max_active`, once per PHP pool of the node (0: no cap).
    pub cap: usize,
    /// Requests holding a slot (counted only under a cap).
    pub active: usize,
    /// Requests waiting, per [`Class`].
    pub queued: [usize; 4],
    /// New sessions dealt past this node because its line was long.
    pub passed_over: u64,
    /// Quiz starts it runs at once (0: not paced).
    pub start_share: usize,
    /// Quiz starts waiting at its gate.
    pub starts_waiting: usize,
}

impl SlotsNow {
    /// Two pools of one node as one: their caps, requests and waits added up.
    pub fn and(self, other: SlotsNow) -> SlotsNow {
        let mut queued = self.queued;
        for (mine, theirs) in queued.iter_mut().zip(other.queued) {
            *mine += theirs;
        }
        SlotsNow {
            cap: self.cap + other.cap,
            active: self.active + other.active,
            queued,
            passed_over: self.passed_over + other.passed_over,
            start_share: self.start_share + other.start_share,
            starts_waiting: self.starts_waiting + other.starts_waiting,
        }
    }
}

impl Slots {
    /// Slots for a node with cap `cap` (0: none), sharing `crowd`'s bound.
    pub fn new(cap: usize, crowd: Arc<Crowd>) -> Self {
        Self {
            cap: AtomicUsize::new(cap),
            line: Mutex::default(),
            queued: AtomicUsize::new(0),
            queued_new_work: AtomicUsize::new(0),
            passed_over: AtomicU64::new(0),
            crowd,
            paces: AtomicBool::new(true),
            starts: Starts::new(0),
        }
    }

    /// The cap (0: none).
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Applies a reloaded cap. Nobody waiting loses a place: a higher cap (or none)
    /// lets the first waiters in at once; a lower one lets requests finish until the
    /// node is under it.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
        let mut line = self.lock();
        while !line.waiters.is_empty() && (cap == 0 || line.active < cap) {
            line.active += 1;
            if !self.hand_over(&mut line) {
                line.active -= 1;
            }
        }
    }

    /// Whether its freed slots count in the crowd's pace (see the field).
    pub fn paces(&self) -> bool {
        self.paces.load(Ordering::Relaxed)
    }

    /// Sets whether its freed slots count in the crowd's pace.
    pub fn set_paces(&self, paces: bool) {
        self.paces.store(paces, Ordering::Relaxed);
    }

    /// The node's gate for quiz starts (no gate until a share is set).
    pub fn starts(&self) -> &Starts {
        &self.starts
    }

    /// Requests waiting for this node.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests waiting for this node that are not work in progress.
    pub fn queued_new_work(&self) -> usize {
        self.queued_new_work.load(Ordering::Relaxed)
    }

    /// Makes the line's length readable without its lock; called under it after
    /// every change.
    fn publish(&self, line: &Line) {
        let all = line.waiters.len();
        let working = line.per_class[Class::Working.index()];
        self.queued.store(all, Ordering::Relaxed);
        self.queued_new_work.store(all - working, Ordering::Relaxed);
    }

    /// Its line is longer than one round of its workers: the deal of a new session
    /// should pass it over while another node has room.
    pub fn crowded(&self) -> bool {
        let cap = self.cap();
        cap > 0 && self.queued() > cap
    }

    /// Counts a new session dealt past this node.
    pub fn passed_over(&self) {
        self.passed_over.fetch_add(1, Ordering::Relaxed);
    }

    /// What the dashboard shows.
    pub fn now(&self) -> SlotsNow {
        let line = self.lock();
        SlotsNow {
            cap: self.cap(),
            active: line.active,
            queued: line.per_class,
            passed_over: self.passed_over.load(Ordering::Relaxed),
            start_share: self.starts.share(),
            starts_waiting: self.starts.waiting(),
        }
    }

    /// A slot on this node if one is free at once (under its cap, nobody waiting):
    /// [`acquire`](Self::acquire)'s first step, for a caller that keeps its clock
    /// and its timer for a request that has to wait.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let cap = self.cap();
        if cap == 0 {
            return Some(Permit { slots: None });
        }
        self.take_free(&mut self.lock(), cap).then(|| Permit {
            slots: Some(self.clone()),
        })
    }

    /// A slot on this node: at once while it is under its cap and nobody waits,
    /// else when its turn comes by the aging rule. Dropping the future gives the
    /// place up (and a slot handed over in that very moment back).
    pub async fn acquire(self: &Arc<Self>, ask: Ask) -> Result<Permit, Ended> {
        let cap = self.cap();
        if cap == 0 {
            return Ok(Permit { slots: None });
        }
        let (place, answer) = {
            // Looked at and joined under one lock, so that a slot freed in between
            // cannot pass a request that is about to wait for it.
            let mut line = self.lock();
            if self.take_free(&mut line, cap) {
                return Ok(Permit {
                    slots: Some(self.clone()),
                });
            }
            let place = Place {
                tier: ask.class.tier(),
                due: ask.arrived + ask.class.handicap(ask.aging),
                seq: line.next_seq,
            };
            line.next_seq += 1;
            if !self.crowd.join(ask.class) && !self.displace(&mut line, place, ask.class) {
                return Err(Ended::Full);
            }
            let (answer, told) = oneshot::channel();
            line.waiters.insert(
                place,
                Waiter {
                    class: ask.class,
                    answer,
                },
            );
            line.per_class[ask.class.index()] += 1;
            self.publish(&line);
            (place, told)
        };
        let mut waiting = Waiting {
            slots: self,
            place,
            answer: Some(answer),
        };
        let told = waiting.answer.as_mut().expect("just set");
        match tokio::time::timeout(ask.patience, told).await {
            Ok(told) => {
                waiting.answer = None;
                match told {
                    Ok(Answer::Slot) => Ok(Permit {
                        slots: Some(self.clone()),
                    }),
                    // Displaced, or the line itself went (it outlives this borrow).
                    Ok(Answer::Displaced) | Err(_) => Err(Ended::Full),
                }
            }
            // Patience ran out: `waiting` gives the place up as it drops, or frees
            // a slot handed over between the timer and its lock.
            Err(_) => Err(Ended::Timeout),
        }
    }

    /// In a full gateway line, a request takes the place of the last waiter of a
    /// lower class on this node (told it is displaced), so a logged-in student is
    /// never the one turned away while newcomers wait.
    fn displace(&self, line: &mut Line, place: Place, class_in: Class) -> bool {
        let last = line.waiters.last_key_value().map(|(p, w)| (*p, w.class));
        let Some((last, class)) = last.filter(|(last, _)| *last > place) else {
            return false;
        };
        let waiter = line.waiters.remove(&last).expect("just seen");
        line.per_class[class.index()] -= 1;
        // Its place in the crowd passes to the request that displaced it.
        self.crowd.pass(class, class_in);
        let _ = waiter.answer.send(Answer::Displaced);
        true
    }

    /// Makes room in a full gateway line for a request of `class` waiting in
    /// another line of the same node (its other PHP pool): the last waiter here,
    /// if its class is lower, is told it is displaced and its place in the crowd
    /// is given up. `false` when nobody here ranks below `class`.
    ///
    /// Why: a node with a low-priority pool keeps its newcomers in that pool's
    /// line and its students' work in progress in its own, so `displace` within
    /// one line could no longer put a student before the crowd.
    pub fn give_way(&self, class: Class) -> bool {
        let mut line = self.lock();
        let last = line.waiters.last_key_value().map(|(p, w)| (*p, w.class));
        let Some((last, lower)) = last.filter(|&(_, w)| w > class) else {
            return false;
        };
        let waiter = line.waiters.remove(&last).expect("just seen");
        line.per_class[lower.index()] -= 1;
        self.publish(&line);
        self.crowd.leave(lower);
        let _ = waiter.answer.send(Answer::Displaced);
        true
    }

    /// Takes a waiter out of line; `false` when it was not there any more.
    fn remove(&self, line: &mut Line, place: Place) -> bool {
        let Some(waiter) = line.waiters.remove(&place) else {
            return false;
        };
        line.per_class[waiter.class.index()] -= 1;
        self.publish(line);
        self.crowd.leave(waiter.class);
        true
    }

    /// Gives one slot to the first waiter still there; `false` when nobody was.
    fn hand_over(&self, line: &mut Line) -> bool {
        while let Some((_, waiter)) = line.waiters.pop_first() {
            line.per_class[waiter.class.index()] -= 1;
            self.publish(line);
            self.crowd.leave(waiter.class);
            if waiter.answer.send(Answer::Slot).is_ok() {
                return true;
            }
        }
        false
    }

    /// A request is done with its slot: the next waiter gets it, else it is free.
    fn release(&self) {
        if self.paces.load(Ordering::Relaxed) {
            self.crowd.freed.fetch_add(1, Ordering::Relaxed);
        }
        let mut line = self.lock();
        let cap = self.cap();
        let over = cap != 0 && line.active > cap;
        if over || !self.hand_over(&mut line) {
            line.active = line.active.saturating_sub(1);
        }
    }

    /// Takes a slot if one is free at once: under the cap, and nobody waiting for one.
    fn take_free(&self, line: &mut Line, cap: usize) -> bool {
        let free = line.active < cap && line.waiters.is_empty();
        line.active += usize::from(free);
        free
    }

    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A waiter's place, given up if its future is dropped before an answer.
struct Waiting<'a> {
    slots: &'a Arc<Slots>,
    place: Place,
    /// `None` once the answer (or the timeout) was taken in hand.
    answer: Option<oneshot::Receiver<Answer>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        let mut line = self.slots.lock();
        if self.slots.remove(&mut line, self.place) {
            return;
        }
        drop(line);
        // Out of line already: a slot handed to a request that left is freed again.
        if answer.try_recv() == Ok(Answer::Slot) {
            self.slots.release();
        }
    }
}

/// A slot held on a node (or nothing, on a node without a cap), freed when dropped
/// or, once the request was sent, when the node's response body ends.
#[derive(Debug)]
pub struct Permit {
    slots: Option<Arc<Slots>>,
}

impl Permit {
    /// The slot, to travel with the node's response body: `None` without a cap.
    pub fn into_held(mut self) -> Option<Arc<dyn Held>> {
        self.slots.take().map(|slots| slots as Arc<dyn Held>)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl Held for Slots {
    fn release(&self) {
        Slots::release(self);
    }
}

#[cfg(test)]
mod tests;
