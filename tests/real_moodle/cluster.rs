//! A Moodle cluster on loopback: four PHP web nodes and a data server, each a
//! `php -S` of the same code and site, and the real gateway binary in front. In the
//! offload mode the nodes answer files with `X-Accel-Redirect` and a private nginx
//! exports the dataroot's file pool to the gateway (see `export.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::Value;

use crate::export::{Export, PREFIX};
use crate::processes::{free_port, wait_until, Proc, Scratch};
use crate::site::{script, Site, PHP_INI};
use crate::student::{between, exchange, try_exchange, HttpClient};

/// Where Moodle keeps sessions (config.php's `MOODLE_SESSIONS`, the gateway's
/// `[session] store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// File sessions in the shared dataroot: every node, and the data server, reads them.
    Shared,
    /// File sessions in a directory of each node's own.
    NodeLocal,
}

impl Store {
    /// The name both config.php and the gateway use.
    pub fn name(self) -> &'static str {
        match self {
            Store::Shared => "shared",
            Store::NodeLocal => "node-local",
        }
    }
}

/// The web nodes' names, in the gateway's config order.
pub const NODES: [&str; 4] = ["web1", "web2", "web3", "web4"];

/// PHP workers per `php -S` (`PHP_CLI_SERVER_WORKERS`) unless a test asks for fewer:
/// how many requests one node runs at once, the rest waiting in its accept queue.
pub const WORKERS: usize = 4;

/// One `php -S` serving Moodle.
pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    /// Its own session directory (node-local sessions only).
    pub sessions: Option<PathBuf>,
    /// Its access and error log.
    pub log: PathBuf,
    /// `<microseconds> <URI>` of each script it ran (prepend.php).
    pub requests: PathBuf,
    /// Its low-priority pool, if the cluster has them.
    pub low: Option<LowPool>,
    _php: Proc,
    /// Dropped after the PHP servers: a cgroup can only go once it is empty.
    _cpu: Option<CpuShare>,
}

/// A node's second `php -S`, at `nice` 10, as a site runs a second PHP-FPM pool
/// with `process.priority = 10`: the same code, sessions and caches, for the
/// gateway's `low_priority_url`.
pub struct LowPool {
    pub addr: SocketAddr,
    /// `<microseconds> <URI>` of each script it ran.
    pub requests: PathBuf,
    _php: Proc,
}

/// Four web nodes and a data server, all with `$CFG->wwwroot` = the gateway's address.
pub struct Cluster {
    pub store: Store,
    /// `127.0.0.1:PORT`, where the gateway must listen (wwwroot's authority).
    pub public: SocketAddr,
    pub nodes: Vec<Node>,
    pub data: Node,
    /// The offload mode: Moodle sends `X-Accel-Redirect`, this nginx exports the files.
    pub offload: Option<Export>,
    /// Dropped last.
    _scratch: Scratch,
}

impl Cluster {
    /// Starts the nodes and the data server for a gateway to come on `public`.
    pub fn start(site: &Site, store: Store) -> Cluster {
        Cluster::start_with(site, store, false, WORKERS)
    }

    /// The offload mode: node-local sessions, `$CFG->xsendfile = 'X-Accel-Redirect'` on
    /// every node, and the data server's file export.
    pub fn start_offload(site: &Site) -> Cluster {
        Cluster::start_with(site, Store::NodeLocal, true, WORKERS)
    }

    /// Any mode (`offload` needs node-local sessions), with `workers` PHP workers per
    /// node: a few make a node that a surge saturates at once, as a small PHP-FPM
    /// pool would be.
    pub fn start_with(site: &Site, store: Store, offload: bool, workers: usize) -> Cluster {
        Cluster::start_tweaked(site, store, offload, workers, &[])
    }

    /// [`Cluster::start_with`] node-local, each web node with a low-priority pool of
    /// `workers` more beside its own.
    pub fn start_with_low_pools(site: &Site, workers: usize) -> Cluster {
        Cluster::start_shaped(site, Store::NodeLocal, false, workers, true, &[])
    }

    /// [`Cluster::start_with_low_pools`], with some pools set up wrong on purpose,
    /// as [`Cluster::start_tweaked`] (a key `LOW:NAME` is for the low-priority pool
    /// alone).
    pub fn start_with_low_pools_tweaked(
        site: &Site,
        workers: usize,
        tweaks: &[(&str, &str, String)],
    ) -> Cluster {
        Cluster::start_shaped(site, Store::NodeLocal, false, workers, true, tweaks)
    }

