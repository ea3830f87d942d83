//! Test support: a real gateway on `127.0.0.1:0` in front of real upstreams, and a
//! small HTTP client that shows exactly what came back.

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use moodle_gateway::demo::Browser;
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
    _spool: Option<TempDir>,
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
        // Nor a spool directory in the crate root: each gateway gets its own.
        let spool = (!config_text.contains("spool_dir")).then(|| {
            config.limits.spool_dir = spool_dir();
            TempDir(config.limits.spool_dir.clone())
        });
        let mut gateway = Self::start_with(config).await;
        gateway._spool = spool;
        gateway
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
            _spool: None,
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

/// A fresh directory path for one gateway's upload spool, under the system's
/// temporary one (the gateway creates it).
pub fn spool_dir() -> std::path::PathBuf {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("moodle-gateway-spool-{}-{n}", std::process::id()))
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
    /// Its admin listener, as it logged it, when the config has `[admin]`.
    pub admin_addr: Option<SocketAddr>,
    /// Every line it wrote to stderr after its listen line.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: TempDir,
}

impl GatewayProcess {
    /// Its working directory (where the default state file goes) and `config.toml`.
    pub fn dir(&self) -> &Path {
        &self._dir.0
    }

    /// The lines of its log (stderr) so far that contain `needle`.
    pub fn logged(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Whether a line containing `needle` is logged within `limit`: for what the
    /// process says after an event the test cannot await (its log reaches the
    /// test through a reader thread, later on a loaded machine).
    pub async fn logs_within(&self, needle: &str, limit: Duration) -> bool {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            if !self.logged(needle).is_empty() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        !self.logged(needle).is_empty()
    }

    /// Sends a signal (`"TERM"`, `"HUP"`) to the process.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status();
        assert!(sent.unwrap().success(), "kill -{name} {pid}");
    }

