//! `[acme]` with `[store] kind = "redis"`: one certificate for the site. The
//! gateways take turns in a lease (`crate::store`, `acme:lease`): the one that
//! holds it orders, the others wait and take the result. The newest certificate
//! and its key, and the CA account, are kept in Redis sealed under a key derived
//! from `store.secret` (as the TLS ticket keys are), so reading Redis alone gives
//! no private key; every gateway installs the newest into its `acme.dir` files and
//! reloads, so all serve the same certificate and a renewal by one reaches all.
//!
//! Why the files stay: a gateway that starts with Redis away serves what its
//! files hold, and a `SIGHUP` re-reads them as on a single gateway. Why "newest"
//! means the later `notAfter`: two gateways that ordered while Redis was away
//! each hold a good certificate; the later one wins everywhere, and a gateway
//! whose files hold a newer one than Redis (a site moving from one gateway with
//! files to several) offers it to the others instead of ordering again.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::config::AcmeConfig;
use crate::store::{AcmeTurn, Store, ACME_LEASE};

/// What the certificate's seal is bound to, so a sealed account never opens as a
/// certificate.
const CERTIFICATE: &[u8] = b"moodle-gateway acme certificate v1";
const ACCOUNT: &[u8] = b"moodle-gateway acme account v1";

/// The certificate as Redis keeps it (sealed): for which CA and names, so a
/// gateway configured for others leaves it alone.
#[derive(Serialize, Deserialize)]
pub(super) struct Bundle {
    pub(super) directory: String,
    pub(super) domains: Vec<String>,
    pub(super) chain: String,
    pub(super) key: String,
}

/// Which way a certificate goes between Redis and this gateway's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Redis holds a newer one: install it here.
    Install,
    /// This gateway serves a newer one that is still valid: offer it.
    Publish,
    /// The same expiry, or nothing worth moving.
    Stay,
}

/// Where the newest of the two goes: by `notAfter`, and never an expired one
/// (the placeholder) out of this gateway.
pub(super) fn direction(
    stored: Option<SystemTime>,
    served: SystemTime,
    now: SystemTime,
) -> Direction {
    match stored {
        Some(stored) if stored > served => Direction::Install,
        Some(stored) if stored == served => Direction::Stay,
        _ if served > now => Direction::Publish,
        _ => Direction::Stay,
    }
}

/// The store and the key the site's ACME secrets are sealed under.
pub struct Sharing {
    store: Store,
    seal: [u8; 32],
    /// The sealed certificate last read from Redis: a poll that finds the same
    /// bytes is done.
    seen: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sharing")
    }
}

impl Sharing {
    /// Sharing through `store`, sealed under `seal` (`store::acme_secret`).
    pub fn new(store: Store, seal: [u8; 32]) -> Self {
        Self {
            store,
            seal,
            seen: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// What Redis holds now, against the last look; `None` when Redis did not
    /// answer.
    pub(super) async fn fresh_certificate(&self) -> Option<Fresh> {
        let stored = self.store.acme_certificate().await?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        Some(match stored {
            Some(sealed) if *seen == sealed => Fresh::Same,
            Some(sealed) => {
                seen.clone_from(&sealed);
                Fresh::New(sealed)
            }
            None => {
                seen.clear();
                Fresh::Empty
            }
        })
    }

    /// The bundle in `sealed`, if it opens under this site's secret and belongs
    /// to `config`'s CA and names.
    pub(super) fn open_bundle(&self, sealed: &[u8], config: &AcmeConfig) -> Option<Bundle> {
        let plain = open(&self.seal, CERTIFICATE, sealed)?;
        let bundle: Bundle = serde_json::from_slice(&plain).ok()?;
        let ours = bundle.directory == config.directory && bundle.domains == config.domains;
        ours.then_some(bundle)
    }

    /// Offers `chain` and `key` to the other gateways as the site's certificate.
    pub(super) async fn publish(&self, config: &AcmeConfig, chain: &str, key: &str) -> bool {
        let bundle = Bundle {
            directory: config.directory.clone(),
            domains: config.domains.clone(),
            chain: chain.to_owned(),
            key: key.to_owned(),
        };
        let plain = serde_json::to_vec(&bundle).unwrap_or_default();
        let Some(sealed) = seal(&self.seal, CERTIFICATE, &plain) else {
            return false;
        };
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = sealed.clone();
        self.store.set_acme_certificate(sealed).await.is_some()
    }

    /// The site's account (`account.json`'s text) from Redis, if it has one.
    pub(super) async fn account(&self) -> Option<Vec<u8>> {
        let sealed = self.store.acme_account().await??;
        open(&self.seal, ACCOUNT, &sealed)
    }

    /// Keeps the account for the other gateways.
    pub(super) async fn keep_account(&self, text: &[u8]) {
        if let Some(sealed) = seal(&self.seal, ACCOUNT, text) {
            let _ = self.store.set_acme_account(sealed).await;
        }
    }

    /// Takes or renews the lease on ordering; `None` with Redis away.
    pub(super) async fn turn(&self) -> Option<AcmeTurn> {
        self.store.acme_turn(ACME_LEASE).await
    }

    /// Keeps the lease while an order runs: renewed every third of it until the
    /// returned task is aborted.
    pub(super) fn keep_turn(&self) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ACME_LEASE / 3).await;
                let _ = store.acme_turn(ACME_LEASE).await;
            }
        })
    }

    /// Ends this gateway's turn: the lease is given back after a certificate, or
    /// held for `back_off` after a failure, so no other gateway tries the same
    /// names before then.
    pub(super) async fn end_turn(&self, back_off: Option<Duration>) {
        match back_off {
            Some(back_off) => drop(self.store.acme_turn(back_off).await),
            None => self.store.end_acme_turn().await,
        }
    }
}