    /// [`Cluster::start_with`], with some nodes set up wrong on purpose: each tweak is
    /// (node, config.php's environment variable, value), applied over that node's own;
    /// `{public}` in a value is the gateway's address (wwwroot's authority).
    pub fn start_tweaked(
        site: &Site,
        store: Store,
        offload: bool,
        workers: usize,
        tweaks: &[(&str, &str, String)],
    ) -> Cluster {
        Cluster::start_shaped(site, store, offload, workers, false, tweaks)
    }

    fn start_shaped(
        site: &Site,
        store: Store,
        offload: bool,
        workers: usize,
        low_pools: bool,
        tweaks: &[(&str, &str, String)],
    ) -> Cluster {
        assert!(
            !offload || store == Store::NodeLocal,
            "offload is node-local"
        );
        assert!(workers >= 1, "a node needs a worker");
        let public: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let scratch = Scratch::new("nodes");
        let shape = Shape {
            store,
            offload,
            workers,
            low_pool: false,
        };
        let start = |name: &str, shape: Shape| {
            let own = tweaks.iter().filter(|(node, _, _)| *node == name);
            let own: Vec<(&str, String)> = own
                .map(|(_, key, value)| (*key, value.replace("{public}", &public.to_string())))
                .collect();
            start_node(site, shape, public, scratch.path(), name, &own)
        };
        let web = Shape {
            low_pool: low_pools,
            ..shape
        };
        let nodes = NODES.iter().map(|name| start(name, web)).collect();
        let data = start("data", shape);
        Cluster {
            store,
            public,
            nodes,
            data,
            offload: offload.then(|| Export::start(&site.dataroot)),
            _scratch: scratch,
        }
    }

    /// The mode's name for messages: the store, plus "+offload".
    pub fn mode(&self) -> String {
        match self.offload {
            Some(_) => format!("{}+offload", self.store.name()),
            None => self.store.name().to_string(),
        }
    }

    /// `http://127.0.0.1:PORT`: Moodle's wwwroot, the gateway.
    pub fn wwwroot(&self) -> String {
        format!("http://{}", self.public)
    }

    /// Every node and the data server.
    pub fn all(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().chain(std::iter::once(&self.data))
    }

    /// Loads the login page and its theme CSS and JavaScript once on every node, with
    /// the public Host (the first CSS build takes seconds); the sessionless asset paths
    /// the page links to.
    pub async fn warm(&self, client: &HttpClient) -> Vec<String> {
        let mut assets = Vec::new();
        for node in self.all() {
            let host = [("host", self.public.to_string())];
            let url = format!("http://{}/login/index.php", node.addr);
            let page = exchange(client, Method::GET, &url, &host, None).await;
            assert_eq!(
                page.status,
                StatusCode::OK,
                "{}: {}",
                node.name,
                page.text()
            );
            assets = asset_paths(&page.text(), &self.wwwroot());
            for path in &assets {
                let url = format!("http://{}{path}", node.addr);
                let page = exchange(client, Method::GET, &url, &host, None).await;
                assert_eq!(page.status, StatusCode::OK, "{} {path}", node.name);
            }
        }
        assets
    }
}

/// What every node of a cluster is like.
#[derive(Clone, Copy)]
struct Shape {
    store: Store,
    offload: bool,
    workers: usize,
    /// A second `php -S` at `nice` 10 beside the node's own.
    low_pool: bool,
}

