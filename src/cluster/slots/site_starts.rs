//! Quiz starts paced for the whole site by how the students already answering
//! fare: while their page turns take longer than `[surge] quiz_starts_yield_at`
//! times their calm, fewer starts run at once across the site, down to one, and
//! more again as the turns recover.
//!
//! Why, on top of each node's gate ([`Starts`](super::Starts)): a node's gate
//! counts that node's starts and slots, but a start's cost is CPU, and nodes
//! often share it (virtual machines on one host, the database every node asks).
//! One node's starts then slow every node's page turns, which no node's count
//! sees, and a node's gate cannot go below one start. The page turns themselves
//! say how much start work the site can take: they are what the students
//! already in the exam feel, timed from their arrival at the gateway to their
//! node's answer, the line's wait included. The nodes' starts are the only work
//! the gateway can hold back without costing anyone exam time (Moodle's timer
//! starts when the attempt is created, after the wait), so they give way.
//!
//! The rule, once a second in which enough turns were timed (their median, so
//! that one slow upload among them does not count as the site slowing down),
//! is TCP's congestion window with the page turns as its round trip:
//! - In a second with no start running, the turns' median is their calm
//!   (smoothed over seconds), and the next wave of starts begins with one start
//!   at once: the first seconds of a class's start are when the turns suffer
//!   most, and a start held back costs no exam time.
//! - While starts wait and the turns stay within half the margin (under 1.25 ×
//!   calm with `yield_at` 1.5), the share doubles each second; once it has been
//!   halved in this wave, it grows by one. A second with fewer than three
//!   turns timed changes nothing.
//! - Turns slower than `yield_at` times the calm halve it (at least one). It is
//!   not halved again while the starts running are still more than the last
//!   halving allows: the turns cannot have felt it yet. Between the margins the
//!   share holds.
//! - A start that waited at the gates a quarter of its patience opens one more
//!   place as it gets in, whatever the turns say: starts are paced, not refused.
//! - A few seconds with no turn timed at all say nobody is at work: the share
//!   is as wide as the nodes' gates.
//!
//! Until the turns' calm has been seen there is nothing to compare with, and
//! the share stays as wide as the nodes' gates; so too when a minute passed
//! without a second free of starts to refresh it (a day when starts never
//! stop: an old calm says little of now). With several gateways each
//! paces the starts it receives on the turns it sees; they see the same nodes,
//! so they give way together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::starts::Counted;
use super::Ended;

/// The share when not narrowed: more starts at once than any site's gates let
/// through, so the nodes' gates alone decide.
const WIDE: usize = 100_000;
/// Fewer turns than this in a second say nothing about the site.
const MIN_TURNS: usize = 3;
/// Turns timed in a second, at most: the median of these many is as good as of
/// all, and the buffer stays small on the busiest site.
const MAX_TURNS: usize = 1024;
/// The weight of a quiet second's median in the calm: the calm follows the
/// site's hour over tens of seconds, not one slow second.
const CALM_WEIGHT: f64 = 0.2;
/// How long without a timed turn before the share opens: nobody is at work.
const UNSEEN: Duration = Duration::from_secs(3);
/// How long a calm is kept without a second free of starts to refresh it: on a
/// day when starts never stop, the turns' calm of an hour ago says little of
/// now, and the nodes' gates alone decide until a new one is seen.
const CALM_KEPT: Duration = Duration::from_secs(60);

/// The site's share of quiz starts at once, following the students at work.
#[derive(Debug)]
pub struct SiteStarts {
    /// One permit per start at once; resized by [`Reckoning::limit`].
    gate: Arc<Semaphore>,
    /// Permits that running starts give up instead of returning, after a
    /// narrowing found fewer free than it took away.
    owed: Arc<AtomicUsize>,
    /// Starts holding a permit now.
    running: Arc<AtomicUsize>,
    /// Starts waiting for one.
    waiting: AtomicUsize,
    reckoning: Mutex<Reckoning>,
}

