//! Moodle's revisioned assets from the gateway's memory, over real sockets: one node
//! request however many students ask at once, the answer as Moodle sent it with an
//! `Age`, a 304 to the browser's condition, and nothing kept that Moodle did not mark
//! for sharing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::support::{self, config_for, named_upstream, send, RawConn, TestGateway};

/// A real past theme revision.
const STYLES: &str = "/theme/styles.php/boost/1700000000_1/all";
const CSS: &str = "body { color: #0f6cbf }";

/// A node whose theme script takes a while (as a first CSS build does), counts
/// what reaches it, and sets a cookie on `cookie_path` only.
async fn node(hits: Arc<AtomicUsize>, cookie_path: &'static str) -> std::net::SocketAddr {
    support::upstream(move |request: Request<Incoming>| {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(150)).await;
            let mut response = Response::builder()
                .header("x-upstream", "web1")
                .header("cache-control", "public, max-age=7776000, immutable")
                .header("content-type", "text/css; charset=utf-8")
                .header("etag", "\"boost-all\"")
                .header("last-modified", "Tue, 01 Dec 2026 09:00:00 GMT");
            if request.uri().path().starts_with(cookie_path) {
                response = response.header("set-cookie", "MoodleSession=abc; path=/");
            }
            response.body(Body::from(CSS)).unwrap()
        }
    })
    .await
}

