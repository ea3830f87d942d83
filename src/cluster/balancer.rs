//! Which PHP node gets a new session: dealing like cards, without a race.
//!
//! The PHP script this gateway replaced read a counter from MySQL, then wrote it back:
//! two students arriving together got the same node. Here the counter is one
//! `AtomicUsize` and `fetch_add` hands every caller its own ticket, so concurrent
//! arrivals can never share a turn. Weights are honoured by dealing from a schedule
//! built once with nginx's *smooth* weighted round robin (weights 3:1 deal
//! `a a b a`, not `a a a b`), so a heavy node never receives a burst.
//!
//! Two independent counters keep sessionless traffic (theme CSS, JavaScript, images)
//! from skewing the deal: a new student's page pulls a dozen such assets, and if they
//! advanced the session counter, the next student's node would depend on how many
//! assets the previous one happened to fetch.
//!
//! No HTTP types and no health here: nodes are positions in the configured list,
//! and the caller says which positions may be picked.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::slow_start::Share;

/// A position in the configured `[[nodes]]` list.
pub type Position = usize;

/// Lock-free node selection over a fixed list of weighted nodes.
#[derive(Debug)]
pub struct Balancer {
    /// One weighted round of node indices in smooth order; its length is the weight sum.
    schedule: Box<[Position]>,
    /// For each slot of `schedule`, how many of the round's earlier slots are its
    /// node's: with the round's number, a node's own count of turns.
    nth: Box<[u32]>,
    weights: Box<[u32]>,
    /// Tickets for new sessions.
    deal: AtomicUsize,
    /// Tickets for sessionless requests, which must not move the deal.
    spread: AtomicUsize,
}

impl Balancer {
    /// Builds the dealing schedule. `weights` has one entry per node, each at least 1.
    ///
    /// # Panics
    /// If `weights` is empty or holds a zero: config validation rules both out.
    pub fn new(weights: &[u32]) -> Self {
        assert!(!weights.is_empty() && weights.iter().all(|&w| w > 0));
        let schedule = smooth_schedule(weights);
        let mut seen = vec![0u32; weights.len()];
        let nth = (schedule.iter())
            .map(|&p| {
                seen[p] += 1;
                seen[p] - 1
            })
            .collect();
        Self {
            schedule: schedule.into_boxed_slice(),
            nth,
            weights: weights.into(),
            deal: AtomicUsize::new(0),
            spread: AtomicUsize::new(0),
        }
    }

    /// The length of one weighted round: enough tickets to reach every node.
    pub fn round(&self) -> usize {
        self.schedule.len()
    }

    /// The node for the next new session (weighted round robin).
    pub fn deal(&self) -> Position {
        self.at(self.deal_ticket())
    }

    /// The node for a request that carries no session and starts none.
    pub fn spread(&self) -> Position {
        self.at(self.spread_ticket())
    }

    /// The next ticket of the deal; [`at`](Self::at) names its node.
    pub fn deal_ticket(&self) -> usize {
        self.deal.fetch_add(1, Ordering::Relaxed)
    }

    /// The next ticket of the sessionless rotation.
    pub fn spread_ticket(&self) -> usize {
        self.spread.fetch_add(1, Ordering::Relaxed)
    }

    /// The node a ticket lands on.
    pub fn at(&self, ticket: usize) -> Position {
        self.schedule[ticket % self.schedule.len()]
    }

    /// Which of its own turns a ticket is for the node it lands on, counted from
    /// the first ticket: a warming node takes some of its turns by this number
    /// ([`takes_turn`](super::slow_start::takes_turn)).
    pub fn turn(&self, ticket: usize) -> u64 {
        let (round, slot) = (ticket / self.round(), ticket % self.round());
        let weight = u64::from(self.weights[self.schedule[slot]]);
        (round as u64).wrapping_mul(weight) + u64::from(self.nth[slot])
    }

    /// The eligible node with the fewest live sessions per unit of weight;
    /// `live(node)` reads the current count, `share(node)` scales a warming node's
    /// weight (in thousandths), so it fills up to its share of the others' load
    /// rather than taking every newcomer until it has as many. Ties rotate with the
    /// deal counter so that an empty cluster still deals evenly instead of always
    /// picking the first node.
    pub fn least_sessions(
        &self,
        live: impl Fn(Position) -> u64,
        share: impl Fn(Position) -> Share,
        eligible: impl Fn(Position) -> bool,
    ) -> Option<Position> {
        let n = self.weights.len();
        let start = self.deal.fetch_add(1, Ordering::Relaxed) % n;
        let mut best: Option<(Position, u64, u128)> = None;
        for node in (0..n)
            .map(|offset| (start + offset) % n)
            .filter(|&p| eligible(p))
        {
            let node_live = live(node);
            let weight = u128::from(self.weights[node]) * u128::from(share(node).max(1));
            // node_live / weight < best_live / best_weight, without division.
            let better = best.is_none_or(|(_, best_live, best_weight)| {
                u128::from(node_live) * best_weight < u128::from(best_live) * weight
            });
            if better {
                best = Some((node, node_live, weight));
            }
        }
        best.map(|(node, ..)| node)
    }
}

