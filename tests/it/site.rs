//! A site for the shared-store tests (`[store] kind = "redis"`): one real
//! `redis-server` started for the test, stand-in nodes, and gateways sharing them.

use std::time::{Duration, Instant};

use moodle_gateway::demo::standin::Cluster;

use crate::support::{RedisServer, TestGateway};

pub const SECRET: &str = "the-site-wide-store-secret-0123456789";
pub const TOKEN: &str = "admin-token-for-the-store-tests-0123456789";

/// A site: one Redis, stand-in nodes, and gateways sharing them.
pub struct Site {
    pub redis: RedisServer,
    pub cluster: Cluster,
    pub gateways: Vec<TestGateway>,
}

impl Site {
    pub async fn start(nodes: usize, names: &[&str], extra: &str) -> Site {
        let redis = RedisServer::start();
        let cluster = Cluster::spawn(nodes, "", "MoodleSession").unwrap();
        let mut site = Site {
            redis,
            cluster,
            gateways: Vec::new(),
        };
        for name in names {
            let gateway = site.gateway(name, extra).await;
            site.gateways.push(gateway);
        }
        site
    }

    /// The config of gateway `name` of this site.
    pub fn config(&self, name: &str, extra: &str) -> String {
        let store = format!(
            "store.kind = \"redis\"\nstore.url = {:?}\nstore.name = {name:?}\n\
             store.secret = {SECRET:?}\n{extra}",
            self.redis.url()
        );
        let admin = Some(("127.0.0.1:0", TOKEN));
        self.cluster.config_toml("127.0.0.1:0", admin, &store)
    }

    /// One more gateway of this site, connected to Redis and resynchronised.
    pub async fn gateway(&self, name: &str, extra: &str) -> TestGateway {
        let gateway = TestGateway::start(&self.config(name, extra)).await;
        ready(gateway).await
    }

    pub fn gw(&self, i: usize) -> &TestGateway {
        &self.gateways[i]
    }
}

/// `gateway`, once it has connected to Redis and resynchronised.
pub async fn ready(gateway: TestGateway) -> TestGateway {
    eventually(Duration::from_secs(5), "the gateway resynchronises", || {
        metric(&gateway, "store_resyncs_total") >= 1.0
    })
    .await;
    gateway
}

/// Waits up to `limit` for `done`; how long it took.
pub async fn eventually(limit: Duration, what: &str, done: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    started.elapsed()
}

/// One sample of `/metrics`, like `store_fallbacks_total{what="deal"}`; 0 when absent.
pub fn metric(gateway: &TestGateway, series: &str) -> f64 {
    let text = gateway.app.gateway().metrics().render(&Default::default());
    let series = format!("moodle_gateway_{series} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}
