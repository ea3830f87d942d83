//! HAProxy in front of the same nodes, as the surge measure's anchor: what a site
//! gets today from a good general proxy doing the gateway's routing job (round robin
//! for new visitors, stickiness learned from Moodle's `Set-Cookie`) with the same
//! per-node cap (`maxconn`) and a plain first-come, first-served queue.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::processes::{wait_until, Proc, Scratch};
use crate::student::SESSION_COOKIE;

/// A running `haproxy`; stopped when dropped.
pub struct Haproxy {
    _proc: Proc,
    _dir: Scratch,
}

impl Haproxy {
    /// HAProxy on `cluster.public` (wwwroot), each web node capped at `maxconn`
    /// requests at once, the rest queued for up to `timeout queue` 60 s (then 503).
    pub fn start(cluster: &Cluster, maxconn: usize) -> Haproxy {
        Haproxy::start_with(cluster, maxconn, false)
    }

    /// [`Haproxy::start`], with `quiz_first` a priority class for an attempt in
    /// progress (its pages, page turns, autosaves, summary and review), which the
    /// queue serves before everything else: what a careful HAProxy set-up gives a
    /// quiz's students.
    pub fn start_with(cluster: &Cluster, maxconn: usize, quiz_first: bool) -> Haproxy {
        let found = Command::new("haproxy").arg("-v").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "haproxy is not installed: bench/surge.sh installs it (apt-get install -y haproxy)"
        );
        let dir = Scratch::new("haproxy");
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config(cluster, maxconn, quiz_first)).unwrap();
        let mut command = Command::new("haproxy");
        command.arg("-db").arg("-f").arg(&path);
        let mut proc = Proc::spawn("haproxy", command, &dir.path().join("haproxy.log"));
        let public: SocketAddr = cluster.public;
        wait_until("haproxy listens", Duration::from_secs(10), || {
            proc.assert_running();
            std::net::TcpStream::connect(public).is_ok()
        });
        Haproxy {
            _proc: proc,
            _dir: dir,
        }
    }
}

/// The config: one frontend on wwwroot's address, one backend of the web nodes.
/// The global `maxconn` stays far under the open-file limit: HAProxy refuses to start
/// when it cannot raise its descriptors to twice that.
/// The stick table is keyed on `MoodleSession`, looked up from the request and
/// learned from the response, so a login's new id stays on its node.
fn config(cluster: &Cluster, maxconn: usize, quiz_first: bool) -> String {
    let priority = if quiz_first {
        "    acl quiz_work path_end /mod/quiz/attempt.php /mod/quiz/processattempt.php \
         /mod/quiz/autosave.ajax.php /mod/quiz/summary.php /mod/quiz/review.php\n\
         \x20   http-request set-priority-class int(-10) if quiz_work\n"
    } else {
        ""
    };
    let mut servers = String::new();
    for node in &cluster.nodes {
        servers.push_str(&format!(
            "    server {} {} maxconn {maxconn}\n",
            node.name, node.addr
        ));
    }
    format!(
        "global\n    maxconn 4000\n\n\
         defaults\n    mode http\n    option forwardfor\n    timeout connect 5s\n\
         \x20   timeout client 120s\n    timeout server 120s\n    timeout queue 60s\n\n\
         frontend students\n    bind {public}\n{priority}    default_backend web\n\n\
         backend web\n    balance roundrobin\n\
         \x20   stick-table type string len 64 size 100k expire 8h\n\
         \x20   stick on req.cook({SESSION_COOKIE})\n\
         \x20   stick store-response res.cook({SESSION_COOKIE})\n{servers}",
        public = cluster.public,
    )
}
