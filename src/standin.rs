//! Stand-ins for the Moodle cluster: PHP nodes with node-local (file) sessions and a
//! data server, each a small HTTP/1.1 server on `127.0.0.1:0`.
//!
//! Why: the gateway exists because one misrouted request logs a student out of every
//! node (MOODLE.md). A real Moodle is too heavy for tests and the demo, so these
//! stand-ins copy exactly the session behaviour that matters: a session lives on the
//! node that issued it; login and logout rotate the id; a request reaching the wrong
//! node *loses* the session (its row is deleted, as Moodle does) and is counted in the
//! cluster's [`Registry`]. Every response carries `X-Upstream: <name>`.
//!
//! # Test directives
//! Request headers that script one response (fixture tests), bypassing all session
//! logic; the request is still recorded in [`StandIn::requests`]:
//! - `x-standin-status: N`: answer status `N` (200..=599) instead of 200.
//! - `x-standin-set-cookie: <raw line>` (may repeat): each value becomes its own
//!   `Set-Cookie` line, byte-identical and in order (the stand-in sets no cookie of
//!   its own on a scripted response).
//! - `x-standin-header: Name: value` (may repeat): adds a response header, e.g.
//!   `Connection: x-foo` plus `X-Foo: 1` to test hop-by-hop stripping.
//! - `x-standin-delay-ms: N`: sleep `N` ms before sending the response head.
//!
//! A malformed directive is answered `500` with the reason in the body.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Scripts that never start a session (`NO_MOODLE_COOKIES`), relative to the site path.
const SESSIONLESS: &[&str] = &[
    "/theme/styles.php",
    "/theme/javascript.php",
    "/theme/image.php",
    "/theme/font.php",
    "/theme/yui_combo.php",
    "/lib/javascript.php",
    "/lib/requirejs.php",
    "/tokenpluginfile.php",
];
/// Scripts that call `require_login()`.
const LOGIN_REQUIRED: &[&str] = &[
    "/my/",
    "/course/view.php",
    "/mod/scorm/player.php",
    "/mod/scorm/datamodel.php",
];
/// Size of `.../big.bin` on the data server: enough to cross many body chunks.
const BIG_FILE: usize = 1 << 20;

/// Which Moodle server a stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A PHP node with node-local sessions.
    Node,
    /// The data server: answers SCORM files without checking sessions. The real one
    /// runs `scorm_pluginfile()` after `require_login()`, so it needs a shared session
    /// store; the stand-in skips that check to keep the cluster's sessions node-local.
    Data,
}

/// How one stand-in behaves.
#[derive(Debug, Clone)]
pub struct StandInConfig {
    /// Sent back in `X-Upstream` and recorded as the owner of sessions it issues.
    pub name: String,
    /// The wwwroot sub-path: `""` or like `"/moodle"`.
    pub site_path: String,
    /// The session cookie name: `MoodleSession` plus any `$CFG->sessioncookie` suffix.
    pub cookie: String,
    /// Node or data server.
    pub role: Role,
}

/// One request as the stand-in received it, for assertions on what the gateway sent.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The method.
    pub method: Method,
    /// The request target as received (origin form: path and query).
    pub uri: Uri,
    /// The headers as received, including any directives.
    pub headers: HeaderMap,
    /// The body length in bytes.
    pub body_len: usize,
}

/// One session: the `sessions` row (owner) plus the node's session data.
struct Session {
    node: String,
    user: Option<String>,
    logintoken: String,
}

#[derive(Default)]
struct Sessions {
    by_id: HashMap<String, Session>,
    lost: u64,
}

/// Every session any node of one cluster issued, like Moodle's `sessions` table: a
/// cheap-clone handle over one mutex, never held across an `.await`. No `Debug`:
/// session ids are credentials, even in a stand-in's test output.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Sessions>>);

