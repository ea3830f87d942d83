//! The file offload (`[offload]`): a PHP node that has checked the student answers
//! `X-Accel-Redirect`, and the student gets the bytes from the data server's file
//! export under the node's headers. Real sockets on both sides: a node that speaks as
//! Moodle's `readfile_accel()` does, and an export that ranges like nginx.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, config_for, named_upstream, send, TestGateway};

const HOST: &str = "moodle.example.edu";
const HASH: &str = "3b8f0c1e9d2a7f4b5c6d7e8f9a0b1c2d3e4f5a6b";
const SCORM: &str = "/pluginfile.php/27/mod_scorm/content/1/shared/launchpage.html";

/// The stored file's bytes: long enough to range, and never mistaken for a page.
fn stored() -> Vec<u8> {
    support::patterned(5000)
}

/// What the export received: method, target and headers of each request.
type Seen = Arc<Mutex<Vec<(String, String, HeaderMap)>>>;

/// A plain file export in front of a dataroot holding one file at `/dataroot/filedir/…`:
/// it labels everything `application/octet-stream` and ranges a single `bytes=a-b`.
async fn export() -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    let addr = support::upstream(move |request: Request<Incoming>| {
        let log = log.clone();
        async move {
            let target = request.uri().to_string();
            let range = request.headers().get("range").cloned();
            log.lock().unwrap().push((
                request.method().to_string(),
                target.clone(),
                request.headers().clone(),
            ));
            if target != format!("/dataroot/filedir/3b/8f/{HASH}") {
                return Response::builder()
                    .status(404)
                    .body(Body::from("nope"))
                    .unwrap();
            }
            let file = stored();
            let builder = Response::builder()
                .header("content-type", "application/octet-stream")
                .header("etag", "\"export-etag\"");
            let Some(range) = range else {
                return builder.body(Body::from(file)).unwrap();
            };
            let (from, to) = range.to_str().unwrap()["bytes=".len()..]
                .split_once('-')
                .map(|(a, b)| (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()))
                .unwrap();
            if from >= file.len() {
                return builder
                    .status(416)
                    .header("content-range", format!("bytes */{}", file.len()))
                    .body(Body::empty())
                    .unwrap();
            }
            builder
                .status(206)
                .header("content-range", format!("bytes {from}-{to}/{}", file.len()))
                .body(Body::from(file[from..=to].to_vec()))
                .unwrap()
        }
    })
    .await;
    (addr, seen)
}

/// What the node received, so a test can see what reached PHP.
type Asked = Arc<Mutex<Vec<HeaderMap>>>;

/// A PHP node with Moodle's accelerated answer: the file's headers, `X-Accel-Redirect`
/// naming `accel`, the session cookie, and no bytes. Pages without a file get `ok`.
async fn node(accel: &'static str) -> (SocketAddr, Asked) {
    let asked = Asked::default();
    let log = asked.clone();
    let addr = support::upstream(move |request: Request<Incoming>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(request.headers().clone());
            let path = request.uri().path().to_owned();
            if !path.starts_with("/pluginfile.php/") {
                return Response::builder()
                    .header("x-upstream", "web1")
                    .header(
                        "set-cookie",
                        "MoodleSession=abcdefghijklmnopqrstuvwxyz; path=/",
                    )
                    .body(Body::from("ok"))
                    .unwrap();
            }
            Response::builder()
                .header("x-upstream", "web1")
                .header("content-type", "text/html")
                .header(
                    "content-disposition",
                    "inline; filename=\"launchpage.html\"",
                )
                .header("cache-control", "private, max-age=7776000, immutable")
                .header("etag", format!("\"{HASH}\""))
                .header("last-modified", "Tue, 01 Dec 2026 09:00:00 GMT")
                .header("x-accel-redirect", accel)
                .header("x-accel-buffering", "no")
                .body(Body::empty())
                .unwrap()
        }
    })
    .await;
    (addr, asked)
}

const ACCEL: &str = "/dataroot/filedir/3b/8f/3b8f0c1e9d2a7f4b5c6d7e8f9a0b1c2d3e4f5a6b";

