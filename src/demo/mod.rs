//! `moodle-gateway demo`: the real gateway in front of a stand-in Moodle cluster
//! ([`crate::demo::standin`]), plus a student simulator that proves nobody gets logged out.
//!
//! Why: the gateway's whole promise is "no student loses their session", and that is
//! only convincing when watched: a room of students logging in at once, the gateway's
//! affinity table filling evenly, and the stand-ins reporting zero requests for a
//! session held by another node. Tests reuse [`simulate_students`] and [`Browser`].

mod arrivals;
mod browser;
mod crowd;
mod setup;
pub mod standin;
mod students;

pub use browser::{Browser, Reply};
pub use students::{simulate_students, Failure, Students, StudentsReport};

use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::DEFAULT_COOKIE;
use crate::demo::standin::Cluster;
use crate::gateway::Gateway;
use crate::App;

/// How many PHP nodes the demo cluster has.
const DEMO_NODES: usize = 4;

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
    /// Few PHP workers and slow pages on every node, a capped gateway, and (while
    /// serving) a crowd arriving in waves: the line and the waiting room at work.
    pub surge: bool,
    /// Where to write the config the demo runs, for `check` and `doctor`.
    pub write_config: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            students: None,
            concurrency: 8,
            surge: false,
            write_config: None,
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

/// A running demo: the stand-in cluster, the real gateway in front of it with the
/// config [`Demo::config_text`], and (once welcomed) simulated visitors.
pub struct Demo {
    cluster: Cluster,
    gateway: Arc<Gateway>,
    public: SocketAddr,
    admin: SocketAddr,
    token: String,
    config: String,
    surge: bool,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
    visitors: Vec<JoinHandle<()>>,
}

impl Demo {
    /// Binds both listeners, spawns the stand-ins, writes the config (to
    /// `write_config` too) and starts the gateway on it. Call inside a Tokio runtime.
    pub async fn start(options: &DemoOptions) -> Result<Demo, Box<dyn Error>> {
        let cluster = Cluster::spawn_offloaded(DEMO_NODES, "", DEFAULT_COOKIE)?;
        let public = bind(options.listen, "students", "--listen").await?;
        let admin = bind(options.admin_listen, "the admin API", "--admin-listen").await?;
        let token = random_hex()?;
        let setup = setup::Setup {
            public: public.local_addr()?,
            admin: admin.local_addr()?,
            token: &token,
            route_secret: &random_hex()?,
            surge: options.surge,
        };
        let config = setup::config_text(&cluster, &setup);
        let parsed = setup::parse(&config)
            .map_err(|e| format!("check refuses the demo's own config (a bug):\n{e}"))?;
        if let Some(path) = &options.write_config {
            write_secret_file(path, &config)
                .map_err(|e| format!("cannot write the config to {}: {e}", path.display()))?;
        }
        if options.surge {
            for node in cluster.nodes() {
                node.set_workers(Some((setup::SURGE_WORKERS, setup::SURGE_PAGE)));
            }
        }
        let app = App::new(parsed);
        let gateway = app.gateway().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(app.serve(public, Some(admin), async {
            let _ = stopped.await;
        }));
        Ok(Demo {
            cluster,
            gateway,
            public: setup.public,
            admin: setup.admin,
            token,
            config,
            surge: options.surge,
            stop,
            server,
            visitors: Vec::new(),
        })
    }

    /// Lets simulated students arrive one by one, and with `surge` the crowd in
    /// waves, until [`Demo::stop`].
    pub fn welcome_visitors(&mut self) {
        let (site, cookie) = (self.cluster.site_path(), self.cluster.cookie());
        let arriving = arrivals::arrive(self.public, site.to_owned(), cookie.to_owned());
        self.visitors.push(tokio::spawn(arriving));
        if self.surge {
            let crowd = crowd::arrive(self.public, site.to_owned(), cookie.to_owned());
            self.visitors.push(tokio::spawn(crowd));
        }
    }

    /// Where students reach the gateway.
    pub fn public_addr(&self) -> SocketAddr {
        self.public
    }

    /// Where the admin API listens.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The admin token of this run.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The stand-in cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The config the gateway runs, as `--write-config` writes it.
    pub fn config_text(&self) -> &str {
        &self.config
    }

    /// Stops the visitors and the gateway; returns the sessions the stand-ins lost.
    pub async fn stop(self) -> Result<u64, Box<dyn Error>> {
        for visitor in &self.visitors {
            visitor.abort();
        }
        let _ = self.stop.send(());
        self.server.await??;
        Ok(self.cluster.lost_sessions())
    }
}

