//! `[store]`: where the affinity table, the deal and the admin state live. The
//! default, `memory`, is one gateway's own table and needs nothing; `redis` shares
//! them between every gateway of a site.
//!
//! With `redis`, every gateway must hash session ids under the same key (its table
//! is keyed by that hash), so the section carries a secret, found by the same rule
//! as the admin token and the route secret: the environment, then `secret`, then
//! `secret_file`.

use std::fmt;
use std::time::Duration;

use super::check::{Checker, Section, Span};
use super::secrets::{Found, SecretKeys};
use super::values::node_name;
use super::MIN_ROUTE_SECRET;

const STORE_KEYS: &str = "kind url sentinels master master_password master_password_file \
     sentinel_password sentinel_password_file prefix name secret secret_file timeout \
     connect_timeout";

/// The environment variable that overrides `store.secret`/`secret_file`.
pub const STORE_SECRET_ENV: &str = "MOODLE_GATEWAY_STORE_SECRET";
/// The environment variable that overrides `store.master_password`/`master_password_file`.
pub const MASTER_PASSWORD_ENV: &str = "MOODLE_GATEWAY_STORE_MASTER_PASSWORD";
/// The environment variable that overrides `store.sentinel_password`/`sentinel_password_file`.
pub const SENTINEL_PASSWORD_ENV: &str = "MOODLE_GATEWAY_STORE_SENTINEL_PASSWORD";
/// `store.prefix` default.
pub const DEFAULT_PREFIX: &str = "moodle-gateway:";
/// `store.timeout` default: the longest a student's request waits for Redis before
/// the gateway carries on alone. A lookup on the same LAN answers in well under a
/// millisecond; 50 ms is a hiccup a student never notices.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// `store.connect_timeout` default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

const SECRET: SecretKeys = SecretKeys {
    what: "store secret",
    inline: "secret",
    file: "secret_file",
    env: STORE_SECRET_ENV,
};

const MASTER_PASSWORD: SecretKeys = SecretKeys {
    what: "primary's password",
    inline: "master_password",
    file: "master_password_file",
    env: MASTER_PASSWORD_ENV,
};

const SENTINEL_PASSWORD: SecretKeys = SecretKeys {
    what: "Sentinels' password",
    inline: "sentinel_password",
    file: "sentinel_password_file",
    env: SENTINEL_PASSWORD_ENV,
};

/// `[store]`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreConfig {
    /// `kind = "memory"` (the default): this gateway's own table, deal and admin state.
    #[default]
    Memory,
    /// `kind = "redis"`: shared with every gateway on the same Redis and prefix
    /// (boxed: the memory store, the common case, carries nothing).
    Redis(Box<RedisConfig>),
}

/// `[store]` with `kind = "redis"`. `Debug` is written by hand: the URL may carry
/// a password, and the secret keys every session's hash.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// Where Redis is.
    pub target: RedisTarget,
    /// `prefix`: put before every key and the channel, so sites can share a Redis.
    pub prefix: String,
    /// `name`: this gateway, as the others and the admin view name it. Default: the
    /// host name.
    pub name: String,
    /// The table's key secret, the same on every gateway.
    pub secret: Vec<u8>,
    /// Where `secret` came from, named as `check` prints it.
    pub secret_source: &'static str,
    /// `timeout`: the longest a request waits for Redis. Default 50ms.
    pub timeout: Duration,
    /// `connect_timeout`: one connection attempt. Default 1s.
    pub connect_timeout: Duration,
}

/// How the gateway finds the Redis primary.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `url`: `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS.
    Url(String),
    /// `sentinels` and `master`: ask the Sentinels which server is the primary now,
    /// and again after every lost connection.
    Sentinel {
        /// `redis://host:port` of each Sentinel.
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the primary under.
        master: String,
        /// `master_password`: the primary's `requirepass` (the Sentinels only name
        /// the server, so no URL can carry it).
        master_password: Option<String>,
        /// `sentinel_password`: the Sentinels' own `requirepass`, for each Sentinel
        /// whose URL has no password of its own.
        sentinel_password: Option<String>,
    },
}

impl RedisTarget {
    /// The target without its passwords, for logs and `check`.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Url(url) => redact(url),
            RedisTarget::Sentinel {
                sentinels,
                master,
                master_password,
                sentinel_password,
            } => {
                let each: Vec<String> = sentinels.iter().map(|s| redact(s)).collect();
                let mut text = format!("master {master:?} via Sentinels {}", each.join(", "));
                let set = |p: &Option<String>| if p.is_some() { "set" } else { "none" };
                if master_password.is_some() || sentinel_password.is_some() {
                    text.push_str(&format!(
                        " (primary's password: {}, Sentinels' password: {})",
                        set(master_password),
                        set(sentinel_password)
                    ));
                }
                text
            }
        }
    }
}

