//! The gateway's configuration: the typed [`Config`] the rest of the crate reads,
//! parsed and validated from `config.toml`.
//!
//! Why it is strict: a gateway running on a half-understood config misroutes
//! students, and one misrouted request can log a student out of every node
//! (MOODLE.md). So a typo such as `max_session` is an error, never a silent
//! default; every value is checked before a port is bound; and *all* problems are
//! reported in one run, each with its dotted key and line, so an admin fixes the
//! file once instead of once per restart.
//!
//! Why it walks a spanned TOML tree ([`toml::de::DeTable`]) instead of deriving
//! serde: serde stops at the first type error and cannot give the line of an
//! unknown key, the two things an admin most needs. Parsing ([`Config::parse`],
//! pure but for `token_file`) is separate from reading the file and environment
//! ([`Config::load`]) so tests feed it strings.

use std::fmt;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::Authority;
use ipnet::IpNet;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

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
/// `nodes[].weight` default: all nodes equal.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Largest `nodes[].weight`: keeps weighted round-robin arithmetic small.
pub const MAX_WEIGHT: u32 = 1000;
/// The environment variable that overrides `admin.token`/`admin.token_file`, so
/// the secret can come from a service manager instead of a file on disk.
pub const ADMIN_TOKEN_ENV: &str = "MOODLE_GATEWAY_ADMIN_TOKEN";

// The keys each table accepts, space-separated; anything else is reported.
const TOP_KEYS: &str = "listen trusted_proxies site admin session timeouts nodes data";
const SITE_KEYS: &str = "path";
const ADMIN_KEYS: &str = "listen token token_file";
const SESSION_KEYS: &str = "cookie cookie_path balance max_sessions logged_in_idle anonymous_idle";
const TIMEOUT_KEYS: &str = "connect response_headers upstream_idle request_headers";
const NODE_KEYS: &str = "name url weight";
const DATA_KEYS: &str = "name url";

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
    /// Directory of the config file, for resolving relative paths.
    pub base_dir: PathBuf,
}

/// `[site]`
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// `path`: the wwwroot sub-path, `""` for a site at the host root, else `"/moodle"`
    /// (leading slash, no trailing slash).
    pub path: String,
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
    /// `request_headers`: how long a client may take to send its request head, default 10s.
    pub request_headers: Duration,
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

/// One problem in the config file. Displays as `<line>: <key>: <message>`,
/// without `<line>: ` when there is no line and without `<key>: ` when the
/// problem is the file itself (unreadable, not TOML).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending key, like `nodes[2].url` (0-based index) or
    /// `admin.token`; empty for problems with the file itself.
    pub key: String,
    /// 1-based line of the offending key or value, when there is one.
    pub line: Option<usize>,
    /// Lowercase reason, quoting the bad value.
    pub message: String,
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
            match (&self.1, e.line) {
                (Some(src), Some(_)) => write!(f, "{src}:{e}")?,
                (Some(src), None) => write!(f, "{src}: {e}")?,
                (None, _) => write!(f, "{e}")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
impl std::error::Error for ConfigErrors {}

fn error(key: impl Into<String>, line: Option<usize>, message: impl Into<String>) -> ConfigError {
    let (key, message) = (key.into(), message.into());
    ConfigError { key, line, message }
}

impl Config {
    /// Reads `path` and [`ADMIN_TOKEN_ENV`], then [`parse`](Config::parse)s.
    /// Errors carry `path` exactly as given, so `check` prints what the user typed.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let source = path.display().to_string();
        let text = fs::read_to_string(path).map_err(|e| {
            let message = format!("cannot read config file: {}", io_reason(&e));
            ConfigErrors::new(vec![error("", None, message)]).with_source(&source)
        })?;
        let base_dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let env_token = std::env::var(ADMIN_TOKEN_ENV).ok();
        Config::parse(&text, base_dir, env_token).map_err(|e| e.with_source(source))
    }

    /// Parses and validates `text`, collecting every problem. Pure except that it
    /// reads `admin.token_file` (relative to `base_dir`) when no token beats it.
    /// `env_token` is the value of [`ADMIN_TOKEN_ENV`]; blank counts as unset.
    pub fn parse(
        text: &str,
        base_dir: &Path,
        env_token: Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let doc = DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
        let env_token = env_token
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let mut c = Checker {
            text,
            base_dir,
            env_token,
            errors: Vec::new(),
        };
        match c.config(doc.get_ref()) {
            Some(config) if c.errors.is_empty() => Ok(config),
            // Whatever is missing recorded an error when it went missing.
            _ => Err(c.finish()),
        }
    }

    /// The resolved setup in plain words, for `moodle-gateway check`. Names
    /// where the admin token came from, never the token.
    pub fn describe(&self) -> String {
        let (s, t) = (&self.session, &self.timeouts);
        let admin = match &self.admin {
            Some(a) => format!("{} (token: set, from {})", a.listen, a.token_source),
            None => "none (no [admin] section)".to_owned(),
        };
        let proxies: Vec<String> = self.trusted_proxies.iter().map(|n| n.to_string()).collect();
        let proxies = match proxies.is_empty() {
            true => "none (X-Forwarded-For from clients is replaced)".to_owned(),
            false => format!("{} (their X-Forwarded-For is extended)", proxies.join(", ")),
        };
        let site = Some(self.site.path.as_str()).filter(|p| !p.is_empty());
        let site = site.unwrap_or("/ (Moodle at the host root)");
        let d = |d| humantime::format_duration(d).to_string();
        let (login, anon) = (d(s.logged_in_idle), d(s.anonymous_idle));
        let [conn, head, pool, req] = [
            t.connect,
            t.response_headers,
            t.upstream_idle,
            t.request_headers,
        ]
        .map(d);
        format!(
            "public listener: {}\nadmin listener: {admin}\ntrusted proxies: {proxies}\n\
             site path: {site}\nsession cookie: {} (path {})\nbalance: {}\n\
             sessions: at most {}; forgotten after {login} idle when logged in, {anon} when anonymous\n\
             timeouts: connect {conn}, response headers {head}, upstream idle {pool}, request headers {req}\n{}",
            self.listen, s.cookie, s.cookie_path, s.balance, s.max_sessions, self.describe_routing()
        )
    }

    /// The upstreams and which requests go where.
    fn describe_routing(&self) -> String {
        let (p, data) = (&self.site.path, &self.data);
        let mut out = "nodes:\n".to_owned();
        for n in &self.nodes {
            out += &format!("  {} http://{} weight {}\n", n.name, n.authority, n.weight);
        }
        out + &format!(
            "data server: {} http://{}\n\
             routing: SCORM files ({p}/pluginfile.php/*/mod_scorm/..., and the same files via \
             {p}/webservice/pluginfile.php, {p}/tokenpluginfile.php and legacy {p}/file.php) go to \
             the data server \"{}\"; every other request goes to a PHP node: the one its {} cookie \
             is bound to, otherwise the next by {}.\n",
            data.name, data.authority, data.name, self.session.cookie, self.session.balance
        )
    }
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

type Span = Range<usize>;
type Value<'a> = Spanned<DeValue<'a>>;

/// One TOML table being read: its dotted key (for messages) and where it starts.
/// `table` is `None` when the section is absent, so every key reads as unset.
struct Section<'a> {
    key: String,
    table: Option<&'a DeTable<'a>>,
    span: Option<Span>,
}

