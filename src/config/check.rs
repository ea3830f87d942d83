//! The tree walk behind [`Config::parse`](super::Config::parse): reads each
//! section of the spanned TOML document, applies defaults, and collects every
//! problem with its dotted key and line instead of stopping at the first. Kept
//! apart from the public types so `mod.rs` reads as the API and this as the rules.
//! This file holds the walk's primitives and the plain sections; the sections
//! with rules of their own extend [`Checker`] in `upstreams`, `secrets`,
//! `operations` and `edge`.

use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::edge::Listeners;
use super::lines::KeyLines;
use super::values::{
    cookie_name, cookie_path, parse_addr, parse_balance, parse_duration, parse_net,
    parse_slow_start, parse_store, site_path, wwwroot,
};
use super::{
    error, line_of, syntax_error, Balance, Config, ConfigEnv, ConfigError, ConfigErrors,
    SessionConfig, SessionStore, SiteConfig, Timeouts, DEFAULT_ANONYMOUS_IDLE, DEFAULT_BODY_IDLE,
    DEFAULT_CONNECT, DEFAULT_COOKIE, DEFAULT_FAILOVER_HOLD, DEFAULT_KEEP_ALIVE, DEFAULT_LISTEN,
    DEFAULT_LOGGED_IN_IDLE, DEFAULT_MAX_SESSIONS, DEFAULT_REQUEST_HEADERS,
    DEFAULT_RESPONSE_HEADERS, DEFAULT_SESSIONTIMEOUT, DEFAULT_SHUTDOWN, DEFAULT_SLOW_START,
    DEFAULT_TUNNEL_IDLE, DEFAULT_UPLOAD, DEFAULT_UPLOAD_MIN_RATE, DEFAULT_UPLOAD_RATE_WINDOW,
    DEFAULT_UPSTREAM_IDLE, KEEP_ALIVE_RANGE,
};

/// What `session.slow_start` must be, for a value that is not a string.
const SLOW_START_WANT: &str = "a duration string (like \"60s\"), or \"0\" for none";

// The keys each table accepts, space-separated; anything else is reported. The
// tables of other files' sections keep their lists next to their readers.
const TOP_KEYS: &str = "listen trusted_proxies site admin session timeouts health state \
                        route_cookie limits tls acme offload access_log store surge cache compression \
                        rate_limits nodes data";
const SITE_KEYS: &str = "wwwroot path hosts";
const SESSION_KEYS: &str =
    "cookie cookie_path balance max_sessions logged_in_idle anonymous_idle sessiontimeout store failover_hold slow_start";
const TIMEOUT_KEYS: &str = "connect response_headers upstream_idle request_headers keep_alive \
                            body_idle shutdown tunnel_idle upload_min_rate upload_rate_window upload";

pub(super) type Span = Range<usize>;
pub(super) type Value<'a> = Spanned<DeValue<'a>>;

/// One TOML table being read: its dotted key (for messages) and where it starts.
/// `table` is `None` when the section is absent, so every key reads as unset.
pub(super) struct Section<'a> {
    pub(super) key: String,
    pub(super) table: Option<&'a DeTable<'a>>,
    pub(super) span: Option<Span>,
}

impl<'a> Section<'a> {
    pub(super) fn key(&self, name: &str) -> String {
        if self.key.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.key)
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<&'a Value<'a>> {
        self.table?.get(name)
    }
}

/// Walks the document and collects every problem instead of stopping at one;
/// each section reader falls back to the default so checking can go on.
pub(super) struct Checker<'t> {
    pub(super) text: &'t str,
    pub(super) base_dir: &'t Path,
    /// Already normalised: blank values are `None`.
    pub(super) env: ConfigEnv,
    pub(super) errors: Vec<ConfigError>,
}

impl<'t> Checker<'t> {
    /// The document of `text` and a checker for it; a TOML syntax error leaves no
    /// tree to walk, so it is the only problem reported.
    pub(super) fn start(
        text: &'t str,
        base_dir: &'t Path,
        env: ConfigEnv,
    ) -> Result<(Spanned<DeTable<'t>>, Checker<'t>), ConfigErrors> {
        let doc = DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
        let checker = Checker {
            text,
            base_dir,
            env: env.normalised(),
            errors: Vec::new(),
        };
        Ok((doc, checker))
    }

