//! The gateway's configuration: the typed [`Config`] the rest of the crate reads,
//! parsed and validated from `config.toml`.
//!
//! Why it is strict: a gateway running on a half-understood config misroutes
//! students, and one misrouted request can log a student out of every node
//! (the book's "Moodle behind a proxy", docs/src/moodle.md). So a typo such as `max_session` is an error, never a silent
//! default; every value is checked before a port is bound; and *all* problems are
//! reported in one run, each with its dotted key and line, so an admin fixes the
//! file once instead of once per restart.
//!
//! Why it walks a spanned TOML tree ([`toml::de::DeTable`]) instead of deriving
//! serde: a derived `Deserialize` stops at the first error. The toml crate does say
//! where that one error is (and `deny_unknown_fields` names an unknown key with its
//! line), but an admin with a typo in `[session]` and a bad duration in `[surge]`
//! would then fix the file one restart at a time. The walk reports every problem of
//! the file at once, and checks the rules between keys (a default that depends on
//! another key, a setup that logs students out) in the same pass. Parsing ([`Config::parse`],
//! pure but for `token_file`, `secret_file` and the `[tls]` files) is separate from reading the file
//! and environment ([`Config::load`], [`ConfigEnv::from_process`]) so tests feed
//! it strings.
//!
//! Layout: this file holds the public types, their errors and the entry points
//! ([`Config::parse`], [`Config::load`]); `check` walks the TOML tree collecting
//! errors, with its sections for upstreams, secrets, operations and the edge
//! (limits, TLS, allowed hosts) in `upstreams`, `secrets`, `operations` and `edge`; `values` holds the pure parsers for single values;
//! `refusals` (with `directories`) judges the whole config for `check`, finding each
//! key's line in `lines`; `describe` words the resolved setup for `check`; `tests` pins
//! every message and line.

use std::fmt;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::Authority;
use ipnet::IpNet;

use check::Checker;
use lines::KeyLines;

mod acme;
mod cache;
mod check;
mod compression;
mod describe;
mod directories;
mod edge;
mod lines;
mod operations;
mod rate_limits;
mod refusals;
mod secrets;
mod store;
mod surge;
#[cfg(test)]
mod tests;
mod upstreams;
mod values;

pub use acme::{AcmeConfig, Challenge, ACME_LOOK_EVERY, DEFAULT_ACME_DIR, DEFAULT_RENEW_BEFORE};
pub use rate_limits::{Rate, RateLimitsConfig, DEFAULT_MAX_KEYS};
pub use store::{
    RedisConfig, RedisTarget, StoreConfig, MASTER_PASSWORD_ENV, SENTINEL_PASSWORD_ENV,
    STORE_SECRET_ENV,
};
pub use surge::MAX_ROOM_PAGE_BYTES;

