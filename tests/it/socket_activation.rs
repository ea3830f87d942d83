//! Every listener on a socket systemd holds: the students', the admin's and the
//! HTTPS redirect's, each passed by name as the package's socket units pass them
//! (`moodle-gateway.socket`, `moodle-gateway-admin.socket`,
//! `moodle-gateway-redirect.socket`), so that a restart refuses a connection on
//! none of them.
//!
//! The gateway runs under `systemd-socket-activate` (Debian's `systemd` package),
//! which binds the sockets, waits for a first connection and execs the gateway with
//! them, as systemd does; the tests skip, saying so, where it is missing.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use moodle_gateway::demo::standin::Cluster;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{GatewayProcess, TempDir};
use crate::tls::TestCert;

const BINARY: &str = env!("CARGO_BIN_EXE_moodle-gateway");
const ACTIVATE: &str = "/usr/bin/systemd-socket-activate";
const TOKEN: &str = "socket-activation-test-token-0123456789";

/// The three sockets systemd would hold, at free loopback ports.
struct Sockets {
    public: SocketAddr,
    admin: SocketAddr,
    redirect: SocketAddr,
}

impl Sockets {
    /// Three different free ports: the three probes are held at once, so no two
    /// of them can be the same port.
    fn free() -> Self {
        let probes: [std::net::TcpListener; 3] =
            std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let at = |i: usize| probes[i].local_addr().unwrap();
        Self {
            public: at(0),
            admin: at(1),
            redirect: at(2),
        }
    }

    /// `systemd-socket-activate` holding them, named as the socket units name
    /// them, ready to exec `BINARY` with `args` (the caller adds `--config`).
    fn activator(&self, args: &[&str]) -> Command {
        let mut command = Command::new(ACTIVATE);
        for at in [self.public, self.admin, self.redirect] {
            command.arg("-l").arg(at.to_string());
        }
        command
            .arg("--fdname=public:admin:redirect")
            // It passes the gateway nothing of its environment unless told.
            .args(["-E", "RUST_LOG"])
            .arg(BINARY)
            .args(args)
            .stdin(Stdio::null());
        command
    }
}

/// Whether `systemd-socket-activate` is here; says why the test skips if not.
fn can_activate() -> bool {
    let here = Path::new(ACTIVATE).exists();
    if !here {
        eprintln!("skipped: no {ACTIVATE} (Debian's systemd package; .ci/run installs it)");
    }
    here
}

/// A config whose public and redirect listeners are configured at wildcard
/// addresses the sockets do not have (as the shipped `listen = "0.0.0.0:8080"`
/// meets systemd's `ListenStream=8080`): the gateway finds those by name. The
/// admin listener is configured at its socket's own address, found by it.
fn config(cluster: &Cluster, cert: &TestCert, sockets: &Sockets) -> String {
    // Sessions in a shared store, so that `check` takes the config as a site's.
    let extra = format!(
        "{}tls.redirect_listen = \"0.0.0.0:2\"\nstate.file = \"\"\nsession.store = \"shared\"\n",
        cert.config_keys()
    );
    let admin = sockets.admin.to_string();
    cluster.config_toml("0.0.0.0:1", Some((&admin, TOKEN)), &extra)
}

/// How many times a test starts the activator on new ports. A free port stays
/// free only until the activator binds it: meanwhile another test's outgoing
/// connection may take it as its own local port, and the activator then exits
/// saying "Address already in use". That start is tried again on other ports.
const STARTS: usize = 5;

