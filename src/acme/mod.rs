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
//! With `[store] kind = "redis"` the gateways of a site order one certificate
//! and all serve it (`acme::shared`): HTTP-01 answers are put in Redis too, so
//! the CA may ask any gateway's redirect listener. TLS-ALPN-01 answers stay with
//! the orderer, whose handshake alone can carry them.
//!
//! What it must not import: the gateway, sessions, Moodle. It knows certificates,
//! and the store's few calls that keep them.

mod expiry;
mod files;
mod order;
mod shared;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use instant_acme::KeyAuthorization;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{AcmeConfig, Challenge};
use crate::http::accept::tls::Certificates;
use crate::metrics::AcmeMeters;
use crate::store::AcmeTurn;

pub use expiry::not_after;
pub use files::prepare;
pub use shared::Sharing;

/// Where the CA fetches an HTTP-01 answer (RFC 8555 section 8.3).
const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// After a failed order, or a new certificate that is already due (a
/// `renew_before` longer than the CA's lifetime): the next try. Let's Encrypt
/// allows five failed validations per name and hour.
const RETRY: Duration = Duration::from_secs(3600);

/// The longest single wait: a clock stepped by NTP or a suspended machine is
/// caught up within this, not after a sleep computed weeks ago.
const RECHECK: Duration = Duration::from_secs(6 * 3600);

/// With a shared store: how often Redis is asked for a newer certificate.
const SYNC: Duration = crate::config::ACME_LOOK_EVERY;

/// How often a gateway whose certificate is due asks again while another one
/// orders, or while Redis is away for a moment.
const WAIT: Duration = Duration::from_secs(2);

/// How long Redis may be away before a gateway whose certificate is due orders
/// on its own: a blip costs nothing, an outage at least no lapsed certificate.
const ALONE_AFTER: Duration = Duration::from_secs(60);

/// The longest HTTP-01 token asked of Redis: a CA's are 43 characters.
const TOKEN_MAX: usize = 128;

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
    /// With a shared store: the site's one certificate, account and challenges.
    sharing: Option<Sharing>,
}

impl Acme {
    /// The client for `config`, renewing `certs` (loaded from its files), counted
    /// in `meters` (`Metrics::acme`), sharing the certificate with the site's
    /// other gateways through `sharing` when there is a shared store.
    pub fn new(
        config: AcmeConfig,
        certs: Arc<Certificates>,
        meters: AcmeMeters,
        sharing: Option<Sharing>,
    ) -> Arc<Self> {
        let renew_before = watch::Sender::new(config.renew_before);
        Arc::new(Self {
            config,
            certs,
            http01: DashMap::new(),
            renew_before,
            meters,
            sharing,
        })
    }

    /// A reload's `acme.renew_before`: the renewal is rescheduled at once (an
    /// admin forcing an early renewal sets it longer than what is left).
    pub fn set_renew_before(&self, renew_before: Duration) {
        self.renew_before.send_replace(renew_before);
    }

    /// The redirect listener's answer to a CA fetching an open HTTP-01 token,
    /// this gateway's or (with a shared store) any gateway's; `None` for every
    /// other request (they are redirected as before).
    pub async fn http01_answer(&self, path: &str) -> Option<Response<Full<Bytes>>> {
        let token = path.strip_prefix(HTTP01_PREFIX)?;
        let local = self.http01.get(token).map(|answer| answer.clone());
        let answer = match local {
            Some(answer) => answer,
            None if is_token(token) => self.sharing.as_ref()?.store().http01(token).await?,
            None => return None,
        };
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

    /// Puts up the answer to `name`'s challenge (an HTTP-01 one in Redis too,
    /// for the other gateways' redirect listeners).
    async fn open(&self, token: &str, name: &str, answer: &KeyAuthorization) -> Result<(), String> {
        match self.config.challenge {
            Challenge::Http01 => {
                self.http01
                    .insert(token.to_owned(), answer.as_str().to_owned());
                if let Some(sharing) = &self.sharing {
                    if sharing
                        .store()
                        .open_http01(token, answer.as_str())
                        .await
                        .is_none()
                    {
                        tracing::warn!(
                            "Redis did not take the HTTP-01 answer: only this gateway gives it"
                        );
                    }
                }
                Ok(())
            }
            Challenge::TlsAlpn01 => {
                let (cert, key) = alpn_certificate(name, answer)?;
                self.certs.open_challenge(name, &cert, &key)
            }
        }
    }

    /// Takes it down.
    async fn close(&self, token: &str, name: &str) {
        if self.http01.remove(token).is_some() {
            if let Some(sharing) = &self.sharing {
                sharing.store().close_http01(token).await;
            }
        }
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

    /// Orders, writes and serves a new certificate, and offers it to the other
    /// gateways; its expiry.
    async fn renew(&self) -> Result<SystemTime, String> {
        let account = order::account(self).await?;
        let issued = order::issue(self, &account).await?;
        files::write_pair(&self.config, &issued.chain, &issued.key)?;
        self.certs.reload()?;
        if let Some(sharing) = &self.sharing {
            if !sharing
                .publish(&self.config, &issued.chain, &issued.key)
                .await
            {
                tracing::warn!("the new TLS certificate is not in Redis yet: offered to the other gateways when it answers");
            }
        }
        Ok(self.expiry())
    }

    /// Renews the certificate `renew_before` ahead of its expiry until `stop`,
    /// logging each step and keeping the expiry in `/metrics`. With a shared
    /// store it also takes the site's newest certificate every `SYNC`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut renew_before = self.renew_before.subscribe();
        let mut state = Round::default();
        loop {
            let renew_before_now = *renew_before.borrow_and_update();
            let pause = self.step(&mut state, renew_before_now).await;
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = renew_before.changed() => {
                    state.retry_at = None;
                    state.said = None;
                }
                _ = stop.changed() => return,
            }
        }
    }

