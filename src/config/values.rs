//! Parsers and validators for single config values (addresses, durations, sizes,
//! paths, host, cookie and node names, upstream URLs, tokens, probe statuses): pure functions
//! from a raw value to a typed one or the message to report. Separate from the tree walk so each
//! rule can be read, and changed, on its own.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery};
use ipnet::IpNet;

use super::{
    Balance, NodeState, SecretSource, SessionStore, StatusRange, TokenSource, Wwwroot,
    ADMIN_TOKEN_ENV, MAX_SLOW_START, MIN_ADMIN_TOKEN, MIN_ROUTE_SECRET, ROUTE_SECRET_ENV,
};

/// `Err(message())` unless `ok`: keeps the value checks below flat.
fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

pub(super) fn parse_addr(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|_| format!("{raw:?} is not an ip:port address (like \"0.0.0.0:8080\")"))
}

/// Longest accepted duration: far beyond any sensible timeout, and small enough
/// that `Instant::now() + d` can never overflow anywhere in the crate.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

pub(super) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw)
        .map_err(|_| format!("{raw:?} is not a duration (like \"5s\", \"90s\" or \"8h30m\")"))?;
    ensure(!d.is_zero(), || format!("{raw:?} must be greater than 0"))?;
    ensure(d <= MAX_DURATION, || {
        format!("{raw:?} is longer than a year")
    })
    .map(|()| d)
}

/// `session.slow_start`: a duration up to an hour, or `"0"` (`"0s"`) for none.
pub(super) fn parse_slow_start(raw: &str) -> Result<Duration, String> {
    if raw == "0" || humantime::parse_duration(raw).is_ok_and(|d| d.is_zero()) {
        return Ok(Duration::ZERO);
    }
    let d = parse_duration(raw).map_err(|e| format!("{e}, or \"0\" for no slow start"))?;
    ensure(d <= MAX_SLOW_START, || {
        format!("{raw:?} is longer than an hour: a longer ramp only keeps a warm node idle")
    })
    .map(|()| d)
}

/// A bare address means just that host; host bits under a CIDR mask are dropped.
pub(super) fn parse_net(raw: &str) -> Result<IpNet, String> {
    let net = raw.parse::<IpNet>().map(|n| n.trunc());
    net.or_else(|_| raw.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{raw:?} is not an IP address or CIDR (like \"10.0.0.0/8\")"))
}

pub(super) fn parse_balance(raw: &str) -> Result<Balance, String> {
    match raw {
        "round-robin" => Ok(Balance::RoundRobin),
        "least-sessions" => Ok(Balance::LeastSessions),
        _ => Err(format!(
            "{raw:?} is not \"round-robin\" or \"least-sessions\""
        )),
    }
}

pub(super) fn parse_store(raw: &str) -> Result<SessionStore, String> {
    match raw {
        "node-local" => Ok(SessionStore::NodeLocal),
        "shared" => Ok(SessionStore::Shared),
        _ => Err(format!("{raw:?} is not \"node-local\" or \"shared\"")),
    }
}

pub(super) fn parse_node_state(raw: &str) -> Result<NodeState, String> {
    match raw {
        "active" => Ok(NodeState::Active),
        "draining" => Ok(NodeState::Draining),
        "disabled" => Ok(NodeState::Disabled),
        _ => Err(format!(
            "{raw:?} is not \"active\", \"draining\" or \"disabled\""
        )),
    }
}

