//! Compression over real sockets: what a node left uncompressed reaches a browser
//! that accepts gzip or brotli compressed, and every answer the rules keep as it is
//! (a range, a body already encoded, a tiny one, an image, a file offered in byte
//! ranges, a HEAD) arrives byte for byte as the node sent it.

use std::io::Read;
use std::net::SocketAddr;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::support::{self, config_for, gunzip, gzip, named_upstream, send, Seen, TestGateway};

/// Moodle's login page, as large as the real one (22 KB), sent plain.
fn login_page() -> String {
    let mut page = String::from("<!DOCTYPE html><html><head><title>Log in to the site</title>");
    while page.len() < 22_000 {
        page.push_str(
            "<div class=\"login-form-username mb-3\"><label for=\"username\">Username</label>",
        );
        page.push_str("<input type=\"text\" name=\"username\" class=\"form-control\"></div>\n");
    }
    page
}

/// A node that answers each path as a Moodle (or its web server) would.
async fn node() -> SocketAddr {
    support::upstream(|request: Request<Incoming>| async move {
        let path = request.uri().path().to_owned();
        let answer = Response::builder().header("x-upstream", "web1");
        let page = |answer: http::response::Builder| {
            answer
                .header("content-type", "text/html; charset=utf-8")
                .header(
                    "cache-control",
                    "private, pre-check=0, post-check=0, max-age=0, no-transform",
                )
                .header("etag", "\"login\"")
        };
        match path.as_str() {
            "/login/index.php" => page(answer).body(Body::from(login_page())),
            "/vary/index.php" => page(answer)
                .header("vary", "Accept-Encoding")
                .body(Body::from(login_page())),
            "/cookie/index.php" => page(answer)
                .header("vary", "Cookie")
                .body(Body::from(login_page())),
            "/zipped/index.php" => page(answer)
                .header("content-encoding", "gzip")
                .body(Body::from(gzip(login_page().as_bytes()))),
            "/tiny/index.php" => page(answer)
                .header("content-length", "11")
                .body(Body::from("<p>tiny</p>")),
            "/pix/photo.jpg" => answer
                .header("content-type", "image/jpeg")
                .body(Body::from(login_page())),
            "/pluginfile.php/1/mod_resource/content/notes.html" => page(answer)
                .header("accept-ranges", "bytes")
                .body(Body::from(login_page())),
            "/ranged/index.php" => {
                let range = request.headers().get("range").cloned();
                let answer = page(answer).status(StatusCode::PARTIAL_CONTENT);
                let answer = answer.header("content-range", "bytes 0-99/22000");
                let _ = range.expect("the Range line reached the node");
                answer.body(Body::from(login_page()[..100].to_owned()))
            }
            _ => answer.status(404).body(Body::empty()),
        }
        .unwrap()
    })
    .await
}

async fn gateway(extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node().await], data, extra)).await
}

