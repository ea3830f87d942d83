//! Micro-benchmarks of the work the gateway does on every proxied request, apart
//! from the network: reading the session cookie, classifying the URL, hashing the id
//! and looking it up, and reading the node's Set-Cookie. Table operations are
//! measured at 10,000 and 1,000,000 live sessions.
//!
//! `cargo bench --bench hot_path`
#![allow(missing_docs)] // criterion's macros generate undocumented items

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::{HeaderMap, HeaderValue};
use moodle_gateway::moodle::Site;
use moodle_gateway::node_id::NodeId;
use moodle_gateway::sessions::affinity::{AffinityTable, Limits, SessionState};
use moodle_gateway::sessions::clock::Clock;

fn browser_headers(session: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let set = |h: &mut HeaderMap, name: &'static str, value: &str| {
        h.append(name, HeaderValue::from_str(value).unwrap());
    };
    set(&mut headers, "host", "moodle.example.edu");
    set(
        &mut headers,
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    );
    set(
        &mut headers,
        "accept",
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    );
    set(&mut headers, "accept-language", "en-US,en;q=0.5");
    set(
        &mut headers,
        "cookie",
        &format!("MOODLEID1_=%25F1%25F2%25F3; MoodleSession={session}; _ga=GA1.2.3"),
    );
    headers
}

fn site() -> Site {
    Site::new("", "MoodleSession", "/")
}

fn moodle(c: &mut Criterion) {
    let site = site();
    let headers = browser_headers("q1w2e3r4t5y6u7i8o9p0a1s2d3");
    c.bench_function("cookie/session_id", |b| {
        b.iter(|| black_box(site.session_id(black_box(&headers))))
    });
    let paths = [
        ("page", "/course/view.php", Some("id=2")),
        (
            "scorm",
            "/pluginfile.php/27/mod_scorm/content/1/index.html",
            None,
        ),
        (
            "sessionless",
            "/theme/styles.php/boost/1700000000_1/all",
            None,
        ),
        (
            "encoded",
            "/pluginfile.php/27/mod_%73corm/content/1/index.html",
            None,
        ),
    ];
    let mut group = c.benchmark_group("classify");
    for (name, path, query) in paths {
        group.bench_function(name, |b| {
            b.iter(|| black_box(site.classify(black_box(path), black_box(query))))
        });
    }
    group.finish();
    let mut response = HeaderMap::new();
    response.append(
        "set-cookie",
        HeaderValue::from_static("MoodleSession=q1w2e3r4t5y6u7i8o9p0a1s2d3; path=/; HttpOnly"),
    );
    response.append(
        "content-type",
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    c.bench_function("set_cookie/issued_session", |b| {
        b.iter(|| black_box(site.issued_session(black_box(&response))))
    });
}

fn filled_table(sessions: usize) -> (AffinityTable, Vec<String>) {
    let limits = Limits {
        max_sessions: sessions * 2,
        logged_in_idle: Duration::from_secs(8 * 3600),
        anonymous_idle: Duration::from_secs(3600),
    };
    let table = AffinityTable::new(limits, Clock::default());
    let ids: Vec<String> = (0..sessions).map(|i| format!("{i:026}")).collect();
    for (i, id) in ids.iter().enumerate() {
        table.bind(
            table.key(id),
            NodeId::new(i % 4).unwrap(),
            SessionState::LoggedIn,
        );
    }
    (table, ids)
}

fn table(c: &mut Criterion) {
    let mut group = c.benchmark_group("table");
    for sessions in [10_000, 1_000_000] {
        let (table, ids) = filled_table(sessions);
        let mut i = 0usize;
        group.bench_function(BenchmarkId::new("key+lookup", sessions), |b| {
            b.iter(|| {
                i = (i + 7919) % ids.len();
                black_box(table.lookup(table.key(&ids[i])))
            })
        });
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("bind+forget", sessions), |b| {
            b.iter(|| {
                n += 1;
                let key = table.key(&format!("{n:026}x"));
                table.bind(key, NodeId::new(1).unwrap(), SessionState::Anonymous);
                table.forget(key)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, moodle, table);
criterion_main!(benches);
