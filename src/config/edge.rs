//! The edge-hardening settings: `[site] hosts`, `[limits]` and `[tls]`, what
//! the public listener accepts before a request reaches a node. Apart from
//! `check` because they have rules of their own: sizes with units, limits
//! checked against each other, and certificate files read from disk.

use std::fs;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use toml::de::DeValue;

use super::acme::AcmeConfig;
use super::check::{integer, Checker, Section, Span};
use super::values::{format_size, listeners_clash, parse_size, site_host};
use super::{
    io_reason, Hsts, LimitsConfig, TlsConfig, DEFAULT_BUFFER_BODY_BYTES, DEFAULT_HTTP2_MAX_STREAMS,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADERS, DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_URI_BYTES, DEFAULT_SPOOL_BODY_BYTES, DEFAULT_SPOOL_DIR,
    DEFAULT_SPOOL_MAX_BYTES,
};

const LIMITS_KEYS: &str = "max_header_bytes max_headers max_uri_bytes max_body_bytes \
                           buffer_body_bytes spool_body_bytes spool_max_bytes spool_dir \
                           max_connections max_in_flight http2_max_streams";
const TLS_KEYS: &str = "cert key redirect_listen hsts_max_age hsts_include_subdomains";

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const TIB: u64 = 1 << 40;

/// The listeners a redirect listener must keep clear of.
pub(super) struct Listeners {
    pub(super) public: SocketAddr,
    pub(super) admin: Option<SocketAddr>,
}