    /// Kills the process at once (`SIGKILL`: no shutdown, no last snapshot, as a
    /// crash or the OOM killer would) and starts the binary again in the same
    /// directory on the same `config.toml`, as systemd's `Restart=on-failure` does.
    pub fn crash_and_restart(mut self) -> GatewayProcess {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let dir = std::mem::replace(&mut self._dir, TempDir(PathBuf::new()));
        spawn_in(Command::new(env!("CARGO_BIN_EXE_moodle-gateway")), dir)
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

/// The lines of a file another process or thread writes (an access log) once it
/// has at least `count`; waits up to 5 s.
pub async fn lines_of(path: &Path, count: usize) -> Vec<String> {
    for _ in 0..100 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= count {
            return text.lines().map(str::to_owned).collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {count} lines in {}", path.display());
}

/// A directory removed, with everything in it, when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the real `moodle-gateway` binary on `config` (whose `listen` should use port
/// 0) and waits until it logs the address it listens on.
pub fn start_binary(config: &str) -> GatewayProcess {
    start_command(Command::new(env!("CARGO_BIN_EXE_moodle-gateway")), config)
}

/// [`start_binary`] with `NOTIFY_SOCKET` naming `socket`, as systemd starts a
/// `Type=notify` unit.
pub fn start_binary_notifying(config: &str, socket: &Path) -> GatewayProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"));
    command.env("NOTIFY_SOCKET", socket);
    start_command(command, config)
}

/// [`start_binary`] under `prlimit --nofile=LIMIT:LIMIT` (util-linux): soft and hard
/// limit alike, so the gateway cannot raise it. `prlimit` execs the gateway, so the
/// child's pid is the gateway's.
pub fn start_binary_with_open_files(config: &str, limit: usize) -> GatewayProcess {
    start_binary_with_nofile(config, limit, limit)
}

/// [`start_binary`] under `prlimit --nofile=SOFT:HARD`: a soft limit the gateway may
/// raise up to `hard` itself.
pub fn start_binary_with_nofile(config: &str, soft: usize, hard: usize) -> GatewayProcess {
    let mut prlimit = Command::new("prlimit");
    prlimit
        .arg(format!("--nofile={soft}:{hard}"))
        .arg(env!("CARGO_BIN_EXE_moodle-gateway"));
    start_command(prlimit, config)
}

/// [`start_binary`] with `files` (name, contents) written beside `config.toml`
/// first: the token and secret files a config reads.
pub fn start_binary_with_files(config: &str, files: &[(&str, &str)]) -> GatewayProcess {
    let dir = test_dir(config);
    for (name, contents) in files {
        std::fs::write(dir.0.join(name), contents).unwrap();
    }
    spawn_in(Command::new(env!("CARGO_BIN_EXE_moodle-gateway")), dir)
}

/// A new directory holding `config.toml`, removed when dropped: for several
/// processes in turn ([`spawn_sharing`]).
pub fn new_dir(config: &str) -> TempDir {
    test_dir(config)
}

/// Runs `command --config DIR/config.toml` in `dir`, which the caller keeps (and
/// removes): processes that take over from each other share their directory.
pub fn spawn_sharing(command: Command, dir: &Path) -> GatewayProcess {
    spawn_at(command, dir, TempDir(PathBuf::new()))
}

/// A new directory holding `config.toml`.
fn test_dir(config: &str) -> TempDir {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("moodle-gateway-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), config).unwrap();
    TempDir(dir)
}

fn start_command(command: Command, config: &str) -> GatewayProcess {
    spawn_in(command, test_dir(config))
}

/// Runs `command --config DIR/config.toml` in `dir` and waits until it logs the
/// address it listens on.
fn spawn_in(command: Command, dir: TempDir) -> GatewayProcess {
    let at = dir.0.clone();
    spawn_at(command, &at, dir)
}

/// [`spawn_in`] in `at`, keeping `dir` (removed with the process).
fn spawn_at(mut command: Command, at: &Path, dir: TempDir) -> GatewayProcess {
    let path = at.join("config.toml");
    let mut child = command
        // The default state file lands in the test's own directory.
        .current_dir(at)
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gateway binary starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Every line is kept, those before the listen address too: a process taking
    // over may hear its predecessor out before it says where it listens.
    let mut before = Vec::new();
    let (addr, admin_addr) = lines
        .by_ref()
        .map_while(Result::ok)
        .inspect(|line| before.push(line.clone()))
        .find_map(|line| {
            let rest = line.split("listen=").nth(1)?;
            let addr = rest.split_whitespace().next()?.parse().ok()?;
            // `admin=127.0.0.1:PORT` or `admin=off`.
            let admin = line
                .split("admin=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok());
            Some((addr, admin))
        })
        .expect("the gateway logged its listen address");
    // Keep draining the log, so a chatty gateway never blocks on a full pipe, and
    // keep it for the tests that read what the gateway said.
    let log = std::sync::Arc::new(std::sync::Mutex::new(before));
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    GatewayProcess {
        child,
        addr,
        admin_addr,
        log,
        _dir: dir,
    }
}

/// One response read off a [`RawConn`], byte for byte as the gateway framed it.
#[derive(Debug)]
pub struct RawResponse {
    /// The status code from the status line.
    pub status: u16,
    /// The head: status line and header lines, without the blank line.
    pub head: String,
    /// The body bytes that arrived.
    pub body: Vec<u8>,
    /// Whether the body was as long as its framing promised.
    pub complete: bool,
}

impl RawResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// What a connection did after the responses a test expected.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterwardsRaw {
    /// The peer closed it (end of stream or reset).
    Closed,
    /// Still open and silent.
    Open,
    /// More bytes arrived: a response nobody asked for.
    Extra(String),
}

/// A client connection that writes exactly the bytes a test gives it, so requests a
/// well-behaved client library would refuse to send can be sent.
pub struct RawConn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes `bytes`; an error means the peer already closed or reset.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await
    }

    /// Reads more into the buffer; `Ok(0)` at end of stream.
    async fn fill(&mut self, limit: Duration) -> Result<usize, String> {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(limit, self.stream.read(&mut chunk)).await {
            Err(_) => Err(format!("nothing more within {limit:?}")),
            Ok(Err(error)) => Err(format!("read failed: {error}")),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(n)
            }
        }
    }

