//! moodle-gateway: a session-sticky reverse proxy for a Moodle cluster.
//!
//! # Layout
//! - [`config`]: `config.toml` parsed into validated types; every error names its key.
//! - [`moodle`]: everything Moodle-specific: cookies, SCORM URL forms, sessionless scripts.
//! - [`balancer`]: the lock-free deal of new sessions over weighted nodes.
//! - [`upstreams`]: the nodes as they are now: stable ids, admin state, health, the deal among them.
//! - [`health`]: active probes and passive marks that take nodes down and bring them back.
//! - [`affinity`]: the session → node table learned from the nodes' `Set-Cookie`.
//! - [`snapshot`]: the affinity table's snapshot file: atomic, streaming, checksummed.
//! - [`state`]: the table across restarts: loaded at start, saved periodically and at shutdown.
//! - [`route_cookie`]: the signed cookie that lets any gateway recover a session's node.
//! - [`edge`]: what a request must be before it is looked at: sizes, framing, one known host.
//! - [`gateway`]: one request's journey: classify, route, forward, learn.
//! - [`proxy`]: forwarding mechanics: header hygiene, streaming, upstream failures as statuses.
//! - [`pool`]: keep-alive connections to the upstreams, driven by the request using them.
//! - [`stall`]: a student who stops reading is cut after `body_idle`, freeing the node.
//! - [`tunnel`]: upgraded connections (WebSocket): a byte tunnel once the node said 101.
//! - [`body`]: the streaming bodies: when an upload is sent, how long a body may pause.
//! - [`error`]: the failures a student can see, and their statuses.
//! - [`tls`]: the public listener's certificate, reloaded by `SIGHUP`; ALPN; the redirect to HTTPS.
//! - [`admin`]: the token-protected admin API on its own listener.
//! - [`listener`]: one listener's accept loop: caps, TLS, HTTP/1.1 or HTTP/2, the drain.
//! - [`app`]: builds the routers, serves the listeners until shutdown, reloads the config.
//! - [`standin`]: stand-in Moodle nodes with node-local sessions, for tests and the demo.
//! - [`demo`]: `moodle-gateway demo`: the real gateway in front of stand-ins, driven by simulated students.

pub mod admin;
pub mod affinity;
pub mod app;
pub mod balancer;
pub mod body;
pub mod config;
pub mod demo;
pub mod edge;
pub mod error;
pub mod gateway;
pub mod health;
pub mod listener;
pub mod moodle;
pub mod pool;
pub mod proxy;
pub mod route_cookie;
pub mod snapshot;
pub mod stall;
pub mod standin;
pub mod state;
pub mod tls;
pub mod tunnel;
pub mod upstreams;

pub use app::App;
pub use config::Config;