impl Checker<'_> {
    /// `[site] hosts`: each item a host (lowercased), no repeats; empty means any.
    pub(super) fn site_hosts(&mut self, s: &Section) -> Vec<String> {
        let items = self.typed(s, "hosts", "an array", |v| v.as_array());
        let mut hosts: Vec<String> = Vec::new();
        for (i, item) in items.iter().flat_map(|(a, _)| a.iter()).enumerate() {
            let key = format!("{}[{i}]", s.key("hosts"));
            let host = match item.get_ref() {
                DeValue::String(raw) => site_host(raw),
                v => Err(format!("expected a string, found {}", v.type_str())),
            };
            let host = host.and_then(|h| match hosts.iter().position(|x| *x == h) {
                Some(first) => Err(format!(
                    "duplicate host {h:?} (already listed as {}[{first}])",
                    s.key("hosts")
                )),
                None => Ok(h),
            });
            match host {
                Ok(h) => hosts.push(h),
                Err(m) => self.error(key, Some(item.span()), m),
            }
        }
        hosts
    }

    pub(super) fn limits(&mut self, root: &Section) -> LimitsConfig {
        let s = self.open("limits".into(), root.get("limits"), LIMITS_KEYS);
        let (max_header_bytes, max_uri_bytes) = self.head_sizes(&s);
        let count = |c: &mut Self, name, max: i64, default: usize| {
            c.int_in(&s, name, 1..=max).map_or(default, |n| n as usize)
        };
        let body = self.size_in(&s, "max_body_bytes", 1..=TIB);
        // Held in memory per slow client: 16 MiB is already 160 GB at
        // 10,000 connections. 0 streams every body as it arrives.
        let buffer = self
            .size_in(&s, "buffer_body_bytes", 0..=16 * MIB)
            .map_or(DEFAULT_BUFFER_BODY_BYTES, |v| v.0);
        let (spool_body_bytes, spool_max_bytes) = self.spool_sizes(&s, buffer);
        let spool_dir = self.string(&s, "spool_dir").map(|v| v.0);
        if spool_dir == Some("") {
            let span = s.get("spool_dir").map(|v| v.span());
            let why = "must name a directory (spool_body_bytes = 0 turns the spool off)";
            self.error(s.key("spool_dir"), span, why.to_owned());
        }
        LimitsConfig {
            max_header_bytes,
            max_headers: count(self, "max_headers", 1000, DEFAULT_MAX_HEADERS),
            max_uri_bytes,
            max_body_bytes: body.map_or(DEFAULT_MAX_BODY_BYTES, |v| v.0),
            buffer_body_bytes: buffer,
            spool_body_bytes,
            spool_max_bytes,
            spool_dir: PathBuf::from(spool_dir.unwrap_or(DEFAULT_SPOOL_DIR)),
            max_connections: count(self, "max_connections", 1_000_000, DEFAULT_MAX_CONNECTIONS),
            max_in_flight: count(self, "max_in_flight", 1_000_000, DEFAULT_MAX_IN_FLIGHT),
            http2_max_streams: self
                .int_in(&s, "http2_max_streams", 1..=10_000)
                .map_or(DEFAULT_HTTP2_MAX_STREAMS, |n| n as u32),
        }
    }

    /// `spool_body_bytes` and `spool_max_bytes`. A spool limit at or below the
    /// buffer limit would never take a body (those are read into memory), and a
    /// spool smaller than its largest body could never hold one: both are errors
    /// on the key that was written.
    fn spool_sizes(&mut self, s: &Section, buffer: u64) -> (u64, u64) {
        let body = self.size_in(s, "spool_body_bytes", 0..=TIB);
        let max = self.size_in(s, "spool_max_bytes", MIB..=64 * TIB);
        let b = body.as_ref().map_or(DEFAULT_SPOOL_BODY_BYTES, |v| v.0);
        let m = max.as_ref().map_or(DEFAULT_SPOOL_MAX_BYTES, |v| v.0);
        if let Some((_, span)) = body.as_ref().filter(|_| b != 0 && b <= buffer) {
            let message = format!(
                "{} is not above limits.buffer_body_bytes ({}): such bodies are read into memory already; raise it, or 0 turns the spool off",
                format_size(b),
                format_size(buffer)
            );
            self.error(s.key("spool_body_bytes"), Some(span.clone()), message);
        }
        if b > m {
            let (key, span) = match (&max, &body) {
                (Some((_, span)), _) => ("spool_max_bytes", span.clone()),
                (None, body) => (
                    "spool_body_bytes",
                    body.clone().map(|v| v.1).unwrap_or_default(),
                ),
            };
            let message = format!(
                "limits.spool_body_bytes ({}) is above limits.spool_max_bytes ({}): the spool could never hold such a body",
                format_size(b),
                format_size(m)
            );
            self.error(s.key(key), Some(span), message);
        }
        (b, m)
    }

    /// `max_header_bytes` and `max_uri_bytes`. The request line is part of the
    /// head, so a URI limit above the head limit could never be reached: the
    /// error blames the key that was written (an unset one is its default).
    fn head_sizes(&mut self, s: &Section) -> (usize, usize) {
        let head = self.size_in(s, "max_header_bytes", KIB..=MIB);
        let uri = self.size_in(s, "max_uri_bytes", 256..=64 * KIB);
        let h = head
            .clone()
            .map_or(DEFAULT_MAX_HEADER_BYTES as u64, |v| v.0);
        let u = uri.clone().map_or(DEFAULT_MAX_URI_BYTES as u64, |v| v.0);
        let invalid = |name, v: &Option<(u64, Span)>| s.get(name).is_some() && v.is_none();
        if u > h && !invalid("max_header_bytes", &head) && !invalid("max_uri_bytes", &uri) {
            let why = "the request line is part of the request head";
            let (key, span, message) = match (uri, head) {
                (Some((_, span)), _) => (
                    "max_uri_bytes",
                    span,
                    format!(
                        "{} is above limits.max_header_bytes ({}): {why}",
                        format_size(u),
                        format_size(h)
                    ),
                ),
                (None, head) => (
                    "max_header_bytes",
                    head.map(|v| v.1).unwrap_or_default(),
                    format!(
                        "{} is below limits.max_uri_bytes ({}, its default): {why}; lower max_uri_bytes too",
                        format_size(h),
                        format_size(u)
                    ),
                ),
            };
            self.error(s.key(key), Some(span), message);
        }
        (h as usize, u as usize)
    }

    /// A size: an integer number of bytes or a string with a unit (`parse_size`).
    pub(super) fn size_in(
        &mut self,
        s: &Section,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Option<(u64, Span)> {
        let v = s.get(name)?;
        let (lo, hi) = (format_size(*range.start()), format_size(*range.end()));
        let out_of_range = |got: String| format!("must be between {lo} and {hi}, got {got}");
        let size = match v.get_ref() {
            DeValue::String(raw) => parse_size(raw),
            other => match integer(other) {
                Some(n) => u64::try_from(n).map_err(|_| out_of_range(n.to_string())),
                None => Err(format!(
                    "expected a size (like \"32KiB\" or 4096), found {}",
                    other.type_str()
                )),
            },
        };
        let size = size.and_then(|n| match range.contains(&n) {
            true => Ok(n),
            false => Err(out_of_range(format_size(n))),
        });
        size.map(|n| (n, v.span()))
            .map_err(|m| self.error(s.key(name), Some(v.span()), m))
            .ok()
    }

    /// Absent section, plain HTTP. Both files are read now, so a wrong path or
    /// a swapped pair fails `check` rather than the start.
    /// With `[acme]` the files are the ones ACME keeps, which need not exist
    /// yet: naming others as well would leave two sources for one certificate.
    pub(super) fn tls(
        &mut self,
        root: &Section,
        listeners: &Listeners,
        acme: Option<&AcmeConfig>,
    ) -> Option<TlsConfig> {
        let s = self.open("tls".into(), root.get("tls"), TLS_KEYS);
        s.table?;
        let (cert, key) = match acme {
            Some(acme) => {
                for name in ["cert", "key"] {
                    if let Some(v) = s.get(name) {
                        let message = "[acme] gets the certificate and keeps it in acme.dir: \
                                       remove this key, or remove [acme] to serve files";
                        self.error(s.key(name), Some(v.span()), message);
                    }
                }
                (Some(acme.cert_path()), Some(acme.key_path()))
            }
            // A broken [acme] is reported there; asking for files would mislead.
            None if root.get("acme").is_some() => (None, None),
            None => {
                self.require(&s, "cert");
                self.require(&s, "key");
                let cert = self.pem_file(&s, "cert", cert_pem_problem);
                (cert, self.pem_file(&s, "key", key_pem_problem))
            }
        };
        let redirect_listen = self.redirect_listen(&s, listeners);
        let hsts = self.hsts(&s);
        Some(TlsConfig {
            cert: cert?,
            key: key?,
            redirect_listen,
            hsts,
        })
    }

    /// `hsts_max_age` turns the header on; `hsts_include_subdomains` means
    /// nothing without it, so alone it is an error rather than silently nothing.
    fn hsts(&mut self, s: &Section) -> Option<Hsts> {
        let want = "a duration string (like \"365d\")";
        let max_age = self.parsed_as(s, "hsts_max_age", want, hsts_max_age);
        let subdomains = self.typed(s, "hsts_include_subdomains", "true or false", |v| {
            v.as_bool()
        });
        match (max_age, subdomains) {
            (Some((max_age, _)), subdomains) => Some(Hsts {
                max_age,
                include_subdomains: subdomains.is_some_and(|(on, _)| on),
            }),
            (None, Some((_, span))) if s.get("hsts_max_age").is_none() => {
                let message =
                    "needs tls.hsts_max_age: without it no Strict-Transport-Security is sent";
                self.error(s.key("hsts_include_subdomains"), Some(span), message);
                None
            }
            (None, _) => None,
        }
    }

    /// The plain-HTTP listener that redirects to HTTPS needs a port of its own.
    fn redirect_listen(&mut self, s: &Section, listeners: &Listeners) -> Option<SocketAddr> {
        let (addr, span) = self.address(s, "redirect_listen")?;
        let others = [
            ("the public listen", Some(listeners.public)),
            ("admin.listen", listeners.admin),
        ];
        for (what, other) in others {
            if let Some(other) = other.filter(|o| listeners_clash(addr, *o)) {
                let message = format!("{addr} clashes with {what} {other}");
                self.error(s.key("redirect_listen"), Some(span.clone()), message);
            }
        }
        Some(addr)
    }

    /// `name`'s file, relative to the config file's directory, read and run
    /// through `problem`; the resolved path when it is fine.
    fn pem_file(
        &mut self,
        s: &Section,
        name: &str,
        problem: fn(&str) -> Option<String>,
    ) -> Option<PathBuf> {
        let (rel, span) = self.string(s, name)?;
        let path = self.base_dir.join(rel);
        let message = match fs::read(&path) {
            Err(e) => Some(format!("cannot read {}: {}", path.display(), io_reason(&e))),
            Ok(bytes) => {
                problem(&String::from_utf8_lossy(&bytes)).map(|p| format!("{} {p}", path.display()))
            }
        };
        match message {
            Some(m) => {
                self.error(s.key(name), Some(span), m);
                None
            }
            None => Some(path),
        }
    }
}

