//! TLS on the public listener with a real TLS client: HTTP/1.1 and HTTP/2 by ALPN,
//! one sticky session across both, HTTP/2 requests reaching PHP as HTTP/1.1, and
//! the plain-HTTP listener that redirects to HTTPS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response, Version};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use moodle_gateway::app::Listeners;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::http::accept::tls::Certificates;
use moodle_gateway::{App, Config};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

/// A self-signed certificate for `localhost`, written where the gateway reads it.
pub struct TestCert {
    dir: std::path::PathBuf,
    der: CertificateDer<'static>,
}

impl TestCert {
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = std::env::temp_dir().join(format!("mg-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
        let der = cert.der().clone();
        Self { dir, der }
    }

    /// The certificate and key as PEM, for a gateway started from a config file.
    pub fn pem(&self) -> (String, String) {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap();
        (read("cert.pem"), read("key.pem"))
    }

    /// `[tls]` naming this certificate's files, as dotted keys for a config.
    pub fn config_keys(&self) -> String {
        let path = |name: &str| self.dir.join(name).display().to_string();
        format!(
            "tls.cert = {:?}\ntls.key = {:?}\n",
            path("cert.pem"),
            path("key.pem")
        )
    }

    fn certificates(&self) -> Arc<Certificates> {
        Certificates::load(&self.dir.join("cert.pem"), &self.dir.join("key.pem")).unwrap()
    }
}

impl Drop for TestCert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The gateway over TLS in front of `cluster`; returns the HTTPS and redirect addresses.
async fn gateway(cluster: &Cluster, cert: &TestCert) -> (SocketAddr, SocketAddr) {
    gateway_with(cluster, cert, "").await
}

/// [`gateway`] with `extra` (dotted keys) in its config.
async fn gateway_with(cluster: &Cluster, cert: &TestCert, extra: &str) -> (SocketAddr, SocketAddr) {
    let extra = format!("state.file = \"\"\n{extra}");
    let text = cluster.config_toml("127.0.0.1:0", None, &extra);
    serve_tls(&text, cert).await
}

/// A gateway of config `text` serving `cert`; its HTTPS and redirect addresses.
pub async fn serve_tls(text: &str, cert: &TestCert) -> (SocketAddr, SocketAddr) {
    let config = Config::parse(text, Path::new("."), Default::default()).unwrap();
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirect = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = (public.local_addr().unwrap(), redirect.local_addr().unwrap());
    let app = App::new(config).with_tls(cert.certificates());
    let listeners = Listeners {
        public,
        admin: None,
        redirect: Some(redirect),
    };
    tokio::spawn(app.serve_all(listeners, std::future::pending()));
    addrs
}

async fn tls_connect(
    addr: SocketAddr,
    cert: &TestCert,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let config = client_config(cert, alpn, rustls::DEFAULT_VERSIONS);
    connect_with(addr, &config).await
}

/// A client that trusts `cert` and offers `alpn` over `versions`; it keeps the
/// sessions it is given in a store its clones share, as a browser does.
pub fn client_config(
    cert: &TestCert,
    alpn: &[u8],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

pub async fn connect_with(
    addr: SocketAddr,
    config: &rustls::ClientConfig,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config.clone()));
    connector.connect(name, tcp).await.unwrap()
}