impl super::Acme {
    /// Installs the site's certificate when Redis holds a newer one than this
    /// gateway serves, or offers this gateway's when it is newer; whether Redis
    /// answered. Either way this gateway keeps serving.
    pub(super) async fn sync(&self, sharing: &Sharing) -> bool {
        let Some(fresh) = sharing.fresh_certificate().await else {
            return false;
        };
        let bundle = match &fresh {
            Fresh::New(sealed) => match sharing.open_bundle(sealed, &self.config) {
                Some(bundle) => Some(bundle),
                None => {
                    tracing::warn!("Redis holds an ACME certificate this gateway cannot use (another store.secret, acme.directory or acme.domains): left alone");
                    return true;
                }
            },
            Fresh::Same => return true,
            Fresh::Empty => None,
        };
        let stored = bundle.as_ref().and_then(Bundle::expiry);
        match direction(stored, self.expiry(), SystemTime::now()) {
            Direction::Install => self.install(sharing, bundle),
            Direction::Publish => self.offer(sharing).await,
            Direction::Stay => {}
        }
        true
    }

    /// Writes the site's certificate into `acme.dir` and serves it; on failure
    /// (a full disk) the next look tries again.
    fn install(&self, sharing: &Sharing, bundle: Option<Bundle>) {
        let Some(bundle) = bundle else {
            return;
        };
        let installed = super::files::write_pair(&self.config, &bundle.chain, &bundle.key)
            .and_then(|()| self.certs.reload());
        match installed {
            Ok(()) => {
                let expires = httpdate::fmt_http_date(self.expiry());
                tracing::info!(%expires, "the site's TLS certificate, from Redis, served");
            }
            Err(error) => {
                sharing
                    .seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                tracing::error!("the site's TLS certificate from Redis not served: {error}");
            }
        }
    }

    /// Offers the pair in `acme.dir` (the one served) to the other gateways.
    async fn offer(&self, sharing: &Sharing) {
        let read = |path: std::path::PathBuf| std::fs::read_to_string(path).ok();
        let (Some(chain), Some(key)) =
            (read(self.config.cert_path()), read(self.config.key_path()))
        else {
            return;
        };
        if sharing.publish(&self.config, &chain, &key).await {
            let expires = httpdate::fmt_http_date(self.expiry());
            tracing::info!(%expires, "this gateway's TLS certificate offered to the others through Redis");
        }
    }
}

impl Bundle {
    /// Its leaf's `notAfter`.
    fn expiry(&self) -> Option<SystemTime> {
        use rustls_pki_types::{pem::PemObject, CertificateDer};
        let leaf = CertificateDer::pem_slice_iter(self.chain.as_bytes())
            .next()?
            .ok()?;
        super::not_after(&leaf)
    }
}

/// What a look at Redis's certificate found.
pub(super) enum Fresh {
    /// Bytes this gateway has not seen (or offered) yet.
    New(Vec<u8>),
    /// The bytes of the last look.
    Same,
    /// No certificate at all.
    Empty,
}

