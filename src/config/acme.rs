//! `[acme]`: certificates the gateway asks a CA for itself (RFC 8555), instead
//! of `[tls] cert` and `key` files an admin renews. Off unless the section is
//! there: a ministry or school network may block the CA, and then files are the
//! only way that works.

use std::path::PathBuf;
use std::time::Duration;

use toml::de::DeValue;

use super::check::{Checker, Section};

const ACME_KEYS: &str = "directory domains contact challenge dir renew_before directory_ca";

/// `acme.dir` default: the package's state directory (systemd's `StateDirectory`).
pub const DEFAULT_ACME_DIR: &str = "/var/lib/moodle-gateway/acme";
/// `acme.renew_before` default: Let's Encrypt's own advice for its 90-day
/// certificates (renew with a third of the lifetime left), and room for a week of
/// failed attempts before a student sees an expired certificate.
pub const DEFAULT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// With `[store] kind = "redis"`: how often every gateway looks in Redis for a
/// newer certificate (one `GET` of a few kilobytes, compared with the last), so a
/// renewal by one reaches the others within it. Here so `check` says it.
pub const ACME_LOOK_EVERY: Duration = Duration::from_secs(15);

/// How the CA checks that the gateway answers for a domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// `http-01`: the CA fetches `http://DOMAIN/.well-known/acme-challenge/TOKEN`
    /// on port 80, which the redirect listener (`tls.redirect_listen`) answers.
    Http01,
    /// `tls-alpn-01`: the CA opens TLS to port 443 offering only `acme-tls/1`,
    /// and the public listener answers with the challenge's certificate.
    TlsAlpn01,
}

impl Challenge {
    /// The name the config and RFC 8555 give it.
    pub fn name(self) -> &'static str {
        match self {
            Challenge::Http01 => "http-01",
            Challenge::TlsAlpn01 => "tls-alpn-01",
        }
    }
}

/// `[acme]`, validated. With it, `[tls] cert` and `key` are the files in `dir`.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    /// `directory`: the CA's ACME directory URL (https).
    pub directory: String,
    /// `domains`: the names the certificate carries, the first its subject.
    pub domains: Vec<String>,
    /// `contact`: an email the CA writes to about expiry or revocation.
    pub contact: Option<String>,
    /// `challenge`: how the CA checks the names. Default `http-01`.
    pub challenge: Challenge,
    /// `dir`: where the account, the certificate and its key are kept. Joined to
    /// `base_dir` already.
    pub dir: PathBuf,
    /// `renew_before`: a new certificate is asked for this long before expiry.
    pub renew_before: Duration,
    /// `directory_ca`: a PEM root the CA's own HTTPS is checked against instead of
    /// the system's (a private CA, or Pebble in tests). Joined to `base_dir`.
    pub directory_ca: Option<PathBuf>,
}

impl AcmeConfig {
    /// The certificate chain ACME keeps, served as `[tls] cert`.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    /// Its private key, served as `[tls] key`.
    pub fn key_path(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    /// The ACME account (its key and URL at the CA), so a restart does not open a
    /// new account each time.
    pub fn account_path(&self) -> PathBuf {
        self.dir.join("account.json")
    }
}

impl Checker<'_> {
    /// `None` when the section is absent (files, as before) or broken (recorded).
    pub(super) fn acme(&mut self, root: &Section) -> Option<AcmeConfig> {
        let s = self.open("acme".into(), root.get("acme"), ACME_KEYS);
        s.table?;
        if root.get("tls").is_none() {
            let message = "[acme] needs a [tls] section: the certificate it gets is served there";
            self.error("acme", s.span.clone(), message);
        }
        self.require(&s, "directory");
        self.require(&s, "domains");
        let directory = self.parsed(&s, "directory", directory_url);
        let domains = self.acme_domains(&s);
        let contact = self.parsed(&s, "contact", contact_email);
        let challenge = self.parsed(&s, "challenge", challenge);
        let challenge = challenge.map_or(Challenge::Http01, |c| c.0);
        if challenge == Challenge::Http01 && !has_redirect_listener(root) {
            let message = "http-01 needs tls.redirect_listen on port 80: the CA asks there; \
                           set it, or use challenge = \"tls-alpn-01\"";
            let span = s
                .get("challenge")
                .map_or(s.span.clone(), |v| Some(v.span()));
            self.error(s.key("challenge"), span, message);
        }
        let dir = self.parsed(&s, "dir", |raw| match raw.is_empty() {
            true => Err("must not be empty".to_owned()),
            false => Ok(raw),
        });
        let dir = self.base_dir.join(dir.map_or(DEFAULT_ACME_DIR, |d| d.0));
        let want = "a duration (like \"30d\")";
        let renew_before = self.parsed_as(&s, "renew_before", want, renew_before);
        let directory_ca = self
            .string(&s, "directory_ca")
            .map(|(p, _)| self.base_dir.join(p));
        Some(AcmeConfig {
            directory: directory?.0.to_owned(),
            domains: domains?,
            contact: contact.map(|c| c.0.to_owned()),
            challenge,
            dir,
            renew_before: renew_before.map_or(DEFAULT_RENEW_BEFORE, |r| r.0),
            directory_ca,
        })
    }