async fn body_text(response: Response<hyper::body::Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_stays_on_its_node_over_http1_and_http2() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let cert = TestCert::new("sticky");
    let (https, _) = gateway(&cluster, &cert).await;

    // HTTP/1.1 over TLS: the first visit deals a node and issues the session.
    let stream = tls_connect(https, &cert, b"http/1.1").await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut h1, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let first = Request::get("/login/index.php")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap();
    let first = h1.send_request(first).await.unwrap();
    assert_eq!(first.status(), 200);
    let node = first.headers()["x-upstream"].to_str().unwrap().to_owned();
    let cookie = first.headers()["set-cookie"].to_str().unwrap();
    let session = cookie.split(';').next().unwrap().to_owned();
    body_text(first).await;

    // HTTP/2 over TLS, the cookie split into crumbs as browsers send it.
    let stream = tls_connect(https, &cert, b"h2").await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let again = Request::get("https://localhost/login/index.php")
        .version(Version::HTTP_2)
        .header("cookie", "MOODLEID1_=x")
        .header("cookie", session.as_str())
        .body(Body::empty())
        .unwrap();
    let again = h2.send_request(again).await.unwrap();
    assert_eq!(again.version(), Version::HTTP_2);
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["x-upstream"], node.as_str(), "same node");
    assert!(!again.headers().contains_key("set-cookie"), "same session");
    body_text(again).await;
    assert_eq!(cluster.lost_sessions(), 0);

    // What PHP saw: HTTP/1.1, one Host, one Cookie line, and that the student used TLS.
    let seen = cluster.by_name(&node).unwrap().last_request().unwrap();
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, [format!("MOODLEID1_=x; {session}").as_str()]);
    assert_eq!(seen.headers["host"], "localhost");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_redirected_to_https_with_the_path_kept() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("redirect");
    let (https, redirect) = gateway(&cluster, &cert).await;
    let url = format!("http://{redirect}/course/view.php?id=2");
    let seen = crate::support::send(&url, "GET", &[("host", "localhost")], "").await;
    assert_eq!(seen.status, 308);
    let location = seen.headers["location"].to_str().unwrap();
    assert_eq!(
        location,
        format!("https://localhost:{}/course/view.php?id=2", https.port())
    );
    assert_eq!(
        cluster.nodes()[0].request_count(),
        0,
        "nothing reached Moodle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_a_renewed_certificate_without_dropping_open_connections() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let old = TestCert::new("renew-old");
    let path = old.dir.join("config.toml");
    std::fs::write(
        &path,
        cluster.config_toml("127.0.0.1:0", None, "state.file = \"\""),
    )
    .unwrap();
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https = public.local_addr().unwrap();
    let app = App::new(Config::load(&path).unwrap())
        .reloading_from(&path)
        .with_tls(old.certificates());
    tokio::spawn(app.clone().serve(public, None, std::future::pending()));

    let open = tls_connect(https, &old, b"http/1.1").await;
    let (mut before, connection) = hyper::client::conn::http1::handshake(TokioIo::new(open))
        .await
        .unwrap();
    tokio::spawn(connection);
    // Renewal: new files at the same paths, then a reload.
    let new = TestCert::new("renew-new");
    for file in ["cert.pem", "key.pem"] {
        std::fs::copy(new.dir.join(file), old.dir.join(file)).unwrap();
    }
    let notes = tokio::task::spawn_blocking(move || app.reload())
        .await
        .unwrap();
    assert_eq!(notes, Ok(vec![]));
    // A new handshake needs the new certificate (the client trusts only it)...
    let renewed = tls_connect(https, &new, b"http/1.1").await;
    let served = renewed.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(served, new.der);
    // ...and the connection opened before still works.
    let request = Request::get("/login/index.php")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap();
    assert_eq!(before.send_request(request).await.unwrap().status(), 200);
}

/// An HTTP/2 connection to `https` that has sent one request and been answered;
/// its connection task ends when the gateway closes it.
async fn h2_after_one_request(
    https: SocketAddr,
    cert: &TestCert,
) -> Option<(
    hyper::client::conn::http2::SendRequest<Body>,
    tokio::task::JoinHandle<()>,
)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(https).await.ok()?;
    let name = ServerName::try_from("localhost").unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // Past max_connections the gateway answers in plain HTTP: the handshake fails.
    let stream = connector.connect(name, tcp).await.ok()?;
    let (mut h2, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .ok()?;
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = Request::get("https://localhost/login/index.php")
        .version(Version::HTTP_2)
        .body(Body::empty())
        .unwrap();
    let response = h2.send_request(request).await.ok()?;
    assert_eq!(response.status(), 200);
    body_text(response).await;
    Some((h2, connection))
}

/// Idle HTTP/2 connections holding every place under `max_connections` are closed
/// after `keep_alive` without a stream, as idle HTTP/1.1 ones are, so the next
/// student gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed_so_the_next_student_gets_in() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("h2idle");
    let extra = "limits.max_connections = 2\ntimeouts.keep_alive = \"1s\"";
    let (https, _) = gateway_with(&cluster, &cert, extra).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(
            h2_after_one_request(https, &cert)
                .await
                .expect("a place is free"),
        );
    }
    for (sender, connection) in idle {
        let closed = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
        assert!(
            closed.is_ok(),
            "an idle HTTP/2 connection was still open after 30 s"
        );
        drop(sender);
    }
    // The gateway gives a place back just after its socket closes: a few tries.
    let mut next = None;
    for _ in 0..50 {
        next = h2_after_one_request(https, &cert).await;
        if next.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(next.is_some(), "the next student was turned away");
}

/// An HTTP/2 connection idle for longer than `request_headers` carries the next
/// request, and one idle past `keep_alive` is closed: not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_kept_for_keep_alive_then_closed() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("h2kept");
    let extra = "timeouts.request_headers = \"1s\"\ntimeouts.keep_alive = \"3s\"";
    let (https, _) = gateway_with(&cluster, &cert, extra).await;
    let (mut h2, connection) = h2_after_one_request(https, &cert).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1800)).await;
    assert!(!connection.is_finished(), "closed after 1.8 s idle");
    let request = Request::get("https://localhost/login/index.php")
        .version(Version::HTTP_2)
        .body(Body::empty())
        .unwrap();
    let response = h2.send_request(request).await.expect("the kept connection");
    assert_eq!(response.status(), 200);
    body_text(response).await;
    let idle = std::time::Instant::now();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(15), connection).await;
    assert!(closed.is_ok(), "still open 15 s after its last answer");
    let after = idle.elapsed();
    assert!(
        after >= std::time::Duration::from_millis(2500),
        "closed {after:?} after its last answer"
    );
}