/// `listen` default: all interfaces, a port that needs no privileges.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080));
/// `admin.listen` default: loopback, so the admin API is never public by accident.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9090));
/// `session.cookie` default: Moodle's name when `$CFG->sessioncookie` is empty.
pub const DEFAULT_COOKIE: &str = "MoodleSession";
/// `session.max_sessions` default: a million entries is tens of megabytes.
pub const DEFAULT_MAX_SESSIONS: usize = 1_000_000;
/// `session.logged_in_idle` default: Moodle's 8 h `sessiontimeout` plus slack, so
/// the gateway never forgets a session Moodle still honours.
pub const DEFAULT_LOGGED_IN_IDLE: Duration = Duration::from_secs(8 * 3600 + 30 * 60);
/// `session.sessiontimeout` default: Moodle's own default `$CFG->sessiontimeout`.
pub const DEFAULT_SESSIONTIMEOUT: Duration = Duration::from_secs(8 * 3600);
/// `session.anonymous_idle` default: guests and crawlers churn, but a login form
/// (its `logintoken` lives in the anonymous session) must stay sticky for a while.
pub const DEFAULT_ANONYMOUS_IDLE: Duration = Duration::from_secs(3600);
/// `timeouts.connect` default: a LAN node that cannot accept in 5 s is down.
pub const DEFAULT_CONNECT: Duration = Duration::from_secs(5);
/// `timeouts.response_headers` default: long enough for slow reports and backups.
pub const DEFAULT_RESPONSE_HEADERS: Duration = Duration::from_secs(60);
/// `timeouts.upstream_idle` default: warm connections survive a pause between
/// clicks; long-idle ones are closed before they go stale.
pub const DEFAULT_UPSTREAM_IDLE: Duration = Duration::from_secs(4);
/// `timeouts.request_headers` default: bounds slow-header (slowloris) clients.
pub const DEFAULT_REQUEST_HEADERS: Duration = Duration::from_secs(10);
/// `timeouts.keep_alive` default: nginx's `keepalive_timeout`. A student reads a page
/// for seconds to minutes before the next click; a connection kept that long spares
/// the click a new TCP and TLS handshake.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(75);
/// `timeouts.keep_alive` bounds: below a second no click would find its connection
/// kept; past an hour browsers have long given theirs up (Firefox after 115 s,
/// Chrome after 5 min), and an idle connection holds its place under
/// `limits.max_connections` for nothing.
pub const KEEP_ALIVE_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);
/// `timeouts.body_idle` default: the pause nginx allows inside a body
/// (`proxy_read_timeout`, `client_body_timeout`).
pub const DEFAULT_BODY_IDLE: Duration = Duration::from_secs(60);
/// Most `[[nodes]]` blocks: the affinity table stores a node index in 16 bits.
pub const MAX_NODES: usize = 1000;
/// `nodes[].weight` default: all nodes equal.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Largest `nodes[].weight`: keeps weighted round-robin arithmetic small.
pub const MAX_WEIGHT: u32 = 1000;
/// `session.failover_hold` default: long enough for a node's web server or PHP-FPM
/// to restart, short enough that a student sees a slow page rather than an error.
pub const DEFAULT_FAILOVER_HOLD: Duration = Duration::from_secs(10);
/// `session.slow_start` default: a Moodle node's OPcache and local caches fill on
/// its first few hundred pages, a minute of a busy site's newcomers at a tenth
/// rising to its full share.
pub const DEFAULT_SLOW_START: Duration = Duration::from_secs(60);
/// Longest `session.slow_start`: a longer ramp only keeps a warm node idle.
pub const MAX_SLOW_START: Duration = Duration::from_secs(3600);
/// `timeouts.tunnel_idle` default: HAProxy's usual `timeout tunnel`.
pub const DEFAULT_TUNNEL_IDLE: Duration = Duration::from_secs(3600);
/// `limits.max_header_bytes` default (HAProxy's `tune.bufsize` order, nginx's
/// `large_client_header_buffers` 4 × 8k).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;
/// `limits.max_headers` default (hyper's and HAProxy's `tune.http.maxhdr` 101).
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// `limits.max_uri_bytes` default (nginx's 8k line buffer).
pub const DEFAULT_MAX_URI_BYTES: usize = 8 * 1024;
/// `limits.max_body_bytes` default: above common Moodle upload limits; set it to
/// PHP's `post_max_size`.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// `limits.buffer_body_bytes` default: Moodle's forms (a quiz page, a forum post,
/// a settings page) and SCORM tracking posts (`datamodel.php`, a few KiB of cmi
/// values) fit many times over, so nearly every POST reaches PHP whole and at LAN
/// speed; a slow student then holds 64 KiB of gateway memory, never a PHP worker.
pub const DEFAULT_BUFFER_BODY_BYTES: u64 = 64 * 1024;
/// `limits.spool_body_bytes` default: an assignment's files fit whole many times
/// over at Moodle's and PHP's default upload limits (`maxbytes` falls back to
/// PHP's `upload_max_filesize`, 2 MB; `post_max_size` 8 MB), and so do the
/// 20-50 MB most sites raise them to; a course backup or a SCORM package above it
/// streams, as an admin's rare upload may.
pub const DEFAULT_SPOOL_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// `limits.spool_max_bytes` default: 64 such uploads at once, or 800 of 5 MB, at a
/// deadline; a body that finds it full streams.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// `limits.spool_dir` default, relative to the working directory like the state
/// file: the Debian package's config names its `CacheDirectory` instead.
pub const DEFAULT_SPOOL_DIR: &str = "moodle-gateway.spool";
/// `timeouts.upload_min_rate` default, bytes per second: 1 KiB/s is 8 kbit/s, below
/// what a 2G phone sends; a real student on the worst line stays far above it.
pub const DEFAULT_UPLOAD_MIN_RATE: u64 = 1024;
/// `timeouts.upload_rate_window` default: the rate is averaged over a minute, so a
/// mobile line that drops out for most of one (under `body_idle`) and then catches
/// up is not cut.
pub const DEFAULT_UPLOAD_RATE_WINDOW: Duration = Duration::from_secs(60);
/// `timeouts.upload` default: a whole streamed upload; 2 h carries 900 MB over a
/// 1 Mbit/s uplink, more than an assignment or most course backups.
pub const DEFAULT_UPLOAD: Duration = Duration::from_secs(2 * 3600);
/// `limits.max_connections` default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// `limits.max_in_flight` default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;
/// `limits.http2_max_streams` default (nginx's `http2_max_concurrent_streams`).
pub const DEFAULT_HTTP2_MAX_STREAMS: u32 = 100;
/// `timeouts.shutdown` default: how long in-flight requests may finish at shutdown.
pub const DEFAULT_SHUTDOWN: Duration = Duration::from_secs(30);
/// `health.path` default, under the site's path: boost's site icon through
/// `theme/image.php`, a `NO_MOODLE_COOKIES` script of every stock Moodle 4.x. With
/// no `rev` it runs Moodle's full setup (config, database) and starts no session,
/// so a 200 says PHP and the database answer. Component `theme`, not `core`: boost
/// keeps its favicon in its own `pix/`, and `core` answers 404 (seen on Moodle
/// 4.5). `/admin/tool/heartbeat/` is better where the plugin is installed.
pub const DEFAULT_HEALTH_PATH: &str = "/theme/image.php?theme=boost&component=theme&image=favicon";
/// `health.interval` default.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// `health.timeout` default.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// `health.rise` default: successes in a row that bring a down node back.
pub const DEFAULT_RISE: u32 = 2;
/// `health.fall` default: failures in a row (probes or proxied requests) that take
/// a node down.
pub const DEFAULT_FALL: u32 = 3;
/// `state.file` default, relative to the working directory: a plain restart keeps
/// every session with no setup.
pub const DEFAULT_STATE_FILE: &str = "moodle-gateway.state";
/// `state.save_every` default.
pub const DEFAULT_SAVE_EVERY: Duration = Duration::from_secs(30);
/// `route_cookie.name` default.
pub const DEFAULT_ROUTE_COOKIE: &str = "MoodleGatewayRoute";
/// The environment variable that overrides `route_cookie.secret`/`secret_file`.
pub const ROUTE_SECRET_ENV: &str = "MOODLE_GATEWAY_ROUTE_SECRET";
/// Shortest accepted route cookie secret, in bytes.
pub const MIN_ROUTE_SECRET: usize = 32;
/// Shortest accepted admin token, in characters: the admin API slows guessing
/// down per address, but a short token falls to a patient or distributed guesser.
pub const MIN_ADMIN_TOKEN: usize = 32;
/// The environment variable that overrides `admin.token`/`admin.token_file`, so
/// the secret can come from a service manager instead of a file on disk.
pub const ADMIN_TOKEN_ENV: &str = "MOODLE_GATEWAY_ADMIN_TOKEN";

