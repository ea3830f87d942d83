//! Measures the affinity table's resident memory per session: binds N sessions
//! (default 1,000,000) and reports the growth of this process's resident set.
//!
//! `cargo run --release --example table_memory [N]`

use std::time::{Duration, Instant};

use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::{AffinityTable, Limits, SessionState};
use moodle_gateway::sessions::clock::Clock;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn main() {
    let sessions: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |n| n.parse().expect("a count"));
    let limits = Limits {
        max_sessions: sessions * 2,
        logged_in_idle: Duration::from_secs(8 * 3600),
        anonymous_idle: Duration::from_secs(3600),
    };
    // Keys are made before measuring, from one reused buffer, so that only the
    // table's own growth is counted (freed id strings would otherwise be reused by
    // the table's allocations and hide part of its size).
    let table = AffinityTable::new(limits, Clock::default());
    let mut id = String::with_capacity(32);
    let keys: Vec<_> = (0..sessions)
        .map(|i| {
            id.clear();
            use std::fmt::Write;
            write!(id, "{i:026}").unwrap();
            table.key(&id)
        })
        .collect();
    let before = resident_bytes();
    let started = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        table.bind(*key, NodeId::new(i % 4).unwrap(), SessionState::LoggedIn);
    }
    let elapsed = started.elapsed();
    let after = resident_bytes();
    let per_entry = (after - before) as f64 / sessions as f64;
    println!(
        "{sessions} sessions: resident +{:.1} MiB, {per_entry:.1} bytes per session, bound in {elapsed:?}",
        (after - before) as f64 / (1 << 20) as f64
    );
    assert_eq!(table.len(), sessions);
}
