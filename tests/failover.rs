//! Two gateway hosts and one floating address (keepalived, VRRP), students under
//! load, and the master gateway killed: how many requests fail, how long the
//! address goes unanswered, and whether anyone is logged out (never).
//!
//! Run by `tests/failover/run.sh`, which builds the hosts as network namespaces on
//! one bridge (`mg-gw-a`, `mg-gw-b`, and `mg-client`, where this test runs) and
//! passes their names and addresses in the environment; ignored otherwise (it
//! needs root, namespaces and keepalived).
//!
//! Why stand-in nodes, not a real Moodle: what is measured is the gateways and
//! VRRP (who holds the address, what each gateway knows of a student), not PHP.
//! The stand-ins keep node-local sessions exactly as a Moodle node with file
//! sessions does (a session id issued by one node means nothing to another, and a
//! student sent elsewhere lands on the login page), which is the case a failover
//! must get right; they run in this namespace on loopback, each reached from the
//! gateways through a relay on the client's bridge address.
//!
//! The gateways share no table (no Redis): the standby learns each student's node
//! from the signed route cookie, the package's default, which is what a gateway
//! that never saw the student needs.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;

const BINARY: &str = env!("CARGO_BIN_EXE_moodle-gateway");
const STUDENTS: usize = 20;
const ROUTE_SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by tests/failover/run.sh"))
}

/// One request's outcome, at the moment it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Their page, from their node.
    Served,
    /// No answer (refused, reset, timed out): a page to reload.
    Failed,
    /// An answer from another node or the login page: logged out.
    LoggedOut,
}

#[derive(Default)]
struct Record(Mutex<Vec<(Instant, Outcome)>>);

impl Record {
    fn add(&self, outcome: Outcome) {
        self.0.lock().unwrap().push((Instant::now(), outcome));
    }

    /// From `from` to `to`: failed requests, logged-out students' requests, and
    /// the seconds from `from` until the first page served after the last failure.
    fn between(&self, from: Instant, to: Instant) -> (usize, usize, f64) {
        let seen = self.0.lock().unwrap();
        let window: Vec<_> = seen.iter().filter(|(t, _)| *t >= from && *t < to).collect();
        let count = |o: Outcome| window.iter().filter(|(_, x)| *x == o).count();
        let last_failure = (window.iter())
            .filter(|(_, o)| *o != Outcome::Served)
            .map(|(t, _)| *t)
            .max();
        let back = match last_failure {
            None => 0.0,
            Some(failed) => (window.iter())
                .filter(|(t, o)| *o == Outcome::Served && *t > failed)
                .map(|(t, _)| t.duration_since(from).as_secs_f64())
                .fold(f64::INFINITY, f64::min),
        };
        (count(Outcome::Failed), count(Outcome::LoggedOut), back)
    }
}