/// A fully validated configuration. Every field has its default applied.
#[derive(Debug, Clone)]
pub struct Config {
    /// Public listener for students (`listen`).
    pub listen: SocketAddr,
    /// Peers whose `X-Forwarded-For` is extended rather than replaced (`trusted_proxies`).
    pub trusted_proxies: Vec<IpNet>,
    /// Where Moodle lives under the public host (`[site]`).
    pub site: SiteConfig,
    /// The admin listener (`[admin]`); `None` when the section is absent.
    pub admin: Option<AdminConfig>,
    /// Session cookie and affinity table settings (`[session]`).
    pub session: SessionConfig,
    /// Timeouts (`[timeouts]`).
    pub timeouts: Timeouts,
    /// The PHP web nodes (`[[nodes]]`), in file order; at least one.
    pub nodes: Vec<UpstreamConfig>,
    /// The data server that serves SCORM files (`[data]`).
    pub data: UpstreamConfig,
    /// Active health checks of every node and the data server (`[health]`).
    pub health: HealthConfig,
    /// The affinity table's snapshot file (`[state]`).
    pub state: StateConfig,
    /// The signed route cookie (`[route_cookie]`); `None` when the section is absent.
    pub route_cookie: Option<RouteCookieConfig>,
    /// Request size and concurrency limits at the edge (`[limits]`).
    pub limits: LimitsConfig,
    /// TLS on the public listener (`[tls]`); `None` when the section is absent.
    pub tls: Option<TlsConfig>,
    /// Certificates from a CA by ACME (`[acme]`); `None`, `[tls]` serves files.
    pub acme: Option<AcmeConfig>,
    /// The file offload (`[offload]`); `None` when the section is absent.
    pub offload: Option<OffloadConfig>,
    /// One line per request (`[access_log]`).
    pub access_log: AccessLogConfig,
    /// Where the affinity table, the deal and the admin state live (`[store]`).
    pub store: StoreConfig,
    /// Each node's cap, the line in the gateway and the waiting room (`[surge]`).
    pub surge: SurgeConfig,
    /// Moodle's revisioned assets kept in the gateway's memory (`[cache]`).
    pub cache: CacheConfig,
    /// Answers compressed on their way to the students (`[compression]`).
    pub compression: CompressionConfig,
    /// Login attempts and anonymous page views, limited (`[rate_limits]`).
    pub rate_limits: RateLimitsConfig,
    /// Directory of the config file, for resolving relative paths.
    pub base_dir: PathBuf,
    /// Where each key is written, for the rules judged after the walk.
    lines: KeyLines,
}

/// `[offload]`: PHP nodes authorise file requests and name the file with
/// `X-Accel-Redirect`; the gateway fetches its bytes from the data server's export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadConfig {
    /// `url`: the data server's file export, `http://host[:port]` only.
    pub authority: Authority,
    /// `prefix`: the key of `$CFG->xsendfilealiases`, like `"/dataroot/"`: only a
    /// header under it is honoured. Starts and ends with `/`. Default `"/dataroot/"`.
    pub prefix: String,
    /// `probe`: a file under `prefix` the export must answer `2xx`, so a probe proves
    /// the files are there; `None` probes `prefix` itself, where any answer below
    /// `500` proves only that the export is up.
    pub probe: Option<String>,
}

/// `offload.prefix` default: the alias Moodle's own documentation uses.
pub const DEFAULT_OFFLOAD_PREFIX: &str = "/dataroot/";

/// `[site]`
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// `wwwroot`: `$CFG->wwwroot` as the admin copied it from config.php; `path`,
    /// the first of `hosts` and the probes' `Host` are derived from it. `None` on a
    /// file that sets `path`/`hosts` by hand.
    pub wwwroot: Option<Wwwroot>,
    /// `path`: the wwwroot sub-path, `""` for a site at the host root, else `"/moodle"`
    /// (leading slash, no trailing slash).
    pub path: String,
    /// `hosts`: the public host names students may use (lowercase, an optional
    /// `:port` kept), wwwroot's first; empty (no wwwroot, no hosts) accepts any. A
    /// request naming another host is refused, so a forged `Host` cannot reach
    /// Moodle (which builds password-reset links from it).
    pub hosts: Vec<String>,
}