fn gzip_from(gateway: &TestGateway, path: &str) -> impl std::future::Future<Output = Seen> {
    let url = gateway.url(path);
    async move {
        send(
            &url,
            "GET",
            &[("accept-encoding", "gzip, deflate")],
            Body::empty(),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_the_node_left_plain_arrives_gzipped_and_decodes_to_the_same_bytes() {
    let gateway = gateway("").await;
    let zipped = gzip_from(&gateway, "/login/index.php").await;
    assert_eq!(zipped.status, StatusCode::OK);
    assert_eq!(zipped.headers["content-encoding"], "gzip");
    assert!(!zipped.headers.contains_key("content-length"), "chunked");
    assert_eq!(zipped.headers["vary"], "accept-encoding");
    assert_eq!(
        zipped.headers["etag"], "W/\"login\"",
        "weak, as nginx makes it"
    );
    assert_eq!(zipped.headers["x-upstream"], "web1");
    assert_eq!(gunzip(&zipped.body), login_page().as_bytes());
    assert!(
        zipped.body.len() * 4 < login_page().len(),
        "{} bytes",
        zipped.body.len()
    );

    let plain = send(&gateway.url("/login/index.php"), "GET", &[], Body::empty()).await;
    assert!(!plain.headers.contains_key("content-encoding"));
    assert_eq!(plain.headers["etag"], "\"login\"");
    assert_eq!(plain.body.as_ref(), login_page().as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_that_offers_brotli_gets_brotli() {
    let gateway = gateway("").await;
    let asked = [("accept-encoding", "gzip, deflate, br, zstd")];
    let seen = send(
        &gateway.url("/login/index.php"),
        "GET",
        &asked,
        Body::empty(),
    )
    .await;
    assert_eq!(seen.headers["content-encoding"], "br");
    let mut plain = Vec::new();
    brotli::Decompressor::new(&seen.body[..], 4096)
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, login_page().as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_names_accept_encoding_once_beside_the_nodes_own() {
    let gateway = gateway("").await;
    let vary = |seen: &Seen| -> Vec<String> {
        (seen.headers.get_all("vary").iter())
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let already = gzip_from(&gateway, "/vary/index.php").await;
    assert_eq!(already.headers["content-encoding"], "gzip");
    assert_eq!(vary(&already), ["Accept-Encoding"]);
    let cookie = gzip_from(&gateway, "/cookie/index.php").await;
    assert_eq!(vary(&cookie), ["Cookie", "accept-encoding"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_rules_keep_arrives_exactly_as_the_node_sent_it() {
    let gateway = gateway("").await;
    let zipped = gzip_from(&gateway, "/zipped/index.php").await;
    assert_eq!(zipped.headers["content-encoding"], "gzip");
    assert_eq!(
        gunzip(&zipped.body),
        login_page().as_bytes(),
        "not compressed twice"
    );

    let tiny = gzip_from(&gateway, "/tiny/index.php").await;
    assert!(!tiny.headers.contains_key("content-encoding"));
    assert_eq!(tiny.headers["content-length"], "11");
    assert_eq!(tiny.body.as_ref(), b"<p>tiny</p>");

    for path in [
        "/pix/photo.jpg",
        "/pluginfile.php/1/mod_resource/content/notes.html",
    ] {
        let seen = gzip_from(&gateway, path).await;
        assert!(!seen.headers.contains_key("content-encoding"), "{path}");
        assert!(!seen.headers.contains_key("vary"), "{path}");
        assert_eq!(seen.body.as_ref(), login_page().as_bytes(), "{path}");
    }

    let ranged = send(
        &gateway.url("/ranged/index.php"),
        "GET",
        &[("accept-encoding", "gzip"), ("range", "bytes=0-99")],
        Body::empty(),
    )
    .await;
    assert_eq!(ranged.status, StatusCode::PARTIAL_CONTENT);
    assert!(!ranged.headers.contains_key("content-encoding"));
    assert_eq!(ranged.body.as_ref(), &login_page().as_bytes()[..100]);

    let head = send(
        &gateway.url("/login/index.php"),
        "HEAD",
        &[("accept-encoding", "gzip")],
        Body::empty(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(!head.headers.contains_key("content-encoding"));
    assert!(!head.headers.contains_key("vary"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_compression_off_or_no_transform_honoured_pages_go_plain() {
    for extra in [
        "[compression]\nenabled = false",
        "[compression]\nhonour_no_transform = true",
    ] {
        let gateway = gateway(extra).await;
        let seen = gzip_from(&gateway, "/login/index.php").await;
        assert!(!seen.headers.contains_key("content-encoding"), "{extra}");
        assert_eq!(seen.body.as_ref(), login_page().as_bytes(), "{extra}");
    }
}

/// A node whose one page is `total` bytes of text streamed in 64 KiB pieces.
async fn streaming_node(total: usize) -> SocketAddr {
    support::upstream(move |_request: Request<Incoming>| async move {
        let pieces = futures_util::stream::iter((0..total.div_ceil(65_536)).map(move |i| {
            let piece = report_text(i * 65_536, (total - i * 65_536).min(65_536));
            Ok::<_, std::io::Error>(Bytes::from(piece))
        }));
        Response::builder()
            .header("content-type", "text/csv")
            .body(Body::from_stream(pieces))
            .unwrap()
    })
    .await
}

/// `len` bytes of a grade report starting at `from`: compressible, and every byte
/// telling where it belongs.
fn report_text(from: usize, len: usize) -> Vec<u8> {
    (from..from + len)
        .map(|i| b"student,quiz 1,quiz 2,total\n0123456789"[i % 37 + (i / 37) % 2])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_streamed_answer_decompresses_to_the_same_bytes() {
    let total = 20 << 20;
    let data = named_upstream("data").await;
    let extra = "[compression]\ntypes = [\"text/csv\"]";
    let gateway =
        TestGateway::start(&config_for(&[streaming_node(total).await], data, extra)).await;
    let zipped = gzip_from(&gateway, "/grade/export/txt/dump.php").await;
    assert_eq!(zipped.headers["content-encoding"], "gzip");
    let plain = gunzip(&zipped.body);
    assert_eq!(plain.len(), total);
    assert!(plain == report_text(0, total), "the same bytes, in order");
}

/// A node that sends the first part of its answer, then waits to be told to end it
/// (a long poll, a report flushed as it is built).
async fn pausing_node(go_on: mpsc::Sender<oneshot::Sender<()>>) -> SocketAddr {
    let go_on = std::sync::Arc::new(Mutex::new(go_on));
    support::upstream(move |_request: Request<Incoming>| {
        let go_on = go_on.clone();
        async move {
            let (tell, told) = oneshot::channel();
            go_on.lock().await.send(tell).await.unwrap();
            let first = Ok::<_, std::io::Error>(Bytes::from(login_page()));
            let rest = async move {
                let _ = told.await;
                Ok(Bytes::from("<p>the rest</p>"))
            };
            let pieces =
                futures_util::stream::iter([first]).chain(futures_util::stream::once(rest));
            Response::builder()
                .header("content-type", "text/html")
                .body(Body::from_stream(pieces))
                .unwrap()
        }
    })
    .await
}

use futures_util::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_node_has_sent_reaches_the_browser_while_the_node_is_still_working() {
    let (go_on, mut asked) = mpsc::channel(1);
    let data = named_upstream("data").await;
    let gateway = TestGateway::start(&config_for(&[pausing_node(go_on).await], data, "")).await;
    let request = Request::get(gateway.url("/message/index.php"))
        .header("accept-encoding", "gzip")
        .body(Body::empty())
        .unwrap();
    let response = support::client().request(request).await.unwrap();
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let tell = asked.recv().await.unwrap();
    // The node has not ended its answer: its first part must arrive anyway.
    let mut body = response.into_body();
    let mut zipped = Vec::new();
    let mut plain = Vec::new();
    while plain.len() < login_page().len() {
        let frame = body.frame().await.unwrap().unwrap();
        zipped.extend_from_slice(&frame.into_data().unwrap());
        plain.clear();
        let _ = flate2::read::GzDecoder::new(&zipped[..]).read_to_end(&mut plain);
    }
    assert_eq!(plain, login_page().as_bytes());
    tell.send(()).unwrap();
    while let Some(frame) = body.frame().await {
        zipped.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    let whole = login_page() + "<p>the rest</p>";
    assert_eq!(gunzip(&zipped), whole.as_bytes());
}