impl<'a> Section<'a> {
    fn key(&self, name: &str) -> String {
        match self.key.is_empty() {
            true => name.to_owned(),
            false => format!("{}.{name}", self.key),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value<'a>> {
        self.table?.get(name)
    }
}

/// An upstream while it is checked: a part is `None` when it was invalid (an
/// error is recorded), so uniqueness can still check the valid parts.
struct Upstream {
    key: String,
    name: Option<(String, Span)>,
    url: Option<(Authority, Span)>,
    weight: u32,
}

impl Upstream {
    fn build(self) -> Option<UpstreamConfig> {
        let ((name, _), (authority, _)) = (self.name?, self.url?);
        Some(UpstreamConfig {
            name,
            authority,
            weight: self.weight,
        })
    }
}

/// Walks the document and collects every problem instead of stopping at one;
/// each section reader falls back to the default so checking can go on.
struct Checker<'t> {
    text: &'t str,
    base_dir: &'t Path,
    env_token: Option<String>,
    errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn error(&mut self, key: impl Into<String>, span: Option<Span>, message: impl Into<String>) {
        let line = span.map(|s| line_of(self.text, s.start));
        self.errors.push(error(key, line, message));
    }

    fn finish(mut self) -> ConfigErrors {
        self.errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        ConfigErrors::new(self.errors)
    }

    fn config(&mut self, doc: &DeTable) -> Option<Config> {
        let root = Section {
            key: String::new(),
            table: Some(doc),
            span: None,
        };
        self.unknown_keys(&root, TOP_KEYS);
        let listen = self.address(&root, "listen");
        let listen = listen.map_or(DEFAULT_LISTEN, |v| v.0);
        let trusted_proxies = self.trusted_proxies(&root);
        let site = self.site(&root);
        let admin = self.admin(&root, listen);
        let session = self.session(&root, &site);
        let timeouts = self.timeouts(&root);
        let nodes = self.nodes(&root);
        let data = self.data(&root);
        self.unique(&nodes.iter().chain(&data).collect::<Vec<_>>());
        Some(Config {
            listen,
            trusted_proxies,
            site,
            admin,
            session,
            timeouts,
            nodes: nodes
                .into_iter()
                .map(Upstream::build)
                .collect::<Option<_>>()?,
            data: data.and_then(Upstream::build)?,
            base_dir: self.base_dir.to_path_buf(),
        })
    }

    fn unknown_keys(&mut self, s: &Section, allowed: &str) {
        for (k, _) in s.table.into_iter().flat_map(|t| t.iter()) {
            if !allowed.split(' ').any(|a| a == k.get_ref()) {
                let message = format!(
                    "unknown key (expected one of: {})",
                    allowed.replace(' ', ", ")
                );
                self.error(s.key(k.get_ref()), Some(k.span()), message);
            }
        }
    }

    /// Opens a sub-table (absent is fine: defaults apply) and rejects unknown keys.
    fn open<'a>(&mut self, key: String, v: Option<&'a Value<'a>>, allowed: &str) -> Section<'a> {
        let mut s = Section {
            key,
            table: None,
            span: None,
        };
        if let Some(v) = v {
            match v.get_ref() {
                DeValue::Table(t) => (s.table, s.span) = (Some(t), Some(v.span())),
                other => {
                    let message = format!("expected a table, found {}", other.type_str());
                    self.error(s.key.clone(), Some(v.span()), message);
                }
            }
        }
        self.unknown_keys(&s, allowed);
        s
    }