/// `$CFG->wwwroot`, taken apart: the one value every node's config.php and the
/// gateway must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wwwroot {
    /// The URL as written (without a trailing `/`), for messages.
    pub url: String,
    /// `https://`: students reach the site over TLS (at the gateway or in front of it).
    pub https: bool,
    /// The host as a browser's `Host` header carries it: lowercase, with `:port`
    /// only when the URL names one.
    pub host: String,
    /// The port the URL names, if any. Moodle compares it with each node's
    /// `$_SERVER['SERVER_PORT']` (`initialise_fullme()`) and redirects on a mismatch.
    pub port: Option<u16>,
    /// The path: `""` at the host root, else like `"/moodle"`.
    pub path: String,
}

/// `[limits]`: what one client may send and how many at once, each refused with
/// its own status before it reaches a node.
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    /// `max_header_bytes`: the whole request head (names, values, request line), 431
    /// beyond. Default 32 KiB.
    pub max_header_bytes: usize,
    /// `max_headers`: header lines per request, 431 beyond. Default 100.
    pub max_headers: usize,
    /// `max_uri_bytes`: the request target, 414 beyond. Default 8 KiB.
    pub max_uri_bytes: usize,
    /// `max_body_bytes`: a request body, 413 beyond (at once on `Content-Length`,
    /// counted while streaming otherwise). Default 2 GiB.
    pub max_body_bytes: u64,
    /// `buffer_body_bytes`: a body of at most this much (by `Content-Length`, or a
    /// chunked one that ends within it) is read whole before a node is contacted,
    /// so a slow client never holds a PHP worker. Default 64 KiB.
    pub buffer_body_bytes: u64,
    /// `spool_body_bytes`: a larger body of at most this much is kept on disk
    /// until whole, then sent at LAN speed, so a slow upload holds no PHP worker
    /// while it arrives; 0 streams every body above `buffer_body_bytes`.
    /// Default 64 MiB.
    pub spool_body_bytes: u64,
    /// `spool_max_bytes`: the disk all spooled bodies may use at once; a body that
    /// does not fit streams. Default 4 GiB.
    pub spool_max_bytes: u64,
    /// `spool_dir`: where spooled bodies live, as files without names. Relative
    /// to the working directory. Default `moodle-gateway.spool`.
    pub spool_dir: PathBuf,
    /// `max_connections`: open client connections; one more gets a 503 and is
    /// closed. Default 10,000.
    pub max_connections: usize,
    /// `max_in_flight`: requests being proxied at once; one more gets a 503.
    /// Default 10,000.
    pub max_in_flight: usize,
    /// `http2_max_streams`: concurrent streams per HTTP/2 connection. Default 100.
    pub http2_max_streams: u32,
}

/// `[tls]`: the public listener speaks TLS (HTTP/2 and HTTP/1.1 by ALPN).
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// `cert`: PEM certificate chain, leaf first. Written relative to the config
    /// file's directory; stored already joined to `base_dir`, so open it as is.
    pub cert: PathBuf,
    /// `key`: PEM private key (PKCS#8, PKCS#1 or SEC1, unencrypted). Stored
    /// joined to `base_dir`, like `cert`.
    pub key: PathBuf,
    /// `redirect_listen`: an optional plain-HTTP listener that redirects to HTTPS.
    pub redirect_listen: Option<SocketAddr>,
    /// `hsts_max_age` and `hsts_include_subdomains`: what the TLS listener's
    /// answers say in `Strict-Transport-Security`; `None`, no such header.
    pub hsts: Option<Hsts>,
}

/// HTTP Strict Transport Security (RFC 6797), sent over TLS only: browsers ignore
/// it over plain HTTP, and the redirect listener never sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hsts {
    /// How long a browser keeps going straight to https; zero tells it to forget.
    pub max_age: Duration,
    /// The same for every sub-domain of the site's host.
    pub include_subdomains: bool,
}

impl Hsts {
    /// The header's value, as browsers read it.
    pub fn value(self) -> String {
        let age = self.max_age.as_secs();
        match self.include_subdomains {
            true => format!("max-age={age}; includeSubDomains"),
            false => format!("max-age={age}"),
        }
    }
}

/// `[admin]`. `Debug` is written by hand so the token never reaches a log.
#[derive(Clone)]
pub struct AdminConfig {
    /// `listen`: never the public listener.
    pub listen: SocketAddr,
    /// The resolved token: `MOODLE_GATEWAY_ADMIN_TOKEN`, else `token`, else the
    /// first line of `token_file`.
    pub token: String,
    /// Where `token` came from, so `check` can say so without printing it.
    pub token_source: TokenSource,
}

/// Which of the three token settings won (the environment beats `token`, which
/// beats `token_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// `MOODLE_GATEWAY_ADMIN_TOKEN`.
    Env,
    /// `admin.token`.
    Token,
    /// `admin.token_file`.
    TokenFile,
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &"<redacted>")
            .field("token_source", &self.token_source)
            .finish()
    }
}

/// `balance`: how a new session picks its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// `"round-robin"` (default): smooth weighted round robin.
    RoundRobin,
    /// `"least-sessions"`: the node with the fewest live sessions per weight.
    LeastSessions,
}