fn start_node(
    site: &Site,
    shape: Shape,
    public: SocketAddr,
    dir: &Path,
    name: &str,
    tweaks: &[(&str, String)],
) -> Node {
    let Shape {
        store,
        offload,
        workers,
        low_pool,
    } = shape;
    let dir = dir.join(name);
    let sessions = (store == Store::NodeLocal).then(|| dir.join("sessions"));
    for sub in ["localcache", "requestdir", "sessions"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let cpu = CpuShare::from_env(name);
    // One `php -S` of this node's: its own address and request log, at `nice`.
    let serve = |nice: u8, requests: &Path, log: &Path| {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut php = match &cpu {
            Some(cpu) => cpu.command("nice"),
            None => Command::new("nice"),
        };
        php.args(["-n", &nice.to_string(), "php"])
            .args(PHP_INI)
            .arg("-d")
            .arg(format!(
                "auto_prepend_file={}",
                script("prepend.php").display()
            ))
            .arg("-S")
            .arg(addr.to_string())
            .arg("-t")
            .arg(&site.code)
            .env("PHP_CLI_SERVER_WORKERS", workers.to_string())
            .envs(site.env(&format!("http://{public}")))
            .env("MOODLE_NODE", name)
            .env("MOODLE_SESSIONS", store.name())
            .env("MOODLE_SESSION_DIR", dir.join("sessions"))
            .env("MOODLE_LOCALCACHEDIR", dir.join("localcache"))
            .env("MOODLE_LOCALREQUESTDIR", dir.join("requestdir"))
            .env("MOODLE_REQUEST_LOG", requests)
            .env(
                "MOODLE_XSENDFILE",
                if offload { "X-Accel-Redirect" } else { "off" },
            )
            .envs(tweaks.iter().filter_map(|(key, value)| {
                // A `LOW:` tweak is the low-priority pool's alone.
                match key.strip_prefix("LOW:") {
                    Some(key) if nice > 0 => Some((key, value)),
                    Some(_) => None,
                    None => Some((*key, value)),
                }
            }));
        let what = match nice {
            0 => format!("php -S ({name})"),
            _ => format!("php -S ({name}, nice {nice})"),
        };
        let mut proc = Proc::spawn_tree(&what, php, log);
        wait_until(&format!("{what} listens"), Duration::from_secs(20), || {
            proc.assert_running();
            std::net::TcpStream::connect(addr).is_ok()
        });
        (addr, proc)
    };
    let log = dir.join("php.log");
    let (addr, proc) = serve(0, &dir.join("requests.log"), &log);
    let low = low_pool.then(|| {
        let requests = dir.join("requests-low.log");
        let (addr, php) = serve(10, &requests, &dir.join("php-low.log"));
        LowPool {
            addr,
            requests,
            _php: php,
        }
    });
    Node {
        name: name.to_string(),
        addr,
        sessions,
        log,
        requests: dir.join("requests.log"),
        low,
        _php: proc,
        _cpu: cpu,
    }
}

/// A web node's own share of the CPU, for the measures: `MOODLE_NODE_CPU=0.35`
/// runs each node's PHP in a CPU cgroup capped at 0.35 of a core. On this machine
/// every node shares the same two cores, so a class's starts on one node slow the
/// page turns on all the others, which no per-node rule of a front can prevent and
/// which a site of separate servers does not see; with a share each, a node is a
/// small server of its own, and a front's rules are measured for what they can do.
/// Needs root and the cgroup `cpu` controller (v1 or v2); unset, nothing changes.
struct CpuShare {
    dir: PathBuf,
}

impl CpuShare {
    fn from_env(name: &str) -> Option<CpuShare> {
        let share: f64 = std::env::var("MOODLE_NODE_CPU").ok()?.parse().ok()?;
        assert!(
            share > 0.0 && share <= 64.0,
            "MOODLE_NODE_CPU is a share of one core, as 0.35"
        );
        let quota = (share * 100_000.0) as u64;
        let leaf = format!("moodle-gateway-test-{}-{name}", std::process::id());
        let (dir, file, value) = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            let dir = Path::new("/sys/fs/cgroup").join(leaf);
            (dir, "cpu.max", format!("{quota} 100000"))
        } else {
            let dir = Path::new("/sys/fs/cgroup/cpu").join(leaf);
            (dir, "cpu.cfs_quota_us", quota.to_string())
        };
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("MOODLE_NODE_CPU: a cgroup at {}: {e}", dir.display()));
        std::fs::write(dir.join(file), value)
            .unwrap_or_else(|e| panic!("MOODLE_NODE_CPU: {}/{file}: {e}", dir.display()));
        eprintln!("real-moodle: {name} runs on {share} of a core");
        Some(CpuShare { dir })
    }

    /// `program`, started inside the cgroup (the shell moves itself in, then execs).
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new("sh");
        command
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(self.dir.join("cgroup.procs"))
            .arg(program);
        command
    }
}