/// The session a request runs in, and whether the response must set its cookie.
struct Current {
    id: String,
    user: Option<String>,
    logintoken: String,
    issue: bool,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests that reached a node other than the one holding their live session:
    /// each one logged a student out (with node-local sessions, the row is deleted).
    pub fn lost_sessions(&self) -> u64 {
        self.lock().lost
    }

    /// The node holding session `id`, if it is live.
    pub fn owner(&self, id: &str) -> Option<String> {
        self.lock().by_id.get(id).map(|s| s.node.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Sessions> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn count(&self, node: &str) -> usize {
        self.lock()
            .by_id
            .values()
            .filter(|s| s.node == node)
            .count()
    }

    /// `core\session\manager::start()`: the cookie's session if `node` holds it, else a
    /// new guest session. A live id held by another node is a lost session: Moodle
    /// finds the row without session data, so it deletes the row and regenerates.
    fn resolve(&self, node: &str, id: Option<&str>) -> Current {
        let mut sessions = self.lock();
        if let Some(id) = id {
            match sessions.by_id.get(id) {
                Some(s) if s.node == node => {
                    let (user, logintoken) = (s.user.clone(), s.logintoken.clone());
                    let (id, issue) = (id.to_owned(), false);
                    return Current {
                        id,
                        user,
                        logintoken,
                        issue,
                    };
                }
                Some(_) => {
                    sessions.lost += 1;
                    sessions.by_id.remove(id);
                }
                None => {}
            }
        }
        let (id, session) = fresh(node, None);
        let logintoken = session.logintoken.clone();
        sessions.by_id.insert(id.clone(), session);
        Current {
            id,
            user: None,
            logintoken,
            issue: true,
        }
    }

    /// `session_regenerate_id(true)`: the old id is gone everywhere.
    fn rotate(&self, node: &str, current: &mut Current, user: Option<String>) {
        let mut sessions = self.lock();
        sessions.by_id.remove(&current.id);
        let (id, session) = fresh(node, user.clone());
        current.logintoken = session.logintoken.clone();
        sessions.by_id.insert(id.clone(), session);
        (current.id, current.user, current.issue) = (id, user, true);
    }
}

fn fresh(node: &str, user: Option<String>) -> (String, Session) {
    let logintoken = random_alnum(32);
    (
        random_alnum(26),
        Session {
            node: node.to_owned(),
            user,
            logintoken,
        },
    )
}

/// `[a-z0-9]{len}` from the OS generator, by rejection so every character is equally likely.
fn random_alnum(len: usize) -> String {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random generator works");
        let usable = bytes.iter().filter(|&&b| b < 252).take(len - out.len());
        out.extend(usable.map(|&b| ALPHABET[usize::from(b % 36)] as char));
    }
    out
}

struct Inner {
    config: StandInConfig,
    upstream: HeaderValue,
    registry: Registry,
    seen: Mutex<Vec<SeenRequest>>,
}

/// One running stand-in. Dropping it (or calling [`StandIn::stop`]) stops accepting
/// and cuts every open connection at once, like a node that died.
pub struct StandIn {
    inner: Arc<Inner>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl StandIn {
    /// Binds `127.0.0.1:0` and serves in the background. Call inside a Tokio runtime.
    pub fn spawn(config: StandInConfig, registry: Registry) -> io::Result<StandIn> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let upstream = HeaderValue::from_str(&config.name).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "name is not a header value")
        })?;
        let seen = Mutex::new(Vec::new());
        let inner = Arc::new(Inner {
            config,
            upstream,
            registry,
            seen,
        });
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept(listener, inner.clone(), stopped));
        Ok(StandIn { inner, addr, stop })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name, as sent in `X-Upstream`.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen().clone()
    }

    /// The most recent request.
    pub fn last_request(&self) -> Option<SeenRequest> {
        self.seen().last().cloned()
    }

    /// How many requests arrived.
    pub fn request_count(&self) -> usize {
        self.seen().len()
    }

    /// Forgets the recorded requests (sessions are kept).
    pub fn clear_requests(&self) {
        self.seen().clear();
    }

    /// Live sessions this node holds.
    pub fn sessions(&self) -> usize {
        self.inner.registry.count(&self.inner.config.name)
    }

    /// Stops serving now, as if the node died; the port stays closed.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    fn seen(&self) -> MutexGuard<'_, Vec<SeenRequest>> {
        self.inner.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Resolves when the stand-in is stopped or dropped (the sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&stopped| stopped).await;
}

