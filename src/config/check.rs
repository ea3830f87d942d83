//! The tree walk behind [`Config::parse`](super::Config::parse): reads each
//! section of the spanned TOML document, applies defaults, and collects every
//! problem with its dotted key and line instead of stopping at the first. Kept
//! apart from the public types so `mod.rs` reads as the API and this as the rules.

use std::fs;
use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::path::Path;
use std::time::Duration;

use http::uri::Authority;
use ipnet::IpNet;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::values::{
    cookie_name, cookie_path, listeners_clash, node_name, parse_addr, parse_balance,
    parse_duration, parse_net, server_key, site_path, token_problem, upstream_authority,
};
use super::{
    error, io_reason, line_of, AdminConfig, Balance, Config, ConfigError, ConfigErrors,
    HealthConfig, NodeState, SessionConfig, SessionStore, SiteConfig, StateConfig, StatusRange,
    Timeouts, TokenSource, UpstreamConfig, ADMIN_TOKEN_ENV, DEFAULT_ADMIN_LISTEN,
    DEFAULT_ANONYMOUS_IDLE, DEFAULT_BODY_IDLE, DEFAULT_CONNECT, DEFAULT_COOKIE,
    DEFAULT_FAILOVER_HOLD, DEFAULT_FALL, DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_PATH,
    DEFAULT_HEALTH_TIMEOUT, DEFAULT_LISTEN, DEFAULT_LOGGED_IN_IDLE, DEFAULT_MAX_SESSIONS,
    DEFAULT_REQUEST_HEADERS, DEFAULT_RESPONSE_HEADERS, DEFAULT_RISE, DEFAULT_SAVE_EVERY,
    DEFAULT_SHUTDOWN, DEFAULT_STATE_FILE, DEFAULT_UPSTREAM_IDLE, DEFAULT_WEIGHT, MAX_NODES,
    MAX_WEIGHT,
};

// The keys each table accepts, space-separated; anything else is reported.
const TOP_KEYS: &str = "listen trusted_proxies site admin session timeouts nodes data";
const SITE_KEYS: &str = "path";
const ADMIN_KEYS: &str = "listen token token_file";
const SESSION_KEYS: &str = "cookie cookie_path balance max_sessions logged_in_idle anonymous_idle";
const TIMEOUT_KEYS: &str = "connect response_headers upstream_idle request_headers body_idle";
const NODE_KEYS: &str = "name url weight";
const DATA_KEYS: &str = "name url";

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
            state: NodeState::Active,
        })
    }
}

/// Walks the document and collects every problem instead of stopping at one;
/// each section reader falls back to the default so checking can go on.
pub(super) struct Checker<'t> {
    pub(super) text: &'t str,
    pub(super) base_dir: &'t Path,
    pub(super) env_token: Option<String>,
    pub(super) errors: Vec<ConfigError>,
}

impl Checker<'_> {
    fn error(&mut self, key: impl Into<String>, span: Option<Span>, message: impl Into<String>) {
        let line = span.map(|s| line_of(self.text, s.start));
        self.errors.push(error(key, line, message));
    }

    pub(super) fn finish(mut self) -> ConfigErrors {
        self.errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        ConfigErrors::new(self.errors)
    }

    pub(super) fn config(&mut self, doc: &DeTable) -> Option<Config> {
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
            health: HealthConfig {
                path: DEFAULT_HEALTH_PATH.to_owned(),
                interval: DEFAULT_HEALTH_INTERVAL,
                timeout: DEFAULT_HEALTH_TIMEOUT,
                rise: DEFAULT_RISE,
                fall: DEFAULT_FALL,
                statuses: vec![StatusRange {
                    low: 200,
                    high: 200,
                }],
            },
            state: StateConfig {
                file: Some(DEFAULT_STATE_FILE.into()),
                save_every: DEFAULT_SAVE_EVERY,
            },
            route_cookie: None,
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
            store: SessionStore::NodeLocal,
            failover_hold: DEFAULT_FAILOVER_HOLD,
        }
    }

    fn timeouts(&mut self, root: &Section) -> Timeouts {
        let s = self.open("timeouts".into(), root.get("timeouts"), TIMEOUT_KEYS);
        Timeouts {
            connect: self.duration(&s, "connect", DEFAULT_CONNECT),
            response_headers: self.duration(&s, "response_headers", DEFAULT_RESPONSE_HEADERS),
            upstream_idle: self.duration(&s, "upstream_idle", DEFAULT_UPSTREAM_IDLE),
            request_headers: self.duration(&s, "request_headers", DEFAULT_REQUEST_HEADERS),
            body_idle: self.duration(&s, "body_idle", DEFAULT_BODY_IDLE),
            shutdown: DEFAULT_SHUTDOWN,
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
        if items.as_ref().is_some_and(|(a, _)| a.len() > MAX_NODES) {
            let message = format!("at most {MAX_NODES} nodes (the table stores a node as 16 bits)");
            self.error("nodes", Some(v.span()), message);
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