async fn gateway(node: SocketAddr, export: SocketAddr) -> TestGateway {
    let data = named_upstream("data").await;
    let extra = format!(
        "[session]\nstore = \"node-local\"\n[offload]\nurl = \"http://{export}\"\nprefix = \"/dataroot/\"\n"
    );
    TestGateway::start(&config_for(&[node], data, &extra)).await
}

fn get(
    gateway: &TestGateway,
    path: &str,
    headers: &[(&str, &str)],
) -> (String, Vec<(String, String)>) {
    let mut all = vec![("host".to_owned(), HOST.to_owned())];
    all.extend(headers.iter().map(|(n, v)| (n.to_string(), v.to_string())));
    (gateway.url(path), all)
}

async fn fetch(
    gateway: &TestGateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> support::Seen {
    let (url, headers) = get(gateway, path, headers);
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    send(&url, method, &headers, Body::empty()).await
}

fn no_accel_header(headers: &HeaderMap) -> bool {
    !headers.keys().any(|n| n.as_str().starts_with("x-accel-"))
}

#[tokio::test]
async fn a_file_the_node_authorises_comes_from_the_export_under_the_nodes_headers() {
    let (export, exported) = export().await;
    let (node, _) = node(ACCEL).await;
    let gateway = gateway(node, export).await;

    let seen = fetch(&gateway, "GET", SCORM, &[("if-none-match", "\"old\"")]).await;
    assert_eq!(seen.status, StatusCode::OK);
    assert_eq!(seen.body.as_ref(), stored().as_slice(), "the stored bytes");
    let h = &seen.headers;
    assert_eq!(
        h["content-type"], "text/html",
        "the node's type, not the export's"
    );
    assert_eq!(h["etag"], format!("\"{HASH}\"").as_str());
    assert_eq!(h["cache-control"], "private, max-age=7776000, immutable");
    assert_eq!(
        h["content-disposition"],
        "inline; filename=\"launchpage.html\""
    );
    assert_eq!(h["content-length"], "5000", "the export's length");
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(h["x-upstream"], "web1", "the node that checked the student");
    assert!(no_accel_header(h), "{h:?}");
    for name in ["date", "accept-ranges", "content-length"] {
        assert_eq!(h.get_all(name).iter().count(), 1, "one {name}: {h:?}");
    }

    let exported = exported.lock().unwrap();
    assert_eq!(exported.len(), 1);
    let (method, target, headers) = &exported[0];
    assert_eq!((method.as_str(), target.as_str()), ("GET", ACCEL));
    assert!(
        !headers.contains_key("if-none-match") && !headers.contains_key("cookie"),
        "the export sees no condition and no credential: {headers:?}"
    );
}

#[tokio::test]
async fn the_gateway_ranges_for_php_and_if_range_judges_against_the_nodes_etag() {
    let (export, _) = export().await;
    let (node, _) = node(ACCEL).await;
    let gateway = gateway(node, export).await;

    let part = fetch(&gateway, "GET", SCORM, &[("range", "bytes=0-99")]).await;
    assert_eq!(part.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(part.body.as_ref(), &stored()[..100]);
    assert_eq!(part.headers["content-range"], "bytes 0-99/5000");
    assert_eq!(part.headers["content-length"], "100");

    let current = format!("\"{HASH}\"");
    let same = fetch(
        &gateway,
        "GET",
        SCORM,
        &[("range", "bytes=100-199"), ("if-range", &current)],
    )
    .await;
    assert_eq!(same.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(same.body.as_ref(), &stored()[100..200]);

    let changed = fetch(
        &gateway,
        "GET",
        SCORM,
        &[("range", "bytes=0-99"), ("if-range", "\"old\"")],
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "a changed file comes whole");
    assert_eq!(changed.body.len(), 5000);

    let beyond = fetch(&gateway, "GET", SCORM, &[("range", "bytes=9000-9100")]).await;
    assert_eq!(beyond.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(beyond.headers["content-range"], "bytes */5000");
}

#[tokio::test]
async fn head_gets_the_files_length_and_no_body() {
    let (export, exported) = export().await;
    let (node, _) = node(ACCEL).await;
    let gateway = gateway(node, export).await;
    let seen = fetch(&gateway, "HEAD", SCORM, &[]).await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(seen.body.is_empty());
    assert_eq!(seen.headers["content-length"], "5000");
    assert_eq!(exported.lock().unwrap()[0].0, "HEAD");
}

#[tokio::test]
async fn a_scorm_file_goes_to_the_students_own_node_not_the_data_server() {
    let (export, _) = export().await;
    let (node, asked) = node(ACCEL).await;
    let gateway = gateway(node, export).await;
    // The first page binds the session to web1.
    let first = fetch(&gateway, "GET", "/my/", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    let cookie = "MoodleSession=abcdefghijklmnopqrstuvwxyz";
    let seen = fetch(&gateway, "GET", SCORM, &[("cookie", cookie)]).await;
    assert_eq!(seen.status, StatusCode::OK);
    assert_eq!(seen.headers["x-upstream"], "web1");
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 2, "both requests reached the node");
    assert_eq!(asked[1]["cookie"], cookie, "with the session it must check");
}

#[tokio::test]
async fn a_student_cannot_speak_x_accel_to_a_node() {
    let (export, exported) = export().await;
    let (node, asked) = node(ACCEL).await;
    let gateway = gateway(node, export).await;
    let seen = fetch(
        &gateway,
        "GET",
        "/course/view.php?id=2",
        &[
            ("x-accel-redirect", "/dataroot/filedir/3b/8f/x"),
            ("x-accel-limit-rate", "1"),
        ],
    )
    .await;
    assert_eq!(seen.body.as_ref(), b"ok");
    assert!(
        no_accel_header(&asked.lock().unwrap()[0]),
        "PHP never sees it"
    );
    assert!(
        exported.lock().unwrap().is_empty(),
        "no student URL reaches the export"
    );
}

#[tokio::test]
async fn a_node_that_names_a_path_outside_the_prefix_gets_a_502_and_the_export_sees_nothing() {
    for hostile in [
        "/dataroot/../etc/passwd",
        "/dataroot/filedir/%2e%2e/%2e%2e/etc/passwd",
        "/etc/passwd",
        "http://evil.example/dataroot/filedir/x",
        "/dataroot/filedir/x?download=1",
    ] {
        let (export, exported) = export().await;
        let (node, _) = node(hostile).await;
        let gateway = gateway(node, export).await;
        let seen = fetch(&gateway, "GET", SCORM, &[]).await;
        assert_eq!(seen.status, StatusCode::BAD_GATEWAY, "{hostile}");
        assert_eq!(
            seen.body.as_ref(),
            b"bad gateway: the moodle server named a file the gateway may not fetch\n"
        );
        assert!(exported.lock().unwrap().is_empty(), "{hostile}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_file_the_export_does_not_have_is_a_404() {
    let (export, exported) = export().await;
    let (node, _) = node("/dataroot/filedir/00/00/0000000000000000000000000000000000000000").await;
    let gateway = gateway(node, export).await;
    let seen = fetch(&gateway, "GET", SCORM, &[]).await;
    assert_eq!(seen.status, StatusCode::NOT_FOUND);
    assert_eq!(
        seen.body.as_ref(),
        b"not found: the data server does not have this file\n"
    );
    assert_eq!(exported.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn an_export_that_is_down_is_a_502_naming_it_and_no_mark_against_the_node() {
    let export = support::refused_addr().await;
    let (node, _) = node(ACCEL).await;
    let gateway = gateway(node, export).await;
    for _ in 0..5 {
        let seen = fetch(&gateway, "GET", SCORM, &[]).await;
        assert_eq!(seen.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            seen.body.as_ref(),
            b"bad gateway: the data server's file export could not be reached\n"
        );
    }
    // Five failed fetches, more than `fall`: the node that answered stays in service.
    let page = fetch(&gateway, "GET", "/course/view.php?id=2", &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    let settings = gateway.app.gateway().settings();
    assert!(settings.upstreams.nodes()[0].health.is_up());
}

#[tokio::test]
async fn without_offload_a_nodes_x_accel_redirect_is_an_error_not_an_empty_file() {
    let (node, _) = node(ACCEL).await;
    let data = named_upstream("data").await;
    let gateway = TestGateway::start(&config_for(&[node], data, "")).await;
    let seen = fetch(
        &gateway,
        "GET",
        "/pluginfile.php/5/mod_resource/content/1/a.pdf",
        &[],
    )
    .await;
    assert_eq!(seen.status, StatusCode::BAD_GATEWAY);
    assert!(no_accel_header(&seen.headers));
}

/// A student who stops reading an offloaded file is cut after `body_idle`, so the
/// export's connection is freed rather than held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_who_stops_reading_an_offloaded_file_is_cut_after_body_idle() {
    const SIZE: usize = 64 << 20;
    let export =
        support::upstream(|_request| async { Response::new(Body::from(vec![7u8; SIZE])) }).await;
    let (node, _) = node(ACCEL).await;
    let data = named_upstream("data").await;
    let extra =
        format!("[timeouts]\nbody_idle = \"500ms\"\n[offload]\nurl = \"http://{export}\"\n");
    let gateway = TestGateway::start(&config_for(&[node], data, &extra)).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let request = format!("GET {SCORM} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut first = vec![0u8; 64 * 1024];
    client.read_exact(&mut first).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the connection was closed, not left hanging");
    assert!(
        first.len() + rest.len() < SIZE,
        "cut before the whole file went out"
    );
}

/// With a cap on the node, an offloaded file holds the node's slot only while the node
/// decides: while the export is still streaming the bytes, the node's one slot is free
/// for the next student.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_file_frees_its_node_slot_while_the_export_streams_it() {
    let release = Arc::new(tokio::sync::Notify::new());
    let hold = release.clone();
    // An export that sends the first bytes, then waits before the rest.
    let export = support::upstream(move |_request: Request<Incoming>| {
        let hold = hold.clone();
        async move {
            let chunks = futures_util::stream::unfold(0, move |sent| {
                let hold = hold.clone();
                async move {
                    match sent {
                        0 => Some((
                            Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"first ")),
                            1,
                        )),
                        1 => {
                            hold.notified().await;
                            Some((Ok(bytes::Bytes::from_static(b"last")), 2))
                        }
                        _ => None,
                    }
                }
            });
            Response::builder()
                .header("content-type", "application/octet-stream")
                .body(Body::from_stream(chunks))
                .unwrap()
        }
    })
    .await;
    let (node, asked) = node(ACCEL).await;
    let data = named_upstream("data").await;
    let extra = format!(
        "[session]\nstore = \"node-local\"\n[offload]\nurl = \"http://{export}\"\n\
         [surge]\nmax_active = 1\nwaiting_room = false\n"
    );
    let gateway = TestGateway::start(&config_for(&[node], data, &extra)).await;
    let (url, _) = get(&gateway, SCORM, &[]);
    let request = Request::get(url)
        .header("host", HOST)
        .body(Body::empty())
        .unwrap();
    let download = support::client().request(request).await.unwrap();
    assert_eq!(download.status(), StatusCode::OK, "the file's head is here");
    // The file is still streaming: the node's one slot must be free again.
    let page = tokio::time::timeout(Duration::from_secs(5), fetch(&gateway, "GET", "/my/", &[]));
    let page = page
        .await
        .expect("the next page did not wait for the download");
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(asked.lock().unwrap().len(), 2, "the node decided both");
    release.notify_one();
    let body = http_body_util::BodyExt::collect(download.into_body())
        .await
        .unwrap();
    assert_eq!(body.to_bytes().as_ref(), b"first last");
}

/// A theme image Moodle accelerates (its `localcachedir` inside the dataroot) is kept
/// by the asset cache as the student got it: the export's bytes under the node's
/// headers; the next student's copy comes from memory, neither node nor export asked.
#[tokio::test]
async fn an_accelerated_theme_image_is_kept_as_the_student_got_it() {
    const ICON: &str = "/theme/image.php/boost/core/1700000000/t/edit";
    const CACHED: &str = "/dataroot/localcache/theme/1700000000/boost/pix/core/t/edit.svg";
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    let node = support::upstream(move |_request: Request<Incoming>| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            Response::builder()
                .header("content-type", "image/svg+xml")
                .header("cache-control", "public, max-age=7776000, immutable")
                .header("etag", "\"edit-icon\"")
                .header("x-accel-redirect", CACHED)
                .body(Body::empty())
                .unwrap()
        }
    })
    .await;
    let export = support::upstream(|request: Request<Incoming>| async move {
        assert_eq!(request.uri().path(), CACHED);
        Response::builder()
            .header("content-type", "application/octet-stream")
            .body(Body::from("<svg>edit</svg>"))
            .unwrap()
    })
    .await;
    let gateway = gateway(node, export).await;
    let first = fetch(&gateway, "GET", ICON, &[]).await;
    let second = fetch(&gateway, "GET", ICON, &[]).await;
    for seen in [&first, &second] {
        assert_eq!(seen.status, StatusCode::OK);
        assert_eq!(seen.body.as_ref(), b"<svg>edit</svg>", "the export's bytes");
        assert_eq!(
            seen.headers["content-type"], "image/svg+xml",
            "the node's type"
        );
        assert!(no_accel_header(&seen.headers));
    }
    assert!(second.headers.contains_key("age"), "the second from memory");
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the node decided once"
    );
}

const TOKEN: &str = "export-watch-admin-token-0123456789";

/// A file export that can be taken away and brought back on the same address, as
/// an nginx restart does: its directory answers 404 (nginx's `location / { return
/// 404; }` in the shipped recipe) and the one stored file its bytes. Stopping it
/// closes the listener and every connection it holds, kept ones included.
struct Removable {
    addr: SocketAddr,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl Removable {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut export = Self {
            addr,
            serving: None,
        };
        export.serve(listener);
        export
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        self.serving = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let found = request.uri().path() == ACCEL;
                    let response = Response::builder()
                        .status(if found { 200 } else { 404 })
                        .header("content-type", "application/octet-stream")
                        .body(Body::from(if found { stored() } else { b"nope".to_vec() }))
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                });
                connections.spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        }));
    }

    fn stop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
    }

    async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