/// A student whose connection closed comes back with an abbreviated handshake (the
/// gateway's ticket), over TLS 1.3 and 1.2, and the click is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_who_reconnects_resumes_the_tls_session() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("resume");
    let (https, _) = gateway(&cluster, &cert).await;
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let browser = client_config(&cert, b"http/1.1", &[version]);
        let mut handshakes = Vec::new();
        for _ in 0..2 {
            handshakes.push(Some(visit(https, &browser).await));
        }
        let want = [rustls::HandshakeKind::Full, rustls::HandshakeKind::Resumed].map(Some);
        assert_eq!(handshakes, want, "{version:?}");
    }
}

/// One page over a new HTTP/1.1 connection to `https`, then closed: how its
/// handshake went. The answer is read, and with it the TLS 1.3 tickets sent before
/// it, so that `browser` holds them for its next connection.
pub async fn visit(https: SocketAddr, browser: &rustls::ClientConfig) -> rustls::HandshakeKind {
    let stream = connect_with(https, browser).await;
    let handshake = stream.get_ref().1.handshake_kind().unwrap();
    let (mut h1, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let request = Request::get("/login/index.php")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap();
    let response = h1.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    body_text(response).await;
    drop(h1);
    let _ = connection.await;
    handshake
}

/// One `method` request for `path` over a new HTTP/1.1 connection to `https`.
async fn ask_over_tls(
    https: SocketAddr,
    cert: &TestCert,
    method: &str,
    path: &str,
) -> Response<()> {
    let stream = tls_connect(https, cert, b"http/1.1").await;
    let (mut h1, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap();
    let response = h1.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    body.collect().await.unwrap();
    Response::from_parts(parts, ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hsts_on_every_https_answer_says_so_and_plain_http_never_does() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("hsts");
    let keys = cert.config_keys();
    let on = format!("{keys}tls.hsts_max_age = \"365d\"\ntls.hsts_include_subdomains = true");
    let (https, redirect) = gateway_with(&cluster, &cert, &on).await;
    let want = "max-age=31536000; includeSubDomains";

    // A Moodle page over HTTP/1.1, and the gateway's own refusal of a method.
    let page = ask_over_tls(https, &cert, "GET", "/login/index.php").await;
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["strict-transport-security"], want);
    let refused = ask_over_tls(https, &cert, "TRACE", "/").await;
    assert_eq!(refused.status(), 405);
    assert_eq!(refused.headers()["strict-transport-security"], want);

    // HTTP/2 the same.
    let stream = tls_connect(https, &cert, b"h2").await;
    let (mut h2, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::get("https://localhost/login/index.php")
        .version(Version::HTTP_2)
        .body(Body::empty())
        .unwrap();
    let page = h2.send_request(request).await.unwrap();
    assert_eq!(page.headers()["strict-transport-security"], want);

    // The redirect listener speaks plain HTTP: a browser must not learn it there
    // (RFC 6797 8.1), so it is never sent.
    let url = format!("http://{redirect}/login/index.php");
    let moved = crate::support::send(&url, "GET", &[("host", "localhost")], "").await;
    assert_eq!(moved.status, 308);
    assert!(!moved.headers.contains_key("strict-transport-security"));

    // Off unless asked for.
    let (https, _) = gateway_with(&cluster, &cert, &keys).await;
    let page = ask_over_tls(https, &cert, "GET", "/login/index.php").await;
    assert_eq!(page.status(), 200);
    assert!(!page.headers().contains_key("strict-transport-security"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_chooses_the_cipher_suite_from_what_the_client_offers() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("order");
    let (https, _) = gateway(&cluster, &cert).await;
    // A client that prefers ChaCha20 but also offers AES-GCM gets AES-GCM, the
    // gateway's first choice; one that offers ChaCha20 alone still connects.
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_CHACHA20_POLY1305_SHA256,
    };
    for (offered, chosen) in [
        (
            vec![TLS13_CHACHA20_POLY1305_SHA256, TLS13_AES_128_GCM_SHA256],
            TLS13_AES_128_GCM_SHA256,
        ),
        (
            vec![TLS13_CHACHA20_POLY1305_SHA256],
            TLS13_CHACHA20_POLY1305_SHA256,
        ),
    ] {
        let provider = rustls::crypto::CryptoProvider {
            cipher_suites: offered,
            ..rustls::crypto::ring::default_provider()
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der.clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let stream = connect_with(https, &client).await;
        let suite = stream.get_ref().1.negotiated_cipher_suite().unwrap();
        assert_eq!(suite.suite(), chosen.suite());
    }
}
