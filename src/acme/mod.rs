//! Opt-in ACME (`[acme]`, RFC 8555): the gateway gets its certificate from a CA
//! such as Let's Encrypt and renews it itself, as Caddy and Traefik do. Off by
//! default: `[tls]` files work on a network that cannot reach a CA.
//!
//! The certificate lives in `acme.dir` as the `cert.pem` and `key.pem` that
//! `[tls]` serves, so everything the file path does still holds: the resolver's
//! certificate is swapped in one pointer store ([`Certificates::reload`]), open
//! connections keep theirs, a `SIGHUP` re-reads the same files. Renewal writes
//! the new pair and then reloads: serving never stops.
//!
//! The CA checks each name by one of two challenges: `http-01`, answered by the
//! redirect listener (port 80) at `/.well-known/acme-challenge/TOKEN`, or
//! `tls-alpn-01`, answered by the public listener's resolver to a handshake that
//! offers only `acme-tls/1`.
//!
//! What it must not import: the gateway, sessions, Moodle. It knows certificates.

mod expiry;
mod files;
mod order;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use instant_acme::KeyAuthorization;
use tokio::sync::watch;

use crate::config::{AcmeConfig, Challenge};
use crate::http::accept::tls::Certificates;
use crate::metrics::AcmeMeters;

pub use expiry::not_after;
pub use files::prepare;

/// Where the CA fetches an HTTP-01 answer (RFC 8555 section 8.3).
const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// After a failed order, or a new certificate that is already due (a
/// `renew_before` longer than the CA's lifetime): the next try. Let's Encrypt
/// allows five failed validations per name and hour.
const RETRY: Duration = Duration::from_secs(3600);

/// The longest single wait: a clock stepped by NTP or a suspended machine is
/// caught up within this, not after a sleep computed weeks ago.
const RECHECK: Duration = Duration::from_secs(6 * 3600);

/// The running ACME client: its settings, the certificates it renews, and the
/// HTTP-01 answers open right now. Cheap to share (`Arc`); the token map is a
/// `DashMap` so the redirect listener reads it without a lock held across a wait.
#[derive(Debug)]
pub struct Acme {
    config: AcmeConfig,
    certs: Arc<Certificates>,
    http01: DashMap<String, String>,
    renew_before: watch::Sender<Duration>,
    meters: AcmeMeters,
}

impl Acme {
    /// The client for `config`, renewing `certs` (loaded from its files), counted
    /// in `meters` (`Metrics::acme`).
    pub fn new(config: AcmeConfig, certs: Arc<Certificates>, meters: AcmeMeters) -> Arc<Self> {
        let renew_before = watch::Sender::new(config.renew_before);
        Arc::new(Self {
            config,
            certs,
            http01: DashMap::new(),
            renew_before,
            meters,
        })
    }

    /// A reload's `acme.renew_before`: the renewal is rescheduled at once (an
    /// admin forcing an early renewal sets it longer than what is left).
    pub fn set_renew_before(&self, renew_before: Duration) {
        self.renew_before.send_replace(renew_before);
    }

    /// The redirect listener's answer to a CA fetching an open HTTP-01 token;
    /// `None` for every other request (they are redirected as before).
    pub fn http01_answer(&self, path: &str) -> Option<Response<Full<Bytes>>> {
        let token = path.strip_prefix(HTTP01_PREFIX)?;
        let answer = self.http01.get(token)?.clone();
        let mut response = Response::new(Full::new(Bytes::from(answer)));
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Some(response)
    }

    /// Puts up the answer to `name`'s challenge.
    fn open(&self, token: &str, name: &str, answer: &KeyAuthorization) -> Result<(), String> {
        match self.config.challenge {
            Challenge::Http01 => {
                self.http01
                    .insert(token.to_owned(), answer.as_str().to_owned());
                Ok(())
            }
            Challenge::TlsAlpn01 => {
                let (cert, key) = alpn_certificate(name, answer)?;
                self.certs.open_challenge(name, &cert, &key)
            }
        }
    }

    /// Takes it down.
    fn close(&self, token: &str, name: &str) {
        self.http01.remove(token);
        self.certs.close_challenge(name);
    }

    /// When the certificate served now expires (the epoch for one unreadable).
    fn expiry(&self) -> SystemTime {
        let chain = self.certs.current_chain();
        chain
            .first()
            .and_then(|leaf| not_after(leaf))
            .unwrap_or(UNIX_EPOCH)
    }

    /// Orders, writes and serves a new certificate; its expiry.
    async fn renew(&self) -> Result<SystemTime, String> {
        let account = order::account(&self.config).await?;
        let issued = order::issue(self, &account).await?;
        files::write_pair(&self.config, &issued.chain, &issued.key)?;
        self.certs.reload()?;
        Ok(self.expiry())
    }

    /// Renews the certificate `renew_before` ahead of its expiry until `stop`,
    /// logging each step and keeping the expiry in `/metrics`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut renew_before = self.renew_before.subscribe();
        loop {
            let expiry = self.expiry();
            self.meters.expires_at(expiry);
            let due = expiry
                .checked_sub(*renew_before.borrow_and_update())
                .unwrap_or(UNIX_EPOCH);
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            if !wait.is_zero() {
                tracing::info!(
                    expires = %httpdate::fmt_http_date(expiry),
                    "TLS certificate valid; renewal in {}",
                    humantime::format_duration(Duration::from_secs(wait.as_secs()))
                );
                tokio::select! {
                    () = tokio::time::sleep(wait.min(RECHECK)) => {}
                    _ = renew_before.changed() => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
            self.attempt().await;
            if self.expiry().checked_sub(*renew_before.borrow()) > Some(SystemTime::now()) {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                _ = renew_before.changed() => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// One renewal, logged and counted whatever its outcome.
    async fn attempt(&self) {
        let domains = self.config.domains.join(", ");
        tracing::info!(%domains, directory = %self.config.directory, "renewing the TLS certificate by ACME");
        match self.renew().await {
            Ok(expiry) => {
                self.meters.renewed(true);
                let expires = httpdate::fmt_http_date(expiry);
                tracing::info!(%domains, %expires, "new TLS certificate served");
            }
            Err(error) => {
                self.meters.renewed(false);
                tracing::error!(%domains, "TLS certificate not renewed, the current one stays: {error}");
            }
        }
    }
}

/// The TLS-ALPN-01 certificate (RFC 8737 section 3): self-signed for `name`,
/// carrying the SHA-256 of the key authorization in the critical
/// `acmeIdentifier` extension. PEM chain and key.
fn alpn_certificate(name: &str, answer: &KeyAuthorization) -> Result<(String, String), String> {
    let failed = |e: rcgen::Error| format!("challenge certificate for {name}: {e}");
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(failed)?;
    let digest = answer.digest();
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest.as_ref()));
    let cert = params.self_signed(&key).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}
