//! `moodle-gateway demo`: the real gateway in front of a stand-in Moodle cluster
//! ([`crate::standin`]), plus a student simulator that proves nobody gets logged out.
//!
//! Why: the gateway's whole promise is "no student loses their session", and that is
//! only convincing when watched: a room of students logging in at once, the gateway's
//! affinity table filling evenly, and the stand-ins reporting zero requests for a
//! session held by another node. Tests reuse [`simulate_students`] and [`Browser`].

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::{Config, DEFAULT_COOKIE};
use crate::gateway::Gateway;
use crate::standin::Cluster;
use crate::App;

/// How many PHP nodes the demo cluster has.
const DEMO_NODES: usize = 4;
/// A student whose request takes longer than this is stuck, not slow.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The sessionless assets a login page pulls in: they must not start sessions or
/// move the deal of new sessions.
const ASSETS: [&str; 3] = [
    "/theme/styles.php/boost/1/all",
    "/lib/javascript.php/1/lib/javascript-static.js",
    "/theme/image.php/boost/core/1/i/loading",
];

/// What `moodle-gateway demo` was asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The gateway's public listener (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// The admin listener (default `127.0.0.1:9090`).
    pub admin_listen: SocketAddr,
    /// Simulate this many students, report and return; `None` serves until Ctrl-C.
    pub students: Option<usize>,
    /// At most this many students at once (default 8).
    pub concurrency: usize,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            students: None,
            concurrency: 8,
        }
    }
}

/// How a demo run ended, so `main` can exit non-zero when a session was lost.
#[derive(Debug)]
pub struct DemoOutcome {
    /// The simulated students' report, when `--students` was given.
    pub report: Option<StudentsReport>,
    /// Requests the stand-ins saw for a session another node holds.
    pub lost_sessions: u64,
}

impl DemoOutcome {
    /// No session lost and no student step failed.
    pub fn success(&self) -> bool {
        self.lost_sessions == 0 && self.report.iter().all(StudentsReport::ok)
    }
}

/// Runs the cluster and the gateway; with `students`, drives them and reports.
pub async fn run(options: DemoOptions) -> Result<DemoOutcome, Box<dyn Error>> {
    let cluster = Cluster::spawn(DEMO_NODES, "", DEFAULT_COOKIE)?;
    let public = TcpListener::bind(options.listen).await?;
    let admin = TcpListener::bind(options.admin_listen).await?;
    let (public_addr, admin_addr) = (public.local_addr()?, admin.local_addr()?);
    let token = random_token()?;
    let admin_settings = Some((admin_addr.to_string(), token.clone()));
    let admin_settings = admin_settings
        .as_ref()
        .map(|(l, t)| (l.as_str(), t.as_str()));
    let toml = cluster.config_toml(&public_addr.to_string(), admin_settings, "");
    let app = App::new(Config::parse(&toml, Path::new("."), None)?);
    let gateway = app.gateway().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.serve(public, Some(admin), async {
        let _ = stopped.await;
    }));
    print_banner(&cluster, public_addr, admin_addr, &token);
    let report = match options.students {
        None => {
            println!("Serving until Ctrl-C.");
            tokio::signal::ctrl_c().await?;
            None
        }
        Some(count) => {
            Some(drive(&cluster, &gateway, public_addr, count, options.concurrency).await)
        }
    };
    let _ = stop.send(());
    server.await??;
    let lost_sessions = cluster.lost_sessions();
    Ok(DemoOutcome {
        report,
        lost_sessions,
    })
}

/// 32 random bytes as hex: a fresh admin token per run, never a default one.
fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn print_banner(cluster: &Cluster, public: SocketAddr, admin: SocketAddr, token: &str) {
    let nodes: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("{} {}", n.name(), n.addr()))
        .collect();
    println!("moodle-gateway demo: stand-in Moodle nodes with node-local sessions");
    println!(
        "  nodes: {}; data server {}",
        nodes.join(", "),
        cluster.data().addr()
    );
    println!(
        "  students: http://{public}{}/login/index.php",
        cluster.site_path()
    );
    println!("  admin:    http://{admin}/affinity   token {token}");
    println!("  curl -H 'Authorization: Bearer {token}' http://{admin}/affinity");
}

/// Logs everyone in, snapshots the gateway's table while they are all logged in,
/// logs everyone out, then prints the report.
async fn drive(
    cluster: &Cluster,
    gateway: &Gateway,
    addr: SocketAddr,
    count: usize,
    concurrency: usize,
) -> StudentsReport {
    let (site, cookie) = (cluster.site_path(), cluster.cookie());
    let students = Students::log_in(addr, site, cookie, count, concurrency).await;
    let table = gateway.table();
    let snapshot: Vec<(String, u64, u64)> = (gateway.nodes().iter().enumerate())
        .map(|(i, node)| (node.name.clone(), table.live(i), table.logged_in(i)))
        .collect();
    let report = students.log_out().await;
    print_report(&report, &snapshot, cluster.lost_sessions());
    report
}