async fn accept(listener: TcpListener, inner: Arc<Inner>, stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stopped(stop.clone()) => return,
        };
        let _ = stream.set_nodelay(true);
        let (inner, stop) = (inner.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(inner.clone(), r));
            let http = hyper::server::conn::http1::Builder::new();
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stopped(stop) => {}
            }
        });
    }
}

async fn handle(
    inner: Arc<Inner>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    inner
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(SeenRequest {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body_len: body.len(),
        });
    let mut response = match scripted(&parts.headers) {
        Some(Ok(script)) => script.respond().await,
        Some(Err(reason)) => reply(StatusCode::INTERNAL_SERVER_ERROR, reason),
        None if inner.config.role == Role::Data => inner.file(&parts.uri),
        None => inner.node(&parts, &body),
    };
    response
        .headers_mut()
        .insert("x-upstream", inner.upstream.clone());
    Ok(response)
}

/// A response scripted by `x-standin-*` request headers.
struct Script {
    status: StatusCode,
    cookies: Vec<HeaderValue>,
    headers: Vec<(HeaderName, HeaderValue)>,
    delay: Duration,
}

fn scripted(headers: &HeaderMap) -> Option<Result<Script, String>> {
    let names = [
        "x-standin-status",
        "x-standin-set-cookie",
        "x-standin-header",
        "x-standin-delay-ms",
    ];
    names
        .iter()
        .any(|name| headers.contains_key(*name))
        .then(|| script(headers))
}

fn script(headers: &HeaderMap) -> Result<Script, String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        let Some(value) = headers.get(name) else {
            return Ok(None);
        };
        let text = value.to_str().unwrap_or("");
        text.trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}: {text:?} is not a number"))
    };
    let status = match number("x-standin-status")? {
        Some(n @ 200..=599) => StatusCode::from_u16(n as u16).map_err(|e| e.to_string())?,
        Some(n) => return Err(format!("x-standin-status: {n} is not a final status")),
        None => StatusCode::OK,
    };
    Ok(Script {
        status,
        cookies: headers
            .get_all("x-standin-set-cookie")
            .iter()
            .cloned()
            .collect(),
        headers: headers
            .get_all("x-standin-header")
            .iter()
            .map(extra_header)
            .collect::<Result<_, _>>()?,
        delay: Duration::from_millis(number("x-standin-delay-ms")?.unwrap_or(0)),
    })
}

/// `Name: value`, split at the first colon.
fn extra_header(raw: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
    let bad = || format!("x-standin-header: {raw:?} is not `Name: value`");
    let (name, value) = raw.as_bytes().split_at(
        raw.as_bytes()
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(bad)?,
    );
    let name = HeaderName::from_bytes(name.trim_ascii()).map_err(|_| bad())?;
    let value = HeaderValue::from_bytes(value[1..].trim_ascii()).map_err(|_| bad())?;
    Ok((name, value))
}