    /// At least one DNS name, no wildcard (neither challenge can prove one), no
    /// repeats.
    fn acme_domains(&mut self, s: &Section) -> Option<Vec<String>> {
        let (items, span) = self.typed(s, "domains", "an array of names", |v| v.as_array())?;
        let mut domains: Vec<String> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let name = match item.get_ref() {
                DeValue::String(raw) => domain(raw),
                v => Err(format!("expected a string, found {}", v.type_str())),
            };
            let name = name.and_then(|n| match domains.contains(&n) {
                true => Err(format!("{n:?} is listed twice")),
                false => Ok(n),
            });
            match name {
                Ok(n) => domains.push(n),
                Err(m) => self.error(format!("{}[{i}]", s.key("domains")), Some(item.span()), m),
            }
        }
        if items.is_empty() {
            self.error(
                s.key("domains"),
                Some(span),
                "must name at least one domain",
            );
            return None;
        }
        (domains.len() == items.len()).then_some(domains)
    }
}

fn has_redirect_listener(root: &Section) -> bool {
    let tls = root.get("tls").and_then(|t| t.get_ref().as_table());
    tls.is_some_and(|t| t.get("redirect_listen").is_some())
}

/// RFC 8555 speaks HTTPS only: the account key signs every request, but the
/// directory's answers (where to send them) must not be forged.
fn directory_url(raw: &str) -> Result<&str, String> {
    let rest = raw.strip_prefix("https://").ok_or_else(|| {
        format!("{raw:?} is not an https:// URL (like \"https://acme-v02.api.letsencrypt.org/directory\")")
    })?;
    match rest.is_empty() || rest.contains(char::is_whitespace) {
        true => Err(format!("{raw:?} is not a URL")),
        false => Ok(raw),
    }
}

/// A host name the CA can reach: letters, digits, inner hyphens; lowercased.
fn domain(raw: &str) -> Result<String, String> {
    let name = raw.to_ascii_lowercase();
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.starts_with("*.") {
        return Err(format!(
            "{raw:?} is a wildcard: only DNS-01 proves those, and the gateway answers http-01 or tls-alpn-01"
        ));
    }
    match name.len() <= 253 && name.split('.').all(label) {
        true => Ok(name),
        false => Err(format!("{raw:?} is not a DNS name")),
    }
}

/// An address, without `mailto:` (the gateway adds it).
fn contact_email(raw: &str) -> Result<&str, String> {
    let ok = raw.split_once('@').is_some_and(|(user, host)| {
        !user.is_empty() && host.contains('.') && !raw.contains(char::is_whitespace)
    });
    match ok && !raw.starts_with("mailto:") {
        true => Ok(raw),
        false => Err(format!(
            "{raw:?} is not an email address (like \"moodle-admin@school.example\", without mailto:)"
        )),
    }
}

/// At least an hour (later risks an expired certificate), at most ten years:
/// longer than a certificate lives is allowed, as the way to force a renewal.
fn renew_before(raw: &str) -> Result<Duration, String> {
    const TEN_YEARS: Duration = Duration::from_secs(3650 * 24 * 3600);
    let d = humantime::parse_duration(raw)
        .map_err(|_| format!("{raw:?} is not a duration (like \"30d\")"))?;
    if d < Duration::from_secs(3600) {
        return Err(format!(
            "{raw:?} is under an hour: renewing that late risks an expired certificate"
        ));
    }
    match d <= TEN_YEARS {
        true => Ok(d),
        false => Err(format!("{raw:?} is longer than ten years (\"3650d\")")),
    }
}

fn challenge(raw: &str) -> Result<Challenge, String> {
    match raw {
        "http-01" => Ok(Challenge::Http01),
        "tls-alpn-01" => Ok(Challenge::TlsAlpn01),
        _ => Err(format!(
            "unknown challenge {raw:?}: use \"http-01\" or \"tls-alpn-01\""
        )),
    }
}