fn print_report(report: &StudentsReport, snapshot: &[(String, u64, u64)], lost: u64) {
    let seconds = report.duration.as_secs_f64();
    println!(
        "\n{} students, {} requests in {seconds:.2}s",
        report.students, report.requests
    );
    println!("node    students logged in   gateway table after logins: live  logged-in");
    for (name, live, logged_in) in snapshot {
        let students = report.logged_in.get(name).copied().unwrap_or(0);
        println!("{name:<7} {students:>18}   {live:>32}  {logged_in:>9}");
    }
    println!("lost sessions: {lost} (stand-ins saw no request for a session another node holds)");
    match report.failures.len() {
        0 => println!("failures: none"),
        n => println!("failures: {n}"),
    }
    for failure in &report.failures {
        println!("  {failure}");
    }
}

/// One simulated browser: a pooled HTTP/1 client and a one-cookie jar holding just
/// the session cookie, updated from every `Set-Cookie` like a browser would.
#[derive(Clone)]
pub struct Browser {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    cookie: String,
    session: Option<String>,
    requests: u64,
}

/// One response, read to the end.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The session id this response set, if it set the session cookie to a value.
    pub issued: Option<String>,
}

impl Reply {
    /// `X-Upstream`: which stand-in answered.
    pub fn upstream(&self) -> &str {
        self.header("x-upstream")
    }

    /// `Location`, or `""`.
    pub fn location(&self) -> &str {
        self.header(LOCATION.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// One header as text, or `""`.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// `"{what}: {status} from {upstream}: want {want}"`, for a failure report.
    pub fn unexpected(&self, what: &str, want: &str) -> String {
        format!(
            "{what}: {} from {}: want {want}",
            self.status,
            self.upstream()
        )
    }

    /// Moodle's `require_login()` bounced the request: the session was not there.
    pub fn sent_to_login(&self) -> bool {
        self.status == StatusCode::SEE_OTHER && self.location().contains("/login/index.php")
    }
}

impl Browser {
    /// A browser for the site at `http://{server}{site_path}` with session cookie `cookie`.
    pub fn new(server: SocketAddr, site_path: &str, cookie: &str) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self::with_client(client, server, site_path, cookie)
    }

    /// Shares a connection pool, so a thousand students do not hold a thousand sockets.
    fn with_client(
        client: Client<HttpConnector, Full<Bytes>>,
        server: SocketAddr,
        site_path: &str,
        cookie: &str,
    ) -> Self {
        let base = format!("http://{server}{site_path}");
        Self {
            client,
            base,
            cookie: cookie.to_owned(),
            session: None,
            requests: 0,
        }
    }

    /// The session id in the jar.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Replaces the jar's session id (to replay a stolen or stale cookie).
    pub fn set_session(&mut self, id: Option<String>) {
        self.session = id;
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// `GET {site}{path}`.
    pub async fn get(&mut self, path: &str) -> Result<Reply, String> {
        self.send(Method::GET, path, None, &[]).await
    }

    /// `POST {site}{path}` with a form body.
    pub async fn post(&mut self, path: &str, form: &str) -> Result<Reply, String> {
        self.send(Method::POST, path, Some(form), &[]).await
    }

    /// Sends one request with the jar's cookie and `headers`, reads the whole reply
    /// and keeps any session cookie it sets. `Err` means no HTTP reply at all.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        form: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let what = format!("{method} {path}");
        let request = self
            .request(method, path, form, headers)
            .map_err(|e| format!("{what}: {e}"))?;
        self.requests += 1;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result.map_err(|e| format!("{what}: {e}"))?,
            Err(_) => return Err(format!("{what}: no reply within {REQUEST_TIMEOUT:?}")),
        };
        let issued = self.keep_cookie(&parts.headers);
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
            issued,
        })
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        form: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Request<Full<Bytes>>, http::Error> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(id) = &self.session {
            request = request.header(COOKIE, format!("{}={id}", self.cookie));
        }
        if form.is_some() {
            request = request.header(CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Full::new(Bytes::from(form.unwrap_or("").to_owned())))
    }

    /// The last `Set-Cookie` for our cookie wins; `deleted` or empty clears the jar.
    fn keep_cookie(&mut self, headers: &HeaderMap) -> Option<String> {
        let value = headers
            .get_all(SET_COOKIE)
            .iter()
            .rev()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|line| line.split(';').next()?.trim().split_once('='))
            .find(|(name, _)| *name == self.cookie)?
            .1;
        let issued = (!value.is_empty() && value != "deleted").then(|| value.to_owned());
        self.session = issued.clone();
        issued
    }
}