/// Zero is allowed, unlike other durations: `max-age=0` is how a site tells
/// browsers to forget an HSTS it sent before. Two years is the most browser
/// preload lists ask for; longer is more likely a typo than a plan.
fn hsts_max_age(raw: &str) -> Result<Duration, String> {
    const TWO_YEARS: Duration = Duration::from_secs(2 * 365 * 24 * 3600);
    let age = humantime::parse_duration(raw)
        .map_err(|_| format!("{raw:?} is not a duration (like \"365d\", or \"0s\" to withdraw)"))?;
    match age <= TWO_YEARS {
        true => Ok(age),
        false => Err(format!("{raw:?} is longer than two years (\"730d\")")),
    }
}

/// The labels of the PEM blocks in `text` (`CERTIFICATE`, `PRIVATE KEY`, ...):
/// only the armour lines are read; the TLS module parses what is inside.
fn pem_labels(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        line.strip_prefix("-----BEGIN ")?.strip_suffix("-----")
    })
}

/// `tls.cert` must hold at least one certificate block. A key in its place
/// is the usual mix-up, so it is named.
fn cert_pem_problem(text: &str) -> Option<String> {
    if pem_labels(text).any(|l| l == "CERTIFICATE") {
        return None;
    }
    let swapped = pem_labels(text).any(|l| l.ends_with("PRIVATE KEY"));
    Some(match swapped {
        true => "holds a private key, not a certificate: are cert and key swapped?".to_owned(),
        false => "has no PEM certificate (a \"-----BEGIN CERTIFICATE-----\" block)".to_owned(),
    })
}

/// `tls.key` must hold an unencrypted private key block (PKCS#8, PKCS#1 or
/// SEC1): the gateway starts unattended and cannot ask for a passphrase.
fn key_pem_problem(text: &str) -> Option<String> {
    let mut labels = pem_labels(text);
    let plain = |l: &str| l.ends_with("PRIVATE KEY") && l != "ENCRYPTED PRIVATE KEY";
    if labels.any(plain) {
        return None;
    }
    let has = |want: &str| pem_labels(text).any(|l| l == want);
    Some(if has("ENCRYPTED PRIVATE KEY") {
        "holds an encrypted private key: the gateway cannot ask for a passphrase \
         (decrypt it with: openssl pkey -in KEY -out KEY.plain)"
            .to_owned()
    } else if has("CERTIFICATE") {
        "holds a certificate, not a private key: are cert and key swapped?".to_owned()
    } else {
        "has no PEM private key (a \"-----BEGIN PRIVATE KEY-----\" block)".to_owned()
    })
}