/// `[session]`
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `cookie`: `MoodleSession` plus `$CFG->sessioncookie`.
    pub cookie: String,
    /// `cookie_path`: default `site.path + "/"`.
    pub cookie_path: String,
    /// `balance`.
    pub balance: Balance,
    /// `max_sessions`: default 1,000,000.
    pub max_sessions: usize,
    /// `logged_in_idle`: default 8h30m (Moodle's `sessiontimeout` plus slack).
    pub logged_in_idle: Duration,
    /// `anonymous_idle`: default 1h.
    pub anonymous_idle: Duration,
    /// `sessiontimeout`: Moodle's `$CFG->sessiontimeout`, default 8h. A logged-in
    /// session Moodle replaces after this much idleness timed out; one replaced
    /// sooner was lost (the session-loss detector tells the two apart).
    pub sessiontimeout: Duration,
    /// `store`: where Moodle keeps sessions, which decides failover. Default node-local.
    pub store: SessionStore,
    /// `failover_hold`: with a node-local store, how long a request waits for its
    /// down node to come back before it is re-dealt. Default 10s.
    pub failover_hold: Duration,
    /// `slow_start`: how long a node back in the deal (up again, undrained, enabled)
    /// takes to reach its full share of new sessions; zero: at once. Default 60s.
    pub slow_start: Duration,
}

/// `store`: where Moodle keeps its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStore {
    /// `"node-local"` (default): only the issuing node has the session, so a student
    /// whose node is down waits `failover_hold` for it before being re-dealt.
    NodeLocal,
    /// `"shared"` (database, Redis, memcached, shared dataroot): any node can serve
    /// any session, so a student whose node is down is re-dealt at once.
    Shared,
}

/// `[health]`: active checks, the same for every node and the data server.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// `path`: path and optional query probed with `GET`; starts with `/`; the
    /// site path is *not* prepended to a written one. Default: the site's path plus
    /// [`DEFAULT_HEALTH_PATH`].
    pub path: String,
    /// `host`: the `Host` header probes carry. Default: the site's host (wwwroot's,
    /// else the first of `hosts`), because Moodle answers any other host with a 303
    /// to wwwroot; `None` (no site host known) sends the upstream's own address.
    pub host: Option<String>,
    /// `interval`: time between probes of one upstream. Default 2s.
    pub interval: Duration,
    /// `timeout`: how long one probe may take (connect to full response head). Default 1s.
    pub timeout: Duration,
    /// `rise`: successes in a row that mark a down upstream up. Default 2.
    pub rise: u32,
    /// `fall`: failures in a row that mark an up upstream down. Default 3.
    pub fall: u32,
    /// `statuses`: the probe answers that count as healthy. Default: 200 only.
    pub statuses: Vec<StatusRange>,
}

/// An accepted probe status or range: `200` is `200..=200`, `"2xx"` is `200..=299`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    /// Lowest status in the range.
    pub low: u16,
    /// Highest status in the range.
    pub high: u16,
}

impl HealthConfig {
    /// Whether a probe answered with `status` counts as healthy.
    pub fn accepts(&self, status: u16) -> bool {
        self.statuses
            .iter()
            .any(|r| (r.low..=r.high).contains(&status))
    }
}

/// `[access_log]`: one line per request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// `to`: `"off"` (default), `"stderr"`, or a file, appended to and reopened on
    /// `SIGHUP` (for logrotate).
    pub to: AccessLogTo,
    /// `format`: `"combined"` (default) or `"json"`.
    pub format: AccessLogFormat,
}

/// Where access log lines go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AccessLogTo {
    /// `"off"`: nowhere.
    #[default]
    Off,
    /// `"stderr"`: beside the gateway's own log (journald keeps both).
    Stderr,
    /// A file path: appended to, reopened on `SIGHUP`.
    File(PathBuf),
}

/// How an access log line is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// The combined log format, with the gateway's fields appended as `key=value`.
    #[default]
    Combined,
    /// One JSON object per line.
    Json,
}

/// `[state]`: the affinity table's snapshot.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// `file`: where the snapshot lives, relative to the working directory; `None`
    /// when set to `""` (no snapshot). Default `moodle-gateway.state`.
    pub file: Option<PathBuf>,
    /// `save_every`: time between snapshots while running. Default 30s.
    pub save_every: Duration,
}

/// `[route_cookie]`. `Debug` is written by hand so the secret never reaches a log.
#[derive(Clone)]
pub struct RouteCookieConfig {
    /// `name`: the cookie's name, default `MoodleGatewayRoute`; never the session cookie.
    pub name: String,
    /// The resolved secret: `MOODLE_GATEWAY_ROUTE_SECRET`, else `secret`, else the
    /// first line of `secret_file`; at least [`MIN_ROUTE_SECRET`] bytes.
    pub secret: Vec<u8>,
    /// Where `secret` came from, so `check` can say so without printing it.
    pub secret_source: SecretSource,
}

/// Which of the three route secret settings won (the environment beats `secret`,
/// which beats `secret_file`), as [`TokenSource`] does for the admin token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretSource {
    /// `MOODLE_GATEWAY_ROUTE_SECRET`.
    Env,
    /// `route_cookie.secret`.
    Secret,
    /// `route_cookie.secret_file`.
    SecretFile,
}

impl fmt::Debug for RouteCookieConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteCookieConfig")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .field("secret_source", &self.secret_source)
            .finish()
    }
}