    /// Reads one response; the body is skipped when `head_only` (answers to `HEAD`).
    pub async fn response(
        &mut self,
        limit: Duration,
        head_only: bool,
    ) -> Result<RawResponse, String> {
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if self.fill(limit).await? == 0 {
                let got = String::from_utf8_lossy(&self.buf).into_owned();
                return Err(format!("closed before a complete response head: {got:?}"));
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line in {head:?}"))?;
        let mut response = RawResponse {
            status,
            head,
            body: Vec::new(),
            complete: true,
        };
        let bodiless = head_only || status < 200 || status == 204 || status == 304;
        if !bodiless {
            self.body(&mut response, limit).await;
        }
        Ok(response)
    }

    async fn body(&mut self, response: &mut RawResponse, limit: Duration) {
        let chunked = response
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
        let length = response
            .header("content-length")
            .and_then(|l| l.parse().ok());
        response.complete = match (chunked, length) {
            (true, _) => self.chunked(&mut response.body, limit).await,
            (false, Some(length)) => self.exactly(&mut response.body, length, limit).await,
            (false, None) => {
                while matches!(self.fill(limit).await, Ok(n) if n > 0) {}
                response.body.append(&mut self.buf);
                true
            }
        };
    }

    async fn exactly(&mut self, into: &mut Vec<u8>, length: usize, limit: Duration) -> bool {
        while self.buf.len() < length {
            if !matches!(self.fill(limit).await, Ok(n) if n > 0) {
                into.append(&mut self.buf);
                return false;
            }
        }
        into.extend(self.buf.drain(..length));
        true
    }

    async fn chunked(&mut self, into: &mut Vec<u8>, limit: Duration) -> bool {
        loop {
            let line_end = loop {
                if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break end;
                }
                if !matches!(self.fill(limit).await, Ok(n) if n > 0) {
                    return false;
                }
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            self.buf.drain(..line_end + 2);
            let size = line.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size, 16) else {
                return false;
            };
            let mut chunk = Vec::new();
            if !self.exactly(&mut chunk, size + 2, limit).await {
                into.extend_from_slice(&chunk);
                return false;
            }
            into.extend_from_slice(&chunk[..size]);
            if size == 0 {
                return true;
            }
        }
    }

    /// Whether the peer closes the connection within `limit`, keeps it open, or
    /// sends more.
    pub async fn afterwards(&mut self, limit: Duration) -> AfterwardsRaw {
        if self.buf.is_empty() {
            match self.fill(limit).await {
                Ok(0) => return AfterwardsRaw::Closed,
                Err(e) if e.starts_with("read failed") => return AfterwardsRaw::Closed,
                Err(_) => return AfterwardsRaw::Open,
                Ok(_) => {}
            }
        }
        AfterwardsRaw::Extra(String::from_utf8_lossy(&self.buf).into_owned())
    }
}

/// One request as a [`recording_upstream`] received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method.
    pub method: String,
    /// The request target as the node saw it.
    pub uri: String,
    /// Header lines in order, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, or what arrived of it; `None` while it is still being read.
    pub body: Option<Result<Vec<u8>, String>>,
}

/// What a [`recording_upstream`] has received so far (health probes excluded).
pub type Record = std::sync::Arc<std::sync::Mutex<Vec<Received>>>;

/// An upstream that records every request except the gateway's health probes and
/// answers 200 `ok`; counted on arrival, before its body is read.
pub async fn recording_upstream() -> (SocketAddr, Record) {
    let record = Record::default();
    let log = record.clone();
    let addr = upstream(move |request: Request<Incoming>| {
        let log = log.clone();
        async move {
            let probe = request.uri().path() == "/theme/image.php";
            let index = (!probe).then(|| {
                let mut log = log.lock().unwrap();
                log.push(Received {
                    method: request.method().to_string(),
                    uri: request.uri().to_string(),
                    headers: request
                        .headers()
                        .iter()
                        .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                        .collect(),
                    body: None,
                });
                log.len() - 1
            });
            let body = request.into_body().collect().await;
            if let Some(index) = index {
                let body = body
                    .map(|b| b.to_bytes().to_vec())
                    .map_err(|e| e.to_string());
                log.lock().unwrap()[index].body = Some(body);
            }
            Response::builder()
                .header("x-upstream", "web1")
                .body(Body::from("ok"))
                .unwrap()
        }
    })
    .await;
    (addr, record)
}

/// A student's click on "Attempt quiz now" (`click` names it in the start's query),
/// followed as a browser follows it: the start's 303 and then the attempt's first
/// page, whose status is returned.
pub async fn start_quiz(student: &mut Browser, click: &str) -> StatusCode {
    let path = format!("/mod/quiz/startattempt.php?{click}");
    let start = student.post(&path, "cmid=7&sesskey=s").await.unwrap();
    assert_eq!(
        start.status,
        StatusCode::SEE_OTHER,
        "{click}: {}",
        start.text()
    );
    let first: http::Uri = start.location().parse().unwrap();
    assert_eq!(first.path(), "/mod/quiz/attempt.php", "{click}");
    let first = first.path_and_query().unwrap().as_str();
    student.get(first).await.unwrap().status
}