    /// One look: the site's certificate taken or offered, then an order if one
    /// is due and this gateway's to make; how long until the next look.
    async fn step(&self, state: &mut Round, renew_before: Duration) -> Duration {
        let poll = match &self.sharing {
            Some(sharing) => {
                let answered = self.sync(sharing).await;
                state.away_since = match answered {
                    true => None,
                    false => state.away_since.or_else(|| Some(Instant::now())),
                };
                SYNC
            }
            None => RECHECK,
        };
        let expiry = self.expiry();
        self.meters.expires_at(expiry);
        let wait = until_due(expiry, renew_before);
        if !wait.is_zero() {
            state.say_valid(expiry, wait);
            return wait.min(RECHECK).min(poll);
        }
        let now = Instant::now();
        if let Some(left) = state.retry_at.and_then(|at| at.checked_duration_since(now)) {
            return left.min(poll);
        }
        let ok = match self.whose_turn(state, renew_before).await {
            Turn::Wait => return WAIT,
            Turn::Alone => self.attempt().await,
            Turn::Ours(sharing) => {
                let keeping = sharing.keep_turn();
                let ok = self.attempt().await;
                keeping.abort();
                sharing.end_turn((!ok).then_some(RETRY)).await;
                ok
            }
        };
        let due = until_due(self.expiry(), renew_before).is_zero();
        state.retry_at = (!ok || due).then(|| Instant::now() + RETRY);
        Duration::ZERO
    }

    /// Whether this gateway orders now: always on its own; with a shared store
    /// when it holds the lease, or when Redis has been away for `ALONE_AFTER`
    /// (a certificate must never lapse for want of Redis).
    async fn whose_turn(&self, state: &mut Round, renew_before: Duration) -> Turn<'_> {
        let Some(sharing) = &self.sharing else {
            return Turn::Alone;
        };
        if let Some(since) = state.away_since {
            if since.elapsed() < ALONE_AFTER {
                return Turn::Wait;
            }
            tracing::warn!("Redis has been away for a minute and the TLS certificate is due: this gateway orders its own");
            return Turn::Alone;
        }
        match sharing.turn().await {
            Some(AcmeTurn::Ours) => {
                // Another gateway may have finished between the look and the lease.
                self.sync(sharing).await;
                if until_due(self.expiry(), renew_before).is_zero() {
                    state.waiting_for = None;
                    return Turn::Ours(sharing);
                }
                sharing.end_turn(None).await;
                Turn::Wait
            }
            Some(AcmeTurn::Theirs(holder)) => {
                if state.waiting_for.as_ref() != Some(&holder) {
                    tracing::info!(gateway = %holder, "another gateway orders the site's TLS certificate: this one takes it from Redis");
                    state.waiting_for = Some(holder);
                }
                Turn::Wait
            }
            None => Turn::Wait,
        }
    }

    /// One renewal, logged and counted whatever its outcome; whether it served a
    /// new certificate.
    async fn attempt(&self) -> bool {
        let domains = self.config.domains.join(", ");
        tracing::info!(%domains, directory = %self.config.directory, "renewing the TLS certificate by ACME");
        match self.renew().await {
            Ok(expiry) => {
                self.meters.renewed(true);
                let expires = httpdate::fmt_http_date(expiry);
                tracing::info!(%domains, %expires, "new TLS certificate served");
                true
            }
            Err(error) => {
                self.meters.renewed(false);
                tracing::error!(%domains, "TLS certificate not renewed, the current one stays: {error}");
                false
            }
        }
    }
}

/// How long until a certificate expiring at `expiry` is due; zero when it is.
fn until_due(expiry: SystemTime, renew_before: Duration) -> Duration {
    let due = expiry.checked_sub(renew_before).unwrap_or(UNIX_EPOCH);
    due.duration_since(SystemTime::now()).unwrap_or_default()
}

/// Who orders the certificate that is due.
enum Turn<'a> {
    /// This gateway, on its own (no shared store, or Redis away too long).
    Alone,
    /// This gateway, holding the site's lease.
    Ours(&'a Sharing),
    /// Not now: another gateway orders, or Redis is away for a moment.
    Wait,
}

/// What the renewal loop remembers between looks.
#[derive(Default)]
struct Round {
    /// No order before this (after a failure, or a new one already due).
    retry_at: Option<Instant>,
    /// Since when Redis has not answered.
    away_since: Option<Instant>,
    /// The gateway last seen ordering, said once.
    waiting_for: Option<String>,
    /// The expiry and wait last logged, said once.
    said: Option<SystemTime>,
}

impl Round {
    fn say_valid(&mut self, expiry: SystemTime, wait: Duration) {
        if self.said == Some(expiry) {
            return;
        }
        self.said = Some(expiry);
        tracing::info!(
            expires = %httpdate::fmt_http_date(expiry),
            "TLS certificate valid; renewal in {}",
            humantime::format_duration(Duration::from_secs(wait.as_secs()))
        );
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

/// Whether `token` may be a CA's (base64url, RFC 8555 section 8.3): anything else
/// is redirected without asking Redis.
fn is_token(token: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    !token.is_empty() && token.len() <= TOKEN_MAX && token.bytes().all(allowed)
}