    pub(super) fn error(
        &mut self,
        key: impl Into<String>,
        span: Option<Span>,
        message: impl Into<String>,
    ) {
        let line = span.map(|s| line_of(self.text, s.start));
        self.errors.push(error(key, line, message));
    }

    pub(super) fn finish(self) -> ConfigErrors {
        ConfigErrors::sorted(self.errors)
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
        let listeners = Listeners {
            public: listen,
            admin: admin.0,
        };
        let admin = admin.1;
        let session = self.session(&root, &site);
        let timeouts = self.timeouts(&root);
        let health = self.health(&root, &site);
        let state = self.state(&root);
        let route_cookie = self.route_cookie(&root, &session.cookie);
        let limits = self.limits(&root);
        let acme = self.acme(&root);
        let tls = self.tls(&root, &listeners, acme.as_ref());
        let offload = self.offload(&root);
        let access_log = self.access_log(&root);
        let store = self.store(&root);
        let surge = self.surge(&root, &session.cookie);
        let cache = self.cache(&root);
        let compression = self.compression(&root);
        let rate_limits = self.rate_limits(&root);
        let upstreams = self.upstreams(&root);
        let (nodes, data) = upstreams?;
        Some(Config {
            listen,
            trusted_proxies,
            site,
            admin,
            session,
            timeouts,
            nodes,
            data,
            health,
            state,
            route_cookie,
            limits,
            tls,
            acme,
            offload,
            access_log,
            store,
            surge,
            cache,
            compression,
            rate_limits,
            base_dir: self.base_dir.to_path_buf(),
            lines: KeyLines::of(doc, self.text),
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
    pub(super) fn open<'a>(
        &mut self,
        key: String,
        v: Option<&'a Value<'a>>,
        allowed: &str,
    ) -> Section<'a> {
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

    pub(super) fn typed<'a, T>(
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

    pub(super) fn string<'a>(&mut self, s: &Section<'a>, name: &str) -> Option<(&'a str, Span)> {
        self.typed(s, name, "a string", |v| v.as_str())
    }

    pub(super) fn parsed<'a, T>(
        &mut self,
        s: &Section<'a>,
        name: &str,
        parse: impl FnOnce(&'a str) -> Result<T, String>,
    ) -> Option<(T, Span)> {
        self.parsed_as(s, name, "a string", parse)
    }

    /// A string run through `parse`, whose `Err` is the message to report;
    /// `want` names the expected type for a value that is not a string at all.
    pub(super) fn parsed_as<'a, T>(
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

    pub(super) fn address(&mut self, s: &Section, name: &str) -> Option<(SocketAddr, Span)> {
        self.parsed_as(s, name, "an \"ip:port\" string", parse_addr)
    }

    pub(super) fn int_in(
        &mut self,
        s: &Section,
        name: &str,
        range: RangeInclusive<i64>,
    ) -> Option<i64> {
        let (n, span) = self.typed(s, name, "an integer", integer)?;
        let message = match (range.start(), range.end()) {
            _ if range.contains(&n) => return Some(n),
            (lo, &i64::MAX) => format!("must be at least {lo}, got {n}"),
            (lo, hi) => format!("must be between {lo} and {hi}, got {n}"),
        };
        self.error(s.key(name), Some(span), message);
        None
    }

    pub(super) fn duration(&mut self, s: &Section, name: &str, default: Duration) -> Duration {
        self.duration_at(s, name).map_or(default, |v| v.0)
    }

    /// A duration with its span, `None` when unset or invalid (recorded).
    pub(super) fn duration_at(&mut self, s: &Section, name: &str) -> Option<(Duration, Span)> {
        let want = "a duration string (like \"90s\")";
        self.parsed_as(s, name, want, parse_duration)
    }

    pub(super) fn require(&mut self, s: &Section, name: &str) {
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

    /// `wwwroot`, or the older `path` and `hosts`. With `wwwroot` the path comes
    /// from it (a second `path` could only disagree, so it is an error) and its host
    /// leads `hosts`, which then lists only aliases.
    fn site(&mut self, root: &Section) -> SiteConfig {
        let s = self.open("site".into(), root.get("site"), SITE_KEYS);
        let wwwroot = self.parsed(&s, "wwwroot", wwwroot).map(|v| v.0);
        let path = self.parsed(&s, "path", site_path);
        let mut hosts = self.site_hosts(&s);
        let Some(wwwroot) = wwwroot else {
            let path = path.map_or_else(String::new, |v| v.0);
            return SiteConfig {
                wwwroot: None,
                path,
                hosts,
            };
        };
        if let Some((_, span)) = path {
            let message = format!(
                "the path comes from site.wwwroot ({:?}): remove site.path",
                wwwroot.path
            );
            self.error(s.key("path"), Some(span), message);
        }
        hosts.retain(|h| *h != wwwroot.host);
        hosts.insert(0, wwwroot.host.clone());
        SiteConfig {
            path: wwwroot.path.clone(),
            wwwroot: Some(wwwroot),
            hosts,
        }
    }

    fn session(&mut self, root: &Section, site: &SiteConfig) -> SessionConfig {
        let s = self.open("session".into(), root.get("session"), SESSION_KEYS);
        let cookie = self.parsed(&s, "cookie", cookie_name);
        let cookie_path = self.parsed(&s, "cookie_path", cookie_path);
        let balance = self.parsed(&s, "balance", parse_balance);
        let max = self.int_in(&s, "max_sessions", 1..=i64::MAX);
        let store = self.parsed(&s, "store", parse_store);
        SessionConfig {
            cookie: cookie.map_or_else(|| DEFAULT_COOKIE.to_owned(), |v| v.0),
            cookie_path: cookie_path.map_or_else(|| format!("{}/", site.path), |v| v.0),
            balance: balance.map_or(Balance::RoundRobin, |v| v.0),
            max_sessions: max.map_or(DEFAULT_MAX_SESSIONS, |n| n.try_into().unwrap_or(usize::MAX)),
            logged_in_idle: self.duration(&s, "logged_in_idle", DEFAULT_LOGGED_IN_IDLE),
            anonymous_idle: self.duration(&s, "anonymous_idle", DEFAULT_ANONYMOUS_IDLE),
            sessiontimeout: self.duration(&s, "sessiontimeout", DEFAULT_SESSIONTIMEOUT),
            store: store.map_or(SessionStore::NodeLocal, |v| v.0),
            failover_hold: self.duration(&s, "failover_hold", DEFAULT_FAILOVER_HOLD),
            slow_start: self
                .parsed_as(&s, "slow_start", SLOW_START_WANT, parse_slow_start)
                .map_or(DEFAULT_SLOW_START, |v| v.0),
        }
    }

    fn timeouts(&mut self, root: &Section) -> Timeouts {
        let s = self.open("timeouts".into(), root.get("timeouts"), TIMEOUT_KEYS);
        Timeouts {
            connect: self.duration(&s, "connect", DEFAULT_CONNECT),
            response_headers: self.duration(&s, "response_headers", DEFAULT_RESPONSE_HEADERS),
            upstream_idle: self.duration(&s, "upstream_idle", DEFAULT_UPSTREAM_IDLE),
            request_headers: self.duration(&s, "request_headers", DEFAULT_REQUEST_HEADERS),
            keep_alive: self.bounded(&s, "keep_alive", DEFAULT_KEEP_ALIVE, KEEP_ALIVE_RANGE),
            body_idle: self.duration(&s, "body_idle", DEFAULT_BODY_IDLE),
            shutdown: self.duration(&s, "shutdown", DEFAULT_SHUTDOWN),
            tunnel_idle: self.duration(&s, "tunnel_idle", DEFAULT_TUNNEL_IDLE),
            upload_min_rate: self
                .size_in(&s, "upload_min_rate", 0..=1 << 30)
                .map_or(DEFAULT_UPLOAD_MIN_RATE, |v| v.0),
            upload_rate_window: self.duration(&s, "upload_rate_window", DEFAULT_UPLOAD_RATE_WINDOW),
            upload: self.duration(&s, "upload", DEFAULT_UPLOAD),
        }
    }
}

/// A TOML integer as `i64`; `None` for any other type or one out of range.
pub(super) fn integer(v: &DeValue) -> Option<i64> {
    v.as_integer()
        .and_then(|i| i64::from_str_radix(i.as_str(), i.radix()).ok())
}