/// The environment variables [`Config::parse`] reads, passed in so that parsing
/// stays a function of its arguments (tests give each case its own environment
/// instead of racing on the process's). A blank value counts as unset. `Debug`
/// is written by hand so neither secret reaches a log.
#[derive(Clone, Default)]
pub struct ConfigEnv {
    /// [`ADMIN_TOKEN_ENV`]: overrides `admin.token` and `admin.token_file`.
    pub admin_token: Option<String>,
    /// [`ROUTE_SECRET_ENV`]: overrides `route_cookie.secret` and `secret_file`.
    pub route_secret: Option<String>,
    /// [`STORE_SECRET_ENV`]: overrides `store.secret` and `secret_file`.
    pub store_secret: Option<String>,
    /// [`MASTER_PASSWORD_ENV`]: overrides `store.master_password` and its file.
    pub store_master_password: Option<String>,
    /// [`SENTINEL_PASSWORD_ENV`]: overrides `store.sentinel_password` and its file.
    pub store_sentinel_password: Option<String>,
}

impl ConfigEnv {
    /// Reads [`ADMIN_TOKEN_ENV`] and [`ROUTE_SECRET_ENV`] from this process.
    pub fn from_process() -> ConfigEnv {
        ConfigEnv {
            admin_token: std::env::var(ADMIN_TOKEN_ENV).ok(),
            route_secret: std::env::var(ROUTE_SECRET_ENV).ok(),
            store_secret: std::env::var(STORE_SECRET_ENV).ok(),
            store_master_password: std::env::var(MASTER_PASSWORD_ENV).ok(),
            store_sentinel_password: std::env::var(SENTINEL_PASSWORD_ENV).ok(),
        }
    }

    /// Trimmed, with blank values dropped: an empty `Environment=` line in a unit
    /// file must not beat the config file's secret.
    fn normalised(self) -> ConfigEnv {
        let clean = |v: Option<String>| v.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        ConfigEnv {
            admin_token: clean(self.admin_token),
            route_secret: clean(self.route_secret),
            store_secret: clean(self.store_secret),
            store_master_password: clean(self.store_master_password),
            store_sentinel_password: clean(self.store_sentinel_password),
        }
    }
}

impl fmt::Debug for ConfigEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &Option<String>| if v.is_some() { "<set>" } else { "<unset>" };
        f.debug_struct("ConfigEnv")
            .field("admin_token", &set(&self.admin_token))
            .field("route_secret", &set(&self.route_secret))
            .field("store_secret", &set(&self.store_secret))
            .field("store_master_password", &set(&self.store_master_password))
            .field(
                "store_sentinel_password",
                &set(&self.store_sentinel_password),
            )
            .finish()
    }
}

/// `[timeouts]`
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// `connect`: TCP connect to an upstream, default 5s.
    pub connect: Duration,
    /// `response_headers`: from sending the request to the upstream's response head, default 60s.
    pub response_headers: Duration,
    /// `upstream_idle`: how long a pooled upstream keep-alive connection may sit idle,
    /// default 4s: below the nodes' own keep-alive timeout (Apache: 5 s), so the gateway
    /// never reuses a connection the node is closing.
    pub upstream_idle: Duration,
    /// `request_headers`: how long a client may take to send its request head, from
    /// the head's first byte (a new connection's first head: from the connection's
    /// start), default 10s.
    pub request_headers: Duration,
    /// `keep_alive`: how long a client connection that has been answered may wait,
    /// idle, for the first byte of its next request (HTTP/1.1), or with no stream
    /// open (HTTP/2), default 75s.
    pub keep_alive: Duration,
    /// `body_idle`: the longest pause inside a body on its way through, upload or
    /// download, default 60s.
    pub body_idle: Duration,
    /// `shutdown`: how long in-flight requests may take to finish once shutdown
    /// starts, default 30s.
    pub shutdown: Duration,
    /// `tunnel_idle`: how long an upgraded connection (WebSocket) may carry no
    /// byte either way, default 1h.
    pub tunnel_idle: Duration,
    /// `upload_min_rate`: bytes per second a streamed upload must average over each
    /// `upload_rate_window`, 408 below; 0 turns the floor off. Default 1 KiB.
    pub upload_min_rate: u64,
    /// `upload_rate_window`: the window `upload_min_rate` is averaged over, default 60s.
    pub upload_rate_window: Duration,
    /// `upload`: the longest a whole upload may take, 408 beyond, default 2h.
    pub upload: Duration,
}

/// One `[[nodes]]` block or the `[data]` block.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `name`: unique among nodes and data.
    pub name: String,
    /// `url`: `http://host[:port]` only (no path, no TLS yet); kept as the authority.
    pub authority: Authority,
    /// `weight`: 1..=1000, default 1 (always 1 for `[data]`).
    pub weight: u32,
    /// `state`: `active` (default), `draining` or `disabled` (always active for `[data]`).
    pub state: NodeState,
    /// `max_active`: this node's own cap, overriding `surge.max_active` (never set
    /// for `[data]`).
    pub max_active: Option<usize>,
    /// `low_priority_url`: the same node's second PHP pool, at a lower CPU
    /// priority, for every request that is not work in progress (never set for
    /// `[data]`).
    pub low_priority: Option<Authority>,
}

impl UpstreamConfig {
    /// The requests this node works on at once under `surge` (0: no cap).
    pub fn cap(&self, surge: &SurgeConfig) -> usize {
        self.max_active.unwrap_or(surge.max_active)
    }
}