/// Knocks on `at` until something listens there, while `running` says the
/// activator has not exited: the connection that makes `systemd-socket-activate`
/// exec the gateway, kept open until dropped. `None` if the activator exited
/// first. Up to 30 s: on a loaded machine the activator itself can take seconds
/// to start.
async fn knock(at: SocketAddr, mut running: impl FnMut() -> bool) -> Option<TcpStream> {
    for _ in 0..1200 {
        if let Ok(stream) = TcpStream::connect(at).await {
            return Some(stream);
        }
        if !running() {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing listens on {at} after 30 s, and the activator still runs");
}

/// The gateway started the way systemd starts it, once a first connection came,
/// on sockets at free ports; `config` is the gateway's config for those sockets.
async fn activated(config: impl Fn(&Sockets) -> String) -> (Sockets, TempDir, GatewayProcess) {
    for start in 1..=STARTS {
        let sockets = Sockets::free();
        let dir = crate::support::new_dir(&config(&sockets));
        let command = sockets.activator(&["run"]);
        let at = dir.0.clone();
        let starting =
            tokio::task::spawn_blocking(move || crate::support::spawn_sharing(command, &at));
        // An activator that exits ends `spawn_sharing` in a panic: no address logged.
        let _first = knock(sockets.admin, || !starting.is_finished()).await;
        match starting.await {
            Ok(gateway) => return (sockets, dir, gateway),
            Err(_) if start < STARTS => {
                eprintln!("the activator exited before listening; starting it on other ports")
            }
            Err(error) => panic!("the activator never started the gateway: {error}"),
        }
    }
    unreachable!("the last start returns or panics")
}

/// One request on a new connection, read to its end: the answer's head and body.
async fn ask(at: SocketAddr, request: &str) -> Result<String, String> {
    let stream = TcpStream::connect(at).await.map_err(|e| e.to_string())?;
    exchange(stream, request).await
}

/// `request` sent on `stream`, and the answer read to the connection's end.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> Result<String, String> {
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Err(_) => return Err("no answer within 10 s".into()),
        // A TLS peer that closes without close_notify still said all it had to.
        Ok(Err(error)) if answer.is_empty() => return Err(error.to_string()),
        Ok(_) => {}
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A student's page over HTTPS, on the students' listener.
async fn page(at: SocketAddr, cert: &TestCert) -> Result<String, String> {
    let config = crate::tls::client_config(cert, b"http/1.1", rustls::DEFAULT_VERSIONS);
    let stream = crate::tls::connect_with(at, &config).await;
    let request = format!(
        "GET /login/index.php HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\n\r\n",
        at.port()
    );
    exchange(stream, &request).await
}

/// The admin listener's `/nodes`, with the token.
async fn admin_nodes(at: SocketAddr) -> Result<String, String> {
    let request = format!(
        "GET /nodes HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    );
    ask(at, &request).await
}

/// A plain-HTTP request to the redirect listener.
async fn redirected(at: SocketAddr) -> Result<String, String> {
    let request = "GET /course/view.php?id=2 HTTP/1.1\r\nHost: moodle.example\r\n\
                   Connection: close\r\n\r\n";
    ask(at, request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_answers_on_the_socket_systemd_passes() {
    if !can_activate() {
        return;
    }
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let cert = TestCert::new("activation");
    let (sockets, _dir, gateway) = activated(|sockets| config(&cluster, &cert, sockets)).await;

    assert_eq!(
        gateway.addr, sockets.public,
        "the students' socket, by name"
    );
    assert_eq!(
        gateway.admin_addr,
        Some(sockets.admin),
        "the admin's, by address"
    );
    let nodes = admin_nodes(sockets.admin).await.unwrap();
    assert!(nodes.starts_with("HTTP/1.1 200"), "{nodes}");
    let moved = redirected(sockets.redirect).await.unwrap();
    assert!(moved.starts_with("HTTP/1.1 308"), "{moved}");
    assert!(
        moved.contains("location: https://moodle.example"),
        "{moved}"
    );
    let students = TcpStream::connect(sockets.public).await;
    assert!(students.is_ok(), "the students' socket accepts");
}

/// What `check` says when systemd passes the sockets: each configured listener by
/// role, and whether it comes from systemd or is bound by the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_which_listeners_come_from_systemd() {
    if !can_activate() {
        return;
    }
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let cert = TestCert::new("activation-check");
    let mut start = 0;
    let (sockets, out) = loop {
        start += 1;
        let sockets = Sockets::free();
        let dir = crate::support::new_dir(&config(&cluster, &cert, &sockets));
        let mut command = sockets.activator(&["check", "--config"]);
        command
            .arg(dir.0.join("config.toml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut checking = command.spawn().unwrap();
        let first = knock(sockets.public, || matches!(checking.try_wait(), Ok(None))).await;
        let out = tokio::task::spawn_blocking(move || checking.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        // `check` ran if it printed, even if it was done (and the activator with it)
        // before the knock's connection was seen to open: it answers no one.
        if first.is_some() || !out.stdout.is_empty() {
            break (sockets, out);
        }
        let errors = String::from_utf8_lossy(&out.stderr);
        assert!(
            errors.contains("Address already in use") && start < STARTS,
            "the activator exited before listening, start {start}: {errors}"
        );
    };
    let said = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}{errors}");
    for line in [
        "listening sockets from systemd:",
        "  public 0.0.0.0:1: systemd's socket",
        &format!("  admin {}: systemd's socket", sockets.admin),
        "  redirect 0.0.0.0:2: systemd's socket",
    ] {
        assert!(said.lines().any(|l| l == line), "no {line:?} in:\n{said}");
    }
}

/// systemd holds every socket while no gateway runs: a connection made to any of
/// them meanwhile waits in its backlog and is answered by the next process. The
/// test holds the sockets itself, as systemd does across `systemctl restart`
/// (`systemd-socket-activate` execs the gateway and cannot outlive it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_waits_through_a_restart_and_answers() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let cert = TestCert::new("activation-restart");
    let bound = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held = [bound(), bound(), bound()];
    let at = |i: usize| held[i].local_addr().unwrap();
    let sockets = Sockets {
        public: at(0),
        admin: at(1),
        redirect: at(2),
    };
    let dir = crate::support::new_dir(&config(&cluster, &cert, &sockets));

    let mut first = crate::handover::activated_with(&held, "public:admin:redirect", &dir);
    let before = page(sockets.public, &cert).await.unwrap();
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    first.signal("TERM");
    first.exit_within(Duration::from_secs(10)).await;

    // No gateway runs now: a student's click, an admin's look and an address typed
    // without https:// wait.
    let cert = std::sync::Arc::new(cert);
    let click = tokio::spawn({
        let cert = cert.clone();
        async move { page(sockets.public, &cert).await }
    });
    let look = tokio::spawn(admin_nodes(sockets.admin));
    let typed = tokio::spawn(redirected(sockets.redirect));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _second = crate::handover::activated_with(&held, "public:admin:redirect", &dir);

    let clicked = click.await.unwrap().expect("the click was answered");
    assert!(clicked.starts_with("HTTP/1.1 200"), "{clicked}");
    let nodes = look.await.unwrap().expect("the admin was answered");
    assert!(nodes.starts_with("HTTP/1.1 200"), "{nodes}");
    let moved = typed
        .await
        .unwrap()
        .expect("the typed address was answered");
    assert!(moved.starts_with("HTTP/1.1 308"), "{moved}");
}
