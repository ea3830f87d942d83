//! `moodle-gateway demo`: the real gateway in front of a stand-in Moodle cluster
//! ([`crate::demo::standin`]), plus a student simulator that proves nobody gets logged out.
//!
//! Why: the gateway's whole promise is "no student loses their session", and that is
//! only convincing when watched: a room of students logging in at once, the gateway's
//! affinity table filling evenly, and the stand-ins reporting zero requests for a
//! session held by another node. Tests reuse [`simulate_students`] and [`Browser`].

mod arrivals;
mod browser;
pub mod standin;
mod students;

pub use browser::{Browser, Reply};
pub use students::{simulate_students, Failure, Students, StudentsReport};

use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;

use tokio::net::TcpListener;

use crate::config::{Config, DEFAULT_COOKIE};
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
    let public = bind(options.listen, "students", "--listen").await?;
    let admin = bind(options.admin_listen, "the admin API", "--admin-listen").await?;
    let (public_addr, admin_addr) = (public.local_addr()?, admin.local_addr()?);
    let token = random_token()?;
    let admin_settings = Some((admin_addr.to_string(), token.clone()));
    let admin_settings = admin_settings
        .as_ref()
        .map(|(l, t)| (l.as_str(), t.as_str()));
    let toml = cluster.config_toml(&public_addr.to_string(), admin_settings, "");
    let app = App::new(demo_config(&toml)?);
    let gateway = app.gateway().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.serve(public, Some(admin), async {
        let _ = stopped.await;
    }));
    print_banner(&cluster, public_addr, admin_addr, &token);
    let report = match options.students {
        None => {
            let (site, cookie) = (cluster.site_path().to_owned(), cluster.cookie().to_owned());
            let arriving = tokio::spawn(arrivals::arrive(public_addr, site, cookie));
            println!(
                "A simulated student logs in every {}s (at most {} stay); watch them on the \
                 dashboard. Serving until Ctrl-C.",
                arrivals::EVERY.as_secs(),
                arrivals::STAY
            );
            tokio::signal::ctrl_c().await?;
            arriving.abort();
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
        "  students:  http://{public}{}/login/index.php",
        cluster.site_path()
    );
    println!("  dashboard: http://{admin}/   log in with the admin token below");
    println!("  admin API: http://{admin}/affinity   token {token}");
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
    let nodes = gateway.settings();
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

/// The demo's config: no state file, since the demo's sessions die with it.
pub(crate) fn demo_config(toml: &str) -> Result<Config, crate::config::ConfigErrors> {
    let mut config = Config::parse(toml, Path::new("."), Default::default())?;
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
        };
        let outcome = run(options).await.unwrap();
        assert!(outcome.success(), "{outcome:?}");
        let report = outcome.report.unwrap();
        assert_eq!(report.logged_in.values().sum::<usize>(), 8);
    }
}