/// `[cache]`: Moodle's revisioned theme and JavaScript answers, kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// `enabled`: default true.
    pub enabled: bool,
    /// `max_bytes`: all entries' bodies together (0 keeps nothing). Default 64 MiB.
    pub max_bytes: u64,
    /// `max_entry_bytes`: one answer's body; a larger one streams on, not kept.
    /// Default 2 MiB.
    pub max_entry_bytes: u64,
}

/// `[compression]`: the answers a node left uncompressed, compressed for the
/// students that accept it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompressionConfig {
    /// `enabled`: default true.
    pub enabled: bool,
    /// `level`: 1 (fastest) to 9 (smallest), gzip's level and brotli's quality.
    /// Default 5.
    pub level: u32,
    /// `min_length`: an answer whose `Content-Length` is smaller goes as it is.
    /// Default 1 KiB.
    pub min_length: u64,
    /// `types`: the media types compressed, lowercase.
    pub types: Vec<String>,
    /// `honour_no_transform`: whether `Cache-Control: no-transform` keeps an answer
    /// as the node sent it. Default false (see the book's "Compression").
    pub honour_no_transform: bool,
}

/// `[surge]`: what the gateway does when more students arrive than the nodes'
/// PHP workers can take. Everything is inert while no node has a cap.
#[derive(Debug, Clone)]
pub struct SurgeConfig {
    /// `max_active`: requests one node works on at once, the rest wait in the
    /// gateway; 0 (default): no cap, every request goes to its node at once.
    pub max_active: usize,
    /// `max_waiting`: requests waiting across all nodes. Default 10,000.
    pub max_waiting: usize,
    /// `quiz_starts`: quiz starts one node runs at once. Default: half its cap.
    pub quiz_starts: QuizStarts,
    /// `quiz_starts_yield_at`: the starts of the whole site give way while the
    /// students' page turns take more than this many times their calm (0: off).
    /// Default 1.5.
    pub quiz_starts_yield_at: f64,
    /// `session_max_active`: one session's requests at its node at once (0: no
    /// limit). Default 6.
    pub session_max_active: usize,
    /// `aging`: the step of the queue's aging rule within a tier. Default 10 s.
    pub aging: Duration,
    /// `patience`: a logged-in student's request waits at most this. Default 60 s.
    pub patience: Duration,
    /// `post_patience`: a logged-in student's POST. Default 180 s.
    pub post_patience: Duration,
    /// `anonymous_patience`: a session that has not logged in. Default 45 s.
    pub anonymous_patience: Duration,
    /// `newcomer_patience`: a request with no known session. Default 30 s.
    pub newcomer_patience: Duration,
    /// The waiting room (`waiting_room`, default on): `None` when turned off.
    pub waiting_room: Option<RoomConfig>,
}

/// `[surge] quiz_starts`: how many quiz starts (`startattempt.php`) one node runs
/// at once, the others waiting in the gateway in the order they came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuizStarts {
    /// `"auto"`: half the node's cap, at least one; none without a cap.
    Auto,
    /// A number per node (0: starts are not paced), at most the node's cap.
    PerNode(usize),
}

impl SurgeConfig {
    /// Quiz starts a node with cap `cap` runs at once (0: no gate). Without a cap
    /// there is no line for the rest of the node's work to go ahead in, so no gate.
    pub fn start_share(&self, cap: usize) -> usize {
        match (cap, self.quiz_starts) {
            (0, _) => 0,
            (_, QuizStarts::Auto) => (cap / 2).max(1),
            (_, QuizStarts::PerNode(n)) => n.min(cap),
        }
    }
}

/// The waiting room of `[surge]`.
#[derive(Debug, Clone)]
pub struct RoomConfig {
    /// `room_opens_at`: the expected wait for a newcomer that opens it. Default 5 s.
    pub opens_at: Duration,
    /// `place_kept`: how long a place in line is kept for a visitor who stopped
    /// refreshing. Default 5 min.
    pub place_kept: Duration,
    /// `room_cookie`: the cookie that holds a visitor's place. Default
    /// `MoodleGatewayPlace`.
    pub cookie: String,
    /// `room_page`: the page's template as read (UTF-8); `None`: the built-in page.
    pub page: Option<String>,
}

/// `nodes[].state`: what an admin wants of a node. The admin API can change it
/// at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// `"active"`: gets new sessions and keeps its own.
    Active,
    /// `"draining"`: keeps serving its bound sessions, gets no new ones, so it
    /// empties as students log out or go idle.
    Draining,
    /// `"disabled"`: gets nothing; its sessions are re-dealt on their next request.
    Disabled,
}

impl NodeState {
    /// The state as `config.toml`, the admin API and `/metrics` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Disabled => "disabled",
        }
    }

    /// The state [`as_str`](Self::as_str) spells `name`.
    pub fn from_name(name: &str) -> Option<NodeState> {
        [NodeState::Active, NodeState::Draining, NodeState::Disabled]
            .into_iter()
            .find(|state| state.as_str() == name)
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Balance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Balance::RoundRobin => "round-robin",
            Balance::LeastSessions => "least-sessions",
        })
    }
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenSource::Env => ADMIN_TOKEN_ENV,
            TokenSource::Token => "admin.token",
            TokenSource::TokenFile => "admin.token_file",
        })
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecretSource::Env => ROUTE_SECRET_ENV,
            SecretSource::Secret => "route_cookie.secret",
            SecretSource::SecretFile => "route_cookie.secret_file",
        })
    }
}