/// Relays `listen` to `to`: how the gateways in their namespaces reach a stand-in
/// on this namespace's loopback.
async fn relay(listen: SocketAddr, to: SocketAddr) {
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

/// A process in namespace `ns`, killed when dropped.
struct InNamespace(Child);

impl InNamespace {
    /// Its output goes to `dir/PROGRAM.log` (appended: a restarted gateway's too),
    /// which run.sh shows when the test fails.
    fn start(ns: &str, dir: &std::path::Path, program: &str, args: &[&str]) -> Self {
        let name = std::path::Path::new(program).file_name().unwrap();
        let log = dir.join(format!("{}.log", name.to_string_lossy()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, program])
            .current_dir(dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {ns} {program}: {e}"));
        Self(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for InNamespace {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One gateway host: its namespace, directory and processes.
struct Host {
    ns: String,
    dir: std::path::PathBuf,
    gateway: Option<InNamespace>,
    _keepalived: InNamespace,
}

impl Host {
    fn start(ns: &str, dir: &std::path::Path, config: &str, keepalived: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.toml"), config).unwrap();
        std::fs::write(dir.join("keepalived.conf"), keepalived).unwrap();
        let mut host = Host {
            ns: ns.to_owned(),
            dir: dir.to_owned(),
            gateway: None,
            _keepalived: InNamespace::start(
                ns,
                dir,
                "keepalived",
                &[
                    "--dont-fork",
                    "--vrrp",
                    "--log-console",
                    "--use-file",
                    &dir.join("keepalived.conf").to_string_lossy(),
                    "--pid",
                    &dir.join("keepalived.pid").to_string_lossy(),
                    "--vrrp_pid",
                    &dir.join("vrrp.pid").to_string_lossy(),
                ],
            ),
        };
        host.start_gateway();
        host
    }

    fn start_gateway(&mut self) {
        let config = self.dir.join("config.toml");
        let args = ["run", "--config", &config.to_string_lossy()];
        // The state file lands in the working directory: each host its own.
        self.gateway = Some(InNamespace::start(&self.ns, &self.dir, BINARY, &args));
    }

    fn ip(&self, args: &[&str]) {
        let done = Command::new("ip")
            .args(["netns", "exec", &self.ns, "ip"])
            .args(args)
            .status();
        assert!(done.unwrap().success(), "ip {args:?} in {}", self.ns);
    }
}

fn keepalived_conf(me: &str, peer: &str, priority: u32, vip: &str, config: &str) -> String {
    format!(
        "global_defs {{\n  script_user root\n  enable_script_security\n}}\n\
         vrrp_script gateway {{\n  script \"{BINARY} ready --config {config}\"\n  \
         interval 1\n  timeout 2\n  fall 2\n  rise 2\n}}\n\
         vrrp_instance moodle {{\n  state BACKUP\n  interface eth0\n  virtual_router_id 51\n  \
         priority {priority}\n  advert_int 1\n  unicast_src_ip {me}\n  unicast_peer {{\n    {peer}\n  }}\n  \
         virtual_ipaddress {{\n    {vip}/24 dev eth0\n  }}\n  track_script {{\n    gateway\n  }}\n}}\n"
    )
}

/// A student who logged in through `vip`: their browser, node and route cookie.
async fn log_in(vip: SocketAddr, n: usize) -> (Browser, String, String) {
    let mut browser = Browser::new(vip, "", "MoodleSession");
    let form = browser.get("/login/index.php").await.unwrap();
    let token = form.text().split_once("logintoken=").unwrap().1[..32].to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    let done = browser.post("/login/index.php", &body).await.unwrap();
    assert_eq!(done.status, 303, "login: {}", done.text());
    let route = (done.headers.get_all("set-cookie").iter())
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("MoodleGatewayRoute="))
        .map(|v| v.split(';').next().unwrap().to_owned())
        .expect("the gateway set its route cookie");
    (browser, done.upstream().to_owned(), route)
}

/// A student clicking (a page, then a SCORM track) every 100 ms until `stop`.
async fn click(
    mut browser: Browser,
    node: String,
    route: String,
    stop: Arc<AtomicBool>,
    record: Arc<Record>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let headers = [("cookie", route.as_str())];
        let asked = match n % 2 {
            0 => browser.send(Method::GET, "/my/", None, &headers),
            _ => {
                let form = Some("cmi.core.lesson_status=incomplete");
                browser.send(Method::POST, "/mod/scorm/datamodel.php", form, &headers)
            }
        };
        let outcome = match tokio::time::timeout(Duration::from_secs(2), asked).await {
            Ok(Ok(reply)) if reply.status == 200 && reply.upstream() == node => Outcome::Served,
            Ok(Ok(_)) => Outcome::LoggedOut,
            _ => Outcome::Failed,
        };
        record.add(outcome);
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `vip` answers a page, up to `limit`.
async fn answers(vip: SocketAddr, limit: Duration) {
    let started = Instant::now();
    loop {
        let mut probe = Browser::new(vip, "", "MoodleSession");
        let asked = probe.get("/login/index.php");
        if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(1), asked).await {
            if reply.status == 200 {
                return;
            }
        }
        assert!(started.elapsed() < limit, "{vip} never answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root, network namespaces and keepalived: run tests/failover/run.sh"]
async fn the_master_gateway_dies_and_returns_and_no_student_is_logged_out() {
    let (ns_a, ns_b) = (env("MG_NS_A"), env("MG_NS_B"));
    let (ip_a, ip_b, ip_client) = (env("MG_IP_A"), env("MG_IP_B"), env("MG_IP_CLIENT"));
    let vip_ip = env("MG_VIP");
    let work = std::path::PathBuf::from(env("MG_WORK"));

    let cluster = Cluster::spawn(3, "", "MoodleSession").unwrap();
    let mut relayed = cluster.config_toml(
        "0.0.0.0:8080",
        Some((
            "127.0.0.1:9090",
            "failover-test-token-0123456789abcdef0123456789",
        )),
        &format!("route_cookie.secret = {ROUTE_SECRET:?}\n"),
    );
    for member in cluster.nodes().iter().chain([cluster.data()]) {
        let at: SocketAddr = format!("{ip_client}:{}", member.addr().port())
            .parse()
            .unwrap();
        relay(at, member.addr()).await;
        relayed = relayed.replace(&member.addr().to_string(), &at.to_string());
    }
    let host = |ns: &str, name: &str, me: &str, peer: &str, priority| {
        let dir = work.join(name);
        let keepalived = keepalived_conf(
            me,
            peer,
            priority,
            &vip_ip,
            &dir.join("config.toml").to_string_lossy(),
        );
        Host::start(ns, &dir, &relayed, &keepalived)
    };
    let mut a = host(&ns_a, "a", &ip_a, &ip_b, 150);
    let _b = host(&ns_b, "b", &ip_b, &ip_a, 100);
    let vip: SocketAddr = format!("{vip_ip}:8080").parse().unwrap();
    answers(vip, Duration::from_secs(30)).await;

    let (stop, record) = (Arc::new(AtomicBool::new(false)), Arc::<Record>::default());
    let mut students = Vec::new();
    for n in 1..=STUDENTS {
        let (browser, node, route) = log_in(vip, n).await;
        let (stop, record) = (stop.clone(), record.clone());
        students.push(tokio::spawn(click(browser, node, route, stop, record)));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut report = Vec::new();
    let mut event = |what: &str, record: &Record, from: Instant, to: Instant| {
        let (failed, logged_out, back) = record.between(from, to);
        report.push(format!(
            "{what:<44} failed requests {failed:>3}   address answered again after {back:>5.1} s   \
             students logged out {logged_out}"
        ));
        logged_out
    };
    let settle = Duration::from_secs(12);
    let mut logged_out = 0;

    let at = Instant::now();
    a.gateway.as_mut().unwrap().kill();
    tokio::time::sleep(settle).await;
    logged_out += event(
        "master's gateway killed (kill -9)",
        &record,
        at,
        Instant::now(),
    );

    let at = Instant::now();
    a.start_gateway();
    tokio::time::sleep(settle).await;
    logged_out += event(
        "master's gateway back (takes the address back)",
        &record,
        at,
        Instant::now(),
    );

    let at = Instant::now();
    a.ip(&["link", "set", "eth0", "down"]);
    tokio::time::sleep(settle).await;
    logged_out += event("master's link down", &record, at, Instant::now());

    let at = Instant::now();
    a.ip(&["link", "set", "eth0", "up"]);
    tokio::time::sleep(settle).await;
    logged_out += event(
        "master's link up (takes the address back)",
        &record,
        at,
        Instant::now(),
    );

    stop.store(true, Ordering::Relaxed);
    for student in students {
        student.await.unwrap();
    }
    println!("\nfailover with {STUDENTS} students clicking every 100 ms (2 s client timeout):");
    for line in &report {
        println!("  {line}");
    }
    assert_eq!(
        logged_out,
        0,
        "students were logged out:\n{}",
        report.join("\n")
    );
}
