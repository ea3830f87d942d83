//! The open-file limit: how many descriptors the configured limits need, and raising
//! the process's soft `RLIMIT_NOFILE` to that at start.
//!
//! Why: every student connection is a descriptor, and so is every connection to a
//! node. A service manager's default soft limit (systemd: 1024) is far below
//! `limits.max_connections` (10000 by default), so without this the gateway would
//! run out of descriptors long before its own cap and answer students 503 (see
//! [`crate::http::upstream::fault`]: it no longer blames the nodes for it, but the students
//! still wait). Only the soft limit is raised, never above the hard one, which only
//! the service manager (systemd's `LimitNOFILE=`) or root can raise.

use crate::config::Config;
use crate::http::body::splice::MAX_PIPES;
use crate::http::upstream::pool::MAX_IDLE;

/// Descriptors beyond the connections: stdio, the listeners (public, admin,
/// redirect), the runtime's epoll and wake-up descriptors, the signal pipe, the
/// state file being written, a few admin clients, and slack for whatever a library
/// opens (certificates on reload, name resolution).
pub const RESERVE: u64 = 64;

/// What the limits of `config` need, at most:
///
/// ```text
/// 2 × max_connections            each student connection, and the node connection
///                                it may hold (a request being answered, or a tunnel)
/// + (MAX_IDLE + 1) × upstreams   the idle keep-alive connections kept per node and
///                                data server (256 each), and one health probe each
/// + 2 × MAX_PIPES                the pipes large answers are spliced through (1024,
///                                two descriptors each)
/// + RESERVE                      listeners, runtime, signals, state file, admin, slack
/// ```
///
/// An HTTP/1.1 connection carries one request at a time, so it holds at most one
/// node connection. An HTTP/2 connection (with `[tls]`) may stream several answers
/// at once; the formula assumes one on average. Past the limit the gateway answers
/// 503 itself and marks no node. Admin and redirect connections share the reserve:
/// under a flood of them the accept loop pauses instead of failing. The nodes are
/// counted as the config in force names them: a reload that adds nodes raises the
/// limit again (see [`crate::app`]).
pub fn needed(config: &Config) -> u64 {
    let connections = config.limits.max_connections as u64;
    let upstreams = config.nodes.len() as u64 + 1;
    2 * connections + (MAX_IDLE as u64 + 1) * upstreams + 2 * MAX_PIPES as u64 + RESERVE
}

/// The limit before and after raising it, against what is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// What the configured limits need ([`needed`]).
    pub needed: u64,
    /// The soft limit found at start.
    pub found: u64,
    /// The hard limit: the most the soft one can be raised to.
    pub hard: u64,
    /// The soft limit the gateway runs with: `needed` capped at `hard`, or `found`
    /// if that was higher already.
    pub gets: u64,
}

impl OpenFiles {
    /// Whether the limit the gateway gets covers what its limits need.
    pub fn suffices(&self) -> bool {
        self.gets >= self.needed
    }

    /// One line for `moodle-gateway check`.
    pub fn describe(&self, config: &Config) -> String {
        let verdict = if self.suffices() {
            "enough".to_owned()
        } else {
            format!(
                "NOT enough for max_connections = {}: raise the hard limit (systemd: \
                 LimitNOFILE={}) or lower max_connections",
                config.limits.max_connections, self.needed
            )
        };
        format!(
            "open files: {} needed; the limit in this shell is {} (hard {}), raised to {} at start: {verdict}\n",
            self.needed,
            self.found,
            limit(self.hard),
            self.gets,
        )
    }
}

/// `RLIM_INFINITY` as a word.
fn limit(value: u64) -> String {
    if value == rlimit::INFINITY {
        "unlimited".to_owned()
    } else {
        value.to_string()
    }
}

/// What [`raise`] would set, without changing anything (for `check`).
pub fn plan(config: &Config) -> std::io::Result<OpenFiles> {
    let (found, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let needed = needed(config);
    Ok(OpenFiles {
        needed,
        found,
        hard,
        gets: found.max(needed.min(hard)),
    })
}

/// Raises the soft open-file limit to what `config` needs, capped at the hard
/// limit; never lowers it. Returns what it got.
pub fn raise(config: &Config) -> std::io::Result<OpenFiles> {
    let planned = plan(config)?;
    if planned.gets > planned.found {
        rlimit::setrlimit(rlimit::Resource::NOFILE, planned.gets, planned.hard)?;
    }
    let (now, _) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    Ok(OpenFiles {
        gets: now,
        ..planned
    })
}

/// [`raise`], and says what it got: info when it suffices, a warning naming
/// `max_connections` and the number needed when the hard limit is too low.
pub fn raise_and_log(config: &Config) {
    match raise(config) {
        Ok(got) if got.suffices() => tracing::info!(
            needed = got.needed,
            limit = got.gets,
            "open-file limit set for max_connections = {}",
            config.limits.max_connections
        ),
        Ok(got) => tracing::warn!(
            needed = got.needed,
            limit = got.gets,
            hard = %limit(got.hard),
            "open-file limit too low for max_connections = {}: {} descriptors needed, \
             the hard limit allows {}; past it students get 503. Raise it (systemd: \
             LimitNOFILE={}) or lower max_connections",
            config.limits.max_connections,
            got.needed,
            got.gets,
            got.needed
        ),
        Err(error) => tracing::warn!("cannot read or raise the open-file limit: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_connections: usize) -> Config {
        let text = format!(
            "limits.max_connections = {max_connections}\n\
             [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:1\"\n\
             [[nodes]]\nname = \"web2\"\nurl = \"http://127.0.0.1:2\"\n\
             [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n"
        );
        Config::parse(&text, std::path::Path::new("."), Default::default()).unwrap()
    }

    #[test]
    fn each_connection_may_hold_a_node_connection_plus_the_pools_probes_pipes_and_a_reserve() {
        // Two nodes and the data server: 3 × (256 idle + 1 probe).
        assert_eq!(needed(&config(10_000)), 20_000 + 3 * 257 + 2048 + 64);
        assert_eq!(needed(&config(1)), 2 + 3 * 257 + 2048 + 64);
    }

    #[test]
    fn the_plan_never_lowers_the_limit_and_never_passes_the_hard_one() {
        let planned = plan(&config(1)).unwrap();
        assert!(planned.gets >= planned.found);
        assert!(planned.gets <= planned.hard.max(planned.found));
        let huge = plan(&config(1_000_000)).unwrap();
        assert_eq!(huge.gets, huge.found.max(huge.needed.min(huge.hard)));
        let line = huge.describe(&config(1_000_000));
        assert!(line.starts_with("open files: "), "{line}");
        assert!(line.ends_with('\n'));
        if !huge.suffices() {
            assert!(line.contains("max_connections = 1000000"), "{line}");
        }
    }
}
