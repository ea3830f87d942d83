//! The rate limits' cost per request, through the real layer around a service
//! that answers at once: a logged-in student's page (skips the buckets), an
//! anonymous page (its address keyed and its bucket taken), and the same with the
//! limits off; and one bucket's check alone with 100,000 addresses remembered.
//!
//! `cargo bench --bench rate_limits`
#![allow(missing_docs)] // criterion's macros generate undocumented items

use std::convert::Infallible;
use std::future::ready;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use moodle_gateway::config::{Config, Rate};
use moodle_gateway::gateway::limiter::{address_key, Bucket, RateLimitLayer};
use moodle_gateway::gateway::{Gateway, ProxyBody};
use moodle_gateway::http::h1::StudentBody;
use moodle_gateway::http::upstream::proxy::Client;
use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::SessionState;
use moodle_gateway::sessions::clock::Clock;
use tower::{Layer, Service};

const SESSION: &str = "q1w2e3r4t5y6u7i8o9p0a1s2d3";

fn gateway(limits: &str) -> Arc<Gateway> {
    let text = format!(
        "[rate_limits]\n{limits}\n\
         [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:1\"\n\
         [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n"
    );
    let config = Config::parse(&text, std::path::Path::new("."), Default::default()).unwrap();
    let gateway = Arc::new(Gateway::new(&config, Clock::default()));
    let table = gateway.table();
    let node = NodeId::new(0).unwrap();
    table.bind(table.key(SESSION), node, SessionState::LoggedIn);
    gateway
}

fn page(cookie: Option<&str>) -> Request<StudentBody> {
    let mut request = Request::builder()
        .uri("/course/view.php?id=2")
        .header("host", "moodle.example.edu")
        .header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0",
        );
    if let Some(cookie) = cookie {
        request = request.header("cookie", format!("MoodleSession={cookie}; _ga=GA1.2.3"));
    }
    request.body(StudentBody::empty()).unwrap()
}

fn layer(c: &mut Criterion) {
    let on = "pages_per_address = { per_minute = 1000000, burst = 1000000 }";
    let mut group = c.benchmark_group("rate_limit");
    for (name, limits, cookie) in [
        ("logged_in_page", on, Some(SESSION)),
        ("anonymous_page", on, None),
        ("anonymous_page_limits_off", "enabled = false", None),
    ] {
        let gateway = gateway(limits);
        let client = Arc::new(Client::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9)), false));
        let inner = tower::service_fn(|_: Request<StudentBody>| {
            let body: ProxyBody = http_body_util::Either::Right(Full::new(Bytes::new()));
            ready(Ok::<_, Infallible>(Response::new(body)))
        });
        let mut service = RateLimitLayer::new(gateway, client).layer(inner);
        group.bench_function(name, |b| {
            b.iter_batched(
                || page(cookie),
                |request| black_box(service.call(request).now_or_never()),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn bucket(c: &mut Criterion) {
    let rate = Rate {
        per_minute: 1_000_000,
        burst: 1_000_000,
    };
    let bucket = Bucket::new(rate, 100_000).unwrap();
    let addresses: Vec<IpAddr> = (0..100_000u32)
        .map(|n| IpAddr::V4(Ipv4Addr::from(n)))
        .collect();
    for address in &addresses {
        let _ = bucket.check(&address_key(*address));
    }
    let mut i = 0usize;
    c.bench_function("rate_limit/bucket_check_100k_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % addresses.len();
            black_box(bucket.check(&address_key(addresses[i])))
        })
    });
}

criterion_group!(benches, layer, bucket);
criterion_main!(benches);