#[derive(Debug)]
struct Reckoning {
    /// Starts allowed at once ([`WIDE`]: not narrowed).
    limit: usize,
    /// The second being timed.
    began: Instant,
    /// Its turns' times (at most [`MAX_TURNS`]).
    turns: Vec<Duration>,
    /// Whether a start ran or was let in during it.
    busy: bool,
    /// Whether a start that waited a quarter of its patience got in during it.
    waited_long: bool,
    /// When a turn was last timed.
    seen: Instant,
    /// The turns' median time in seconds without starts, smoothed, and when it
    /// was last refreshed.
    calm: Option<(f64, Instant)>,
    /// Whether the share doubles when the turns allow (since the last quiet
    /// second, until the turns slow down), rather than grows by one.
    growing: bool,
}

/// A start's place in the site's share, given back when dropped.
#[derive(Debug)]
pub struct SitePermit {
    permit: Option<OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    /// Whether the start waited for it.
    pub waited: bool,
}

/// What `/metrics` shows of it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SiteStartsNow {
    /// Starts allowed at once, `None` while not narrowed.
    pub limit: Option<usize>,
    /// Starts holding a place.
    pub running: usize,
    /// Starts waiting for one.
    pub waiting: usize,
    /// The page turns' calm median time, once seen.
    pub calm: Option<Duration>,
}

impl Default for SiteStarts {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            gate: Arc::new(Semaphore::new(WIDE)),
            owed: Arc::default(),
            running: Arc::default(),
            waiting: AtomicUsize::new(0),
            reckoning: Mutex::new(Reckoning {
                limit: WIDE,
                began: now,
                turns: Vec::new(),
                busy: false,
                waited_long: false,
                seen: now,
                calm: None,
                growing: true,
            }),
        }
    }
}

impl SiteStarts {
    /// A place for a start that reached the gates at `asked`: at once while the
    /// share has room, else in the order the starts came, until `asked +
    /// patience`. `yield_at` 0: not paced.
    pub async fn enter(
        &self,
        yield_at: f64,
        asked: Instant,
        patience: Duration,
    ) -> Result<SitePermit, Ended> {
        let mut permit = SitePermit {
            permit: None,
            owed: self.owed.clone(),
            running: self.running.clone(),
            waited: false,
        };
        if yield_at == 0.0 {
            self.widen_fully();
            return Ok(permit);
        }
        let taken = match self.gate.clone().try_acquire_owned() {
            Ok(taken) => taken,
            Err(_) => {
                self.waiting.fetch_add(1, Ordering::Relaxed);
                let _counted = Counted(&self.waiting);
                let acquire = self.gate.clone().acquire_owned();
                let waited = tokio::time::timeout_at(asked + patience, acquire).await;
                permit.waited = true;
                match waited {
                    Ok(Ok(taken)) => taken,
                    // The gate is never closed; a timeout is the only end.
                    Ok(Err(_)) | Err(_) => return Err(Ended::Timeout),
                }
            }
        };
        let mut r = self.lock();
        self.tick(&mut r, yield_at);
        self.running.fetch_add(1, Ordering::Relaxed);
        permit.permit = Some(taken);
        r.busy = true;
        r.waited_long |= permit.waited && asked.elapsed() >= patience / 4;
        Ok(permit)
    }

    /// A page turn of a student at work took `took`, from its arrival to its
    /// node's answer head. Closes the second being timed when it is over.
    pub fn turn_took(&self, yield_at: f64, took: Duration) {
        if yield_at == 0.0 {
            return;
        }
        let mut r = self.lock();
        r.seen = self.tick(&mut r, yield_at);
        if r.turns.len() < MAX_TURNS {
            r.turns.push(took);
        }
        r.busy |= self.running.load(Ordering::Relaxed) > 0;
    }

    /// What it is doing now.
    pub fn now(&self) -> SiteStartsNow {
        let r = self.lock();
        SiteStartsNow {
            limit: (r.limit < WIDE).then_some(r.limit),
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            calm: r.calm.map(|(calm, _)| Duration::from_secs_f64(calm)),
        }
    }

    /// Closes the second being timed if it is over, and says when now is.
    /// Starts tick too, so that the share follows even while no turn is timed.
    fn tick(&self, r: &mut Reckoning, yield_at: f64) -> Instant {
        let now = Instant::now();
        if now.duration_since(r.began) >= Duration::from_secs(1) {
            self.close_second(r, yield_at, now);
        }
        now
    }