impl Script {
    async fn respond(self) -> Response<Full<Bytes>> {
        tokio::time::sleep(self.delay).await;
        let empty = matches!(self.status.as_u16(), 204 | 304);
        let body = if empty {
            String::new()
        } else {
            format!("scripted {}\n", self.status)
        };
        let mut response = reply(self.status, body);
        let headers = response.headers_mut();
        for cookie in self.cookies {
            headers.append(SET_COOKIE, cookie);
        }
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

/// What a path under the site is, as Moodle's scripts see it.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    /// `tool_heartbeat`: no session, a fixed answer.
    Heartbeat,
    /// `NO_MOODLE_COOKIES` scripts and static files.
    Sessionless,
    /// A script (or directory index) that runs in a session.
    Script(&'a str),
}

/// `rest` is the path below the site; a script is the path up to its first `.php`
/// segment, so slash arguments (`/theme/styles.php/boost/1/all`) name their script.
fn target(rest: &str) -> Target<'_> {
    if rest.starts_with("/admin/tool/heartbeat/") {
        return Target::Heartbeat;
    }
    if rest.starts_with("/webservice/") {
        return Target::Sessionless;
    }
    let script = rest
        .match_indices(".php")
        .map(|(i, _)| &rest[..i + 4])
        .find(|s| matches!(rest.as_bytes().get(s.len()), None | Some(b'/')));
    match script {
        Some(s) if SESSIONLESS.contains(&s) => Target::Sessionless,
        Some(s) => Target::Script(s),
        None if rest.ends_with('/') => Target::Script(rest),
        None => Target::Sessionless,
    }
}

/// The path below `site`, or `None` when the request is outside the site.
fn under<'a>(path: &'a str, site: &str) -> Option<&'a str> {
    match path.strip_prefix(site)? {
        "" => Some("/"),
        rest if rest.starts_with('/') => Some(rest),
        _ => None,
    }
}

impl Inner {
    fn node(&self, parts: &Parts, body: &[u8]) -> Response<Full<Bytes>> {
        let Some(rest) = under(parts.uri.path(), &self.config.site_path) else {
            return reply(StatusCode::NOT_FOUND, "not under the site path\n");
        };
        match target(rest) {
            Target::Heartbeat => reply(StatusCode::OK, "Server is ALIVE\n"),
            Target::Sessionless => reply(
                StatusCode::OK,
                format!("/* {rest} from {} */\n", self.config.name),
            ),
            Target::Script(script) => self.script(script, parts, body),
        }
    }

    /// One script inside a session, then `Set-Cookie` if the session started or rotated.
    fn script(&self, script: &str, parts: &Parts, body: &[u8]) -> Response<Full<Bytes>> {
        let StandInConfig {
            name,
            site_path: site,
            cookie,
            ..
        } = &self.config;
        let mut current = self
            .registry
            .resolve(name, session_cookie(&parts.headers, cookie));
        let post = parts.method == Method::POST;
        let mut response = match script {
            "/login/index.php" if post => self.log_in(&mut current, body),
            "/login/index.php" => login_form(site, name, &current.logintoken, ""),
            "/login/logout.php" => self.log_out(&mut current),
            s if LOGIN_REQUIRED.contains(&s) || s == "/my/index.php" => match &current.user {
                None => redirect(format!("{site}/login/index.php")),
                Some(_) if post && s == "/mod/scorm/datamodel.php" => reply(StatusCode::OK, "true"),
                Some(user) => reply(StatusCode::OK, hello(site, user, name)),
            },
            _ => reply(StatusCode::OK, format!("<p>{script} from {name}\n")),
        };
        if current.issue {
            let line = format!("{cookie}={}; path={site}/; HttpOnly", current.id);
            let line =
                HeaderValue::try_from(line).expect("ids and validated names are header-safe");
            response.headers_mut().append(SET_COOKIE, line);
        }
        response
    }

    /// `login_user()` after the `logintoken` check: any username and password pass.
    fn log_in(&self, current: &mut Current, body: &[u8]) -> Response<Full<Bytes>> {
        let (name, site) = (&self.config.name, &self.config.site_path);
        if form_value(body, "logintoken").as_deref() != Some(current.logintoken.as_str()) {
            let error = "<p class=\"error\">invalidlogintoken: your session may have timed out\n";
            return login_form(site, name, &current.logintoken, error);
        }
        let user = form_value(body, "username").filter(|u| !u.is_empty());
        let user = user.unwrap_or_else(|| "student".to_owned());
        self.registry.rotate(name, current, Some(user));
        redirect(format!("{site}/my/"))
    }

