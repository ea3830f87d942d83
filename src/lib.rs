//! moodle-gateway: a session-sticky reverse proxy for a Moodle cluster.
//!
//! # Layout
//! The tree names the architecture: three wings that never reach into each other
//! except where their `mod.rs` says, and the modules where they meet.
//!
//! Imports only point down. From the bottom: [`node_id`], [`moodle`], [`logs`] and
//! [`error`] import nothing of the crate; then [`config`]; [`http`]; [`access_log`],
//! [`cluster`], [`open_files`] and [`ready`]; [`metrics`] and [`sessions`];
//! [`store`]; [`gateway`]; [`admin`] and [`doctor`]; [`app`]; [`demo`] and [`handover`]. A module
//! uses only modules of the layers below its own (`tests/it/layers.rs` fails on any
//! other import), so no two modules import each other, and each can be read
//! knowing only what is under it.
//! - [`moodle`]: every Moodle fact: the kinds of request and the site they belong to;
//!   its readers of paths and SCORM URL forms, and of the session cookie both ways.
//! - [`gateway`]: one request's journey: admit, classify, route, forward (`failover`: where
//!   an attempt that sent nothing may go next), learn (`learning`: the node's `Set-Cookie`
//!   and the session-loss detector). Where the wings meet.
//! - [`http`]: bytes in and out.
//!   - [`http::listener`]: one listener's accept loop: caps, TLS, HTTP/1.1 or HTTP/2, the drain.
//!   - [`http::inherited`]: listening sockets passed in by systemd or by the previous
//!     process, each matched to a configured listener.
//!   - `http::server`: the HTTP/1.1 a student's connection speaks, by hand for plain
//!     requests, handed to hyper's server for the rest (upgrades, chunked uploads).
//!   - `http::wire`: what both hand-written HTTP/1.1 sides share: the `writev` queue, numbers.
//!   - [`http::tls`]: the public listener's certificate, reloaded by `SIGHUP`; ALPN;
//!     resumption by ticket; the redirect to HTTPS.
//!   - [`http::tickets`]: TLS tickets sealed with the keys the gateways of a site share.
//!   - [`http::edge`]: what a request must be before it is looked at: sizes, framing, one
//!     known host.
//!   - [`http::proxy`]: forwarding mechanics: header hygiene, streaming, upstream failures as
//!     statuses.
//!   - [`http::pool`]: keep-alive connections to the upstreams, driven by the request using them.
//!   - [`http::fault`]: whose fault a failed connect is: the gateway's own limits, a refusal,
//!     or the node.
//!   - [`http::body`]: the streaming bodies: when an upload is sent, how long a body may pause.
//!   - [`http::stall`]: a student who stops reading is cut after `body_idle`, freeing the node.
//!   - `http::splice`: a large answer's body moved from the node's socket to the student's
//!     inside the kernel, through a pipe.
//!   - `http::streams`: an HTTP/2 connection without streams closes after `request_headers`;
//!     a stream that gets no window for `body_idle` frees its node.
//!   - [`http::offload`]: a node's `X-Accel-Redirect` answered with the bytes of the data
//!     server's file export, under the node's headers.
//!   - [`http::tunnel`]: upgraded connections (WebSocket): a byte tunnel once the node said 101.
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