/// `nonce ‖ sealed ‖ tag`, with `label` bound in as associated data.
pub(super) fn seal(key: &[u8; 32], label: &'static [u8], plain: &[u8]) -> Option<Vec<u8>> {
    let sealing = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).ok()?);
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).ok()?;
    let mut sealed = plain.to_vec();
    let aad = Aad::from(label);
    sealing
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), aad, &mut sealed)
        .ok()?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&sealed);
    Some(out)
}

/// What [`seal`] sealed under the same key and label; `None` for anything else.
pub(super) fn open(key: &[u8; 32], label: &'static [u8], sealed: &[u8]) -> Option<Vec<u8>> {
    let opening = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).ok()?);
    let nonce = Nonce::try_assume_unique_for_key(sealed.get(..NONCE_LEN)?).ok()?;
    let mut body = sealed.get(NONCE_LEN..)?.to_vec();
    let plain = opening
        .open_in_place(nonce, Aad::from(label), &mut body)
        .ok()?;
    Some(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn a_sealed_certificate_opens_only_under_the_same_secret_and_purpose() {
        let sealed = seal(&KEY, CERTIFICATE, b"-----BEGIN PRIVATE KEY-----").unwrap();
        assert!(!sealed.windows(11).any(|w| w == b"PRIVATE KEY"));
        assert_eq!(
            open(&KEY, CERTIFICATE, &sealed).unwrap(),
            b"-----BEGIN PRIVATE KEY-----"
        );
        assert_eq!(
            open(&[8; 32], CERTIFICATE, &sealed),
            None,
            "another store.secret"
        );
        assert_eq!(
            open(&KEY, ACCOUNT, &sealed),
            None,
            "an account is not a certificate"
        );
        let mut bent = sealed.clone();
        bent[NONCE_LEN] ^= 1;
        assert_eq!(open(&KEY, CERTIFICATE, &bent), None, "tampered with");
        assert_eq!(open(&KEY, CERTIFICATE, &sealed[..5]), None, "cut short");
    }

    #[test]
    fn two_seals_of_one_certificate_differ_so_redis_shows_no_repeat() {
        let a = seal(&KEY, CERTIFICATE, b"chain").unwrap();
        let b = seal(&KEY, CERTIFICATE, b"chain").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn the_later_expiry_wins_and_an_expired_one_is_never_offered() {
        use Direction::*;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (earlier, later) = (now + Duration::from_secs(10), now + Duration::from_secs(20));
        let expired = now - Duration::from_secs(1);
        assert_eq!(direction(Some(later), earlier, now), Install);
        assert_eq!(
            direction(Some(later), expired, now),
            Install,
            "the placeholder"
        );
        assert_eq!(direction(Some(earlier), later, now), Publish);
        assert_eq!(direction(None, later, now), Publish, "Redis holds none yet");
        assert_eq!(
            direction(None, expired, now),
            Stay,
            "the placeholder stays here"
        );
        assert_eq!(direction(Some(expired), expired, now), Stay);
        assert_eq!(direction(Some(later), later, now), Stay);
    }

    #[test]
    fn a_bundle_for_other_names_or_another_ca_is_left_alone() {
        let config = crate::config::AcmeConfig {
            directory: "https://ca.example/dir".into(),
            domains: vec!["moodle.example.edu".into()],
            contact: None,
            challenge: crate::config::Challenge::Http01,
            dir: "/nonexistent".into(),
            renew_before: Duration::from_secs(86400),
            directory_ca: None,
        };
        let sharing = Sharing::new(Store::memory(), KEY);
        let sealed = |directory: &str, domain: &str| {
            let bundle = Bundle {
                directory: directory.into(),
                domains: vec![domain.into()],
                chain: "chain".into(),
                key: "key".into(),
            };
            seal(&KEY, CERTIFICATE, &serde_json::to_vec(&bundle).unwrap()).unwrap()
        };
        let ours = sealed("https://ca.example/dir", "moodle.example.edu");
        assert_eq!(sharing.open_bundle(&ours, &config).unwrap().chain, "chain");
        let other_name = sealed("https://ca.example/dir", "old.example.edu");
        assert!(sharing.open_bundle(&other_name, &config).is_none());
        let other_ca = sealed("https://staging.example/dir", "moodle.example.edu");
        assert!(sharing.open_bundle(&other_ca, &config).is_none());
    }
}