/// The gateway binary with an admin listener, probing every 200 ms, down after 2
/// failures and up after 2 successes.
fn watching_gateway(
    node: SocketAddr,
    data: SocketAddr,
    export: SocketAddr,
) -> support::GatewayProcess {
    let extra = format!(
        "admin.listen = \"127.0.0.1:0\"\nadmin.token = \"{TOKEN}\"\n\
         [session]\nstore = \"node-local\"\n\
         [health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nfall = 2\nrise = 2\n\
         [offload]\nurl = \"http://{export}\"\n"
    );
    support::start_binary(&config_for(&[node], data, &extra))
}

async fn admin(gateway: &support::GatewayProcess, path: &str) -> support::Seen {
    let url = format!("http://{}{path}", gateway.admin_addr.unwrap());
    let auth = format!("Bearer {TOKEN}");
    send(&url, "GET", &[("authorization", &auth)], Body::empty()).await
}

/// `GET /nodes`' `export` entry.
async fn export_entry(gateway: &support::GatewayProcess) -> serde_json::Value {
    let seen = admin(gateway, "/nodes").await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.text());
    let nodes: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    nodes["export"].clone()
}

/// Waits up to 10 s for `/nodes` to show the export `health` after a probe.
async fn export_turns(gateway: &support::GatewayProcess, health: &str) -> serde_json::Value {
    for _ in 0..100 {
        let entry = export_entry(gateway).await;
        if entry["health"] == health && !entry["last_probe"].is_null() {
            return entry;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the export never showed {health}: {}",
        export_entry(gateway).await
    );
}

async fn metric(gateway: &support::GatewayProcess, sample: &str) -> String {
    let text = admin(gateway, "/metrics").await.text();
    let line = text.lines().find(|l| l.starts_with(&format!("{sample} ")));
    let line = line.unwrap_or_else(|| panic!("no {sample} in /metrics:\n{text}"));
    line.rsplit(' ').next().unwrap().to_owned()
}

/// The gateway's log lines containing `needle`, once there is one (the log is read
/// by another thread) or after 5 s.
async fn said(gateway: &support::GatewayProcess, needle: &str) -> Vec<String> {
    gateway.logs_within(needle, Duration::from_secs(5)).await;
    gateway.logged(needle)
}

async fn file_from(gateway: &support::GatewayProcess) -> support::Seen {
    let url = format!("http://{}{SCORM}", gateway.addr);
    send(&url, "GET", &[("host", HOST)], Body::empty()).await
}

/// The export is watched like an upstream: its going away shows in `/nodes`, the
/// dashboard and `/metrics`, is one log line however many files fail meanwhile (each
/// student told the export is down), and its return is one line again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_goes_down_and_comes_back_is_shown_and_said_once_each_way() {
    let mut export = Removable::start().await;
    let (node, _) = node(ACCEL).await;
    let data = named_upstream("data").await;
    let gateway = watching_gateway(node, data, export.addr);

    let up = export_turns(&gateway, "up").await;
    assert_eq!(up["url"], format!("http://{}", export.addr));
    assert_eq!(up["probe"], "/dataroot/");
    assert_eq!(up["last_probe"]["said"], "answered 404 Not Found", "{up}");
    let served = file_from(&gateway).await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.body.as_ref(), stored().as_slice());
    assert_eq!(metric(&gateway, "moodle_gateway_export_up").await, "1");

    export.stop();
    let down = export_turns(&gateway, "down").await;
    assert_eq!(down["last_probe"]["said"], "connection failed", "{down}");
    for _ in 0..5 {
        let failed = file_from(&gateway).await;
        assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            failed.text(),
            "bad gateway: the data server's file export is down; files come back when it does\n"
        );
    }
    assert_eq!(metric(&gateway, "moodle_gateway_export_up").await, "0");
    let unreachable = r#"moodle_gateway_export_files_total{result="unreachable"}"#;
    assert_eq!(metric(&gateway, unreachable).await, "5");
    let served = r#"moodle_gateway_export_files_total{result="served"}"#;
    assert_eq!(metric(&gateway, served).await, "1");
    let entry = export_entry(&gateway).await;
    assert_eq!(entry["files"]["failed"], 5, "{entry}");
    let page = admin(&gateway, "/").await.text();
    assert!(page.contains("id=\"export\""), "{page}");
    assert!(page.contains("502 for every offloaded file"), "{page}");
    let said_down = said(&gateway, "file export is down").await;
    assert_eq!(said_down.len(), 1, "{said_down:?}");
    assert!(
        said_down[0].contains(&export.addr.to_string()),
        "{said_down:?}"
    );
    assert!(
        said_down[0].contains("502"),
        "says what students get: {said_down:?}"
    );
    assert_eq!(gateway.logged("file offload failed"), Vec::<String>::new());

    export.restart().await;
    export_turns(&gateway, "up").await;
    let served = file_from(&gateway).await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(metric(&gateway, "moodle_gateway_export_up").await, "1");
    assert_eq!(said(&gateway, "file export is up again").await.len(), 1);
    assert_eq!(gateway.logged("file export is down").len(), 1, "still one");
}