async fn gateway(node: std::net::SocketAddr, extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_first_visits_at_once_cost_one_node_request_and_get_moodles_bytes() {
    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(node(hits.clone(), "/never").await, "").await;
    let url = gateway.url(STYLES);
    let visits: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { send(&url, "GET", &[], Body::empty()).await })
        })
        .collect();
    for visit in visits {
        let seen = visit.await.unwrap();
        assert_eq!(seen.status, StatusCode::OK);
        assert_eq!(seen.body.as_ref(), CSS.as_bytes());
        assert_eq!(seen.headers["etag"], "\"boost-all\"");
        assert_eq!(seen.headers["content-type"], "text/css; charset=utf-8");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "one node request for twenty visits"
    );
    let later = send(&url, "GET", &[], Body::empty()).await;
    assert!(later.headers.contains_key("age"), "from memory");
    assert_eq!(
        later.headers["x-upstream"], "web1",
        "the node's own lines, kept with its answer"
    );
    let revisit = send(
        &url,
        "GET",
        &[("if-none-match", "\"boost-all\"")],
        Body::empty(),
    )
    .await;
    assert_eq!(revisit.status, StatusCode::NOT_MODIFIED);
    let head = send(&url, "HEAD", &[], Body::empty()).await;
    assert_eq!(
        (
            head.status,
            head.headers["content-length"].to_str().unwrap()
        ),
        (StatusCode::OK, "23")
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let cache = gateway.app.gateway().asset_cache().now();
    assert_eq!((cache.entries, cache.fills, cache.misses), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_cookie_designer_mode_or_a_cache_turned_off_always_reaches_the_node() {
    let hits = Arc::new(AtomicUsize::new(0));
    let cookies = gateway(node(hits.clone(), "/theme/").await, "").await;
    for _ in 0..2 {
        let seen = send(&cookies.url(STYLES), "GET", &[], Body::empty()).await;
        assert_eq!(seen.status, StatusCode::OK);
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "an answer with Set-Cookie is never kept"
    );

    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(node(hits.clone(), "/never").await, "").await;
    for _ in 0..2 {
        send(
            &gateway.url("/theme/styles.php/boost/-1/all"),
            "GET",
            &[],
            Body::empty(),
        )
        .await;
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "revision -1: theme designer mode"
    );

    let hits = Arc::new(AtomicUsize::new(0));
    let off = gateway_off(node(hits.clone(), "/never").await).await;
    for _ in 0..2 {
        send(&off.url(STYLES), "GET", &[], Body::empty()).await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 2, "[cache] enabled = false");
}

async fn gateway_off(node: std::net::SocketAddr) -> TestGateway {
    gateway(node, "[cache]\nenabled = false\n").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_hit_takes_no_slot_on_a_node_at_its_cap() {
    let hits = Arc::new(AtomicUsize::new(0));
    let node = node(hits.clone(), "/never").await;
    let gateway = gateway(node, "[surge]\nmax_active = 1\nwaiting_room = false\n").await;
    send(&gateway.url(STYLES), "GET", &[], Body::empty()).await;
    // The node's one slot is busy with a slow page…
    let busy = gateway.url("/course/view.php?id=2");
    let page = tokio::spawn(async move { send(&busy, "GET", &[], Body::empty()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // …and the asset comes from memory while the page is still on the node.
    let asset = send(&gateway.url(STYLES), "GET", &[], Body::empty()).await;
    assert_eq!(asset.status, StatusCode::OK);
    assert!(
        !page.is_finished(),
        "the asset did not wait for the node's slot"
    );
    assert_eq!(page.await.unwrap().status, StatusCode::OK);
    assert_eq!(hits.load(Ordering::SeqCst), 2, "the fill and the page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_says_which_answer_came_from_memory() {
    let dir = std::env::temp_dir().join(format!("mg-cache-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = support::TempDir(dir);
    let file = dir.0.join("access.log");
    let hits = Arc::new(AtomicUsize::new(0));
    let extra = format!("[access_log]\nto = {:?}\n", file.display().to_string());
    let gateway = gateway(node(hits, "/never").await, &extra).await;
    // The browser's lines pass the gateway's header map by; the log still reads them.
    let browser = [
        ("referer", "http://moodle.example.edu/my/"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0",
        ),
    ];
    for _ in 0..2 {
        send(&gateway.url(STYLES), "GET", &browser, Body::empty()).await;
    }
    let lines = support::lines_of(&file, 2).await;
    assert!(lines[0].contains(" upstream=web1 "), "{}", lines[0]);
    assert!(lines[1].contains(" upstream=cache "), "{}", lines[1]);
    let said = "\"http://moodle.example.edu/my/\" \"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0\"";
    for line in &lines {
        assert!(line.contains(said), "{line}");
    }
}

/// The node's CSS as PHP's `zlib.output_compression` sends it.
fn gzipped_css() -> Vec<u8> {
    support::gzip(CSS.as_bytes())
}

/// Every browser's `Accept-Encoding`, however spelt, costs the node one run: the
/// fill asks for gzip, and the one gzip copy answers each browser in a coding it
/// takes (gunzipped for those that take no gzip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gzip_copy_answers_every_coding_after_one_node_run() {
    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(php_node(hits.clone(), true).await, "").await;
    let url = gateway.url(STYLES);
    let asking = |coding: &'static str| {
        let url = url.clone();
        async move { send(&url, "GET", &[("accept-encoding", coding)], Body::empty()).await }
    };
    let plain = asking("identity").await;
    assert_eq!(
        plain.body.as_ref(),
        CSS.as_bytes(),
        "gunzipped as it streams"
    );
    assert!(!plain.headers.contains_key("content-encoding"));
    assert!(!plain.headers.contains_key("age"), "it filled the entry");
    for coding in ["gzip", "gzip, deflate, br, zstd", "deflate, gzip", "x-gzip"] {
        let zipped = asking(coding).await;
        assert_eq!(zipped.headers["content-encoding"], "gzip", "{coding}");
        assert_eq!(
            zipped.body.as_ref(),
            gzipped_css(),
            "{coding}: the node's own bytes"
        );
        assert!(zipped.headers.contains_key("age"), "{coding}: from memory");
    }
    // A browser taking brotli only gets the copy gunzipped, then compressed again.
    let brotli = asking("br").await;
    assert_eq!(brotli.headers["content-encoding"], "br");
    assert!(brotli.headers.contains_key("age"), "br: from memory");
    for coding in ["identity", "deflate", "gzip;q=0"] {
        let plain = asking(coding).await;
        assert_eq!(plain.body.as_ref(), CSS.as_bytes(), "{coding}");
        assert!(plain.headers.contains_key("age"), "{coding}: from memory");
        assert_eq!(plain.headers["vary"], "Accept-Encoding");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1, "one node run in all");
    assert_eq!(gateway.app.gateway().asset_cache().now().entries, 1);
}

/// A node that compresses as PHP's `zlib.output_compression` does: when the
/// `Accept-Encoding` lines, joined as the web server joins them, hold `gzip`.
/// With `vary` false its web server forgets to say `Vary: Accept-Encoding`.
async fn php_node(hits: Arc<AtomicUsize>, vary: bool) -> std::net::SocketAddr {
    support::upstream(move |request: Request<Incoming>| {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            let joined = (request.headers().get_all("accept-encoding").iter())
                .map(|v| v.to_str().unwrap())
                .collect::<Vec<_>>()
                .join(", ");
            let gzip = joined.contains("gzip");
            let body = match gzip {
                true => gzipped_css(),
                false => CSS.as_bytes().to_vec(),
            };
            let mut response = Response::builder()
                .header("cache-control", "public, max-age=7776000, immutable")
                .header("content-type", "text/css; charset=utf-8")
                .header("x-content-type-options", "nosniff")
                .header("strict-transport-security", "max-age=31536000")
                .header("access-control-allow-origin", "*")
                .header("accept-ranges", "none");
            if gzip {
                response = response.header("content-encoding", "gzip");
            }
            if gzip && vary {
                response = response.header("vary", "Accept-Encoding");
            }
            response.body(Body::from(body)).unwrap()
        }
    })
    .await
}

/// The review's poisoning: an empty `Accept-Encoding` line, then `gzip`. The node
/// reads both and compresses; a browser that sends none must still get plain bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accept_encoding_lines_never_give_gzip_to_a_browser_that_sent_none() {
    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(php_node(hits.clone(), true).await, "").await;
    let mut raw = RawConn::connect(gateway.addr).await;
    let head = format!(
        "GET {STYLES} HTTP/1.1\r\nHost: {}\r\nAccept-Encoding: \r\nAccept-Encoding: gzip\r\n\r\n",
        gateway.addr
    );
    raw.send(head.as_bytes()).await.unwrap();
    let first = raw.response(Duration::from_secs(5), false).await.unwrap();
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    for _ in 0..2 {
        let plain = send(&gateway.url(STYLES), "GET", &[], Body::empty()).await;
        assert_eq!(plain.status, StatusCode::OK);
        assert!(!plain.headers.contains_key("content-encoding"));
        assert_eq!(plain.body.as_ref(), CSS.as_bytes(), "identity bytes");
    }
    let zipped = send(
        &gateway.url(STYLES),
        "GET",
        &[("accept-encoding", "gzip, deflate, br")],
        Body::empty(),
    )
    .await;
    assert_eq!(zipped.body.as_ref(), gzipped_css());
    assert!(
        zipped.headers.contains_key("age"),
        "the first one's, from memory"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "one gzip copy for every coding"
    );
}

/// A gzip answer kept without `Vary` (a web server that forgot it) goes as it is
/// only to browsers that accept gzip; PHP compresses for `gzip;q=0` (its search
/// reads no q-value), and the gateway never answers that browser with gzip bytes:
/// every other browser gets the copy gunzipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_coding_goes_only_to_a_browser_that_accepts_it() {
    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(php_node(hits.clone(), false).await, "").await;
    let url = gateway.url(STYLES);
    let asking = |coding: &'static str| {
        let url = url.clone();
        async move { send(&url, "GET", &[("accept-encoding", coding)], Body::empty()).await }
    };
    assert_eq!(asking("gzip").await.body.as_ref(), gzipped_css());
    assert!(asking("gzip").await.headers.contains_key("age"), "kept");
    for refusing in ["identity", "deflate", "gzip;q=0"] {
        let seen = asking(refusing).await;
        assert!(!seen.headers.contains_key("content-encoding"), "{refusing}");
        assert_eq!(seen.body.as_ref(), CSS.as_bytes(), "{refusing}: gunzipped");
    }
    let plain = send(&url, "GET", &[], Body::empty()).await;
    assert_eq!(plain.body.as_ref(), CSS.as_bytes());
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the node answered once");
}

/// What the node's web server adds (security headers, CORS, ranges) reaches the
/// browser on a hit as it did on the fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_keeps_the_nodes_security_and_site_headers() {
    let hits = Arc::new(AtomicUsize::new(0));
    let gateway = gateway(php_node(hits.clone(), true).await, "").await;
    send(&gateway.url(STYLES), "GET", &[], Body::empty()).await;
    let hit = send(&gateway.url(STYLES), "GET", &[], Body::empty()).await;
    assert!(hit.headers.contains_key("age"), "from memory");
    assert_eq!(hit.headers["x-content-type-options"], "nosniff");
    assert_eq!(hit.headers["strict-transport-security"], "max-age=31536000");
    assert_eq!(hit.headers["access-control-allow-origin"], "*");
    assert_eq!(hit.headers["accept-ranges"], "none");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