/// One step that did not go as Moodle would have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The student, numbered from 1.
    pub student: usize,
    /// What went wrong, starting with the request.
    pub reason: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "student {}: {}", self.student, self.reason)
    }
}

/// What the simulated students experienced.
#[derive(Debug, Clone, Default)]
pub struct StudentsReport {
    /// How many students ran.
    pub students: usize,
    /// Node name (`X-Upstream` of the login POST) → students who logged in there.
    pub logged_in: BTreeMap<String, usize>,
    /// One per student whose flow broke, at the first broken step.
    pub failures: Vec<Failure>,
    /// Requests sent through the gateway.
    pub requests: u64,
    /// Wall time of both phases.
    pub duration: Duration,
}

impl StudentsReport {
    /// Every student logged in, studied and logged out without a hitch.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs `count` students through the whole flow (log in, browse, SCORM, log out),
/// at most `concurrency` at once; with 1 they arrive one after another.
pub async fn simulate_students(
    gateway: SocketAddr,
    site_path: &str,
    cookie: &str,
    count: usize,
    concurrency: usize,
) -> StudentsReport {
    let students = Students::log_in(gateway, site_path, cookie, count, concurrency).await;
    students.log_out().await
}

/// Students between the two phases: logged in and done studying, not yet logged
/// out, so the gateway's table can be inspected with every session live.
pub struct Students {
    students: Vec<Student>,
    concurrency: usize,
    started: Instant,
}

impl Students {
    /// Phase one: each student opens the login form, loads its assets, logs in,
    /// visits their dashboard and course, opens a SCORM file and saves progress.
    pub async fn log_in(
        gateway: SocketAddr,
        site_path: &str,
        cookie: &str,
        count: usize,
        concurrency: usize,
    ) -> Students {
        let started = Instant::now();
        let client = Client::builder(TokioExecutor::new()).build_http();
        let students = (1..=count).map(|index| Student {
            index,
            browser: Browser::with_client(client.clone(), gateway, site_path, cookie),
            login_node: None,
            failure: None,
        });
        let students = run_phase(students.collect(), concurrency, Phase::LogIn).await;
        Students {
            students,
            concurrency,
            started,
        }
    }

    /// Phase two: every student still in good standing logs out.
    pub async fn log_out(self) -> StudentsReport {
        let students = run_phase(self.students, self.concurrency, Phase::LogOut).await;
        let mut report = StudentsReport {
            students: students.len(),
            duration: self.started.elapsed(),
            ..StudentsReport::default()
        };
        for student in students {
            report.requests += student.browser.requests();
            if let Some(node) = student.login_node {
                *report.logged_in.entry(node).or_default() += 1;
            }
            if let Some(reason) = student.failure {
                report.failures.push(Failure {
                    student: student.index,
                    reason,
                });
            }
        }
        report
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    LogIn,
    LogOut,
}

/// Permits are taken in student order before each task starts, so students arrive
/// in order and never more than `concurrency` are mid-flow.
async fn run_phase(students: Vec<Student>, concurrency: usize, phase: Phase) -> Vec<Student> {
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(students.len());
    for mut student in students {
        let permit = gate
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        tasks.push(tokio::spawn(async move {
            student.play(phase).await;
            drop(permit);
            student
        }));
    }
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await.expect("a student task panicked"));
    }
    done
}

struct Student {
    index: usize,
    browser: Browser,
    login_node: Option<String>,
    failure: Option<String>,
}

impl Student {
    async fn play(&mut self, phase: Phase) {
        if self.failure.is_some() {
            return;
        }
        let result = match phase {
            Phase::LogIn => self.log_in().await,
            Phase::LogOut => self.log_out().await,
        };
        self.failure = result.err();
    }