impl Drop for CpuShare {
    fn drop(&mut self) {
        // The PHP server's group was just killed: give its processes a moment to go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The theme CSS, JavaScript and image URLs a Moodle page links to, as paths.
/// Three, not four: if sessionless requests took turns of the deal, four of them
/// between two students would cost exactly one round of the four nodes and go unseen;
/// three send the next student to the same node as the last, which the sequential
/// run's `deal_goes_round` catches.
fn asset_paths(html: &str, wwwroot: &str) -> Vec<String> {
    let html = html.replace("\\/", "/");
    [
        "/theme/styles.php/",
        "/lib/javascript.php/",
        "/theme/image.php/",
    ]
    .iter()
    .map(|script| {
        let start = format!("{wwwroot}{script}");
        let rest = between(&html, &start, "\"")
            .unwrap_or_else(|| panic!("the login page links to {script}"));
        let rest = rest.split(['\'', ' ']).next().unwrap();
        format!("{script}{rest}")
    })
    .collect()
}

/// The real `moodle-gateway` binary, run from its own directory; killed on drop.
pub struct Gateway {
    /// Where students reach it.
    pub public: SocketAddr,
    pub admin: SocketAddr,
    pub token: String,
    client: HttpClient,
    proc: Proc,
    dir: Scratch,
}

/// The admin token the suite's gateways read from `admin.token`.
const TOKEN: &str = "real-moodle-suite-admin-token-0123456789";
/// The route cookie's secret, in `route.secret` where the shipped config reads it.
const ROUTE_SECRET: &str = "real-moodle-suite-route-secret-0123456789";

impl Gateway {
    /// Writes `config` (see [`config_for`]), the token file and the route cookie's
    /// secret file (the shipped config reads both) into a new directory and
    /// runs `moodle-gateway run --config` there until it answers on both listeners.
    pub fn start(
        config: &str,
        public: SocketAddr,
        admin: SocketAddr,
        client: &HttpClient,
    ) -> Gateway {
        let binary = Path::new(env!("CARGO_BIN_EXE_moodle-gateway"));
        Gateway::start_binary(binary, config, public, admin, client)
    }

    /// [`Gateway::start`] with another build of the gateway (a measure's "before").
    pub fn start_binary(
        binary: &Path,
        config: &str,
        public: SocketAddr,
        admin: SocketAddr,
        client: &HttpClient,
    ) -> Gateway {
        let dir = Scratch::new("gateway");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, config).unwrap();
        std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
        std::fs::write(dir.path().join("route.secret"), format!("{ROUTE_SECRET}\n")).unwrap();
        let mut command = Command::new(binary);
        command
            .current_dir(dir.path())
            .arg("run")
            .arg("--config")
            .arg(&path)
            .env_remove("MOODLE_GATEWAY_ADMIN_TOKEN")
            .env_remove("MOODLE_GATEWAY_ROUTE_SECRET")
            .env("RUST_LOG", "info");
        let mut proc = Proc::spawn("moodle-gateway", command, &dir.path().join("gateway.log"));
        wait_until("the gateway listens", Duration::from_secs(20), || {
            proc.assert_running();
            std::net::TcpStream::connect(public).is_ok()
                && std::net::TcpStream::connect(admin).is_ok()
        });
        Gateway {
            public,
            admin,
            token: TOKEN.to_string(),
            client: client.clone(),
            proc,
            dir,
        }
    }

    /// The gateway's log lines at `WARN` and `ERROR`: what it said about a failure.
    pub fn warnings(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default();
        let loud = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "));
        loud.map(str::to_owned).collect()
    }

    /// The gateway's process id (setpriv execs it: the spawned pid is the gateway's).
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// `GET {path}` on the admin API with the token: status and JSON.
    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        let url = format!("http://{}{path}", self.admin);
        let auth = [("authorization", format!("Bearer {}", self.token))];
        let page = exchange(&self.client, Method::GET, &url, &auth, None).await;
        let json = serde_json::from_slice(&page.body).unwrap_or(Value::Null);
        (page.status, json)
    }

    /// `GET /metrics` as `name{labels}` → value.
    pub async fn metrics(&self) -> BTreeMap<String, f64> {
        self.try_metrics().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// `GET /metrics`, or why the gateway did not answer it.
    pub async fn try_metrics(&self) -> Result<BTreeMap<String, f64>, String> {
        let url = format!("http://{}/metrics", self.admin);
        let auth = [("authorization", format!("Bearer {}", self.token))];
        let limit = Duration::from_secs(120);
        let page = try_exchange(&self.client, Method::GET, &url, &auth, None, limit).await?;
        if page.status != StatusCode::OK {
            return Err(format!("GET {url}: {}", page.status));
        }
        let text = String::from_utf8_lossy(&page.body).into_owned();
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty());
        let samples = samples
            .filter_map(|line| line.rsplit_once(' '))
            .map(|(key, value)| (key.to_owned(), value.parse().unwrap_or(f64::NAN)));
        Ok(samples.collect())
    }

