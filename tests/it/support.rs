//! Test support: a real gateway on `127.0.0.1:0` in front of real upstreams, and a
//! small HTTP client that shows exactly what came back.

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use moodle_gateway::{App, Config};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A gateway running in this test process.
pub struct TestGateway {
    /// The public listener.
    pub addr: SocketAddr,
    /// The admin listener, when the config has `[admin]`.
    pub admin_addr: Option<SocketAddr>,
    /// The running app (its table, clock).
    pub app: App,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl TestGateway {
    /// Parses `config_text` (listener addresses in it are ignored: both listeners are
    /// bound on `127.0.0.1:0`) and serves it.
    pub async fn start(config_text: &str) -> Self {
        let mut config = Config::parse(config_text, Path::new("."), Default::default())
            .unwrap_or_else(|errors| panic!("test config is invalid:\n{errors}"));
        // No state file in the working directory (the crate root) unless a test
        // asks for one: tests must not restore each other's sessions.
        if !config_text.contains("[state]") && !config_text.contains("state.file") {
            config.state.file = None;
        }
        Self::start_with(config).await
    }

    /// Serves a config loaded from `path`, which `POST /reload` re-reads.
    pub async fn start_with_source(config: Config, path: &Path) -> Self {
        Self::serve(config, Some(path)).await
    }

    /// Serves an already built config.
    pub async fn start_with(config: Config) -> Self {
        Self::serve(config, None).await
    }

    async fn serve(config: Config, source: Option<&Path>) -> Self {
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = match config.admin {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let addr = public.local_addr().unwrap();
        let admin_addr = admin.as_ref().map(|l| l.local_addr().unwrap());
        let app = match source {
            Some(path) => App::new(config).reloading_from(path),
            None => App::new(config),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = app.clone().serve(public, admin, async {
            let _ = stopped.await;
        });
        let done = tokio::spawn(async move {
            serving.await.unwrap();
        });
        Self {
            addr,
            admin_addr,
            app,
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops accepting and waits for in-flight requests to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.unwrap();
        }
    }
}

/// A minimal gateway config for `nodes` upstream addresses and a data server.
pub fn config_for(nodes: &[SocketAddr], data: SocketAddr, extra: &str) -> String {
    let mut text = String::from("listen = \"127.0.0.1:0\"\n");
    text.push_str(extra);
    text.push('\n');
    for (i, node) in nodes.iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"web{}\"\nurl = \"http://{node}\"\n",
            i + 1
        ));
    }
    text.push_str(&format!(
        "[data]\nname = \"data\"\nurl = \"http://{data}\"\n"
    ));
    text
}

/// What a test client saw.
#[derive(Debug)]
pub struct Seen {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
    /// The `X-Upstream` header the stand-ins and fake upstreams put on every answer.
    pub fn upstream(&self) -> Option<&str> {
        self.headers.get("x-upstream").and_then(|v| v.to_str().ok())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A plain HTTP/1.1 client with no cookie handling of its own.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends one request with the given header lines (kept in order, duplicates allowed).
pub async fn send(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Seen {
    let mut request = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(url)
        .body(body.into())
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("the gateway answered within 30 s")
        .expect("the gateway answered");
    collect(response).await
}

/// A GET with no extra headers.
pub async fn get(url: &str) -> Seen {
    send(url, "GET", &[], Body::empty()).await
}

async fn collect(response: Response<Incoming>) -> Seen {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("a complete body").to_bytes();
    Seen {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// A raw upstream on `127.0.0.1:0` answering with `handler`; runs until the test ends.
pub async fn upstream<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let service = hyper::service::service_fn(move |request| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(request).await) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// An upstream that names itself in `X-Upstream` and answers 200.
pub async fn named_upstream(name: &'static str) -> SocketAddr {
    upstream(move |_request| async move {
        Response::builder()
            .header("x-upstream", name)
            .body(Body::from(name))
            .unwrap()
    })
    .await
}

/// An address where nothing listens: connections are refused.
pub async fn refused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// An upstream that accepts connections and reads requests but never answers.
pub async fn silent_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    addr
}

/// The gateway binary as a child process; killed when dropped.
pub struct GatewayProcess {
    /// The running binary.
    pub child: Child,
    /// Its public listener, as it logged it.
    pub addr: SocketAddr,
    _dir: TempDir,
}

impl GatewayProcess {
    /// Its working directory (where the default state file goes) and `config.toml`.
    pub fn dir(&self) -> &Path {
        &self._dir.0
    }

    /// Sends a signal (`"TERM"`, `"HUP"`) to the process.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status();
        assert!(sent.unwrap().success(), "kill -{name} {pid}");
    }

    /// Waits up to `limit` for the process to exit; its status.
    pub async fn exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let started = std::time::Instant::now();
        loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                return exit;
            }
            assert!(
                started.elapsed() < limit,
                "the gateway did not exit within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the real `moodle-gateway` binary on `config` (whose `listen` should use port
/// 0) and waits until it logs the address it listens on.
pub fn start_binary(config: &str) -> GatewayProcess {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("moodle-gateway-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        // The default state file lands in the test's own directory.
        .current_dir(&dir)
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gateway binary starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            let rest = line.split("listen=").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .expect("the gateway logged its listen address");
    // Keep draining the log, so a chatty gateway never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    GatewayProcess {
        child,
        addr,
        _dir: TempDir(dir),
    }
}