    fn typed<'a, T>(
        &mut self,
        s: &Section<'a>,
        name: &str,
        want: &str,
        convert: impl FnOnce(&'a DeValue<'a>) -> Option<T>,
    ) -> Option<(T, Span)> {
        let v = s.get(name)?;
        let converted = convert(v.get_ref());
        if converted.is_none() {
            let message = format!("expected {want}, found {}", v.get_ref().type_str());
            self.error(s.key(name), Some(v.span()), message);
        }
        converted.map(|t| (t, v.span()))
    }

    fn string<'a>(&mut self, s: &Section<'a>, name: &str) -> Option<(&'a str, Span)> {
        self.typed(s, name, "a string", |v| v.as_str())
    }

    fn parsed<'a, T>(
        &mut self,
        s: &Section<'a>,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Option<(T, Span)> {
        self.parsed_as(s, name, "a string", parse)
    }

    /// A string run through `parse`, whose `Err` is the message to report;
    /// `want` names the expected type for a value that is not a string at all.
    fn parsed_as<'a, T>(
        &mut self,
        s: &Section<'a>,
        name: &str,
        want: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Option<(T, Span)> {
        let (raw, span) = self.typed(s, name, want, |v| v.as_str())?;
        parse(raw)
            .map(|v| (v, span.clone()))
            .map_err(|message| self.error(s.key(name), Some(span), message))
            .ok()
    }

    fn address(&mut self, s: &Section, name: &str) -> Option<(SocketAddr, Span)> {
        self.parsed_as(s, name, "an \"ip:port\" string", parse_addr)
    }

    fn int_in(&mut self, s: &Section, name: &str, range: RangeInclusive<i64>) -> Option<i64> {
        let int = |v: &DeValue| {
            v.as_integer()
                .and_then(|i| i64::from_str_radix(i.as_str(), i.radix()).ok())
        };
        let (n, span) = self.typed(s, name, "an integer", int)?;
        let message = match (range.start(), range.end()) {
            _ if range.contains(&n) => return Some(n),
            (lo, &i64::MAX) => format!("must be at least {lo}, got {n}"),
            (lo, hi) => format!("must be between {lo} and {hi}, got {n}"),
        };
        self.error(s.key(name), Some(span), message);
        None
    }

    fn duration(&mut self, s: &Section, name: &str, default: Duration) -> Duration {
        let want = "a duration string (like \"90s\")";
        self.parsed_as(s, name, want, parse_duration)
            .map_or(default, |v| v.0)
    }

    fn require(&mut self, s: &Section, name: &str) {
        if s.table.is_some() && s.get(name).is_none() {
            self.error(s.key(name), s.span.clone(), "missing required key");
        }
    }

    fn trusted_proxies(&mut self, root: &Section) -> Vec<IpNet> {
        let items = self.typed(root, "trusted_proxies", "an array", |v| v.as_array());
        let mut nets = Vec::new();
        for (i, item) in items.iter().flat_map(|(a, _)| a.iter()).enumerate() {
            let parsed = match item.get_ref().as_str() {
                Some(raw) => parse_net(raw),
                None => Err(format!(
                    "expected a string, found {}",
                    item.get_ref().type_str()
                )),
            };
            match parsed {
                Ok(net) => nets.push(net),
                Err(m) => self.error(format!("trusted_proxies[{i}]"), Some(item.span()), m),
            }
        }
        nets
    }

    fn site(&mut self, root: &Section) -> SiteConfig {
        let s = self.open("site".into(), root.get("site"), SITE_KEYS);
        let path = self
            .parsed(&s, "path", site_path)
            .map_or_else(String::new, |v| v.0);
        SiteConfig { path }
    }

    fn admin(&mut self, root: &Section, public: SocketAddr) -> Option<AdminConfig> {
        let s = self.open("admin".into(), root.get("admin"), ADMIN_KEYS);
        s.table?;
        let (listen, span) = match self.address(&s, "listen") {
            Some((addr, span)) => (addr, Some(span)),
            None => (DEFAULT_ADMIN_LISTEN, s.span.clone()),
        };
        if listeners_clash(listen, public) {
            let message = format!("{listen} clashes with the public listen {public}");
            self.error(s.key("listen"), span, message);
        }
        let (token, token_source) = self.admin_token(&s)?;
        Some(AdminConfig {
            listen,
            token,
            token_source,
        })
    }

    /// Precedence: environment, then `token`, then `token_file`; the file is not
    /// read when something beats it. Giving both `token` and `token_file` is an
    /// error even then, as the file's owner cannot tell which one is live.
    fn admin_token(&mut self, s: &Section) -> Option<(String, TokenSource)> {
        let (inline, file) = (self.string(s, "token"), self.string(s, "token_file"));
        if let (Some(_), Some((_, span))) = (&inline, &file) {
            let message = "set either token or token_file, not both";
            self.error(s.key("token_file"), Some(span.clone()), message);
        }
        let (token, source, key, span) = match (self.env_token.clone(), inline, file) {
            (Some(t), _, _) => (t, TokenSource::Env, "token", None),
            (None, Some((t, span)), _) => (t.to_owned(), TokenSource::Token, "token", Some(span)),
            (None, None, Some((rel, span))) => {
                let t = self.token_file(s.key("token_file"), span.clone(), rel)?;
                (t, TokenSource::TokenFile, "token_file", Some(span))
            }
            (None, None, None) => {
                let message = format!("no admin token: set token, token_file or {ADMIN_TOKEN_ENV}");
                self.error(s.key("token"), s.span.clone(), message);
                return None;
            }
        };
        match token_problem(&token, source) {
            Some(message) => self.error(s.key(key), span, message),
            None => return Some((token, source)),
        }
        None
    }

    fn token_file(&mut self, key: String, span: Span, rel: &str) -> Option<String> {
        let path = self.base_dir.join(rel);
        let read = fs::read_to_string(&path);
        let reason = |e| format!("cannot read {}: {}", path.display(), io_reason(&e));
        read.map(|text| text.lines().next().unwrap_or("").trim().to_owned())
            .map_err(|e| self.error(key, Some(span), reason(e)))
            .ok()
    }

    fn session(&mut self, root: &Section, site: &SiteConfig) -> SessionConfig {
        let s = self.open("session".into(), root.get("session"), SESSION_KEYS);
        let cookie = self.parsed(&s, "cookie", cookie_name);
        let cookie_path = self.parsed(&s, "cookie_path", cookie_path);
        let balance = self.parsed(&s, "balance", parse_balance);
        let max = self.int_in(&s, "max_sessions", 1..=i64::MAX);
        SessionConfig {
            cookie: cookie.map_or_else(|| DEFAULT_COOKIE.to_owned(), |v| v.0),
            cookie_path: cookie_path.map_or_else(|| format!("{}/", site.path), |v| v.0),
            balance: balance.map_or(Balance::RoundRobin, |v| v.0),
            max_sessions: max.map_or(DEFAULT_MAX_SESSIONS, |n| n.try_into().unwrap_or(usize::MAX)),
            logged_in_idle: self.duration(&s, "logged_in_idle", DEFAULT_LOGGED_IN_IDLE),
            anonymous_idle: self.duration(&s, "anonymous_idle", DEFAULT_ANONYMOUS_IDLE),
        }
    }

    fn timeouts(&mut self, root: &Section) -> Timeouts {
        let s = self.open("timeouts".into(), root.get("timeouts"), TIMEOUT_KEYS);
        Timeouts {
            connect: self.duration(&s, "connect", DEFAULT_CONNECT),
            response_headers: self.duration(&s, "response_headers", DEFAULT_RESPONSE_HEADERS),
            upstream_idle: self.duration(&s, "upstream_idle", DEFAULT_UPSTREAM_IDLE),
            request_headers: self.duration(&s, "request_headers", DEFAULT_REQUEST_HEADERS),
        }
    }

    fn nodes(&mut self, root: &Section) -> Vec<Upstream> {
        let missing = "at least one [[nodes]] block is required";
        let Some(v) = root.get("nodes") else {
            self.error("nodes", None, missing);
            return Vec::new();
        };
        let items = self.typed(root, "nodes", "an array of tables", |v| v.as_array());
        if items.as_ref().is_some_and(|(a, _)| a.is_empty()) {
            self.error("nodes", Some(v.span()), missing);
        }
        let mut nodes = Vec::new();
        for (i, item) in items.iter().flat_map(|(a, _)| a.iter()).enumerate() {
            let s = self.open(format!("nodes[{i}]"), Some(item), NODE_KEYS);
            nodes.push(self.upstream(s, true));
        }
        nodes
    }

    fn data(&mut self, root: &Section) -> Option<Upstream> {
        if root.get("data").is_none() {
            let message = "missing required section [data] (the server for SCORM files)";
            self.error("data", None, message);
            return None;
        }
        let s = self.open("data".into(), root.get("data"), DATA_KEYS);
        Some(self.upstream(s, false))
    }

    fn upstream(&mut self, s: Section, weighted: bool) -> Upstream {
        self.require(&s, "name");
        self.require(&s, "url");
        let name = self.parsed(&s, "name", node_name);
        let url = self.parsed(&s, "url", upstream_authority);
        let weight = weighted.then(|| self.int_in(&s, "weight", 1..=MAX_WEIGHT.into()));
        let weight = weight.flatten().map_or(DEFAULT_WEIGHT, |w| w as u32);
        Upstream {
            key: s.key,
            name,
            url,
            weight,
        }
    }

    /// Names must be unique so logs and the admin API are unambiguous; addresses
    /// so that weights and session counts mean what they say.
    fn unique(&mut self, all: &[&Upstream]) {
        let names = all
            .iter()
            .map(|u| u.name.as_ref().map(|(n, s)| (n.clone(), s.clone())));
        self.no_duplicates(all, "name", "name", names.collect());
        let addrs = all
            .iter()
            .map(|u| u.url.as_ref().map(|(a, s)| (server_key(a), s.clone())));
        self.no_duplicates(all, "url", "address", addrs.collect());
    }

    /// `values[i]` is `all[i]`'s `field`, `None` where it was invalid.
    fn no_duplicates(
        &mut self,
        all: &[&Upstream],
        field: &str,
        what: &str,
        values: Vec<Option<(String, Span)>>,
    ) {
        for (i, (u, v)) in all.iter().zip(&values).enumerate() {
            let Some((value, span)) = v else { continue };
            let same = |e: &Option<(String, Span)>| e.as_ref().is_some_and(|(x, _)| x == value);
            if let Some(first) = values[..i].iter().position(same) {
                let message = format!(
                    "duplicate {what} {value:?} (already used by {})",
                    all[first].key
                );
                self.error(format!("{}.{field}", u.key), Some(span.clone()), message);
            }
        }
    }
}