    /// Phase one for this student; the first unexpected answer ends it.
    async fn log_in(&mut self) -> Result<(), String> {
        let (token, guest) = self.open_login_form().await?;
        let form = format!(
            "username=student{}&password=x&logintoken={token}",
            self.index
        );
        let reply = self.browser.post("/login/index.php", &form).await?;
        let rotated = reply.issued.as_ref().is_some_and(|id| *id != guest);
        if reply.status != StatusCode::SEE_OTHER || !rotated {
            return Err(reply.unexpected("POST /login/index.php", "303 and a new session id"));
        }
        self.login_node = Some(reply.upstream().to_owned());
        self.page(Method::GET, "/my/", "Hello").await?;
        self.page(Method::GET, "/course/view.php?id=2", "Hello")
            .await?;
        let path = "/pluginfile.php/27/mod_scorm/content/1/index.html";
        let file = self.browser.get(path).await?;
        if file.status != StatusCode::OK || file.upstream() != "data" {
            return Err(file.unexpected(&format!("GET {path}"), "200 from data"));
        }
        self.page(Method::GET, "/mod/scorm/player.php?a=1", "Hello")
            .await?;
        self.page(Method::POST, "/mod/scorm/datamodel.php", "true")
            .await
    }

    /// The login form and the assets it pulls in; returns the logintoken and the
    /// guest session id the form was served in.
    async fn open_login_form(&mut self) -> Result<(String, String), String> {
        let form = self.browser.get("/login/index.php").await?;
        let (Some(token), Some(guest)) = (logintoken(&form.text()), form.issued.clone()) else {
            return Err(form.unexpected("GET /login/index.php", "a logintoken and a session"));
        };
        for asset in ASSETS {
            let reply = self.browser.get(asset).await?;
            if reply.status != StatusCode::OK || reply.issued.is_some() {
                return Err(reply.unexpected(&format!("GET {asset}"), "200 without a session"));
            }
        }
        Ok((token, guest))
    }

    /// A page behind `require_login()`: a bounce to the login page is a lost session.
    async fn page(&mut self, method: Method, path: &str, expect: &str) -> Result<(), String> {
        let form = (method == Method::POST).then_some("cmi.core.lesson_status=completed");
        let what = format!("{method} {path}");
        let reply = self.browser.send(method, path, form, &[]).await?;
        if reply.sent_to_login() {
            return Err(format!(
                "{what}: lost session: {} sent the student to log in",
                reply.upstream()
            ));
        }
        if reply.status != StatusCode::OK || !reply.text().starts_with(expect) {
            return Err(reply.unexpected(&what, &format!("{expect:?}")));
        }
        Ok(())
    }

    /// Moodle's logout starts a new anonymous session rather than clearing the cookie.
    async fn log_out(&mut self) -> Result<(), String> {
        let before = self.browser.session().map(str::to_owned);
        let reply = self.browser.get("/login/logout.php?sesskey=x").await?;
        let anonymous = reply.issued.is_some() && reply.issued != before;
        if reply.status != StatusCode::SEE_OTHER || !anonymous {
            let want = "303 and a new anonymous session";
            return Err(reply.unexpected("GET /login/logout.php", want));
        }
        Ok(())
    }
}

/// The token after `logintoken=` in a login page.
fn logintoken(page: &str) -> Option<String> {
    let (_, rest) = page.split_once("logintoken=")?;
    let token: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real gateway (no admin listener) before `cluster`, until the test ends.
    async fn gateway(cluster: &Cluster) -> SocketAddr {
        let toml = cluster.config_toml("127.0.0.1:0", None, "");
        let app = App::new(Config::parse(&toml, Path::new("."), None).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(app.serve(listener, None, std::future::pending()));
        addr
    }

    #[tokio::test]
    async fn eight_students_keep_their_sessions_through_the_gateway() {
        let cluster = Cluster::spawn(4, "/moodle", "MoodleSessionlms").unwrap();
        let addr = gateway(&cluster).await;
        let report = simulate_students(addr, "/moodle", "MoodleSessionlms", 8, 4).await;
        assert!(report.ok(), "{:?}", report.failures);
        let spread: Vec<_> = report.logged_in.values().copied().collect();
        assert_eq!(spread, [2, 2, 2, 2], "{:?}", report.logged_in);
        assert_eq!(cluster.lost_sessions(), 0);
        assert_eq!(report.requests, 8 * 11);
        assert_eq!(cluster.data().request_count(), 8);
    }

    #[tokio::test]
    async fn the_demo_runs_students_and_reports_success() {
        let options = DemoOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            students: Some(8),
            concurrency: 1,
        };
        let outcome = run(options).await.unwrap();
        assert!(outcome.success(), "{outcome:?}");
        let report = outcome.report.unwrap();
        assert_eq!(report.logged_in.values().sum::<usize>(), 8);
    }

    #[test]
    fn logintoken_is_read_from_the_page() {
        let page = "<input name=\"logintoken\" value=\"Ab12\">\n<!-- logintoken=Ab12 -->";
        assert_eq!(logintoken(page).as_deref(), Some("Ab12"));
        assert_eq!(logintoken("nothing"), None);
    }
}