    fn close_second(&self, r: &mut Reckoning, yield_at: f64, now: Instant) {
        let running = self.running.load(Ordering::Relaxed);
        let busy = r.busy || running > 0;
        // A "second" that spans an idle gap is old news.
        let fresh = now.duration_since(r.began) < 2 * Duration::from_secs(1);
        let median = median(&mut r.turns).filter(|_| fresh && r.turns.len() >= MIN_TURNS);
        let waited_long = r.waited_long;
        r.began = now;
        // The caller marks the next second busy if a start runs as it begins.
        (r.busy, r.waited_long) = (false, false);
        r.turns.clear();
        match (median, r.calm) {
            (Some(median), calm) if !busy => {
                let calm = calm.map_or(median, |(c, _)| c + CALM_WEIGHT * (median - c));
                r.calm = Some((calm, now));
            }
            (_, Some((_, at))) if now.duration_since(at) >= CALM_KEPT => r.calm = None,
            _ => {}
        }
        let slowed = median.zip(r.calm).map(|(median, (calm, _))| median / calm);
        let recovered = 1.0 + (yield_at - 1.0) / 2.0;
        let limit = r.limit;
        let waiting = self.waiting.load(Ordering::Relaxed) > 0;
        let to = match slowed {
            // Paced, not refused: a long wait opens a place whatever the turns say.
            _ if waited_long => limit.saturating_add(1),
            // No calm (yet, or any more) to compare with.
            _ if r.calm.is_none() => {
                r.growing = true;
                WIDE
            }
            // A quiet second: the next wave begins with one start at once.
            Some(_) if !busy => {
                r.growing = true;
                1
            }
            // No turn timed for a while: nobody at work to make way for.
            None if now.duration_since(r.seen) >= UNSEEN => {
                r.growing = true;
                WIDE
            }
            // Still more running than the last halving allows: not felt yet.
            Some(slowed) if slowed > yield_at && running > limit => limit,
            Some(slowed) if slowed > yield_at => {
                r.growing = false;
                (limit.min(running) / 2).max(1)
            }
            // Turns within their margin while starts wait: double until the share
            // is first halved in this wave, then one more at a time.
            Some(slowed) if slowed < recovered && waiting && r.growing => limit.saturating_mul(2),
            Some(slowed) if slowed < recovered && waiting => limit.saturating_add(1),
            _ => limit,
        };
        self.resize(r, to);
        if r.limit != limit {
            tracing::info!(
                starts_at_once = ?(r.limit < WIDE).then_some(r.limit),
                turns_against_calm = ?slowed.map(|s| format!("{s:.2} ×")),
                "the site's quiz starts follow the students at work"
            );
        }
    }

    /// Applies a new limit: a wider one adds permits (first paying back what
    /// running starts still owe), a narrower one takes free permits away and
    /// has running starts give up the rest as they finish.
    fn resize(&self, r: &mut Reckoning, to: usize) {
        let to = to.min(WIDE);
        let from = std::mem::replace(&mut r.limit, to);
        if to < from {
            let forgotten = self.gate.forget_permits(from - to);
            self.owed
                .fetch_add(from - to - forgotten, Ordering::Relaxed);
        } else if to > from {
            let give = to - from;
            let mut repaid = 0;
            let _ = (self.owed).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |owed| {
                repaid = owed.min(give);
                Some(owed - repaid)
            });
            self.gate.add_permits(give - repaid);
        }
    }

    fn widen_fully(&self) {
        let mut r = self.lock();
        self.resize(&mut r, WIDE);
    }

    fn lock(&self) -> MutexGuard<'_, Reckoning> {
        self.reckoning
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The median of `times` in seconds (sorting them), `None` when empty.
fn median(times: &mut [Duration]) -> Option<f64> {
    times.sort_unstable();
    times.get(times.len() / 2).map(Duration::as_secs_f64)
}

impl Drop for SitePermit {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        self.running.fetch_sub(1, Ordering::Relaxed);
        // A narrowing that found fewer free permits than it took away is paid
        // by the starts running then, as they finish.
        let paid = (self.owed).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |owed| {
            owed.checked_sub(1)
        });
        if paid.is_ok() {
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests;
