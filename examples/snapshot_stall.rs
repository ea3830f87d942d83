//! How long a bind waits while a snapshot of the table is written: binds a
//! steady stream of new sessions (as new visitors arrive) into a table of N
//! sessions (default 1,000,000), first alone, then while `state::save` writes the
//! table, and prints each phase's bind latencies.
//!
//! `cargo run --release --example snapshot_stall [N]`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::{AffinityTable, Limits, SessionState};
use moodle_gateway::sessions::clock::Clock;
use moodle_gateway::sessions::snapshot::SnapshotNode;
use moodle_gateway::sessions::state;

/// Binds a new session every 20 µs (50,000 new visitors a second) until `stop`,
/// returning each bind's time in nanoseconds.
fn bind_stream(table: &AffinityTable, first: u64, stop: &AtomicBool) -> Vec<u64> {
    let mut took = Vec::new();
    let mut n = first;
    while !stop.load(Ordering::Relaxed) {
        let key = table.key(&format!("{n:026}"));
        let started = Instant::now();
        table.bind(
            key,
            NodeId::new((n % 4) as usize).unwrap(),
            SessionState::Anonymous,
        );
        took.push(started.elapsed().as_nanos() as u64);
        n += 1;
        let next = started + Duration::from_micros(20);
        while Instant::now() < next {
            std::hint::spin_loop();
        }
    }
    took
}

fn report(phase: &str, mut took: Vec<u64>) {
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    let over = |us: u64| took.iter().filter(|&&t| t > us * 1000).count();
    println!(
        "{phase}: {} binds, p50 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs, over 100 µs: {}, over 1 ms: {}",
        took.len(),
        at(0.5),
        at(0.999),
        at(1.0),
        over(100),
        over(1000)
    );
}

fn main() {
    let sessions: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |n| n.parse().expect("a count"));
    let limits = Limits {
        max_sessions: sessions * 4,
        logged_in_idle: Duration::from_secs(8 * 3600),
        anonymous_idle: Duration::from_secs(3600),
    };
    let table = Arc::new(AffinityTable::new(limits, Clock::default()));
    for i in 0..sessions {
        let key = table.key(&format!("old{i:023}"));
        table.bind(key, NodeId::new(i % 4).unwrap(), SessionState::LoggedIn);
    }
    let nodes: Vec<_> = (0..4)
        .map(|i| {
            let node = SnapshotNode {
                name: format!("web{}", i + 1),
                state: None,
            };
            (NodeId::new(i).unwrap(), node)
        })
        .collect();
    let path = std::env::temp_dir().join(format!("snapshot_stall.{}", std::process::id()));

    // Alone, for as long as a save takes.
    let started = Instant::now();
    state::save(&table, &nodes, &path).expect("a save");
    let save_time = started.elapsed();
    let stop = AtomicBool::new(false);
    let alone = std::thread::scope(|s| {
        let binds = s.spawn(|| bind_stream(&table, 0, &stop));
        std::thread::sleep(save_time * 3);
        stop.store(true, Ordering::Relaxed);
        binds.join().unwrap()
    });
    report("binds alone", alone);

    // While three saves run back to back on another thread.
    let stop = AtomicBool::new(false);
    let during = std::thread::scope(|s| {
        let binds = s.spawn(|| bind_stream(&table, 10_000_000, &stop));
        for _ in 0..3 {
            state::save(&table, &nodes, &path).expect("a save");
        }
        stop.store(true, Ordering::Relaxed);
        binds.join().unwrap()
    });
    report("binds during saves", during);
    println!("a save of {} sessions took {save_time:?}", table.len());
    let _ = std::fs::remove_file(&path);
}
