//! Allocation counts on the hot path, with a counting global allocator (its own test
//! binary, so no other test shares the allocator).
//!
//! The per-request work the gateway adds to hyper (cookie read, URL classification,
//! table key and lookup) must not allocate at all; a whole proxied request must not
//! allocate more than it does today. A count, unlike a time, is the same on every
//! machine, so these assertions are stable.

use std::alloc::System;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use moodle_gateway::moodle::Site;
use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::{AffinityTable, Limits, SessionState};
use moodle_gateway::sessions::clock::Clock;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocator counts for the whole process: tests that count must not overlap,
/// and neither must what a test leaves to free when it ends (an async test's runtime,
/// with the gateway and its connections, is dropped after the test's last line).
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn at the allocator, kept however the test before it ended.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    COUNTING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A runtime like `#[tokio::test]`'s, made inside the test's turn so that it is
/// dropped, and everything it ran freed, before the next test counts.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn allocations_in(f: impl FnOnce()) -> usize {
    let region = Region::new(GLOBAL);
    f();
    let change = region.change();
    change.allocations + change.reallocations
}

#[test]
fn routing_a_returning_student_allocates_nothing() {
    let _alone = alone();
    let site = Site::new("", "MoodleSession", "/");
    let limits = Limits {
        max_sessions: 1000,
        logged_in_idle: Duration::from_secs(3600),
        anonymous_idle: Duration::from_secs(3600),
    };
    let table = AffinityTable::new(limits, Clock::default());
    table.bind(
        table.key("q1w2e3r4t5y6u7i8o9p0a1s2d3"),
        NodeId::new(2).unwrap(),
        SessionState::LoggedIn,
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        "cookie",
        HeaderValue::from_static("MOODLEID1_=%25F1; MoodleSession=q1w2e3r4t5y6u7i8o9p0a1s2d3"),
    );
    let paths = [
        ("/course/view.php", Some("id=2")),
        ("/pluginfile.php/27/mod_scorm/content/1/index.html", None),
        ("/theme/styles.php/boost/1/all", None),
        ("/moodle/login/index.php", None),
    ];

    let route_100 = || {
        allocations_in(|| {
            for _ in 0..100 {
                for (path, query) in paths {
                    std::hint::black_box(site.classify(path, query).unwrap());
                }
                let id = site.session_id(&headers).unwrap();
                assert_eq!(table.lookup(table.key(id)), NodeId::new(2));
            }
        })
    };
    // The counter is process-wide and the test harness's own thread may allocate
    // meanwhile; an allocation on the routing path would show in every window.
    let fewest = (0..5).map(|_| route_100()).min().unwrap();
    assert_eq!(fewest, 0, "allocations while routing 100 requests");
}

