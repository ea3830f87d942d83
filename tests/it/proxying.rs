//! The gateway as a plain reverse proxy: streaming, header hygiene, keep-alive reuse,
//! and clear answers when an upstream fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use http_body_util::channel::Channel;
use http_body_util::BodyExt;

use crate::support::{self, config_for, named_upstream, send, RawConn, TestGateway};

/// An upstream that reports the request headers it received, one `name: value` line
/// each, in its body.
async fn echo_upstream() -> std::net::SocketAddr {
    support::upstream(|request| async move {
        let mut lines = String::new();
        for (name, value) in request.headers() {
            lines.push_str(&format!("{}: {}\n", name, value.to_str().unwrap_or("?")));
        }
        Response::builder()
            .header("x-upstream", "echo")
            .body(Body::from(lines))
            .unwrap()
    })
    .await
}

/// A gateway in front of `node`, with `extra` config lines (the data server is a
/// named upstream that these tests never ask).
async fn in_front_of(node: std::net::SocketAddr, extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

fn received(seen: &support::Seen, name: &str) -> Vec<String> {
    seen.text()
        .lines()
        .filter_map(|line| line.strip_prefix(&format!("{name}: ")).map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn an_upload_reaches_the_node_before_the_student_has_finished_sending_it() {
    let (first_seen_tx, first_seen_rx) = tokio::sync::oneshot::channel::<()>();
    let first_seen_tx = Arc::new(std::sync::Mutex::new(Some(first_seen_tx)));
    let node = support::upstream(move |request| {
        let first_seen_tx = first_seen_tx.clone();
        async move {
            let mut body = request.into_body();
            let mut total = 0usize;
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.unwrap().into_data() {
                    total += data.len();
                    if let Some(tx) = first_seen_tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
            }
            Response::new(Body::from(total.to_string()))
        }
    })
    .await;
    // The spool off, as for an upload above `spool_body_bytes`.
    let gateway = in_front_of(node, "[limits]\nspool_body_bytes = 0\n").await;

    // Larger than `limits.buffer_body_bytes` (64 KiB): a small body would be read
    // whole first, an upload past it streams.
    let (mut sender, body) = Channel::<Bytes>::new(1);
    let uploader = tokio::spawn(async move {
        sender
            .send_data(Bytes::from(vec![b'a'; 96 * 1024]))
            .await
            .unwrap();
        // The rest is only sent once the node has seen the first part: a gateway that
        // buffered the whole upload would wait here forever.
        tokio::time::timeout(Duration::from_secs(10), first_seen_rx)
            .await
            .expect("the node saw the first bytes while the upload was still open")
            .unwrap();
        sender
            .send_data(Bytes::from(vec![b'b'; 64 * 1024]))
            .await
            .unwrap();
    });
    let seen = send(
        &gateway.url("/repository/upload.php"),
        "POST",
        &[],
        Body::new(body),
    )
    .await;
    uploader.await.unwrap();
    assert_eq!(seen.status, 200);
    assert_eq!(seen.text(), (160 * 1024).to_string());
}

#[tokio::test]
async fn a_download_reaches_the_student_before_the_node_has_finished_sending_it() {
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let node = support::upstream(move |_request| {
        let mut release_rx = release_rx.clone();
        async move {
            let (mut sender, body) = Channel::<Bytes>::new(1);
            tokio::spawn(async move {
                sender
                    .send_data(Bytes::from_static(b"first part;"))
                    .await
                    .unwrap();
                let _ = release_rx.wait_for(|&go| go).await;
                sender
                    .send_data(Bytes::from_static(b"second part"))
                    .await
                    .unwrap();
            });
            Response::new(Body::new(body))
        }
    })
    .await;
    let gateway = in_front_of(node, "").await;

    let response = support::client()
        .get(gateway.url("/mod/resource/view.php?id=1").parse().unwrap())
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first part arrived while the node still held the rest")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first part;");
    release_tx.send(true).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "second part");
}

#[tokio::test]
async fn forwarding_headers_replace_what_the_client_claims() {
    let node = echo_upstream().await;
    let gateway = in_front_of(node, "").await;
    let seen = send(
        &gateway.url("/course/view.php?id=2"),
        "GET",
        &[
            ("host", "moodle.example.edu"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
            ("client-ip", "6.6.6.6"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(
        received(&seen, "host"),
        ["moodle.example.edu"],
        "Host kept for wwwroot"
    );
    assert_eq!(received(&seen, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(received(&seen, "x-forwarded-proto"), ["http"]);
    assert_eq!(received(&seen, "x-forwarded-host"), ["moodle.example.edu"]);
    assert!(received(&seen, "client-ip").is_empty());
}

#[tokio::test]
async fn a_trusted_front_proxy_keeps_its_forwarding_chain() {
    let node = echo_upstream().await;
    let gateway = in_front_of(node, "trusted_proxies = [\"127.0.0.0/8\"]").await;
    let seen = send(
        &gateway.url("/"),
        "GET",
        &[
            ("host", "node.internal"),
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "moodle.example.edu"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(
        received(&seen, "x-forwarded-for"),
        ["198.51.100.7, 127.0.0.1"]
    );
    assert_eq!(received(&seen, "x-forwarded-proto"), ["https"]);
    assert_eq!(
        received(&seen, "x-forwarded-host"),
        ["moodle.example.edu"],
        "the host the student asked the front proxy for"
    );
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways() {
    let node = support::upstream(|request| async move {
        let leaked: Vec<String> = [
            "x-client-hop",
            "keep-alive",
            "proxy-authorization",
            "te",
            "upgrade",
        ]
        .iter()
        .filter(|name| request.headers().contains_key(**name))
        .map(|name| name.to_string())
        .collect();
        Response::builder()
            .header("connection", "x-node-hop")
            .header("x-node-hop", "secret")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("x-leaked", leaked.join(","))
            .body(Body::from("ok"))
            .unwrap()
    })
    .await;
    let gateway = in_front_of(node, "").await;
    let seen = send(
        &gateway.url("/"),
        "GET",
        &[
            ("connection", "x-client-hop"),
            ("x-client-hop", "1"),
            ("keep-alive", "timeout=9"),
            ("proxy-authorization", "Basic eA=="),
            ("te", "trailers"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(
        seen.headers["x-leaked"], "",
        "the node saw no client hop-by-hop header"
    );
    for name in ["x-node-hop", "keep-alive", "proxy-authenticate"] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} reached the student"
        );
    }
}

/// What a browser sends of itself, in its own spelling of the names.
const BROWSER_LINES: [(&str, &str); 15] = [
    (
        "User-Agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0",
    ),
    ("Accept", "text/html,application/xhtml+xml"),
    ("Accept-Language", "pt-PT,pt;q=0.9,en;q=0.5"),
    ("accept-encoding", "gzip, br"),
    ("Referer", "http://moodle.example.edu/my/"),
    ("DNT", "1"),
    ("Priority", "u=0, i"),
    ("Upgrade-Insecure-Requests", "1"),
    ("Sec-Fetch-Dest", "document"),
    ("Sec-Fetch-Mode", "navigate"),
    ("Sec-Fetch-Site", "same-origin"),
    ("SEC-FETCH-USER", "?1"),
    ("Sec-CH-UA", "\"Chromium\";v=\"130\""),
    ("Sec-CH-UA-Mobile", "?0"),
    ("Sec-CH-UA-Platform", "\"Linux\""),
];

/// A request for `/` with a browser's lines and then `more`, as the student sends it.
fn browser_head(more: &str) -> String {
    let mut head = String::from("GET / HTTP/1.1\r\nHost: moodle.example.edu\r\n");
    for (name, value) in BROWSER_LINES {
        head.push_str(&format!("{name}:  {value}\r\n"));
    }
    head + more + "\r\n"
}

/// The lines the echoing node received for `head`, sent on a connection of its own.
async fn echoed(gateway: &TestGateway, head: &str) -> Vec<String> {
    let mut connection = RawConn::connect(gateway.addr).await;
    connection.send(head.as_bytes()).await.unwrap();
    let answer = connection.response(Duration::from_secs(5), false).await;
    let answer = answer.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.head);
    let lines = String::from_utf8(answer.body).unwrap();
    lines.lines().map(str::to_owned).collect()
}

/// The values of the lines named `name` among `lines`, in order.
fn named<'a>(lines: &'a [String], name: &str) -> Vec<&'a str> {
    let prefix = format!("{}: ", name.to_ascii_lowercase());
    lines
        .iter()
        .filter_map(|line| line.strip_prefix(&prefix))
        .collect()
}

/// The lines a browser sends of itself go to the node as the student sent them,
/// around the gateway's header map: each must arrive once, with its value, and
/// lines of one name in their order; so too when there are more of them than pass
/// the map by, and every line goes through it.
#[tokio::test]
async fn a_browsers_own_lines_reach_the_node_once_each() {
    let gateway = in_front_of(echo_upstream().await, "").await;
    let cookie = "Cookie: MoodleSession=abcdefghijklmnopqrstuvwxyz\r\n";
    for accepts in [&["*/*"][..], &["*/*", "text/css", "image/png"]] {
        let more: String = accepts.iter().map(|a| format!("Accept: {a}\r\n")).collect();
        let lines = echoed(&gateway, &browser_head(&(more + cookie))).await;
        for (name, value) in BROWSER_LINES.into_iter().skip(2) {
            assert_eq!(named(&lines, name), [value], "{name} in {lines:?}");
        }
        let mut accept = vec!["text/html,application/xhtml+xml"];
        accept.extend(accepts);
        assert_eq!(named(&lines, "accept"), accept);
        assert_eq!(named(&lines, "user-agent"), [BROWSER_LINES[0].1]);
        assert_eq!(
            named(&lines, "cookie"),
            ["MoodleSession=abcdefghijklmnopqrstuvwxyz"]
        );
        assert_eq!(named(&lines, "host"), ["moodle.example.edu"]);
    }
}

/// Lines of one name keep the student's order when one of them is empty (an empty
/// value goes through the map, and so then does every line).
#[tokio::test]
async fn a_browsers_lines_of_one_name_keep_their_order_when_one_is_empty() {
    let gateway = in_front_of(echo_upstream().await, "").await;
    let head = browser_head("Accept-Encoding: br\r\nAccept-Encoding:\r\n");
    let lines = echoed(&gateway, &head).await;
    assert_eq!(named(&lines, "accept-encoding"), ["gzip, br", "br", ""]);
}

/// A `Connection` line naming one of a browser's lines takes it away, as it does
/// any other: the line is the student's hop's alone.
#[tokio::test]
async fn a_browsers_line_named_by_connection_stays_with_the_hop() {
    let gateway = in_front_of(echo_upstream().await, "").await;
    let head = browser_head("Connection: keep-alive, DNT\r\n");
    let lines = echoed(&gateway, &head).await;
    assert!(named(&lines, "dnt").is_empty(), "{lines:?}");
    assert_eq!(named(&lines, "sec-fetch-user"), ["?1"], "{lines:?}");
}

#[tokio::test]
async fn every_set_cookie_line_reaches_the_browser_byte_for_byte() {
    const LINES: [&str; 3] = [
        "MoodleSession=abcdefghijklmnopqrstuvwxyz; path=/; HttpOnly",
        "MOODLEID1_=%25F1%25F2; expires=Thu, 01-Jan-2099 00:00:00 GMT; path=/",
        "MoodleSession=deleted; expires=Thu, 01-Jan-1970 00:00:01 GMT; Max-Age=0; path=/",
    ];
    let node = support::upstream(|_request| async move {
        let mut response = Response::builder();
        for line in LINES {
            response = response.header("set-cookie", line);
        }
        response.body(Body::empty()).unwrap()
    })
    .await;
    let gateway = in_front_of(node, "").await;
    let seen = support::get(&gateway.url("/login/index.php")).await;
    let got: Vec<&[u8]> = seen
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let want: Vec<&[u8]> = LINES.iter().map(|l| l.as_bytes()).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_nodes_own_lines_reach_the_student_once_whichever_side_writes_the_head() {
    const LINES: [(&str, &str); 6] = [
        ("server", "Apache/2.4"),
        ("date", "Sat, 05 Dec 2026 10:00:00 GMT"),
        ("x-frame-options", "sameorigin"),
        ("x-powered-by", "PHP/8.3"),
        ("content-language", "en"),
        ("content-type", "text/html; charset=utf-8"),
    ];
    let node = support::upstream(|_request| async move {
        let mut response = Response::builder();
        for (name, value) in LINES {
            response = response.header(name, value);
        }
        response.body(Body::from("ok")).unwrap()
    })
    .await;
    let gateway = in_front_of(node, "").await;
    // A plain GET's answer is written by the gateway's own HTTP/1.1 side, a chunked
    // upload's by hyper's: both from the answer's map.
    let plain = support::get(&gateway.url("/")).await;
    let (mut sender, body) = Channel::<Bytes>::new(1);
    let uploader = tokio::spawn(async move {
        sender.send_data(Bytes::from_static(b"a=1")).await.unwrap();
    });
    let chunked = send(&gateway.url("/"), "POST", &[], Body::new(body)).await;
    uploader.await.unwrap();
    for (side, seen) in [("own", plain), ("hyper's", chunked)] {
        assert_eq!(seen.status, 200, "{side}");
        assert_eq!(seen.body, "ok", "{side}");
        for (name, value) in LINES {
            let got: Vec<_> = seen.headers.get_all(name).iter().collect();
            assert_eq!(got, [value], "{name} on the {side} side");
        }
    }
}

#[tokio::test]
async fn keep_alive_connections_to_a_node_are_reused() {
    let connections = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = listener.local_addr().unwrap();
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let service = hyper::service::service_fn(|_request| async {
                Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    let gateway = in_front_of(node, "").await;
    // One browser's connection: a first request from a new one would take only a
    // node connection that has been quiet (`pool::QUIET`).
    let browser = support::client();
    for _ in 0..20 {
        let seen = browser
            .get(gateway.url("/my/").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(seen.status(), 200);
        http_body_util::BodyExt::collect(seen.into_body())
            .await
            .unwrap();
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "one pooled connection served all 20"
    );
}

#[tokio::test]
async fn a_node_that_refuses_connections_is_a_fast_502() {
    let node = support::refused_addr().await;
    let gateway = in_front_of(node, "").await;
    let seen = support::get(&gateway.url("/my/")).await;
    assert_eq!(seen.status, 502);
    assert!(seen.text().starts_with("bad gateway"), "{}", seen.text());
    assert!(
        !seen.text().contains("127.0.0.1"),
        "no upstream address leaks"
    );
}

#[tokio::test]
async fn a_node_that_never_answers_is_a_504_after_the_configured_timeout() {
    let node = support::silent_upstream().await;
    let gateway = in_front_of(node, "[timeouts]\nresponse_headers = \"1s\"\n").await;
    let waited = a_504_after_a_second(&gateway, "/my/").await;
    assert!(waited < Duration::from_secs(20), "no hang");
}

/// Asks `gateway` for `path`, which must be a 504 and come no sooner than its one
/// second of `response_headers`; says how long it took.
async fn a_504_after_a_second(gateway: &TestGateway, path: &str) -> Duration {
    let started = Instant::now();
    let seen = support::get(&gateway.url(path)).await;
    assert_eq!(seen.status, 504, "{path}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "504 before the timeout: {waited:?}"
    );
    waited
}

/// The node connection keeps one timer for every answer it waits for: each answer
/// still gets its own `response_headers` from its own request, on a kept
/// connection too. The second page below would be cut at 1 s after the first one's
/// request if the deadline were not moved; the third, slower than the timeout on
/// the same connection, is still a 504 after the full second (the node would have
/// answered at 1.5 s).
#[tokio::test]
async fn each_answer_on_a_kept_connection_gets_its_own_response_timeout() {
    let node = support::upstream(|request| async move {
        let slow = request.uri().path() == "/slow.php";
        let pause = if slow { 1500 } else { 600 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        Response::new(Body::from("page"))
    })
    .await;
    let gateway = in_front_of(node, "[timeouts]\nresponse_headers = \"1s\"\n").await;
    for page in ["/my/", "/course/view.php"] {
        let seen = support::get(&gateway.url(page)).await;
        assert_eq!(seen.status, 200, "{page} answered in 0.6 s of its own 1 s");
    }
    a_504_after_a_second(&gateway, "/slow.php").await;
}

#[tokio::test]
async fn an_ambiguous_path_is_refused_before_any_node_sees_it() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let node = support::upstream(move |_request| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Response::new(Body::empty()) }
    })
    .await;
    let gateway = in_front_of(node, "").await;
    for path in [
        "/pluginfile.php/1/mod_scorm%2Fcontent/1/x",
        "/a/%00/b.php",
        "/a%5Cb.php",
    ] {
        assert_eq!(support::get(&gateway.url(path)).await.status, 400, "{path}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_upload_slower_than_the_response_timeout_still_gets_its_answer() {
    // PHP answers only after reading the whole upload, so the wait for the response
    // head starts when the body has been sent, not when the request started.
    let node = support::upstream(|request| async move {
        let body = request.into_body().collect().await.unwrap().to_bytes();
        Response::new(Body::from(format!("stored {} bytes", body.len())))
    })
    .await;
    let gateway = in_front_of(node, "[timeouts]\nresponse_headers = \"1s\"\n").await;
    let (mut sender, body) = Channel::<Bytes>::new(1);
    tokio::spawn(async move {
        for _ in 0..5 {
            sender
                .send_data(Bytes::from(vec![b'z'; 1000]))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let started = Instant::now();
    let seen = send(
        &gateway.url("/mod/scorm/upload.php"),
        "POST",
        &[],
        Body::new(body),
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the upload took its time"
    );
    assert_eq!(seen.status, 200, "{}", seen.text());
    assert_eq!(seen.text(), "stored 5000 bytes");
}

#[tokio::test]
async fn a_node_that_stalls_mid_body_has_the_students_connection_cut_not_left_hanging() {
    let node = support::upstream(|_request| async move {
        let (mut sender, body) = Channel::<Bytes>::new(1);
        tokio::spawn(async move {
            sender
                .send_data(Bytes::from_static(b"first tenth"))
                .await
                .unwrap();
            // ... and the rest never comes, while the node keeps the connection open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(sender);
        });
        Response::builder()
            .header("content-length", "110")
            .body(Body::new(body))
            .unwrap()
    })
    .await;
    let gateway = in_front_of(node, "[timeouts]\nbody_idle = \"1s\"\n").await;
    let response = support::client()
        .get(gateway.url("/mod/resource/view.php?id=7").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the gateway ended the body instead of hanging");
    assert!(body.is_err(), "a truncated body must not look complete");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn an_upload_that_stops_arriving_is_answered_408() {
    let node = support::upstream(|request| async move {
        let body = request.into_body().collect().await;
        Response::new(Body::from(format!("node read the body: {}", body.is_ok())))
    })
    .await;
    let gateway = in_front_of(node, "[timeouts]\nbody_idle = \"1s\"\n").await;
    let (mut sender, body) = Channel::<Bytes>::new(1);
    let stalled = tokio::spawn(async move {
        sender
            .send_data(Bytes::from_static(b"part of an upload"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(sender);
    });
    let request = http::Request::post(gateway.url("/repository/repository_ajax.php"))
        .header("content-length", "100000")
        .body(Body::new(body))
        .unwrap();
    let response =
        tokio::time::timeout(Duration::from_secs(20), support::client().request(request))
            .await
            .expect("the gateway answered instead of waiting for ever")
            .unwrap();
    assert_eq!(response.status(), 408);
    stalled.abort();
}

/// A file of `length` bytes (see [`support::patterned`]).
fn large_file(length: usize) -> Bytes {
    Bytes::from(support::patterned(length))
}

/// An upstream that answers every request with `file`, sized.
async fn serving_file(file: Bytes) -> std::net::SocketAddr {
    support::upstream(move |_request| {
        let file = file.clone();
        async move {
            Response::builder()
                .header("content-length", file.len())
                .body(Body::from(file))
                .unwrap()
        }
    })
    .await
}

/// A large file takes the kernel's way from the upstream's socket to the student's (a
/// pipe, see `http::body::splice`), past every layer a node's body passes: it arrives
/// byte for byte, twice on one kept connection, and the access log counts every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_arrives_whole_twice_on_one_connection_and_the_log_counts_every_byte() {
    const LENGTH: usize = 3 << 20;
    let file = large_file(LENGTH);
    let node = serving_file(file.clone()).await;
    let data = serving_file(file.clone()).await;
    let dir = std::env::temp_dir().join(format!("mg-splice-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = support::TempDir(dir.clone());
    let log = dir.join("access.log");
    let extra = format!("[access_log]\nto = {:?}\n", log.display().to_string());
    let gateway = TestGateway::start(&config_for(&[node], data, &extra)).await;
    let mut conn = support::RawConn::connect(gateway.addr).await;
    for _ in 0..2 {
        conn.send(b"GET /pluginfile.php/42/mod_scorm/content/1/big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let response = conn.response(Duration::from_secs(10), false).await.unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-length"), Some("3145728"));
        assert!(response.complete, "cut after {} bytes", response.body.len());
        assert!(response.body == file, "the file arrived changed");
    }
    let lines = support::lines_of(&log, 2).await;
    for line in &lines {
        assert!(line.contains("\" 200 3145728 \""), "{line}");
    }
}

/// The pipes a process holds, read from `/proc`.
fn pipes_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("pipe:"))
        .count()
}

/// A student stalled halfway through a large file holds a pipe in the kernel, not
/// the file's bytes in the gateway; the pipe is closed when the student leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_large_download_holds_a_pipe_until_the_student_leaves() {
    let file = large_file(64 << 20);
    let node = serving_file(file.clone()).await;
    let data = serving_file(file).await;
    let gateway = support::start_binary(&config_for(&[node], data, ""));
    let pid = gateway.child.id();
    let before = pipes_of(pid);
    let mut conn = support::RawConn::connect(gateway.addr).await;
    conn.send(
        b"GET /pluginfile.php/42/mod_scorm/content/1/big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await
    .unwrap();
    // Never read: the student's socket fills, and the pipe holds what came after.
    let mut during = before;
    for _ in 0..100 {
        during = pipes_of(pid);
        if during >= before + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        during >= before + 2,
        "no pipe's two ends while the file streams"
    );
    // Full when the student leaves, so closed rather than kept for the next answer.
    drop(conn);
    let mut after = during;
    for _ in 0..100 {
        after = pipes_of(pid);
        if after <= before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        after <= before,
        "the pipe outlived the download: {after} > {before}"
    );
}