/// `Err(message())` unless `ok`: keeps the value checks below flat.
fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

fn parse_addr(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|_| format!("{raw:?} is not an ip:port address (like \"0.0.0.0:8080\")"))
}

/// Longest accepted duration: far beyond any sensible timeout, and small enough
/// that `Instant::now() + d` can never overflow anywhere in the crate.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn parse_duration(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw)
        .map_err(|_| format!("{raw:?} is not a duration (like \"5s\", \"90s\" or \"8h30m\")"))?;
    ensure(!d.is_zero(), || format!("{raw:?} must be greater than 0"))?;
    ensure(d <= MAX_DURATION, || {
        format!("{raw:?} is longer than a year")
    })
    .map(|()| d)
}

/// A bare address means just that host; host bits under a CIDR mask are dropped.
fn parse_net(raw: &str) -> Result<IpNet, String> {
    let net = raw.parse::<IpNet>().map(|n| n.trunc());
    net.or_else(|_| raw.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{raw:?} is not an IP address or CIDR (like \"10.0.0.0/8\")"))
}

fn parse_balance(raw: &str) -> Result<Balance, String> {
    match raw {
        "round-robin" => Ok(Balance::RoundRobin),
        "least-sessions" => Ok(Balance::LeastSessions),
        _ => Err(format!(
            "{raw:?} is not \"round-robin\" or \"least-sessions\""
        )),
    }
}

