//! The data server's file export for the offload mode: a private nginx running
//! `tests/moodle/nginx-export.conf` (the config the book's offload chapter shows) with its addresses and
//! paths swapped for a scratch directory's, and its access log, which tells the tests
//! what the gateway fetched.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::processes::{free_port, wait_until, Proc, Scratch};
use crate::site::script;

/// The alias prefix of `$CFG->xsendfilealiases` and the gateway's `[offload] prefix`.
pub const PREFIX: &str = "/dataroot/";

/// One nginx exporting `filedir/` of a dataroot on loopback; killed on drop.
pub struct Export {
    pub addr: SocketAddr,
    pub access_log: PathBuf,
    _proc: Proc,
    /// Dropped last.
    _scratch: Scratch,
}

/// One line of the access log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fetch {
    pub method: String,
    pub uri: String,
    pub status: u16,
    pub bytes: u64,
    pub range: String,
}

impl Export {
    /// Starts nginx on a free loopback port, exporting `dataroot`'s file pool.
    pub fn start(dataroot: &Path) -> Export {
        let scratch = Scratch::new("export");
        let dir = scratch.path();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let access_log = dir.join("access.log");
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut config = std::fs::read_to_string(script("nginx-export.conf")).unwrap();
        let mut swap = |from: &str, to: String| {
            assert_eq!(
                config.matches(from).count(),
                1,
                "nginx-export.conf has one {from}"
            );
            config = config.replace(from, &to);
        };
        swap("worker_processes auto;", "worker_processes 1;".into());
        swap(
            "pid /run/moodle-export.pid;",
            format!("pid {};", path(&dir.join("nginx.pid"))),
        );
        swap(
            "error_log /var/log/nginx/moodle-export.error.log;",
            format!("error_log {};", path(&dir.join("error.log"))),
        );
        swap("/var/log/nginx/moodle-export.access.log", path(&access_log));
        for temp in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            swap(
                &format!("/var/lib/nginx/moodle-export/{temp};"),
                format!("{};", path(&dir.join(temp))),
            );
        }
        swap("listen 192.168.1.5:8081;", format!("listen {addr};"));
        swap("allow 192.168.1.10;", "allow 127.0.0.1;".into());
        swap(
            "alias /var/moodledata/filedir/;",
            format!("alias {}/;", path(&dataroot.join("filedir"))),
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config).unwrap();
        std::fs::write(&access_log, "").unwrap();

        let mut command = Command::new(nginx());
        // -e: the log nginx writes before it has read the config. One process in the
        // foreground, managed like the suite's others (killed with the test).
        command
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off; master_process off;"]);
        let mut proc = Proc::spawn("nginx (export)", command, &dir.join("nginx.out"));
        wait_until("the export listens", Duration::from_secs(20), || {
            proc.assert_running();
            std::net::TcpStream::connect(addr).is_ok()
        });
        Export {
            addr,
            access_log,
            _proc: proc,
            _scratch: scratch,
        }
    }

    /// `http://127.0.0.1:PORT`, the gateway's `[offload] url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every file fetch logged so far, in order: the gateway's probes of the export
    /// (the prefix itself, with no probe file configured) are [`probes`](Self::probes).
    pub fn fetches(&self) -> Vec<Fetch> {
        let log = std::fs::read_to_string(&self.access_log).unwrap();
        log.lines().map(parse).filter(|f| f.uri != PREFIX).collect()
    }

    /// The gateway's probes of the export logged so far: `GET {PREFIX}`.
    pub fn probes(&self) -> Vec<Fetch> {
        let log = std::fs::read_to_string(&self.access_log).unwrap();
        log.lines().map(parse).filter(|f| f.uri == PREFIX).collect()
    }

    /// How many fetches of each (uri, status) are logged.
    pub fn counts(&self) -> BTreeMap<(String, u16), usize> {
        let mut counts = BTreeMap::new();
        for fetch in self.fetches() {
            *counts.entry((fetch.uri, fetch.status)).or_default() += 1;
        }
        counts
    }
}

/// The path Moodle names in `X-Accel-Redirect` for `contenthash`.
pub fn pool_path(contenthash: &str) -> String {
    format!(
        "{PREFIX}filedir/{}/{}/{contenthash}",
        &contenthash[0..2],
        &contenthash[2..4]
    )
}

/// `ADDR [TIME] "METHOD URI" STATUS BYTES "RANGE"` (the `export` log_format).
fn parse(line: &str) -> Fetch {
    try_parse(line).unwrap_or_else(|| panic!("an access log line not in the export format: {line}"))
}

fn try_parse(line: &str) -> Option<Fetch> {
    let (_, rest) = line.split_once("] \"")?;
    let (request, rest) = rest.split_once("\" ")?;
    let (method, uri) = request.split_once(' ')?;
    let mut fields = rest.splitn(3, ' ');
    let status = fields.next()?.parse().ok()?;
    let bytes = fields.next()?.parse().ok()?;
    let range = fields.next()?.trim_matches('"');
    Some(Fetch {
        method: method.to_string(),
        uri: uri.to_string(),
        status,
        bytes,
        range: if range == "-" { "" } else { range }.to_string(),
    })
}

/// Debian's nginx (nginx-light installs /usr/sbin/nginx), else the one on PATH.
fn nginx() -> PathBuf {
    let debian = Path::new("/usr/sbin/nginx");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("nginx")
    }
}