    /// `terminate_current()`: a logged-in student gets a new anonymous session.
    fn log_out(&self, current: &mut Current) -> Response<Full<Bytes>> {
        if current.user.is_some() {
            self.registry.rotate(&self.config.name, current, None);
        }
        redirect(format!("{}/", self.config.site_path))
    }

    /// Any `mod_scorm` file (every URL form) from the data server; the rest is 404.
    fn file(&self, uri: &Uri) -> Response<Full<Bytes>> {
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        if !(target.contains("mod_scorm") || target.contains("moddata/scorm")) {
            return reply(StatusCode::NOT_FOUND, "not a SCORM file\n");
        }
        if uri.path().ends_with("/big.bin") {
            let bytes: Vec<u8> = (0..BIG_FILE).map(|i| (i % 251) as u8).collect();
            let mut response = reply(StatusCode::OK, bytes);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            return response;
        }
        reply(
            StatusCode::OK,
            format!("SCORM {} from {}\n", uri.path(), self.config.name),
        )
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let html = HeaderValue::from_static("text/html; charset=utf-8");
    response.headers_mut().insert(CONTENT_TYPE, html);
    response
}

/// Moodle's `redirect()` answers 303 See Other.
fn redirect(location: String) -> Response<Full<Bytes>> {
    let mut response = reply(StatusCode::SEE_OTHER, "");
    let location = HeaderValue::try_from(location).expect("site paths are header-safe");
    response.headers_mut().insert(LOCATION, location);
    response
}

/// A usable form for a real browser (the demo), and `logintoken=TOKEN` for scripts.
fn login_form(site: &str, node: &str, token: &str, error: &str) -> Response<Full<Bytes>> {
    reply(StatusCode::OK, format!(
        "<!doctype html><title>Log in</title>{error}<p>Log in on {node} (any name and password)\n\
         <form method=\"post\" action=\"{site}/login/index.php\">\
         <input type=\"hidden\" name=\"logintoken\" value=\"{token}\">\
         <input name=\"username\" value=\"student\"><input name=\"password\" type=\"password\" value=\"x\">\
         <button>Log in</button></form>\n<!-- logintoken={token} -->\n"
    ))
}

fn hello(site: &str, user: &str, node: &str) -> String {
    format!(
        "Hello {user} from {node}\n<p><a href=\"{site}/course/view.php?id=2\">course</a> \
         <a href=\"{site}/mod/scorm/player.php?a=1\">SCORM</a> \
         <a href=\"{site}/login/logout.php?sesskey=x\">log out</a>\n"
    )
}

/// The first cookie called `name` across all `Cookie` headers, as PHP reads it;
/// empty and `deleted` count as no cookie.
fn session_cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let (_, value) = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)?;
    (!value.is_empty() && value != "deleted").then_some(value)
}