/// Allocations the gateway adds to one proxied request: the same client sends the
/// same requests to a node directly and through the gateway (all keep-alive, all in
/// this process), and the difference is the gateway's share.
#[test]
fn a_proxied_request_allocates_no_more_than_it_does_today() {
    let _alone = alone();
    runtime().block_on(async {
        use axum::body::Body;
        use http_body_util::BodyExt;
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::{TokioExecutor, TokioIo};

        const REQUESTS: usize = 200;
        /// Measured 2026-11-29 (16; a direct client + node pair takes 21); lower it when the gateway gets leaner, never raise it
        /// without a reason in the commit message. Raised to 18 the same day (measured
        /// 17.5, rounding either way): the request here is a new visitor's (its cookie is
        /// unknown), and a body-less request with no affinity is now copied so it can go
        /// to another node when its first cannot be reached (a dead node costs no student
        /// an error page). Lowered to 11 (measured 10) when the upstream connections
        /// became the request's own (`pool`) and the peer's address was formatted once
        /// per connection; measured 8 by 2026-12-01. 10 again on 2026-12-02: a GET keeps a
        /// copy of its head (the header map's two vectors) to be sent again if its node
        /// closes before answering, since hyper cannot hand back a
        /// request it sent. 11 on 2026-12-03: the request's future is boxed for the time it
        /// waits for its response head (`http::body::stall::SocketPacedResponse`), so that hyper's
        /// per-connection room for it is a pointer, not 8 KB held by every idle keep-alive
        /// connection and every stalled reader. 8 (measured 7) the same day: the node side
        /// speaks HTTP/1.1 itself (`http::h1::client`), without hyper's request channel,
        /// its answer's oneshot and its body's channel, and parses the answer's headers
        /// into the request's emptied map. 6 (measured 5) the same day: the GET's head
        /// is no longer copied, since the node connection keeps the head it sent until
        /// the answer's arrives and hands it back if none does. 5 (measured 4) on
        /// 2026-12-05: the students' HTTP/1.1 is the gateway's own (`http::h1::server`), and
        /// the last answer's emptied header map takes the next request's headers. 5
        /// (measured 5) on 2026-12-06: the journey's future is boxed where it is made, so
        /// that the six layers above it move a pointer instead of copying its 4 KB each
        /// (W1: about 1,000 fewer instructions per request than the copies cost).
        const CEILING: usize = 5;

        let node = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node_addr = node.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = node.accept().await {
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(
                        "hello from web1",
                    )))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        let gateway_addr = gateway_before(node_addr, "").await;

        let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
        let run = |addr: std::net::SocketAddr| {
            let client = client.clone();
            async move {
                let request = http::Request::get(format!("http://{addr}/course/view.php?id=2"))
                    .header("cookie", "MoodleSession=q1w2e3r4t5y6u7i8o9p0a1s2d3")
                    .body(Body::empty())
                    .unwrap();
                let response = client.request(request).await.unwrap();
                response.into_body().collect().await.unwrap();
            }
        };
        // Warm both paths so pools and buffers exist before counting.
        for _ in 0..10 {
            run(node_addr).await;
            run(gateway_addr).await;
        }
        let count = |addr| async move {
            let region = Region::new(GLOBAL);
            for _ in 0..REQUESTS {
                run(addr).await;
            }
            let change = region.change();
            change.allocations + change.reallocations
        };
        let direct = count(node_addr).await;
        let proxied = count(gateway_addr).await;
        let added = proxied.saturating_sub(direct) / REQUESTS;
        println!(
            "allocations per request: direct {}, through the gateway {}, added {added}",
            direct / REQUESTS,
            proxied / REQUESTS
        );
        assert!(
            added <= CEILING,
            "the gateway adds {added} allocations per request (ceiling {CEILING})"
        );
    });
}

/// A gateway in this process in front of one node at `node`, with `extra` (TOML
/// tables) in its config; its address.
async fn gateway_before(node: std::net::SocketAddr, extra: &str) -> std::net::SocketAddr {
    // The data server is never asked here; it only needs an address of its own, kept
    // open as long as the runtime runs.
    let data = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data_addr = data.local_addr().unwrap();
    tokio::spawn(async move {
        let _open = data;
        std::future::pending::<()>().await
    });
    let config = format!(
        "listen = \"127.0.0.1:0\"\n{extra}[[nodes]]\nname = \"web1\"\n\
         url = \"http://{node}\"\n[data]\nname = \"data\"\nurl = \"http://{data_addr}\"\n"
    );
    let mut config =
        moodle_gateway::Config::parse(&config, std::path::Path::new("."), Default::default())
            .unwrap();
    config.state.file = None;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = public.local_addr().unwrap();
    tokio::spawn(moodle_gateway::App::new(config).serve(public, None, std::future::pending()));
    gateway
}

/// Bytes held now by everything allocated since `region` began.
fn held(region: &Region<System>) -> isize {
    let change = region.change();
    change.bytes_allocated as isize - change.bytes_deallocated as isize + change.bytes_reallocated
}