/// A node whose `$CFG->localcachedir` is Moodle's default (inside the dataroot)
/// accelerates theme files the recipe's export does not serve: the students get
/// 404s, and the admin one warning naming the setting and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn theme_files_from_a_localcachedir_the_export_lacks_are_one_warning_naming_it() {
    const ICON: &str = "/theme/image.php/boost/core/1700000000/t/edit";
    let node = support::upstream(|_request: Request<Incoming>| async move {
        Response::builder()
            .header("content-type", "image/svg+xml")
            .header(
                "x-accel-redirect",
                "/dataroot/localcache/theme/1700000000/boost/pix/core/t/edit.svg",
            )
            .body(Body::empty())
            .unwrap()
    })
    .await;
    let export = Removable::start().await;
    let data = named_upstream("data").await;
    let gateway = watching_gateway(node, data, export.addr);
    for _ in 0..3 {
        let url = format!("http://{}{ICON}", gateway.addr);
        let seen = send(&url, "GET", &[("host", HOST)], Body::empty()).await;
        assert_eq!(seen.status, StatusCode::NOT_FOUND);
    }
    let warned = said(&gateway, "$CFG->localcachedir").await;
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("outside the dataroot"), "{warned:?}");
    assert!(warned[0].contains("/dataroot/localcache/"), "{warned:?}");
    let not_found = r#"moodle_gateway_export_files_total{result="not_found"}"#;
    assert_eq!(metric(&gateway, not_found).await, "3");
}