fn form_value(body: &[u8], key: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let (_, value) = text
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == key)?;
    let value = value.replace('+', " ");
    Some(
        percent_encoding::percent_decode_str(&value)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// `web1..webN` and `data`, sharing one [`Registry`]: a Moodle cluster with node-local
/// sessions, the setup where a misrouted request costs a student their login.
pub struct Cluster {
    nodes: Vec<StandIn>,
    data: StandIn,
    registry: Registry,
    site_path: String,
    cookie: String,
}

impl Cluster {
    /// Spawns `nodes` PHP nodes and the data server. Call inside a Tokio runtime.
    pub fn spawn(nodes: usize, site_path: &str, cookie: &str) -> io::Result<Cluster> {
        let registry = Registry::new();
        let spawn = |name: String, role| {
            let (site_path, cookie) = (site_path.to_owned(), cookie.to_owned());
            StandIn::spawn(
                StandInConfig {
                    name,
                    site_path,
                    cookie,
                    role,
                },
                registry.clone(),
            )
        };
        let nodes = (1..=nodes).map(|i| spawn(format!("web{i}"), Role::Node));
        let nodes = nodes.collect::<io::Result<Vec<_>>>()?;
        let data = spawn("data".to_owned(), Role::Data)?;
        let (site_path, cookie) = (site_path.to_owned(), cookie.to_owned());
        Ok(Cluster {
            nodes,
            data,
            registry,
            site_path,
            cookie,
        })
    }

    /// The PHP nodes, `web1` first (the gateway's config order).
    pub fn nodes(&self) -> &[StandIn] {
        &self.nodes
    }

    /// The data server.
    pub fn data(&self) -> &StandIn {
        &self.data
    }

    /// A node or the data server by name.
    pub fn by_name(&self, name: &str) -> Option<&StandIn> {
        self.nodes
            .iter()
            .chain([&self.data])
            .find(|s| s.name() == name)
    }

    /// The cluster's session registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// See [`Registry::lost_sessions`].
    pub fn lost_sessions(&self) -> u64 {
        self.registry.lost_sessions()
    }

    /// The wwwroot sub-path the stand-ins serve.
    pub fn site_path(&self) -> &str {
        &self.site_path
    }

    /// The session cookie name.
    pub fn cookie(&self) -> &str {
        &self.cookie
    }

    /// A gateway config for this cluster. Every generated setting is a top-level or
    /// dotted key (`site.path`, `session.cookie`, `admin.token`), so `extra` is placed
    /// after them, before `[[nodes]]`, and may hold top-level keys
    /// (`trusted_proxies = ["127.0.0.1"]`), dotted keys of any section
    /// (`session.balance = "least-sessions"`, `timeouts.response_headers = "1s"`) or
    /// whole `[timeouts]` tables; not `[site]`, `[session]` or `[admin]` headers.
    pub fn config_toml(&self, listen: &str, admin: Option<(&str, &str)>, extra: &str) -> String {
        let mut toml = format!(
            "listen = {listen:?}\nsite.path = {:?}\nsession.cookie = {:?}\n",
            self.site_path, self.cookie
        );
        if let Some((listen, token)) = admin {
            toml += &format!("admin.listen = {listen:?}\nadmin.token = {token:?}\n");
        }
        toml += extra;
        toml += "\n";
        for node in &self.nodes {
            toml += &format!(
                "\n[[nodes]]\nname = {:?}\nurl = \"http://{}\"\n",
                node.name(),
                node.addr()
            );
        }
        toml += &format!(
            "\n[data]\nname = {:?}\nurl = \"http://{}\"\n",
            self.data.name(),
            self.data.addr()
        );
        toml
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{Browser, Reply};

    fn browser(cluster: &Cluster, node: usize) -> Browser {
        let addr = cluster.nodes()[node].addr();
        Browser::new(addr, cluster.site_path(), cluster.cookie())
    }

    /// Opens the form and logs in; returns the form's reply and the login POST's.
    async fn log_in(browser: &mut Browser) -> (Reply, Reply) {
        let form = browser.get("/login/index.php").await.unwrap();
        let text = form.text();
        let token = text
            .split_once("logintoken=")
            .unwrap()
            .1
            .split_whitespace()
            .next();
        let body = format!("username=ann&password=x&logintoken={}", token.unwrap());
        (form, browser.post("/login/index.php", &body).await.unwrap())
    }

    #[tokio::test]
    async fn a_first_visit_starts_a_guest_session() {
        let cluster = Cluster::spawn(1, "/moodle", "MoodleSessionlms").unwrap();
        let mut b = browser(&cluster, 0);
        let reply = b.get("/login/index.php").await.unwrap();
        let id = reply.issued.clone().unwrap();
        assert_eq!(id.len(), 26);
        assert!(id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        let line = format!("MoodleSessionlms={id}; path=/moodle/; HttpOnly");
        assert_eq!(reply.header("set-cookie"), line);
        assert_eq!(reply.upstream(), "web1");
        assert!(reply.text().contains("name=\"logintoken\" value=\""));
        let again = b.get("/").await.unwrap();
        assert_eq!((again.status, again.issued), (StatusCode::OK, None));
        b.set_session(Some("deleted".into()));
        assert!(b.get("/login/").await.unwrap().issued.is_some());
        assert_eq!(cluster.nodes()[0].sessions(), 2);
        assert_eq!(
            b.get("/elsewhere.php").await.unwrap().status,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn login_with_the_right_token_rotates_the_id() {
        let cluster = Cluster::spawn(1, "/moodle", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        let (form, login) = log_in(&mut b).await;
        let (guest, user) = (form.issued.unwrap(), login.issued.clone().unwrap());
        assert_eq!(
            (login.status, login.location()),
            (StatusCode::SEE_OTHER, "/moodle/my/")
        );
        assert_ne!(guest, user);
        assert_eq!(cluster.registry().owner(&guest), None);
        assert_eq!(cluster.registry().owner(&user).as_deref(), Some("web1"));
        assert_eq!(
            b.get("/my/").await.unwrap().text().lines().next(),
            Some("Hello ann from web1")
        );
        let saved = b.post("/mod/scorm/datamodel.php", "cmi=1").await.unwrap();
        assert_eq!((saved.text().as_str(), saved.issued), ("true", None));
    }

    #[tokio::test]
    async fn a_wrong_token_keeps_the_id_and_logs_nobody_in() {
        let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        b.get("/login/index.php").await.unwrap();
        let reply = b
            .post("/login/index.php", "username=a&password=b&logintoken=nope")
            .await
            .unwrap();
        assert_eq!((reply.status, reply.issued.clone()), (StatusCode::OK, None));
        assert!(reply.text().contains("invalidlogintoken"));
        assert!(b
            .get("/course/view.php?id=2")
            .await
            .unwrap()
            .sent_to_login());
    }

    #[tokio::test]
    async fn logout_starts_a_new_anonymous_session() {
        let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        let user = log_in(&mut b).await.1.issued.unwrap();
        let out = b.get("/login/logout.php?sesskey=x").await.unwrap();
        assert_eq!((out.status, out.location()), (StatusCode::SEE_OTHER, "/"));
        assert!(out.issued.as_ref().is_some_and(|id| *id != user));
        assert!(b.get("/my/").await.unwrap().sent_to_login());
        let again = b.get("/login/logout.php?sesskey=x").await.unwrap();
        assert_eq!((again.status, again.issued), (StatusCode::SEE_OTHER, None));
    }

    #[tokio::test]
    async fn a_session_from_another_node_is_lost_everywhere() {
        let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
        let (mut on_web1, mut on_web2) = (browser(&cluster, 0), browser(&cluster, 1));
        let user = log_in(&mut on_web1).await.1.issued.unwrap();
        on_web2.set_session(Some(user));
        let misrouted = on_web2.get("/my/").await.unwrap();
        assert!(misrouted.sent_to_login() && misrouted.issued.is_some());
        assert_eq!(cluster.lost_sessions(), 1);
        // Moodle deleted the row: the student is logged out on their own node too.
        assert!(on_web1.get("/my/").await.unwrap().sent_to_login());
        assert_eq!(cluster.lost_sessions(), 1);
    }

    #[tokio::test]
    async fn sessionless_requests_never_touch_a_session() {
        let cluster = Cluster::spawn(1, "/moodle", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        let paths = [
            "/theme/styles.php/boost/1/all",
            "/theme/javascript.php/boost/1/footer",
            "/theme/image.php/boost/core/1/i/loading",
            "/theme/font.php/boost/core/1/x.woff",
            "/theme/yui_combo.php?a.js",
            "/lib/javascript.php/1/lib/x.js",
            "/lib/requirejs.php/1/x.js",
            "/webservice/rest/server.php",
            "/tokenpluginfile.php/t/27/mod_scorm/content/1/a.html",
            "/pix/i/loading.gif",
            "/admin/tool/heartbeat/",
        ];
        for path in paths {
            let reply = b.get(path).await.unwrap();
            assert_eq!(
                (reply.status, reply.issued),
                (StatusCode::OK, None),
                "{path}"
            );
        }
        assert_eq!(
            b.get("/admin/tool/heartbeat/").await.unwrap().text(),
            "Server is ALIVE\n"
        );
        assert_eq!(cluster.registry().owner("x"), None);
        assert_eq!(cluster.nodes()[0].sessions(), 0);
        let mut data = Browser::new(cluster.data().addr(), "/moodle", "MoodleSession");
        let file = data
            .get("/pluginfile.php/27/mod_scorm/content/1/big.bin")
            .await
            .unwrap();
        assert_eq!(
            (file.status, file.body.len(), file.upstream()),
            (StatusCode::OK, BIG_FILE, "data")
        );
        assert!(file.headers.get(SET_COOKIE).is_none());
    }

    #[tokio::test]
    async fn directives_script_the_response() {
        let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        let directives = [
            ("x-standin-status", "502"),
            ("x-standin-set-cookie", "MoodleSession=a1; path=/"),
            ("x-standin-set-cookie", "Other=b;  Secure"),
            ("x-standin-header", "Connection: x-foo"),
            ("x-standin-header", "X-Foo: bar"),
            ("x-standin-delay-ms", "60"),
        ];
        let started = std::time::Instant::now();
        let reply = b
            .send(Method::GET, "/my/", None, &directives)
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(60));
        assert_eq!(
            (reply.status, reply.upstream()),
            (StatusCode::BAD_GATEWAY, "web1")
        );
        let cookies: Vec<_> = reply.headers.get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["MoodleSession=a1; path=/", "Other=b;  Secure"]);
        assert_eq!(
            (reply.header("connection"), reply.header("x-foo")),
            ("x-foo", "bar")
        );
        assert_eq!(cluster.nodes()[0].sessions(), 0);
        let seen = cluster.nodes()[0].last_request().unwrap();
        assert_eq!(
            (seen.uri.path(), seen.headers["x-standin-status"].as_bytes()),
            ("/my/", &b"502"[..])
        );
        let bad = b
            .send(Method::GET, "/", None, &[("x-standin-header", "nocolon")])
            .await
            .unwrap();
        assert_eq!(bad.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(cluster.nodes()[0].request_count(), 2);
    }

    #[tokio::test]
    async fn a_stopped_node_refuses_connections() {
        let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
        let mut b = browser(&cluster, 0);
        assert_eq!(b.get("/").await.unwrap().status, StatusCode::OK);
        cluster.nodes()[0].stop();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(b.get("/").await.is_err());
    }

    #[tokio::test]
    async fn config_toml_is_a_valid_gateway_config() {
        let cluster = Cluster::spawn(3, "/moodle", "MoodleSessionlms").unwrap();
        let extra = "session.balance = \"least-sessions\"\n[timeouts]\nconnect = \"1s\"";
        let toml = cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", "s3cret")), extra);
        let config = crate::Config::parse(&toml, std::path::Path::new("."), None).unwrap();
        let names: Vec<_> = config.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["web1", "web2", "web3"]);
        assert_eq!(
            config.nodes[1].authority.as_str(),
            cluster.nodes()[1].addr().to_string()
        );
        assert_eq!(
            config.data.authority.as_str(),
            cluster.data().addr().to_string()
        );
        assert_eq!(
            (config.site.path.as_str(), config.session.cookie.as_str()),
            ("/moodle", "MoodleSessionlms")
        );
        assert_eq!(config.admin.unwrap().token, "s3cret");
        assert_eq!(
            config.session.balance,
            crate::config::Balance::LeastSessions
        );
        assert_eq!(config.timeouts.connect, Duration::from_secs(1));
    }
}