/// One round of nginx's smooth weighted round robin: each step every node gains its
/// weight, the richest is picked and pays the total back.
fn smooth_schedule(weights: &[u32]) -> Vec<Position> {
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    let mut current = vec![0i64; weights.len()];
    (0..total)
        .map(|_| {
            for (c, &w) in current.iter_mut().zip(weights) {
                *c += i64::from(w);
            }
            let pick = (0..weights.len())
                .max_by_key(|&i| (current[i], std::cmp::Reverse(i)))
                .expect("at least one node");
            current[pick] -= total;
            pick
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::slow_start::FULL;

    fn counts(picks: impl Iterator<Item = Position>, nodes: usize) -> Vec<usize> {
        let mut counts = vec![0; nodes];
        picks.for_each(|n| counts[n] += 1);
        counts
    }

    #[test]
    fn equal_weights_deal_like_cards() {
        let b = Balancer::new(&[1, 1, 1, 1]);
        let picks: Vec<_> = (0..8).map(|_| b.deal()).collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn heavy_node_is_interleaved_not_bursted() {
        let b = Balancer::new(&[3, 1]);
        let picks: Vec<_> = (0..4).map(|_| b.deal()).collect();
        assert_eq!(picks, [0, 0, 1, 0]);
        assert_eq!(smooth_schedule(&[5, 1, 1]), [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn weights_are_honoured_over_many_rounds() {
        let b = Balancer::new(&[2, 1, 1]);
        assert_eq!(counts((0..400).map(|_| b.deal()), 3), [200, 100, 100]);
    }

    #[test]
    fn sessionless_requests_do_not_move_the_deal() {
        let b = Balancer::new(&[1, 1, 1]);
        assert_eq!(b.deal(), 0);
        for _ in 0..7 {
            b.spread();
        }
        assert_eq!(b.deal(), 1);
    }

    #[test]
    fn concurrent_deals_never_share_a_ticket() {
        let b = std::sync::Arc::new(Balancer::new(&[1, 1, 1, 1]));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).map(|_| b.deal()).collect::<Vec<_>>())
            })
            .collect();
        let all = threads.into_iter().flat_map(|t| t.join().unwrap());
        assert_eq!(counts(all, 4), [2000, 2000, 2000, 2000]);
    }

    #[test]
    fn least_sessions_picks_the_emptiest_node_by_weight() {
        let b = Balancer::new(&[1, 2, 1]);
        let live = [10, 12, 9];
        // per weight: 10, 6, 9
        let full = |_| FULL;
        assert_eq!(b.least_sessions(|n| live[n], full, |_| true), Some(1));
        assert_eq!(b.least_sessions(|n| live[n], full, |n| n != 1), Some(2));
        assert_eq!(b.least_sessions(|n| live[n], full, |_| false), None);
    }

    #[test]
    fn least_sessions_rotates_ties() {
        let b = Balancer::new(&[1, 1, 1]);
        let picks: Vec<_> = (0..3)
            .map(|_| b.least_sessions(|_| 0, |_| FULL, |_| true))
            .collect();
        assert_eq!(picks, [Some(0), Some(1), Some(2)]);
    }

    #[test]
    fn a_warming_node_fills_to_its_share_of_the_others_load() {
        let b = Balancer::new(&[1, 1]);
        // Node 1 came back empty at a quarter share: it takes newcomers until it
        // holds a quarter of node 0's 100, then only its share of them.
        let live = std::cell::RefCell::new([100u64, 0]);
        let quarter = |n| if n == 1 { 250 } else { FULL };
        for _ in 0..25 {
            let n = b.least_sessions(|n| live.borrow()[n], quarter, |_| true);
            live.borrow_mut()[n.unwrap()] += 1;
        }
        assert_eq!(*live.borrow(), [100, 25]);
        for _ in 0..50 {
            let n = b.least_sessions(|n| live.borrow()[n], quarter, |_| true);
            live.borrow_mut()[n.unwrap()] += 1;
        }
        assert_eq!(*live.borrow(), [140, 35], "four in five to the warm node");
    }

    #[test]
    fn a_ticket_names_its_nodes_own_turn() {
        let b = Balancer::new(&[2, 1]);
        // The schedule is a b a; node a's turns are 0, 1, then 2, 3 in the next round.
        let turns: Vec<_> = (0..6).map(|t| (b.at(t), b.turn(t))).collect();
        assert_eq!(turns, [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 3)]);
    }
}