/// `scheme://user:password@host` → `scheme://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or(auth, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("target", &self.target.redacted())
            .field("prefix", &self.prefix)
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .field("secret_source", &self.secret_source)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Checker<'_> {
    /// `[store]`: absent or `kind = "memory"` is the gateway's own table.
    pub(super) fn store(&mut self, root: &Section) -> StoreConfig {
        let s = self.open("store".into(), root.get("store"), STORE_KEYS);
        let kind = self.parsed(&s, "kind", |raw| match raw {
            "memory" | "redis" => Ok(raw),
            _ => Err(format!("unknown kind {raw:?}: use \"memory\" or \"redis\"")),
        });
        match kind {
            Some(("redis", _)) => self
                .redis(&s)
                .map_or(StoreConfig::Memory, |r| StoreConfig::Redis(Box::new(r))),
            Some(_) | None => {
                // Settings for a Redis that is not used are a half-finished change.
                for key in STORE_KEYS.split(' ').filter(|&k| k != "kind") {
                    if let Some(v) = s.get(key) {
                        let message =
                            "only used with kind = \"redis\": set kind, or remove this key";
                        self.error(s.key(key), Some(v.span()), message);
                    }
                }
                StoreConfig::Memory
            }
        }
    }

    fn redis(&mut self, s: &Section) -> Option<RedisConfig> {
        let target = self.redis_target(s);
        let prefix = self.parsed(s, "prefix", prefix);
        let name = match self.parsed(s, "name", node_name) {
            Some((name, _)) => Some(name),
            None if s.get("name").is_some() => None,
            None => self.host_name(s),
        };
        let env = self.env.store_secret.clone();
        let secret = self.secret(s, env, &SECRET).and_then(|r| {
            let from = match r.found {
                Found::Env => STORE_SECRET_ENV,
                Found::Inline => "store.secret",
                Found::File => "store.secret_file",
            };
            if r.value.len() < MIN_ROUTE_SECRET {
                let message = format!(
                    "must be at least {MIN_ROUTE_SECRET} bytes, got {} (generate one with: \
                     openssl rand -hex 32, and give every gateway the same)",
                    r.value.len()
                );
                self.error(s.key(r.key), r.span, message);
                return None;
            }
            Some((r.value.into_bytes(), from))
        });
        let timeout = self.bounded(s, "timeout", DEFAULT_TIMEOUT, ms(1)..=ms(10_000));
        let connect_timeout = self.bounded(
            s,
            "connect_timeout",
            DEFAULT_CONNECT_TIMEOUT,
            ms(10)..=ms(60_000),
        );
        let (secret, secret_source) = secret?;
        Some(RedisConfig {
            target: target?,
            prefix: prefix.map_or_else(|| DEFAULT_PREFIX.to_owned(), |v| v.0),
            name: name?,
            secret,
            secret_source,
            timeout,
            connect_timeout,
        })
    }

    /// Exactly one of `url`, or `sentinels` with `master`.
    fn redis_target(&mut self, s: &Section) -> Option<RedisTarget> {
        let url = self.parsed(s, "url", |raw| redis_url(raw, &["redis", "rediss"]));
        let sentinels = self.sentinels(s);
        let master = self
            .string(s, "master")
            .map(|(m, span)| (m.to_owned(), span));
        match (url, sentinels, master) {
            (Some((url, _)), None, None) => {
                self.no_passwords_beside_url(s);
                Some(RedisTarget::Url(url))
            }
            (None, Some((sentinels, _)), Some((master, _))) => {
                let env = self.env.store_master_password.clone();
                let master_password = self.password(s, env, &MASTER_PASSWORD)?;
                let env = self.env.store_sentinel_password.clone();
                let sentinel_password = self.password(s, env, &SENTINEL_PASSWORD)?;
                Some(RedisTarget::Sentinel {
                    sentinels,
                    master,
                    master_password,
                    sentinel_password,
                })
            }
            (Some(_), Some((_, span)), _) | (Some(_), None, Some((_, span))) => {
                let message = "set either url, or sentinels with master, not both";
                self.error(s.key("sentinels"), Some(span), message);
                None
            }
            (None, Some(_), None) => {
                let message = "missing: the name the Sentinels monitor the primary under";
                self.error(s.key("master"), s.span.clone(), message);
                None
            }
            (None, None, Some((_, span))) => {
                let message = "master needs sentinels: the addresses of the Sentinels";
                self.error(s.key("sentinels"), Some(span), message);
                None
            }
            (None, None, None) if s.get("url").is_none() && s.get("sentinels").is_none() => {
                let message = "kind = \"redis\" needs url (like \"redis://10.0.0.5:6379\"), \
                               or sentinels with master";
                self.error(s.key("url"), s.span.clone(), message);
                None
            }
            _ => None, // a bad url or sentinel list is reported already
        }
    }

    /// An optional password of the Sentinel setup: `Some(None)` when none of its
    /// three places is set, `None` when it is set badly (reported).
    fn password(
        &mut self,
        s: &Section,
        env: Option<String>,
        k: &SecretKeys,
    ) -> Option<Option<String>> {
        if env.is_none() && s.get(k.inline).is_none() && s.get(k.file).is_none() {
            return Some(None);
        }
        let r = self.secret(s, env, k)?;
        if r.value.is_empty() {
            let message = format!("is empty: remove it if the {} has none", k.what);
            self.error(s.key(r.key), r.span, message);
            return None;
        }
        Some(Some(r.value))
    }

    /// With `url` the password goes in the URL: a password key beside it would be
    /// silently unused.
    fn no_passwords_beside_url(&mut self, s: &Section) {
        let keys = ["master_password", "master_password_file"];
        let keys = keys
            .into_iter()
            .chain(["sentinel_password", "sentinel_password_file"]);
        for key in keys {
            if let Some(v) = s.get(key) {
                let message = "only used with sentinels: with url, the password goes in it \
                               (redis://:password@host:6379)";
                self.error(s.key(key), Some(v.span()), message);
            }
        }
    }

    fn sentinels(&mut self, s: &Section) -> Option<(Vec<String>, Span)> {
        let (items, span) = self.typed(s, "sentinels", "an array of URLs", |v| v.as_array())?;
        if items.is_empty() {
            let message = "must list at least one Sentinel, like [\"redis://10.0.0.5:26379\"]";
            self.error(s.key("sentinels"), Some(span), message);
            return None;
        }
        let mut urls = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let key = format!("{}[{i}]", s.key("sentinels"));
            match item
                .get_ref()
                .as_str()
                .map(|raw| redis_url(raw, &["redis"]))
            {
                Some(Ok(url)) => urls.push(url),
                Some(Err(message)) => self.error(key, Some(item.span()), message),
                None => self.error(key, Some(item.span()), "expected a URL string"),
            }
        }
        (urls.len() == items.len()).then_some((urls, span))
    }

    /// The host name, when it makes a valid gateway name; else an error asking for one.
    fn host_name(&mut self, s: &Section) -> Option<String> {
        let host = host_name();
        match host.as_deref().map(node_name) {
            Some(Ok(name)) => Some(name),
            _ => {
                let message = format!(
                    "the host name ({}) is not a usable gateway name: set name, using letters, \
                     digits, \".\", \"_\" and \"-\"",
                    host.as_deref().unwrap_or("unknown")
                );
                self.error(s.key("name"), s.span.clone(), message);
                None
            }
        }
    }

    pub(super) fn bounded(
        &mut self,
        s: &Section,
        name: &str,
        default: Duration,
        range: std::ops::RangeInclusive<Duration>,
    ) -> Duration {
        let Some((value, span)) = self.duration_at(s, name) else {
            return default;
        };
        if range.contains(&value) {
            return value;
        }
        let d = |d: &Duration| humantime::format_duration(*d).to_string();
        let message = format!(
            "must be between {} and {}",
            d(range.start()),
            d(range.end())
        );
        self.error(s.key(name), Some(span), message);
        default
    }
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A URL the Redis client accepts, with one of `schemes`.
fn redis_url(raw: &str, schemes: &[&str]) -> Result<String, String> {
    let scheme = raw.split_once("://").map(|(scheme, _)| scheme);
    let listed: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
    let listed = listed.join(" or ");
    if !scheme.is_some_and(|scheme| schemes.contains(&scheme)) {
        return Err(format!("{} must start with {listed}", redact(raw)));
    }
    match redis::parse_redis_url(raw) {
        Some(_) => Ok(raw.to_owned()),
        None => Err(format!("{} is not a valid URL", redact(raw))),
    }
}

/// Keys and the channel start with it; the resync's SCAN pattern too, so no glob
/// characters (`*`, `?`, `[`, `\`) that would change what it matches.
fn prefix(raw: &str) -> Result<String, String> {
    let plain = !raw.is_empty()
        && raw.len() <= 64
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":._-/".contains(&b));
    if plain {
        Ok(raw.to_owned())
    } else {
        Err("must be 1 to 64 letters, digits and \":\", \".\", \"_\", \"-\", \"/\"".to_owned())
    }
}

/// This machine's host name, as `uname -n` prints it.
fn host_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = text.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_log() {
        assert_eq!(
            redact("redis://:hunter2@10.0.0.5:6379/0"),
            "redis://:***@10.0.0.5:6379/0"
        );
        assert_eq!(
            redact("rediss://gw:pw@redis.example"),
            "rediss://gw:***@redis.example"
        );
        assert_eq!(redact("redis://10.0.0.5"), "redis://10.0.0.5");
        assert_eq!(redact("redis://u:p@ss@host"), "redis://u:***@host");
    }
}