/// `""` and `"/"` mean the host root; a trailing slash is dropped so that
/// `path + "/pluginfile.php"` is always right.
fn site_path(raw: &str) -> Result<String, String> {
    let path = raw.strip_suffix('/').unwrap_or(raw);
    let rooted = path.is_empty() || path.starts_with('/');
    ensure(rooted, || {
        format!("{raw:?} must start with \"/\" (like \"/moodle\")")
    })?;
    let bad_segment = path
        .split('/')
        .skip(1)
        .any(|s| matches!(s, "" | "." | ".."));
    ensure(!bad_segment, || {
        format!("{raw:?} has an empty, \".\" or \"..\" segment")
    })?;
    path_chars(raw).map(|()| path.to_owned())
}

fn cookie_path(raw: &str) -> Result<String, String> {
    ensure(raw.starts_with('/'), || {
        format!("{raw:?} must start with \"/\"")
    })?;
    path_chars(raw).map(|()| raw.to_owned())
}

/// Plain URL path characters only: no query, fragment, escapes or `;`, which
/// would change meaning inside a URL or a `Set-Cookie` attribute.
fn path_chars(raw: &str) -> Result<(), String> {
    let plain = raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/-._~!$&'()*+=:@".contains(c));
    ensure(plain, || {
        format!("{raw:?} contains a character not allowed in a URL path")
    })
}

/// An RFC 6265 cookie-name token, since the gateway matches it byte for byte.
fn cookie_name(raw: &str) -> Result<String, String> {
    let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
    let ok = !raw.is_empty() && raw.bytes().all(token);
    ensure(ok, || format!("{raw:?} is not a valid cookie name")).map(|()| raw.to_owned())
}

/// Names appear in logs, metrics labels and admin URLs: keep them plain.
fn node_name(raw: &str) -> Result<String, String> {
    ensure(!raw.is_empty(), || "must not be empty".to_owned())?;
    let plain = raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let why = || format!("{raw:?} may only contain letters, digits, \".\", \"_\" and \"-\"");
    ensure(plain, why).map(|()| raw.to_owned())
}

/// The gateway forwards the browser's path unchanged, so an upstream is only a
/// host and port: a path here would be silently ignored, hence an error.
fn upstream_authority(raw: &str) -> Result<Authority, String> {
    let scheme_end = raw.find("://").map_or(0, |i| i + 3);
    match raw[..scheme_end].to_ascii_lowercase().as_str() {
        "http://" => {}
        "https://" => return Err(format!("{raw:?}: TLS to upstreams is not supported yet")),
        _ => return Err(format!("{raw:?} is not an http:// URL")),
    }
    let rest = &raw[scheme_end..];
    let (auth, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let no_path = tail.is_empty() || tail == "/";
    ensure(no_path, || {
        format!("{raw:?} must be just http://host[:port], without a path")
    })?;
    ensure(!auth.contains('@'), || {
        format!("{raw:?} must not contain user info")
    })?;
    let bad = || format!("{raw:?} has no valid host[:port]");
    let authority: Authority = auth.parse().map_err(|_| bad())?;
    let port = authority.as_str().get(authority.host().len() + 1..);
    let bad_port = port.is_some_and(|p| !matches!(p.parse::<u16>(), Ok(1..)));
    ensure(!authority.host().is_empty() && !bad_port, bad).map(|()| authority)
}

/// Two URLs name the same server when host (case-insensitively) and port match.
fn server_key(a: &Authority) -> String {
    format!(
        "{}:{}",
        a.host().to_ascii_lowercase(),
        a.port_u16().unwrap_or(80)
    )
}

/// Port 0 asks the OS for a free port, so it never clashes (tests rely on it).
/// A wildcard address takes its port on every interface (`[::]` usually on IPv4
/// too), so it clashes with anything on the same port.
fn listeners_clash(a: SocketAddr, b: SocketAddr) -> bool {
    let wildcard = a.ip().is_unspecified() || b.ip().is_unspecified();
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || wildcard)
}

