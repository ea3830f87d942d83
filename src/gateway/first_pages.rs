//! A quiz start's turn at its node's gate (`[surge] quiz_starts`), kept from the
//! start's answer until the attempt's first page is answered.
//!
//! Why: `startattempt.php` creates the attempt and answers 303 to its first page
//! (`attempt.php`), the heaviest page of the quiz. Were the turn given back with
//! the 303, the gate would let the next start in while the first page still ran,
//! and at a class's synchronised start every node would work on a start and on the
//! previous student's first page at once: twice the new work `quiz_starts` allows,
//! and the students already answering would share the node's CPU (and, without a
//! low-priority pool, its PHP workers) with both. Kept, the turn counts a start
//! with its first page, as the gate's share is meant to.
//!
//! The first page itself never waits at the gate: its student's timer runs from
//! the start, so it takes the turn its own start held and stands in the line as
//! work in progress. A browser follows a 303 at once; a first page that has not
//! come within [`FIRST_PAGE_WAIT`] (a closed tab, a lost connection, a gateway
//! behind a balancer that sent the page to another one) gives the turn back
//! without it. A second start of the same session (a double click, a second tab)
//! takes the kept turn too, rather than wait at the gate behind it. Only starts
//! that held a turn are kept, so the map holds at most the gates' shares together
//! (and, for a moment after a reload changed a share, the old gate's).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::cluster::slots::{SitePermit, StartPermit};
use crate::sessions::affinity::SessionKey;
use crate::store::StartLease;

/// How long a start's turn waits for its first page: far longer than a browser
/// takes to follow a redirect over a slow link, short enough that a start whose
/// student went away holds up the next start only a moment.
pub const FIRST_PAGE_WAIT: Duration = Duration::from_secs(5);

/// A start's turn: its place at its node's gate, with a shared store its lease
/// on the node's share across gateways, and its place in the site's share.
#[derive(Debug)]
pub struct StartTurn {
    pub permit: StartPermit,
    pub lease: Option<StartLease>,
    pub site: Option<SitePermit>,
}

/// The turns of starts answered whose first page has not come yet, by session.
#[derive(Debug, Default)]
pub struct FirstPages {
    held: Arc<DashMap<SessionKey, Kept>>,
    /// Tells a turn kept for a session from a later one of the same session (a
    /// student who clicked twice), so that the first one's expiry leaves the
    /// second alone.
    next: AtomicU64,
}

#[derive(Debug)]
struct Kept {
    turn: StartTurn,
    id: u64,
}

impl FirstPages {
    /// Keeps `turn`, held by `key`'s start, for the session's first page, at most
    /// [`FIRST_PAGE_WAIT`]. Needs a tokio runtime (its expiry is a timer task).
    pub fn keep(&self, key: SessionKey, turn: StartTurn) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.held.insert(key, Kept { turn, id });
        let held = Arc::clone(&self.held);
        tokio::spawn(async move {
            tokio::time::sleep(FIRST_PAGE_WAIT).await;
            held.remove_if(&key, |_, kept| kept.id == id);
        });
    }

    /// The turn kept for `key`'s first page, if one is: the page holds it until
    /// its node answers.
    pub fn take(&self, key: SessionKey) -> Option<StartTurn> {
        self.held.remove(&key).map(|(_, kept)| kept.turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::slots::Starts;

    fn key(n: u64) -> SessionKey {
        SessionKey::prefix_range(&format!("{n:016x}")).unwrap().0
    }

    /// A start of session `n` through `starts`, answered: its turn kept by `pages`.
    async fn start(starts: &Starts, pages: &FirstPages, n: u64) {
        let permit = starts.enter(Duration::from_secs(60)).await.unwrap();
        pages.keep(
            key(n),
            StartTurn {
                permit,
                lease: None,
                site: None,
            },
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_turn_holds_the_gate_until_its_first_page_takes_it_and_ends() {
        let starts = Starts::new(1);
        let pages = FirstPages::default();
        start(&starts, &pages, 1).await;
        // The next start waits while the first page has not been answered.
        let next = tokio::time::timeout(Duration::from_secs(1), starts.enter(FIRST_PAGE_WAIT));
        assert!(next.await.is_err(), "the gate is still held");
        assert!(
            pages.take(key(2)).is_none(),
            "another session's page takes nothing"
        );
        let turn = pages
            .take(key(1))
            .expect("the first page takes its start's turn");
        assert!(pages.take(key(1)).is_none(), "taken once");
        drop(turn);
        let next = tokio::time::timeout(Duration::from_secs(1), starts.enter(FIRST_PAGE_WAIT));
        assert!(next.await.is_ok(), "the page answered, the next start goes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_page_that_never_comes_gives_the_turn_back_after_the_wait() {
        let starts = Starts::new(1);
        let pages = FirstPages::default();
        start(&starts, &pages, 1).await;
        let next = starts.enter(Duration::from_secs(60));
        let waited = tokio::time::Instant::now();
        next.await.expect("the turn comes back");
        assert_eq!(waited.elapsed(), FIRST_PAGE_WAIT);
        assert!(pages.take(key(1)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_start_of_one_session_is_not_given_back_by_the_first_ones_expiry() {
        let starts = Starts::new(2);
        let pages = FirstPages::default();
        start(&starts, &pages, 1).await;
        tokio::time::sleep(FIRST_PAGE_WAIT / 2).await;
        // The second replaces the first, whose turn goes back at once.
        start(&starts, &pages, 1).await;
        let third = starts.enter(Duration::ZERO).await;
        assert!(third.is_ok(), "the first start's turn is free again");
        drop(third);
        tokio::time::sleep(FIRST_PAGE_WAIT * 3 / 4).await;
        assert!(
            pages.take(key(1)).is_some(),
            "the second start's turn is kept"
        );
    }
}
