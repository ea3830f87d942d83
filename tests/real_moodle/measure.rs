//! The offload measure (not a test: nothing here is asserted about time): one student
//! downloads the same 50 MiB file resource through the gateway, first served by PHP
//! (no offload), then offloaded (`X-Accel-Redirect`, the bytes from the nginx export).
//! For each: how long the node's PHP worker was busy per download (prepend.php's
//! request log) and the gateway's CPU per MiB (`/proc/<pid>/stat` utime + stime).

use std::process::Command;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

use crate::cluster::{admin_addr, config_for, Cluster, Gateway, Store};
use crate::site::{script, Site, StoredFile, PHP_INI};
use crate::student::{between, http_client, Browser};

/// The file's size, and how many timed downloads each way (after one untimed).
const MIB: u64 = 50;
const DOWNLOADS: usize = 8;

/// One way of serving the file, measured.
struct Figures {
    /// The node's request time of each timed download, in microseconds.
    node_us: Vec<u64>,
    /// The gateway's CPU over the timed downloads, in seconds.
    gateway_cpu: f64,
    /// Wall time of the timed downloads.
    wall: Duration,
    /// Fetches the export logged.
    fetches: usize,
}

/// Runs both rounds on one restored site and prints the table.
pub fn offload() {
    let site = Site::restore();
    let big = big_file(&site);
    let stored = site.stored(&big.contenthash);
    assert_eq!(stored.len() as u64, MIB * 1024 * 1024);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (php, offloaded) = runtime.block_on(async {
        let php = round(&site, &big, &stored, false).await;
        let offloaded = round(&site, &big, &stored, true).await;
        (php, offloaded)
    });
    assert_eq!(php.fetches, 0, "PHP served the file: nothing fetched");
    assert_eq!(offloaded.fetches, DOWNLOADS + 1, "every download offloaded");

    let mib = (MIB as usize * DOWNLOADS) as f64;
    let median = |f: &Figures| {
        let mut v = f.node_us.clone();
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1000.0
    };
    let mean = |f: &Figures| f.node_us.iter().sum::<u64>() as f64 / f.node_us.len() as f64 / 1000.0;
    let cpu_per_mib = |f: &Figures| f.gateway_cpu * 1000.0 / mib;
    let per_download = |f: &Figures| f.wall.as_secs_f64() * 1000.0 / DOWNLOADS as f64;
    eprintln!(
        "\nmeasure_offload: {DOWNLOADS} downloads of a {MIB} MiB mod_resource file per row, one student, through the gateway"
    );
    eprintln!(
        "{:<12} {:>16} {:>16} {:>20} {:>18}",
        "served by", "node ms median", "node ms mean", "gateway CPU ms/MiB", "wall ms/download"
    );
    for (name, f) in [("PHP", &php), ("offload", &offloaded)] {
        eprintln!(
            "{name:<12} {:>16.2} {:>16.2} {:>20.3} {:>18.1}",
            median(f),
            mean(f),
            cpu_per_mib(f),
            per_download(f)
        );
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    eprintln!(
        "{:<12} {:>16.4} {:>16.4} {:>20.3} {:>18.3}\n",
        "offload/PHP",
        ratio(median(&offloaded), median(&php)),
        ratio(mean(&offloaded), mean(&php)),
        ratio(cpu_per_mib(&offloaded), cpu_per_mib(&php)),
        ratio(per_download(&offloaded), per_download(&php)),
    );
}

/// A cluster (node-local sessions, offloaded or not) and a gateway; one student logs
/// in and downloads the file `DOWNLOADS + 1` times, the first untimed.
async fn round(site: &Site, big: &StoredFile, stored: &[u8], offload: bool) -> Figures {
    let cluster = match offload {
        true => Cluster::start_offload(site),
        false => Cluster::start(site, Store::NodeLocal),
    };
    let client = http_client();
    cluster.warm(&client).await;
    let admin = admin_addr();
    let gateway = Gateway::start(&config_for(&cluster, admin), cluster.public, admin, &client);
    let mut b = Browser::new(client, &cluster.wwwroot());
    let node = log_in(&mut b, &site.data.students[0]).await;
    download(&mut b, big, stored, &node).await;
    let cpu_before = cpu_seconds(gateway.pid());
    let started = Instant::now();
    for _ in 0..DOWNLOADS {
        download(&mut b, big, stored, &node).await;
    }
    let wall = started.elapsed();
    let gateway_cpu = cpu_seconds(gateway.pid()) - cpu_before;
    assert!(b.lost.is_empty(), "lost sessions: {:?}", b.lost);

    let log = cluster.nodes.iter().find(|n| n.name == node).unwrap();
    // The shutdown function writes after the answer has gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let times: Vec<u64> = std::fs::read_to_string(&log.requests)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, uri)| *uri == big.url)
        .map(|(us, _)| us.parse().unwrap())
        .collect();
    assert_eq!(times.len(), DOWNLOADS + 1, "{node}'s request log");
    let fetches = cluster.offload.as_ref().map_or(0, |e| {
        e.fetches()
            .iter()
            .filter(|f| f.uri == crate::export::pool_path(&big.contenthash))
            .count()
    });
    Figures {
        node_us: times[1..].to_vec(),
        gateway_cpu,
        wall,
        fetches,
    }
}

/// One download of the file, checked: every byte, from the student's node.
async fn download(b: &mut Browser, big: &StoredFile, stored: &[u8], node: &str) {
    let url = &big.url;
    let page = b.send(Method::GET, url, &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{url}: {}", page.text());
    assert!(page.body == stored, "{url}: the bytes Moodle stored");
    assert_eq!(page.node(), Some(node), "{url}");
}

/// Logs `account` in through the gateway; the node it was dealt.
async fn log_in(b: &mut Browser, account: &crate::site::StudentAccount) -> String {
    let form = b.get("/login/index.php").await.pop().unwrap();
    let token = between(&form.text(), "name=\"logintoken\" value=\"", "\"")
        .expect("the form has a logintoken")
        .to_string();
    let fields = [
        ("anchor", ""),
        ("logintoken", token.as_str()),
        ("username", account.username.as_str()),
        ("password", account.password.as_str()),
    ];
    let hops = b.post("/login/index.php", &fields).await;
    let dashboard = hops.last().unwrap();
    assert!(dashboard.request.starts_with("GET /my/"), "logged in");
    b.logged_in = true;
    dashboard.node().expect("Moodle names its node").to_string()
}

/// Adds the big file resource to the restored site (tests/moodle/bigfile.php).
fn big_file(site: &Site) -> StoredFile {
    let out = crate::processes::run(
        "tests/moodle/bigfile.php",
        Command::new("php")
            .args(PHP_INI)
            .arg(script("bigfile.php"))
            .arg(format!("--mib={MIB}"))
            .envs(site.env("http://127.0.0.1:9")),
    );
    serde_json::from_str(&out).expect("bigfile.php prints the file")
}

/// utime + stime of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    let out = crate::processes::run("getconf CLK_TCK", Command::new("getconf").arg("CLK_TCK"));
    out.trim().parse().unwrap()
}