/// `""` and `"/"` mean the host root; a trailing slash is dropped so that
/// `path + "/pluginfile.php"` is always right.
pub(super) fn site_path(raw: &str) -> Result<String, String> {
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

/// `site.wwwroot`: `http://` or `https://`, a host with an optional port, an optional
/// path; nothing Moodle itself would refuse in `$CFG->wwwroot` (a query, a fragment,
/// credentials).
pub(super) fn wwwroot(raw: &str) -> Result<Wwwroot, String> {
    let example = "like \"https://moodle.example.edu\" or \"https://example.edu/moodle\"";
    let lower = raw.to_ascii_lowercase();
    let (https, rest) = match (
        lower.strip_prefix("https://"),
        lower.strip_prefix("http://"),
    ) {
        (Some(rest), _) => (true, &raw[raw.len() - rest.len()..]),
        (None, Some(rest)) => (false, &raw[raw.len() - rest.len()..]),
        _ => {
            return Err(format!(
                "{raw:?} must start with https:// or http:// ({example})"
            ))
        }
    };
    ensure(!rest.contains(['?', '#']), || {
        format!(
            "{raw:?} must not carry a query or fragment: copy $CFG->wwwroot as it is ({example})"
        )
    })?;
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    ensure(!authority.contains('@'), || {
        format!("{raw:?} must not carry a user name or password")
    })?;
    let host =
        site_host(authority).map_err(|_| format!("{raw:?} has no valid host name ({example})"))?;
    let port = match host.rsplit_once(':') {
        Some((_, p)) if !host.ends_with(']') => p.parse::<u16>().ok(),
        _ => None,
    };
    let path = site_path(path).map_err(|m| format!("the path of {raw:?}: {m}"))?;
    Ok(Wwwroot {
        url: raw.strip_suffix('/').unwrap_or(raw).to_owned(),
        https,
        host,
        port,
        path,
    })
}

pub(super) fn cookie_path(raw: &str) -> Result<String, String> {
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

/// The probe's request target, sent byte for byte: so only what a request line
/// may carry unescaped. A fragment is refused rather than dropped, as it never
/// reaches a server and `http` would silently cut it off.
pub(super) fn health_path(raw: &str) -> Result<String, String> {
    ensure(raw.starts_with('/'), || {
        format!("{raw:?} must start with \"/\" (like \"/admin/tool/heartbeat/\")")
    })?;
    ensure(!raw.contains('#'), || {
        format!("{raw:?} must not have a fragment (\"#...\"): it is never sent to a server")
    })?;
    ensure(raw.chars().all(|c| c.is_ascii_graphic()), || {
        format!("{raw:?} contains a space, control or non-ASCII character (percent-encode it)")
    })?;
    let valid = raw.parse::<PathAndQuery>().is_ok();
    ensure(valid, || format!("{raw:?} is not a valid path and query")).map(|()| raw.to_owned())
}

pub(super) fn status_code(n: i64) -> Result<StatusRange, String> {
    ensure((100..=599).contains(&n), || {
        format!("must be between 100 and 599, got {n}")
    })?;
    let code = n as u16;
    Ok(StatusRange {
        low: code,
        high: code,
    })
}

/// `"2xx"` is every status from 200 to 299.
pub(super) fn status_class(raw: &str) -> Result<StatusRange, String> {
    match raw.as_bytes() {
        [d @ b'1'..=b'5', b'x', b'x'] => {
            let low = u16::from(d - b'0') * 100;
            Ok(StatusRange {
                low,
                high: low + 99,
            })
        }
        _ => Err(format!(
            "{raw:?} is not a status class (\"1xx\" to \"5xx\")"
        )),
    }
}

/// `""` turns snapshots off. Anything else is kept as written, relative paths
/// included: they are resolved against the working directory when the file is
/// opened, as state belongs where the service runs, not beside its config.
pub(super) fn state_file(raw: &str) -> Result<Option<PathBuf>, String> {
    ensure(!raw.ends_with('/'), || {
        format!("{raw:?} names a directory: name the file, like \"{raw}moodle-gateway.state\"")
    })?;
    ensure(!raw.contains('\0'), || {
        format!("{raw:?} contains a NUL character")
    })?;
    Ok(Some(raw).filter(|r| !r.is_empty()).map(PathBuf::from))
}

/// An RFC 6265 cookie-name token, since the gateway matches it byte for byte.
pub(super) fn cookie_name(raw: &str) -> Result<String, String> {
    let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
    let ok = !raw.is_empty() && raw.bytes().all(token);
    ensure(ok, || format!("{raw:?} is not a valid cookie name")).map(|()| raw.to_owned())
}

/// Longest node name: the route cookie carries the name and refuses longer ones, so a longer
/// name would silently lose that node's route cookies.
const MAX_NODE_NAME: usize = 64;

/// Names appear in logs, metrics labels, admin URLs and route cookies: keep them plain and short.
pub(super) fn node_name(raw: &str) -> Result<String, String> {
    ensure(!raw.is_empty(), || "must not be empty".to_owned())?;
    let plain = raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let why = || format!("{raw:?} may only contain letters, digits, \".\", \"_\" and \"-\"");
    ensure(plain, why)?;
    // `/metrics` labels the gateway's own answers `upstream="gateway"`.
    ensure(raw != "gateway", || {
        "\"gateway\" is reserved: /metrics counts the gateway's own answers under it".to_owned()
    })?;
    let long = || {
        format!(
            "must be at most {MAX_NODE_NAME} characters, got {}",
            raw.len()
        )
    };
    ensure(raw.len() <= MAX_NODE_NAME, long).map(|()| raw.to_owned())
}

/// The gateway forwards the browser's path unchanged, so an upstream is only a
/// host and port: a path here would be silently ignored, hence an error.
pub(super) fn upstream_authority(raw: &str) -> Result<Authority, String> {
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
pub(super) fn server_key(a: &Authority) -> String {
    format!(
        "{}:{}",
        a.host().to_ascii_lowercase(),
        a.port_u16().unwrap_or(80)
    )
}

/// Port 0 asks the OS for a free port, so it never clashes (tests rely on it).
/// A wildcard address takes its port on every interface (`[::]` usually on IPv4
/// too), so it clashes with anything on the same port.
pub(super) fn listeners_clash(a: SocketAddr, b: SocketAddr) -> bool {
    let wildcard = a.ip().is_unspecified() || b.ip().is_unspecified();
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || wildcard)
}

/// The token travels in an HTTP header and is compared byte for byte.
pub(super) fn token_problem(token: &str, source: TokenSource) -> Option<String> {
    let from = match source {
        TokenSource::Env => format!("{ADMIN_TOKEN_ENV} "),
        TokenSource::Token => String::new(),
        TokenSource::TokenFile => "its first line ".to_owned(),
    };
    if token.is_empty() {
        return Some(format!("{from}must not be empty"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Some(format!("{from}must be printable ASCII without spaces"));
    }
    (token.len() < MIN_ADMIN_TOKEN).then(|| {
        format!(
            "{from}must be at least {MIN_ADMIN_TOKEN} characters, got {} (generate one with: openssl rand -hex 32)",
            token.len()
        )
    })
}

/// The route secret keys an HMAC: short ones can be brute-forced offline from
/// any one cookie a student holds.
pub(super) fn route_secret_problem(secret: &str, source: SecretSource) -> Option<String> {
    let from = match source {
        SecretSource::Env => format!("{ROUTE_SECRET_ENV} "),
        SecretSource::Secret => String::new(),
        SecretSource::SecretFile => "its first line ".to_owned(),
    };
    (secret.len() < MIN_ROUTE_SECRET).then(|| {
        format!(
            "{from}must be at least {MIN_ROUTE_SECRET} bytes, got {} (generate one with: openssl rand -hex 32)",
            secret.len()
        )
    })
}

/// Size units, matched ignoring case: a bare letter is binary like nginx's
/// `8k`, `KB`/`MB`/... are decimal as disks are sold, `KiB`/`MiB`/... binary.
const SIZE_UNITS: [(&str, u64); 13] = [
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("kb", 1_000),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("mb", 1_000_000),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("gb", 1_000_000_000),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("tb", 1_000_000_000_000),
];

/// A byte size written as a string: digits, then an optional unit (`"512"`,
/// `"32KiB"`, `"8k"`, `"100MB"`, `"2 GiB"`). Whole numbers only: a fraction of
/// a unit is rarely a whole number of bytes.
pub(super) fn parse_size(raw: &str) -> Result<u64, String> {
    let bad = || format!("{raw:?} is not a size (like \"32KiB\", \"100MiB\" or 4096)");
    let trimmed = raw.trim();
    let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = trimmed.split_at(digits);
    let unit = unit.trim_start().to_ascii_lowercase();
    let scale = match unit.as_str() {
        "" => 1,
        unit => {
            SIZE_UNITS
                .iter()
                .find(|(u, _)| *u == unit)
                .ok_or_else(bad)?
                .1
        }
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("{raw:?} is too large"))
}

/// `n` bytes as a person would write them: in the largest binary unit that
/// holds it exactly (`32KiB`), else decimal (`100MB`), else bytes (`1000B`
/// is `1KB`, `1500B` stays bytes).
pub(super) fn format_size(n: u64) -> String {
    let units = [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ];
    let exact = units
        .iter()
        .find(|(_, scale)| n != 0 && n.is_multiple_of(*scale));
    exact.map_or_else(
        || format!("{n}B"),
        |(unit, scale)| format!("{}{unit}", n / scale),
    )
}

/// A `Host` header value students may send: a DNS name, an IPv4 address or a
/// bracketed IPv6 address, with an optional port 1..65535. Lowercased, as host
/// names compare ignoring case.
pub(super) fn site_host(raw: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "{raw:?} is not a host name (like \"moodle.example.edu\" or \"moodle.example.edu:8443\")"
        )
    };
    let lower = raw.to_ascii_lowercase();
    let (host, port) = match lower.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']').ok_or_else(bad)?;
            ensure(v6.parse::<Ipv6Addr>().is_ok(), bad)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(bad)?),
            };
            (v6, port)
        }
        None => match lower.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (lower.as_str(), None),
        },
    };
    let port_ok = port.is_none_or(|p| {
        p.bytes().all(|b| b.is_ascii_digit()) && matches!(p.parse::<u16>(), Ok(1..))
    });
    let name_ok = lower.starts_with('[') || dns_name(host);
    ensure(port_ok && name_ok, bad).map(|()| lower.clone())
}

/// RFC 1123 labels: letters, digits and inner hyphens, 1..63 each, 253 in all.
fn dns_name(host: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.len() <= 253 && host.split('.').all(label)
}
