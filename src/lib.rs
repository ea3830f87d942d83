//! moodle-gateway: a session-sticky reverse proxy for a Moodle cluster.
//!
//! # Layout
//! The tree names the architecture: three wings that never reach into each other
//! except where their `mod.rs` says, and the modules where they meet.
//!
//! Imports only point down. From the bottom: [`node_id`], [`moodle`], [`logs`] and
//! [`error`] import nothing of the crate; then [`config`]; [`http`]; [`access_log`],
//! [`cluster`], [`open_files`] and [`ready`]; [`metrics`] and [`sessions`];
//! [`store`]; [`acme`]; [`gateway`]; [`admin`] and [`doctor`]; [`app`]; [`demo`] and [`handover`]. A module
//! uses only modules of the layers below its own (`tests/it/layers.rs` fails on any
//! other import), so no two modules import each other, and each can be read
//! knowing only what is under it.
//! - [`moodle`]: every Moodle fact: the kinds of request and the site they belong to;
//!   its readers of paths and SCORM URL forms, and of the session cookie both ways.
//! - [`gateway`]: one request's journey: admit, classify, route, forward (`failover`: where
//!   an attempt that sent nothing may go next), learn (`learning`: the node's `Set-Cookie`
//!   and the session-loss detector). Where the wings meet.
//! - [`http`]: bytes in and out, in four folders by role, each importing only the ones
//!   before it here.
//!   - [`http::body`]: the streaming bodies, how they fail and how long they may pause
//!     (`stall`: a student who stops reading is cut after `body_idle`); `splice`: a
//!     large answer moved inside the kernel; [`http::body::spool`]: uploads kept on
//!     disk until whole.
//!   - [`http::h1`]: HTTP/1.1 on the wire. `server`: the students' side, by hand for
//!     plain requests; `handover`: where it meets hyper's server for the rest
//!     (upgrades, chunked uploads); [`http::h1::client`]: the nodes' side; `wire`: what
//!     both share (the `writev` queue, numbers, header lines).
//!   - [`http::accept`]: where a student's connection begins: the accept loop (caps,
//!     TLS, HTTP/1.1 or HTTP/2, the drain), inherited sockets, TLS and its shared
//!     tickets, HTTP/2's idle streams, and the edge rules (sizes, framing, one known
//!     host).
//!   - [`http::upstream`]: where a request leaves for a node: the upload read ahead,
//!     forwarding (`proxy`: header hygiene, streaming, failures as statuses), kept
//!     connections (`pool`), whose fault a failed connect is, WebSocket tunnels, the
//!     file offload, and the asset cache.
//! - [`sessions`]: the session table and how it outlives a process.
//!   - [`sessions::affinity`]: the session → node table learned from the nodes' `Set-Cookie`.
//!   - [`sessions::clock`]: table time, in seconds that mean the same to the next process.
//!   - [`sessions::snapshot`]: the table's snapshot file: atomic, streaming, checksummed.
//!   - [`sessions::state`]: the table across restarts: loaded at start, saved by [`app`].
//!   - [`sessions::route_cookie`]: the signed cookie that lets any gateway recover a
//!     session's node.
//! - [`node_id`]: a node's stable id, all that the session table, the store and
//!   the metrics know of a node.
//! - [`cluster`]: the nodes.
//!   - [`cluster::upstreams`]: the nodes as they are now: stable ids, admin state, health.
//!   - [`cluster::balancer`]: the lock-free deal of new sessions over weighted nodes.
//!   - [`cluster::health`]: active probes and passive marks that take nodes down and bring
//!     them back.
//!   - [`cluster::export`]: the data server's file export (`[offload]`), probed on the
//!     nodes' rhythm, its going down and coming back said once each.
//! - [`store`]: several gateways, one truth: the table, the deal and the admin state
//!   shared through Redis (`[store] kind = "redis"`); nothing at all with the default
//!   `memory`. Knows sessions and node names, never HTTP.
//! - [`config`]: `config.toml` parsed into validated types; every error names its key.
//! - [`admin`]: the token-protected admin API on its own listener, and `/metrics`.
//! - [`metrics`]: what the gateway counts: per-node counters found by id on the request
//!   path, and the Prometheus families.
//! - [`access_log`]: one line per request, written by a thread of its own.
//! - [`logs`]: log lines that repeat under load, said at most once per interval.
//! - [`clock`]: the kernel's coarse clock, for the timestamps every request takes.
//! - [`error`]: the failures a student can see, and their statuses.
//! - [`ready`]: `moodle-gateway ready`, keepalived's question: can this gateway serve now.
//! - [`open_files`]: the open-file limit the configured limits need, raised at start.
//! - [`app`]: builds everything, serves the listeners, runs the background tasks (sweeper,
//!   probes, snapshots), reloads the config, shuts down.
//! - [`handover`]: a restart or upgrade outside systemd: the new process takes the
//!   listening sockets and the table from the old one, which drains and exits.
//! - [`demo`]: `moodle-gateway demo`: the real gateway in front of stand-in nodes
//!   ([`demo::standin`], also the tests' double), driven by simulated students.
//! - [`doctor`]: `moodle-gateway doctor`: asks the live site through every node what a
//!   Moodle expert would, and names the `config.php` line or key that fixes each problem.

pub mod access_log;
pub mod acme;
pub mod admin;
pub mod app;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod doctor;
pub mod error;
pub mod gateway;
pub mod handover;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod moodle;
pub mod node_id;
pub mod open_files;
pub mod ready;
pub mod sessions;
pub mod store;

pub use app::App;
pub use config::Config;
