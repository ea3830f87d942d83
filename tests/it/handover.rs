//! A restart and an upgrade that cost no student a request: the new process takes
//! the listening sockets and the session table from the old one (`run --handover
//! PATH`), the old one finishes what it has in flight and exits; and systemd's
//! socket activation, where the socket outlives every process.
//!
//! Students keep clicking through both, someone downloads a file and someone
//! uploads one across the moment of the handover, and newcomers log in while it
//! happens: not one connection may be refused, not one request fail, and every
//! student stays on the node that holds their session (a student sent elsewhere
//! would be logged out with node-local sessions).
//!
//! One thing the students do that a bare HTTP client does not: like every browser,
//! they send a request again, once, when a kept-alive connection closed before
//! answering it (RFC 9112, 9.3.1). A server may close an idle connection just as
//! the next request leaves the client; the old process closes its idle ones when
//! it stops accepting, and nginx and HAProxy do the same at a reload.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::{Browser, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{GatewayProcess, TempDir};

const BINARY: &str = env!("CARGO_BIN_EXE_moodle-gateway");

/// What went wrong for the students, as they would tell it.
#[derive(Default)]
struct Complaints(Mutex<Vec<String>>);

impl Complaints {
    fn add(&self, what: String) {
        self.0.lock().unwrap().push(what);
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// `GET path`, sent again once if a kept connection closed before any answer.
async fn get(browser: &mut Browser, path: &str) -> Result<Reply, String> {
    match browser.get(path).await {
        Err(error) if closed_unanswered(&error) => browser.get(path).await,
        answered => answered,
    }
}

/// `POST path`, the same way.
async fn post(browser: &mut Browser, path: &str, form: &str) -> Result<Reply, String> {
    match browser.post(path, form).await {
        Err(error) if closed_unanswered(&error) => browser.post(path, form).await,
        answered => answered,
    }
}

fn closed_unanswered(error: &str) -> bool {
    error.contains("IncompleteMessage") || error.contains("ConnectionReset")
}

/// A student who logged in: their browser and the node holding their session.
async fn log_in(addr: std::net::SocketAddr, n: usize) -> Result<(Browser, String), String> {
    let mut browser = Browser::new(addr, "", "MoodleSession");
    let form = get(&mut browser, "/login/index.php").await?;
    let text = form.text();
    let token = (text.split_once("logintoken=").map(|(_, t)| &t[..32]))
        .ok_or_else(|| format!("no login form: {text}"))?
        .to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    let done = post(&mut browser, "/login/index.php", &body).await?;
    if done.status != 303 {
        return Err(done.unexpected("login", "303"));
    }
    let home = get(&mut browser, "/my/").await?;
    if home.status != 200 {
        return Err(home.unexpected("home", "200"));
    }
    let node = home.upstream().to_owned();
    Ok((browser, node))
}

/// A logged-in student clicking until `stop`: every page must be theirs, from
/// their node. Returns how many pages they saw.
async fn keep_clicking(
    mut browser: Browser,
    node: String,
    stop: Arc<AtomicBool>,
    complaints: Arc<Complaints>,
) -> usize {
    let mut pages = 0;
    while !stop.load(Ordering::Relaxed) {
        match get(&mut browser, "/my/").await {
            Ok(page) if page.status == 200 && page.upstream() == node => pages += 1,
            Ok(page) => complaints.add(page.unexpected("a page", &format!("200 from {node}"))),
            Err(error) => complaints.add(format!("a click failed: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pages
}

/// Newcomers logging in one after another until `stop`, each checking that the
/// page after the login comes from the node that logged them in (a login the old
/// process finishes must be known to the new one).
async fn keep_logging_in(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    complaints: Arc<Complaints>,
    counted: Arc<AtomicUsize>,
) {
    let mut n = 1000;
    while !stop.load(Ordering::Relaxed) {
        match log_in(addr, n).await {
            Ok((mut browser, node)) => match get(&mut browser, "/course/view.php?id=2").await {
                Ok(page) if page.status == 200 && page.upstream() == node => {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(page) => complaints.add(page.unexpected("after login", &node)),
                Err(error) => complaints.add(format!("after login: {error}")),
            },
            Err(error) => complaints.add(format!("a login failed: {error}")),
        }
        n += 1;
    }
}

/// A large file read slowly, through a small receive buffer, so that it is still
/// coming when the handover happens; its length when whole.
async fn slow_download(addr: std::net::SocketAddr, cookie: String) -> Result<usize, String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .set_recv_buffer_size(4096)
        .map_err(|e| e.to_string())?;
    let mut conn = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!(
        "GET /pluginfile.php/27/mod_scorm/content/1/big.bin HTTP/1.1\r\nHost: localhost\r\n\
         Cookie: {cookie}\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = conn.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let end = (answer.windows(4).position(|w| w == b"\r\n\r\n")).ok_or("no response head")?;
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("download answered {head}"));
    }
    Ok(answer.len() - end - 4)
}

/// A SCORM track upload whose body trickles in over a few seconds; the status.
async fn slow_upload(addr: std::net::SocketAddr, cookie: String) -> Result<u16, String> {
    let body: String = "cmi.core.lesson_status=completed&".repeat(40);
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let head = format!(
        "POST /mod/scorm/datamodel.php HTTP/1.1\r\nHost: localhost\r\nCookie: {cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    for piece in body.as_bytes().chunks(body.len() / 20 + 1) {
        conn.write_all(piece).await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let status = String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .map(str::to_owned);
    status
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status: {:?}", String::from_utf8_lossy(&answer)))
}

/// `run --handover DIR/handover.sock` with `binary`, in `dir` (its config and
/// state file), as an operator starts the new binary beside the old one.
fn start_handing_over(binary: &Path, dir: &Path) -> GatewayProcess {
    let mut command = Command::new(binary);
    command
        .arg("run")
        .arg("--handover")
        .arg(dir.join("handover.sock"));
    crate::support::spawn_sharing(command, dir)
}

/// A copy of the gateway binary elsewhere: "the new version" of an upgrade.
fn second_binary(dir: &Path) -> PathBuf {
    let copy = dir.join("moodle-gateway-next");
    std::fs::copy(BINARY, &copy).unwrap();
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_an_upgrade_under_load_refuse_no_one_fail_nothing_and_log_no_one_out() {
    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let dir = crate::support::new_dir(&cluster.config_toml("127.0.0.1:0", None, ""));
    let first = start_handing_over(Path::new(BINARY), &dir.0);
    let addr = first.addr;

    let (stop, complaints) = (
        Arc::new(AtomicBool::new(false)),
        Arc::<Complaints>::default(),
    );
    let mut clicking = Vec::new();
    let mut cookies = Vec::new();
    for n in 1..=6 {
        let (browser, node) = log_in(addr, n).await.unwrap();
        cookies.push(format!("MoodleSession={}", browser.session().unwrap()));
        let (stop, complaints) = (stop.clone(), complaints.clone());
        clicking.push(tokio::spawn(keep_clicking(browser, node, stop, complaints)));
    }
    let logins = Arc::new(AtomicUsize::new(0));
    let newcomers = tokio::spawn(keep_logging_in(
        addr,
        stop.clone(),
        complaints.clone(),
        logins.clone(),
    ));

    // The restart: the same binary again. A download and an upload are on their way.
    let download = tokio::spawn(slow_download(addr, cookies[0].clone()));
    let upload = tokio::spawn(slow_upload(addr, cookies[1].clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut first = first;
    let second = start_handing_over(Path::new(BINARY), &dir.0);
    assert_eq!(second.addr, addr, "the new process serves the same socket");
    let exit = first.exit_within(Duration::from_secs(30)).await;
    assert!(exit.success(), "the old process exits cleanly: {exit}");
    assert_eq!(
        download.await.unwrap(),
        Ok(1 << 20),
        "the download in flight arrived whole"
    );
    assert_eq!(
        upload.await.unwrap(),
        Ok(200),
        "the upload in flight was answered"
    );

    // The upgrade: another binary takes over from the second process.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut second = second;
    let third = start_handing_over(&second_binary(&dir.0), &dir.0);
    let exit = second.exit_within(Duration::from_secs(30)).await;
    assert!(
        exit.success(),
        "the upgraded-from process exits cleanly: {exit}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.store(true, Ordering::Relaxed);
    newcomers.await.unwrap();
    let mut pages = 0;
    for student in clicking {
        pages += student.await.unwrap();
    }
    assert_eq!(
        complaints.all(),
        Vec::<String>::new(),
        "{:#?}",
        [&first, &second, &third].map(|p| p.logged("previous process"))
    );
    assert!(pages > 0 && logins.load(Ordering::Relaxed) > 0);
    let heard = third.logs_within("the previous process has finished", Duration::from_secs(30));
    assert!(
        heard.await,
        "the new process heard the old one out: {:#?}",
        [&second, &third].map(|p| p.logged(""))
    );
}

/// systemd holds the socket (`moodle-gateway.socket`) and passes it to each
/// process it starts: a connection made while no gateway runs waits in the
/// backlog and is answered by the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_passed_the_way_systemd_does_is_served_and_outlives_a_restart() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    // A configured address the socket does not have: it is found by its name.
    let dir = crate::support::new_dir(&cluster.config_toml("0.0.0.0:1", None, ""));

    let first = activated(&socket, &dir);
    assert_eq!(first.addr, addr);
    let (mut browser, node) = log_in(addr, 1).await.unwrap();
    let mut first = first;
    first.signal("TERM");
    first.exit_within(Duration::from_secs(10)).await;

    // No gateway runs now: the click waits in the socket's backlog.
    let click = tokio::spawn(async move { browser.get("/my/").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _second = activated(&socket, &dir);
    let page = click
        .await
        .unwrap()
        .expect("the click was answered, not refused");
    assert_eq!(
        (page.status.as_u16(), page.upstream()),
        (200, node.as_str())
    );
}

/// The gateway started as systemd starts a socket-activated service: the socket
/// as descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` its own pid (set by a shell that
/// then execs the gateway, keeping its pid), `LISTEN_FDNAMES=public`.
fn activated(socket: &std::net::TcpListener, dir: &TempDir) -> GatewayProcess {
    activated_with(std::slice::from_ref(socket), "public", dir)
}

/// The same with several sockets, as descriptors 3 on, named by `names`
/// (`LISTEN_FDNAMES`, colon-separated). bash, not sh: dash moves only
/// single-digit descriptors.
pub(crate) fn activated_with(
    sockets: &[std::net::TcpListener],
    names: &str,
    dir: &TempDir,
) -> GatewayProcess {
    use std::os::fd::AsRawFd;
    let mut moves = String::new();
    for (n, socket) in sockets.iter().enumerate() {
        // Kept open across exec, as systemd's are.
        rustix::io::fcntl_setfd(socket, rustix::io::FdFlags::empty()).unwrap();
        moves += &format!("exec {}<&{}; ", 3 + n, socket.as_raw_fd());
    }
    let count = sockets.len();
    let script = format!(
        "{moves}LISTEN_PID=$$ LISTEN_FDS={count} LISTEN_FDNAMES={names} exec \"$0\" run \"$@\""
    );
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .arg(BINARY)
        .stdin(Stdio::null());
    crate::support::spawn_sharing(command, &dir.0)
}