/// One problem in the config file. Displays as `<line>: <key>: <message>`,
/// without `<line>: ` when there is no line and without `<key>: ` when the
/// problem is the file itself (unreadable, not TOML); a warning says
/// `warning: ` before its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending key, like `nodes[2].url` (0-based index) or
    /// `admin.token`; empty for problems with the file itself.
    pub key: String,
    /// 1-based line of the offending key or value, when there is one.
    pub line: Option<usize>,
    /// Lowercase reason, quoting the bad value.
    pub message: String,
    /// Whether the file is refused for it, or only told about it.
    pub severity: Severity,
}

/// How much a problem weighs: an error refuses the file; a warning is said
/// beside the resolved setup, and the file is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The file cannot work as written: `check` exits 1.
    Error,
    /// It works, but costs students their login on a bad day.
    Warning,
}

/// Every problem found in one run, sorted by line (line-less ones last).
///
/// Displays one error per line, no trailing newline, prefixed by the source
/// (the path as given to [`Config::load`]) when known:
/// `<source>:<line>: <key>: <message>`, or `<source>: <key>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>, Option<String>);

impl ConfigErrors {
    /// Errors with no source name yet (what [`Config::parse`] returns).
    pub fn new(errors: Vec<ConfigError>) -> Self {
        ConfigErrors(errors, None)
    }

    /// Problems found in more than one pass, in one list: by line, line-less
    /// ones last (a stable sort keeps each pass's order within a line).
    fn sorted(mut problems: Vec<ConfigError>) -> Self {
        problems.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        ConfigErrors::new(problems)
    }

    /// Names the file the errors came from, for the `<source>:` prefix.
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.1 = Some(source.into());
        self
    }

    /// The name the errors are prefixed with, if any.
    pub fn source(&self) -> Option<&str> {
        self.1.as_deref()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "{line}: ")?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            f.write_str(if i == 0 { "" } else { "\n" })?;
            match &self.1 {
                Some(source) => write!(f, "{}", e.in_file(source))?,
                None => write!(f, "{e}")?,
            }
        }
        Ok(())
    }
}

impl ConfigError {
    /// As `check` prints it: `<source>:<line>: <key>: <message>`, or
    /// `<source>: <key>: <message>` without a line.
    pub fn in_file<'a>(&'a self, source: &'a str) -> impl fmt::Display + 'a {
        InFile(source, self)
    }
}

struct InFile<'a>(&'a str, &'a ConfigError);

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let InFile(source, e) = self;
        match e.line {
            Some(_) => write!(f, "{source}:{e}"),
            None => write!(f, "{source}: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}
impl std::error::Error for ConfigErrors {}

fn error(key: impl Into<String>, line: Option<usize>, message: impl Into<String>) -> ConfigError {
    let (key, message) = (key.into(), message.into());
    let severity = Severity::Error;
    ConfigError {
        key,
        line,
        message,
        severity,
    }
}

impl Config {
    /// Reads `path` and the environment ([`ConfigEnv::from_process`]), then
    /// [`parse`](Config::parse)s.
    /// Errors carry `path` exactly as given, so `check` prints what the user typed.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let source = path.display().to_string();
        let (text, base_dir) = read(path)?;
        let env = ConfigEnv::from_process();
        Config::parse(&text, base_dir, env).map_err(|e| e.with_source(source))
    }

    /// Parses and validates `text`, collecting every problem. Pure except that it
    /// reads `admin.token_file` and `route_cookie.secret_file` (relative to
    /// `base_dir`) when nothing beats them, and `tls.cert` and `tls.key` to see
    /// that they hold PEM blocks of the right kind. `env` stands for the process
    /// environment; its blank values count as unset.
    pub fn parse(text: &str, base_dir: &Path, env: ConfigEnv) -> Result<Config, ConfigErrors> {
        let (doc, mut c) = Checker::start(text, base_dir, env)?;
        match c.config(doc.get_ref()) {
            Some(config) if c.errors.is_empty() => Ok(config),
            // Whatever is missing recorded an error when it went missing.
            _ => Err(c.finish()),
        }
    }
}

/// The file's text and the directory its relative paths start from.
fn read(path: &Path) -> Result<(String, &Path), ConfigErrors> {
    let text = fs::read_to_string(path).map_err(|e| {
        let message = format!("cannot read config file: {}", io_reason(&e));
        ConfigErrors::new(vec![error("", None, message)]).with_source(path.display().to_string())
    })?;
    let base_dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    Ok((text, base_dir))
}

/// A TOML syntax error leaves no tree to check, so it is reported alone.
fn syntax_error(text: &str, e: &toml::de::Error) -> ConfigErrors {
    let line = e.span().map(|s| line_of(text, s.start));
    let message = format!("invalid TOML: {}", e.message().replace('\n', "; "));
    ConfigErrors::new(vec![error("", line, message)])
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// `std::io::Error` messages start with a capital; ours are lowercase.
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    let mut chars = s.chars();
    chars
        .next()
        .map_or(String::new(), |c| c.to_lowercase().chain(chars).collect())
}