/// Runs the cluster and the gateway; with `students`, drives them and reports.
pub async fn run(options: DemoOptions) -> Result<DemoOutcome, Box<dyn Error>> {
    let mut demo = Demo::start(&options).await?;
    print_banner(&demo, &options);
    let report = match options.students {
        None => {
            demo.welcome_visitors();
            println!(
                "A simulated student logs in every {}s (at most {} stay); watch them on the \
                 dashboard. Serving until Ctrl-C.",
                arrivals::EVERY.as_secs(),
                arrivals::STAY
            );
            tokio::signal::ctrl_c().await?;
            None
        }
        Some(count) => Some(drive(&demo, count, options.concurrency).await),
    };
    let lost_sessions = demo.stop().await?;
    Ok(DemoOutcome {
        report,
        lost_sessions,
    })
}

/// The config holds the admin token and the route cookie's secret: readable by its
/// owner only, as `check` would want of a real one.
fn write_secret_file(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// A listener on `addr`, or an error that names the address and the `flag` that
/// moves it: the defaults (8080, 9090) are ports another program often holds.
async fn bind(addr: SocketAddr, whom: &str, flag: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|error| {
        let hint = format!(
            "cannot listen for {whom} on {addr}: {error}; choose another address with {flag} ADDR"
        );
        std::io::Error::new(error.kind(), hint)
    })
}

/// 32 random bytes as hex: a fresh admin token (and route secret) per run, never
/// a default one.
fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn print_banner(demo: &Demo, options: &DemoOptions) {
    let (cluster, public, admin, token) = (demo.cluster(), demo.public, demo.admin, &demo.token);
    let nodes: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("{} {}", n.name(), n.addr()))
        .collect();
    println!(
        "moodle-gateway demo: stand-in Moodle nodes with node-local sessions, files through \
         each student's own node (the offload)"
    );
    println!("  nodes: {}", nodes.join(", "));
    let export = cluster
        .export()
        .map(|e| e.addr().to_string())
        .unwrap_or_default();
    println!(
        "  data server {}, its file export {export}",
        cluster.data().addr()
    );
    println!("  students:  http://{public}/login/index.php   (any name and password)");
    println!("  dashboard: http://{admin}/   log in with the admin token below");
    println!("  admin API: http://{admin}/affinity   token {token}");
    println!("  curl -H 'Authorization: Bearer {token}' http://{admin}/affinity");
    if let Some(path) = &options.write_config {
        let path = path.display();
        println!(
            "  config: {path}   (moodle-gateway check --config {path}, and doctor while this runs)"
        );
    }
    if options.surge {
        println!(
            "  surge: {} PHP workers per node, {} ms a page, the gateway's cap {}; while serving, \
             {} newcomers arrive every {} s: watch the line and the waiting room",
            setup::SURGE_WORKERS,
            setup::SURGE_PAGE.as_millis(),
            setup::SURGE_WORKERS - 1,
            crowd::CROWD,
            crowd::EVERY.as_secs()
        );
    }
}

/// Logs everyone in, snapshots the gateway's table while they are all logged in,
/// logs everyone out, then prints the report.
async fn drive(demo: &Demo, count: usize, concurrency: usize) -> StudentsReport {
    let cluster = demo.cluster();
    let (site, cookie) = (cluster.site_path(), cluster.cookie());
    let students = Students::log_in(demo.public, site, cookie, count, concurrency).await;
    let table = demo.gateway.table();
    let nodes = demo.gateway.settings();
    let snapshot: Vec<(String, u64, u64)> = (nodes.upstreams.nodes().iter())
        .map(|node| {
            (
                node.name.clone(),
                table.live(node.id),
                table.logged_in(node.id),
            )
        })
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

/// A test's config for a plain stand-in cluster: no state file, since its sessions
/// die with it.
#[cfg(test)]
pub(crate) fn demo_config(
    toml: &str,
) -> Result<crate::config::Config, crate::config::ConfigErrors> {
    let mut config = crate::config::Config::parse(toml, Path::new("."), Default::default())?;
    config.state.file = None;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_demo_runs_students_and_reports_success() {
        let options = DemoOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            students: Some(8),
            concurrency: 1,
            ..DemoOptions::default()
        };
        let outcome = run(options).await.unwrap();
        assert!(outcome.success(), "{outcome:?}");
        let report = outcome.report.unwrap();
        assert_eq!(report.logged_in.values().sum::<usize>(), 8);
    }
}