    /// Waits until the gateway has connected to its shared store and read what Redis
    /// holds (`store_resyncs_total` ≥ 1): before that it would deal on its own.
    pub async fn synchronised(&self) {
        let started = std::time::Instant::now();
        let resyncs = "moodle_gateway_store_resyncs_total";
        while self.metrics().await.get(resyncs).copied().unwrap_or(0.0) < 1.0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the gateway on {} never synchronised with Redis",
                self.public
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every nonzero `session_losses_total` sample.
    pub async fn losses(&self) -> Vec<(String, f64)> {
        let prefix = "moodle_gateway_session_losses_total{";
        let samples = self.metrics().await.into_iter();
        samples
            .filter(|(key, value)| key.starts_with(prefix) && *value != 0.0)
            .collect()
    }

    /// The admin entry of raw session id `id` (`/affinity/lookup`), `None` on 404.
    pub async fn lookup(&self, id: &str) -> Option<Value> {
        let (status, json) = self
            .admin_get(&format!("/affinity/lookup?session={id}"))
            .await;
        match status {
            StatusCode::OK => Some(json),
            StatusCode::NOT_FOUND => None,
            other => panic!("/affinity/lookup answered {other}: {json}"),
        }
    }

    /// Each upstream's `health` from `/nodes`, data server last: `(name, health)`.
    pub async fn health(&self) -> Vec<(String, String)> {
        let (status, json) = self.admin_get("/nodes").await;
        assert_eq!(status, StatusCode::OK, "{json}");
        let row = |v: &Value| {
            (
                v["name"].as_str().unwrap_or("?").to_string(),
                v["health"].as_str().unwrap_or("?").to_string(),
            )
        };
        let mut rows: Vec<_> = json["nodes"].as_array().unwrap().iter().map(row).collect();
        rows.push(row(&json["data"]));
        rows
    }
}

/// The suite's gateway config for `cluster`: its nodes, the data server, both listeners
/// on loopback, the token file, and a health probe that works on real Moodle.
pub fn config_for(cluster: &Cluster, admin: SocketAddr) -> String {
    gateway_config(cluster, cluster.public, admin)
}

/// `config` (of [`config_for`]) with each node's `low_priority_url`: its low-priority
/// pool, which the cluster must have.
pub fn with_low_pools(config: &str, cluster: &Cluster) -> String {
    let mut config = config.to_owned();
    for node in &cluster.nodes {
        let low = node
            .low
            .as_ref()
            .expect("a cluster with low-priority pools");
        let url = format!("url = \"http://{}\"\n", node.addr);
        let both = format!("{url}low_priority_url = \"http://{}\"\n", low.addr);
        assert!(config.contains(&url), "no {url:?} in the config");
        config = config.replace(&url, &both);
    }
    config
}

/// [`config_for`] a gateway that listens on `listen` rather than on wwwroot's own
/// address: one of several behind one name (DNS round robin). `[site] wwwroot` stays
/// the cluster's, so the `Host` students send is still the one it serves.
pub fn gateway_config(cluster: &Cluster, listen: SocketAddr, admin: SocketAddr) -> String {
    let mut text = format!(
        r#"listen = "{listen}"

[site]
wwwroot = "http://{public}"

[admin]
listen = "{admin}"
token_file = "admin.token"

[session]
store = "{store}"

# The default probe, under wwwroot's path and with wwwroot's Host: boost's favicon
# through theme/image.php, which runs Moodle's setup and starts no session.
[health]
# php -S has a few workers per node (four; two in the surge): under concurrent
# students a probe may queue behind slow pages, so give it the whole interval.
interval = "2s"
timeout = "2s"

[state]
file = "gateway.state"
"#,
        public = cluster.public,
        store = cluster.store.name(),
    );
    for node in &cluster.nodes {
        let _ = write!(
            text,
            "\n[[nodes]]\nname = \"{}\"\nurl = \"http://{}\"\n",
            node.name, node.addr
        );
    }
    let _ = write!(
        text,
        "\n[data]\nname = \"data\"\nurl = \"http://{}\"\n",
        cluster.data.addr
    );
    if let Some(export) = &cluster.offload {
        let _ = write!(
            text,
            "\n# The data server's file export (tests/moodle/nginx-export.conf).\n\
             [offload]\nurl = \"{}\"\nprefix = \"{PREFIX}\"\n",
            export.url()
        );
    }
    text
}

/// The `[surge]` section capping every node at `max_active` requests at once, the
/// rest at its defaults.
pub fn surge_section(max_active: usize) -> String {
    format!(
        "\n# At most this many requests inside each node's PHP at once (its workers); the\n\
         # rest wait in the gateway, logged-in students first.\n\
         [surge]\nmax_active = {max_active}\n"
    )
}

/// The secret every gateway of a shared store must have (`store.secret`).
const STORE_SECRET: &str = "real-moodle-suite-store-secret-0123456789";

/// The `[store]` section of gateway `name` sharing the Redis at `url`.
pub fn store_section(url: &str, name: &str) -> String {
    format!(
        "\n# Several gateways, one affinity table and one deal.\n\
         [store]\nkind = \"redis\"\nurl = \"{url}\"\nname = \"{name}\"\nsecret = \"{STORE_SECRET}\"\n"
    )
}

/// A free loopback address for an admin listener.
pub fn admin_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}