/// The token travels in an HTTP header and is compared byte for byte.
fn token_problem(token: &str, source: TokenSource) -> Option<String> {
    let from = match source {
        TokenSource::Env => format!("{ADMIN_TOKEN_ENV} "),
        TokenSource::Token => String::new(),
        TokenSource::TokenFile => "its first line ".to_owned(),
    };
    if token.is_empty() {
        return Some(format!("{from}must not be empty"));
    }
    let printable = token.bytes().all(|b| b.is_ascii_graphic());
    (!printable).then(|| format!("{from}must be printable ASCII without spaces"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "[[nodes]]\nname = \"web1\"\nurl = \"http://192.168.1.1\"\n";
    const DATA: &str = "[data]\nname = \"data\"\nurl = \"http://192.168.1.5\"\n";

    fn parse(text: &str, env: Option<&str>) -> Result<Config, ConfigErrors> {
        Config::parse(text, Path::new("/nonexistent"), env.map(String::from))
    }

    /// The errors for `text`, one `<line>: <key>: <message>` per line.
    fn errors(text: &str) -> String {
        let errors = parse(text, None).expect_err("config should be rejected").0;
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_minimal_config_gets_every_default() {
        let c = parse(&format!("{NODES}{DATA}"), None).unwrap();
        assert_eq!(
            c.describe(),
            r#"public listener: 0.0.0.0:8080
admin listener: none (no [admin] section)
trusted proxies: none (X-Forwarded-For from clients is replaced)
site path: / (Moodle at the host root)
session cookie: MoodleSession (path /)
balance: round-robin
sessions: at most 1000000; forgotten after 8h 30m idle when logged in, 1h when anonymous
timeouts: connect 5s, response headers 1m, upstream idle 4s, request headers 10s
nodes:
  web1 http://192.168.1.1 weight 1
data server: data http://192.168.1.5
routing: SCORM files (/pluginfile.php/*/mod_scorm/..., and the same files via /webservice/pluginfile.php, /tokenpluginfile.php and legacy /file.php) go to the data server "data"; every other request goes to a PHP node: the one its MoodleSession cookie is bound to, otherwise the next by round-robin.
"#
        );
        assert_eq!(c.session.logged_in_idle, DEFAULT_LOGGED_IN_IDLE);
        assert_eq!(c.base_dir, Path::new("/nonexistent"));
    }

    const FULL: &str = r#"listen = "[::]:80"
trusted_proxies = ["10.1.2.3/8", "192.0.2.7", "2001:db8::/32"]
[site]
path = "/moodle/"
[admin]
listen = "127.0.0.1:9999"
token = "s3cret-token"
[session]
cookie = "MoodleSessionprod"
balance = "least-sessions"
max_sessions = 5_000
logged_in_idle = "2h 30m"
anonymous_idle = "15m"
[timeouts]
connect = "1s"
response_headers = "2m"
upstream_idle = "30s"
request_headers = "3s"
[[nodes]]
name = "web1"
url = "http://192.168.1.1:8080/"
weight = 3
[[nodes]]
name = "web-2.b_c"
url = "HTTP://[fd00::2]"
[data]
name = "data"
url = "http://192.168.1.1:8081"
"#;

    #[test]
    fn a_full_config_reads_every_key() {
        let c = parse(FULL, None).unwrap();
        assert_eq!(
            c.describe(),
            r#"public listener: [::]:80
admin listener: 127.0.0.1:9999 (token: set, from admin.token)
trusted proxies: 10.0.0.0/8, 192.0.2.7/32, 2001:db8::/32 (their X-Forwarded-For is extended)
site path: /moodle
session cookie: MoodleSessionprod (path /moodle/)
balance: least-sessions
sessions: at most 5000; forgotten after 2h 30m idle when logged in, 15m when anonymous
timeouts: connect 1s, response headers 2m, upstream idle 30s, request headers 3s
nodes:
  web1 http://192.168.1.1:8080 weight 3
  web-2.b_c http://[fd00::2] weight 1
data server: data http://192.168.1.1:8081
routing: SCORM files (/moodle/pluginfile.php/*/mod_scorm/..., and the same files via /moodle/webservice/pluginfile.php, /moodle/tokenpluginfile.php and legacy /moodle/file.php) go to the data server "data"; every other request goes to a PHP node: the one its MoodleSessionprod cookie is bound to, otherwise the next by least-sessions.
"#
        );
        assert_eq!(c.admin.map(|a| a.token).as_deref(), Some("s3cret-token"));
    }

    /// Asserts the errors for `doc` followed by a valid `[[nodes]]` and `[data]`.
    fn check(doc: &str, want: &str) {
        assert_eq!(
            errors(&format!("{doc}\n{NODES}{DATA}")),
            want.trim(),
            "for {doc:?}"
        );
    }

    #[test]
    fn top_level_site_session_and_timeout_problems() {
        let doc = r#"listen = "localhost:80"
trusted_proxies = ["10.0.0.0/33", 7]
lisen = 1
[site]
path = "moodle"
[session]
cookie = "Moodle Session"
cookie_path = "moodle/"
balance = "random"
max_sessions = 0
logged_in_idle = "8"
anonymous_idle = 60
[timeouts]
connect = "0s"
read = "5s"
upstream_idle = "400 days""#;
        check(
            doc,
            r#"
1: listen: "localhost:80" is not an ip:port address (like "0.0.0.0:8080")
2: trusted_proxies[0]: "10.0.0.0/33" is not an IP address or CIDR (like "10.0.0.0/8")
2: trusted_proxies[1]: expected a string, found integer
3: lisen: unknown key (expected one of: listen, trusted_proxies, site, admin, session, timeouts, nodes, data)
5: site.path: "moodle" must start with "/" (like "/moodle")
7: session.cookie: "Moodle Session" is not a valid cookie name
8: session.cookie_path: "moodle/" must start with "/"
9: session.balance: "random" is not "round-robin" or "least-sessions"
10: session.max_sessions: must be at least 1, got 0
11: session.logged_in_idle: "8" is not a duration (like "5s", "90s" or "8h30m")
12: session.anonymous_idle: expected a duration string (like "90s"), found integer
14: timeouts.connect: "0s" must be greater than 0
15: timeouts.read: unknown key (expected one of: connect, response_headers, upstream_idle, request_headers)
16: timeouts.upstream_idle: "400 days" is longer than a year"#,
        );
        check("site = 3", "1: site: expected a table, found integer");
        check(
            "site.path = \"/a//b\"",
            r#"1: site.path: "/a//b" has an empty, "." or ".." segment"#,
        );
        let want = r#"1: site.path: "/mo odle" contains a character not allowed in a URL path"#;
        check("site.path = \"/mo odle\"", want);
        let want = "1: session.max_sessions: expected an integer, found string";
        check("session.max_sessions = \"many\"", want);
    }

    #[test]
    fn admin_problems() {
        let no_token = "no admin token: set token, token_file or MOODLE_GATEWAY_ADMIN_TOKEN";
        check("[admin]", &format!("1: admin.token: {no_token}"));
        check(
            "admin = \"yes\"",
            "1: admin: expected a table, found string",
        );
        let want = "1: admin.listen: 127.0.0.1:8080 clashes with the public listen 0.0.0.0:8080";
        check(
            "admin = { listen = \"127.0.0.1:8080\", token = \"t\" }",
            want,
        );
        let want = "1: admin.token_file: set either token or token_file, not both";
        check("admin = { token = \"t\", token_file = \"t.txt\" }", want);
        let want = "1: admin.token: must be printable ASCII without spaces";
        check("admin.token = \"two words\"", want);
        check("admin.token = \"\"", "1: admin.token: must not be empty");
        let want = "1: admin.token_file: cannot read /nonexistent/t.txt: no such file or directory";
        assert!(errors(&format!("admin.token_file = \"t.txt\"\n{NODES}{DATA}")).starts_with(want));
    }

    #[test]
    fn node_problems() {
        let doc = r#"[[nodes]]
name = "web 2"
url = "ftp://x"
weight = 1001
port = 80
[[nodes]]
name = ""
url = "https://x"
weight = "x"
[[nodes]]
weight = 2
[[nodes]]
name = "n3"
url = "http://x/moodle"
[[nodes]]
name = "n4"
url = "http://x?a=1"
[[nodes]]
name = "n5"
url = "http://u:p@x"
[[nodes]]
name = "n6"
url = "http://x:0"
[[nodes]]
name = "n7"
url = "http://:80"
[[nodes]]
name = "web1"
url = "http://192.168.1.1:80"
[[nodes]]
name = "n9"
url = "192.168.1.2""#;
        check(
            doc,
            r#"
2: nodes[0].name: "web 2" may only contain letters, digits, ".", "_" and "-"
3: nodes[0].url: "ftp://x" is not an http:// URL
4: nodes[0].weight: must be between 1 and 1000, got 1001
5: nodes[0].port: unknown key (expected one of: name, url, weight)
7: nodes[1].name: must not be empty
8: nodes[1].url: "https://x": TLS to upstreams is not supported yet
9: nodes[1].weight: expected an integer, found string
10: nodes[2].name: missing required key
10: nodes[2].url: missing required key
14: nodes[3].url: "http://x/moodle" must be just http://host[:port], without a path
17: nodes[4].url: "http://x?a=1" must be just http://host[:port], without a path
20: nodes[5].url: "http://u:p@x" must not contain user info
23: nodes[6].url: "http://x:0" has no valid host[:port]
26: nodes[7].url: "http://:80" has no valid host[:port]
32: nodes[9].url: "192.168.1.2" is not an http:// URL
34: nodes[10].name: duplicate name "web1" (already used by nodes[8])
35: nodes[10].url: duplicate address "192.168.1.1:80" (already used by nodes[8])"#,
        );
    }

    #[test]
    fn whole_file_problems() {
        let bad = |text: &str, want: &str| assert_eq!(errors(text), want, "for {text:?}");
        let no_nodes = "nodes: at least one [[nodes]] block is required";
        let no_data = "data: missing required section [data] (the server for SCORM files)";
        bad("", &format!("{no_nodes}\n{no_data}"));
        bad(NODES, no_data);
        bad(&format!("nodes = []\n{DATA}"), &format!("1: {no_nodes}"));
        let want = "1: nodes: expected an array of tables, found string";
        bad(&format!("nodes = \"web1\"\n{DATA}"), want);
        bad(
            &format!("nodes = [1]\n{DATA}"),
            "1: nodes[0]: expected a table, found integer",
        );
        let want = "7: data.weight: unknown key (expected one of: name, url)";
        bad(&format!("{NODES}{DATA}weight = 2"), want);
        let want = r#"5: data.name: duplicate name "web1" (already used by nodes[0])
6: data.url: duplicate address "192.168.1.1:80" (already used by nodes[0])"#;
        bad(
            &format!("{NODES}[data]\nname = \"web1\"\nurl = \"http://192.168.1.1/\""),
            want,
        );
        let want = "1: invalid TOML: string values must be quoted, expected literal string";
        bad("listen = \n", want);
        bad(
            &format!("{NODES}{DATA}name = \"again\""),
            "7: invalid TOML: duplicate key",
        );
    }

    #[test]
    fn all_problems_come_back_together_sorted_by_line() {
        let text = format!("[[nodes]]\nname = \"web1\"\nurl = \"ftp://h\"\n[session]\ncookies = \"x\"\n{NODES}{DATA}");
        let errors = parse(&text, None).unwrap_err().with_source("gw.toml");
        assert_eq!(
            errors.to_string(),
            "gw.toml:3: nodes[0].url: \"ftp://h\" is not an http:// URL\n\
             gw.toml:5: session.cookies: unknown key (expected one of: cookie, cookie_path, balance, max_sessions, logged_in_idle, anonymous_idle)\n\
             gw.toml:7: nodes[1].name: duplicate name \"web1\" (already used by nodes[0])"
        );
    }

    #[test]
    fn admin_token_precedence_is_env_then_token_then_file() {
        let dir =
            std::env::temp_dir().join(format!("moodle-gateway-config-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("admin.token"), "  from-file  \nsecond line\n").unwrap();
        let admin = |keys: &str, env: Option<&str>| {
            let text = format!("[admin]\n{keys}\n{NODES}{DATA}");
            let a = Config::parse(&text, &dir, env.map(String::from))
                .unwrap()
                .admin
                .unwrap();
            (a.token, a.token_source)
        };
        let env = ("from-env".to_owned(), TokenSource::Env);
        assert_eq!(admin("token = \"inline\"", Some(" from-env\n")), env);
        assert_eq!(admin("token_file = \"admin.token\"", Some("from-env")), env);
        assert_eq!(admin("token_file = \"not-read\"", Some("from-env")), env);
        assert_eq!(
            admin("token = \"inline\"", Some("  ")),
            ("inline".into(), TokenSource::Token)
        );
        let file = ("from-file".to_owned(), TokenSource::TokenFile);
        assert_eq!(admin("token_file = \"admin.token\"", None), file);
        let abs = format!(
            "token_file = {:?}",
            dir.join("admin.token").display().to_string()
        );
        assert_eq!(admin(&abs, None), file);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn describe_and_debug_never_show_the_token() {
        let c = parse(FULL, Some("env-secret")).unwrap();
        let want = "admin listener: 127.0.0.1:9999 (token: set, from MOODLE_GATEWAY_ADMIN_TOKEN)\n";
        assert!(c.describe().contains(want), "{}", c.describe());
        assert!(!c.describe().contains("env-secret") && !format!("{c:?}").contains("env-secret"));
    }

    #[test]
    fn the_shipped_config_parses() {
        let c = parse(include_str!("../config.toml"), Some("from-env")).unwrap();
        let names: Vec<_> = c.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["web1", "web2", "web3", "web4"]);
        assert_eq!(c.data.authority.as_str(), "192.168.1.5");
        assert_eq!(c.admin.unwrap().token_source, TokenSource::Env);
    }

    /// Pins the exact `check` stderr the integration test compares against:
    /// every `fixtures/config/X.toml` fails with exactly `X.expected`.
    #[test]
    fn broken_fixtures_report_exactly_their_expected_lines() {
        let mut checked = 0;
        for entry in fs::read_dir("fixtures/config").unwrap() {
            let path = format!(
                "fixtures/config/{}",
                entry.unwrap().file_name().to_string_lossy()
            );
            let Some(stem) = path.strip_suffix(".toml") else {
                continue;
            };
            let expected = fs::read_to_string(format!("{stem}.expected")).unwrap();
            let errors = Config::load(Path::new(&path)).expect_err(&path);
            assert_eq!(format!("{errors}\n"), expected, "for {path}");
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} fixtures");
        let missing = Config::load(Path::new("fixtures/config/nope.toml")).unwrap_err();
        let want = "fixtures/config/nope.toml: cannot read config file: no such file or directory";
        assert!(missing.to_string().starts_with(want), "{missing}");
    }
}