/// Stand-in student `student{n}`, logged in through the gateway with the form's
/// `logintoken`; returns them and the node that holds them.
pub async fn logged_in(gateway: &TestGateway, n: usize) -> (Browser, String) {
    let mut student = Browser::new(gateway.addr, "", "MoodleSession");
    let form = student.get("/login/index.php").await.unwrap();
    let token = form.text().split_once("logintoken=").unwrap().1[..32].to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    let done = student.post("/login/index.php", &body).await.unwrap();
    assert_eq!(done.status, 303, "login: {}", done.text());
    let home = student.get("/my/").await.unwrap();
    assert_eq!(home.status, 200);
    let node = home.upstream().to_owned();
    (student, node)
}

/// A real `redis-server` on a free loopback port, with no persistence; killed when
/// dropped. Started by each test that needs one, so tests never share its data.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// `requirepass`, while set: only the test's own commands get in.
    password: Option<String>,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts one and waits until it answers `PING`.
    pub fn start() -> Self {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("moodle-gateway-redis-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self {
            port,
            child: None,
            password: None,
            _dir: TempDir(dir),
        };
        server.restart();
        server
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (`SIGKILL`: no goodbye to its clients), keeping the port.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.restart_locked(None);
    }

    /// Starts it again on the same port, empty, and with `requirepass` set to
    /// `password` (a gateway cannot get in until [`unlock`](Self::unlock)).
    pub fn restart_locked(&mut self, password: Option<&str>) {
        self.password = password.map(str::to_owned);
        let mut command = Command::new("redis-server");
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        self.run(command);
    }

    /// A replica of `primary`, on a port of its own.
    pub fn replica_of(primary: &RedisServer) -> Self {
        let mut replica = Self::start();
        let mut command = Command::new("redis-server");
        command.args(["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        replica.run(command);
        replica
    }

    /// A Sentinel watching `primary` as `master` (quorum 1, down after 500 ms).
    pub fn sentinel_of(primary: &RedisServer, master: &str) -> Self {
        Self::sentinel_with_passwords(primary, master, None)
    }

    /// A Sentinel watching `primary` as `master`, logging in to it with the
    /// primary's `requirepass` when it has one, and with `requirepass` of its own.
    pub fn sentinel_with_passwords(
        primary: &RedisServer,
        master: &str,
        requirepass: Option<&str>,
    ) -> Self {
        let mut sentinel = Self::start();
        sentinel.kill();
        let conf = sentinel._dir.0.join("sentinel.conf");
        let mut text = format!(
            "port {}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
             sentinel monitor {master} 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds {master} 500\n\
             sentinel failover-timeout {master} 5000\n",
            sentinel.port,
            sentinel._dir.0.display(),
            primary.port
        );
        if let Some(password) = &primary.password {
            text.push_str(&format!("sentinel auth-pass {master} {password}\n"));
        }
        if let Some(password) = requirepass {
            text.push_str(&format!("requirepass {password}\n"));
        }
        sentinel.password = requirepass.map(str::to_owned);
        std::fs::write(&conf, text).unwrap();
        let mut command = Command::new("redis-server");
        command.arg(&conf).arg("--sentinel");
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        sentinel.child = Some(child);
        for _ in 0..200 {
            if sentinel.command(&["PING"]).is_ok() {
                return sentinel;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-sentinel did not answer on port {}", sentinel.port);
    }

    fn run(&mut self, mut command: Command) {
        self.kill();
        let child = command
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            // DEBUG SLEEP stalls it, as a fork or a slow disk would.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self._dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server; .ci/run installs it)");
        self.child = Some(child);
        for _ in 0..200 {
            if self.command(&["PING"]).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer on port {}", self.port);
    }

    /// Lets everyone in again.
    pub fn unlock(&mut self) {
        self.command(&["CONFIG", "SET", "requirepass", ""]).unwrap();
        self.password = None;
    }

    /// One command, as `redis-cli` would send it.
    pub fn command(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let url = match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        let client = redis::Client::open(url)?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
    }

    /// A string value, or `None`.
    pub fn get(&self, key: &str) -> Option<String> {
        match self.command(&["GET", key]).unwrap() {
            redis::Value::Nil => None,
            value => redis::from_redis_value(value).ok(),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `len` bytes, every one telling where it belongs (a file, an upload): a byte out
/// of place or missing shows in a comparison, where zeros would not.
pub fn patterned(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// `plain` gzipped, as PHP's `zlib.output_compression` or a web server sends it.
pub fn gzip(plain: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(plain).unwrap();
    encoder.finish().unwrap()
}

/// A gzip body made plain again, as a browser does.
pub fn gunzip(zipped: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(zipped)
        .read_to_end(&mut plain)
        .expect("a whole gzip body");
    plain
}