#[test]
fn a_rate_limit_under_a_flood_of_100000_and_more_addresses_holds_bounded_memory() {
    use moodle_gateway::config::Rate;
    use moodle_gateway::gateway::limiter::{address_key, Bucket};
    use std::net::{IpAddr, Ipv6Addr};

    let _alone = alone();
    let rate = Rate {
        per_minute: 60,
        burst: 10,
    };
    let region = Region::new(GLOBAL);
    let bucket = Bucket::new(rate, 100_000).unwrap();
    // One address in each of 400,000 /64s of one /32: 400,000 clients.
    let flood = |clients: std::ops::Range<u128>| {
        for n in clients {
            let ip = IpAddr::V6(Ipv6Addr::from((0x2001_0db8_u128 << 96) | (n << 64) | 1));
            let _ = bucket.check(&address_key(ip));
        }
    };
    flood(0..100_000);
    let full = held(&region);
    assert_eq!(bucket.len(), 100_000);
    flood(100_000..400_000);
    let after = held(&region);
    assert!(bucket.len() <= 100_000, "{} keys", bucket.len());
    eprintln!(
        "rate limit memory: {full} bytes at 100,000 addresses, {after} after 400,000 ({} bytes a key)",
        full / 100_000
    );
    assert!(full < 16 << 20, "{full} bytes for 100,000 addresses");
    assert!(after <= full + full / 10, "{full} bytes grew to {after}");
}

/// A student reading a page holds a kept connection for many seconds, and on exam
/// day tens of thousands do at once: once parked (idle a second), a connection's
/// heap is its task and its socket's few boxes, nothing that serves a request.
/// Counted in bytes, the same on every machine; the process's resident memory per
/// connection (`tests/it/memory.rs`, `bench/idle_memory.sh`) adds the allocator's
/// own pages and the kernel's.
#[test]
fn a_parked_connection_holds_at_most_700_bytes_of_heap() {
    let _alone = alone();
    runtime().block_on(async {
        use std::io::{Read, Write};

        const CONNS: usize = 200;
        /// Measured 2026-12-07 (debug build): 720 bytes with the socket's two halves
        /// kept apart while parked, 680 with them whole again. Lower it when a parked
        /// connection gets leaner, never raise it without a reason in the commit.
        const CEILING: isize = 700;

        let node = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node_addr = node.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = node.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0; 4096];
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\nhello from web1";
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        if buf[..n].ends_with(b"\r\n\r\n")
                            && stream.write_all(answer).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        // Node connections kept long enough that none closes while counting.
        let gateway = gateway_before(node_addr, "[timeouts]\nupstream_idle = \"300s\"\n").await;

        // Blocking sockets on a thread of their own: the students' side allocates
        // nothing on the heap, so all that grows is the gateway's.
        let students = move |count: usize| {
            std::thread::spawn(move || {
                (0..count)
                    .map(|_| {
                        let mut student = std::net::TcpStream::connect(gateway).unwrap();
                        let ask = b"GET /course/view.php?id=2 HTTP/1.1\r\nhost: moodle\r\n\r\n";
                        student.write_all(ask).unwrap();
                        let mut answer = [0; 4096];
                        let mut read = 0;
                        while !answer[..read].ends_with(b"hello from web1") {
                            read += student.read(&mut answer[read..]).unwrap();
                        }
                        student
                    })
                    .collect::<Vec<_>>()
            })
            .join()
            .unwrap()
        };
        // As many students first, so that the node connections their first requests
        // need (one quiet for a second each) are kept before counting.
        drop(
            tokio::task::spawn_blocking(move || students(CONNS))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;

        let region = Region::new(GLOBAL);
        let reading = tokio::task::spawn_blocking(move || students(CONNS));
        let reading = reading.await.unwrap();
        // Past the second after which an idle connection is parked.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let each = held(&region) / CONNS as isize;
        println!("heap held by one parked connection: {each} bytes");
        assert!(each <= CEILING, "{each} bytes a parked connection");
        drop(reading);
    });
}
