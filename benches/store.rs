//! What a request pays for the shared store (`[store] kind = "redis"`), against a
//! real `redis-server` on loopback that this bench starts: a lookup of a session
//! the local table missed (the added latency of a miss), the deal's shared ticket,
//! writing a new session before its response leaves, and a session's move off a
//! node (compare-and-set, against that plain write); beside them, the local table's
//! own lookup, the baseline measured in the same run.
//!
//! `cargo bench --bench store` (needs redis-server: apt-get install redis-server)
#![allow(missing_docs)] // criterion's macros generate undocumented items

use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use moodle_gateway::config::{NodeState, RedisConfig, RedisTarget};
use moodle_gateway::metrics::Metrics;
use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::{AffinityTable, Limits, SessionState};
use moodle_gateway::sessions::clock::Clock;
use moodle_gateway::store::{Local, Store};

const PORT: u16 = 18591;

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The table and node names the store needs of a gateway.
struct Gateway(AffinityTable);

impl Local for Gateway {
    fn table(&self) -> &AffinityTable {
        &self.0
    }
    fn node_id(&self, name: &str) -> Option<NodeId> {
        NodeId::new(name.strip_prefix("web")?.parse().ok()?)
    }
    fn node_name(&self, id: NodeId) -> Option<String> {
        Some(format!("web{id}"))
    }
    fn node_state(&self, _: &str, _: NodeState, _: &str) {}
    fn beat(&self) -> serde_json::Value {
        serde_json::json!({})
    }
}

fn limits() -> Limits {
    Limits {
        max_sessions: 1_000_000,
        logged_in_idle: Duration::from_secs(8 * 3600),
        anonymous_idle: Duration::from_secs(3600),
    }
}

fn redis() -> Redis {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &PORT.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server runs (apt-get install redis-server)");
    std::thread::sleep(Duration::from_millis(300));
    Redis(child)
}

fn store(c: &mut Criterion) {
    let _redis = redis();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let config = RedisConfig {
        target: RedisTarget::Url(format!("redis://127.0.0.1:{PORT}")),
        prefix: "bench:".into(),
        name: "bench".into(),
        secret: b"bench-store-secret-0123456789abcdef".to_vec(),
        secret_source: "store.secret",
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    };
    let metrics = Metrics::new();
    let store = Store::redis(&config, limits(), metrics.store().clone());
    let table = AffinityTable::new(limits(), Clock::default());
    let keys: Vec<_> = (0..10_000)
        .map(|i| table.key(&format!("{i:026}")))
        .collect();
    let local = Arc::new(Gateway(table));
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    runtime.spawn(store.clone().run(local.clone(), stopped));
    runtime.block_on(async {
        while store.is_up() != Some(true) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (i, &key) in keys.iter().enumerate() {
            store
                .bound(key, SessionState::LoggedIn, &format!("web{}", i % 4))
                .await;
        }
    });
    let mut group = c.benchmark_group("store");
    let mut i = 0;
    local
        .0
        .bind(keys[0], NodeId::new(1).unwrap(), SessionState::LoggedIn);
    group.bench_function("local table find (baseline)", |b| {
        b.iter(|| black_box(local.0.find(black_box(keys[0]))))
    });
    group.bench_function("miss: redis lookup of a stored session", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            runtime.block_on(store.lookup(keys[i])).expect("stored")
        })
    });
    group.bench_function("new session: shared deal ticket (INCR)", |b| {
        b.iter(|| runtime.block_on(store.ticket()).expect("a ticket"))
    });
    group.bench_function(
        "new session: bind written before the response (SET+PUBLISH)",
        |b| {
            b.iter(|| {
                i = (i + 7919) % keys.len();
                runtime.block_on(store.bound(keys[i], SessionState::Anonymous, "web2"))
            })
        },
    );
    // A session moving off a node: the compare-and-set script, every call a move
    // that wins (the key goes back and forth), against the plain bind above.
    let moving = keys[1];
    runtime.block_on(store.bound(moving, SessionState::LoggedIn, "web1"));
    let mut on_web1 = true;
    group.bench_function("move off a node: compare-and-set (EVAL)", |b| {
        b.iter(|| {
            let (from, to) = if on_web1 {
                ("web1", "web2")
            } else {
                ("web2", "web1")
            };
            on_web1 = !on_web1;
            let first = runtime.block_on(store.moved(moving, SessionState::LoggedIn, from, to));
            assert_eq!(first, None, "every move wins");
        })
    });
    group.finish();
    let fell_back = metrics.render(&Default::default());
    let fallbacks: Vec<&str> = (fell_back.lines())
        .filter(|l| l.starts_with("moodle_gateway_store_fallbacks_total"))
        .collect();
    println!("fallbacks (must be 0): {fallbacks:?}");
}

criterion_group!(benches, store);
criterion_main!(benches);
