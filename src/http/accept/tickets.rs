//! TLS session tickets sealed with keys every gateway of a site shares
//! (`[store] kind = "redis"`), so that a student moved to another gateway (the
//! address moved by keepalived, a restart) resumes instead of a full handshake.
//!
//! Why not rustls's own `Ticketer` alone: its keys are random in each process, so
//! a ticket opens only on the gateway that sealed it. Here a key belongs to a
//! period of [`PERIOD`]; the first gateway that asks for a period's key makes it
//! and every other reads the same one (`crate::store`, where the key is kept
//! sealed under `store.secret`). A ticket is sealed with the current period's key
//! and opens with the keys of the periods its [`LIFETIME`] spans; a key is gone
//! from the store and from memory a day after it was made, which bounds what a
//! stolen key could open.
//!
//! Until the current period's key is here (Redis not reached yet, or away across a
//! rotation), tickets are sealed by rustls's `Ticketer`, as on a single gateway,
//! and both kinds are opened: Redis away costs resumption across gateways, never
//! on this one.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;
use sha2::{Digest, Sha256};

/// How long one key seals tickets: rustls's own rotation.
pub const PERIOD: Duration = Duration::from_secs(6 * 3600);

/// How long a ticket may be used, in seconds (rustls's own, two periods).
pub const LIFETIME: u32 = 12 * 3600;

/// A key's bytes, as the store keeps them (sealed) and as tickets use them.
pub type KeyBytes = [u8; 32];

const NAME_LEN: usize = 16;
const TAG_LEN: usize = 16;

/// The period `at` falls in, on the clock every gateway keeps in step (NTP).
pub fn period_at(at: SystemTime) -> u64 {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    secs / PERIOD.as_secs()
}

/// A ticket key: its name (what a ticket carries to say which key sealed it)
/// and the key itself.
struct Key {
    period: u64,
    name: [u8; NAME_LEN],
    key: LessSafeKey,
}

impl Key {
    fn new(period: u64, bytes: &KeyBytes) -> Self {
        let digest = Sha256::new()
            .chain_update(b"moodle-gateway ticket key name v1")
            .chain_update(bytes)
            .finalize();
        let mut name = [0; NAME_LEN];
        name.copy_from_slice(&digest[..NAME_LEN]);
        let key = UnboundKey::new(&CHACHA20_POLY1305, bytes).expect("a 32-byte key");
        Self {
            period,
            name,
            key: LessSafeKey::new(key),
        }
    }
}

/// Tickets sealed with the site's shared keys, rustls's own until one is here.
pub struct SharedTickets {
    keys: ArcSwap<Vec<Key>>,
    local: Arc<dyn ProducesTickets>,
    random: SystemRandom,
}

/// Written by hand: the keys have no business in a log.
impl fmt::Debug for SharedTickets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let periods: Vec<u64> = self.keys.load().iter().map(|k| k.period).collect();
        f.debug_struct("SharedTickets")
            .field("periods", &periods)
            .finish_non_exhaustive()
    }
}

impl SharedTickets {
    /// No shared key yet: rustls's `Ticketer` seals. Fails only when the system's
    /// random source does.
    pub fn new() -> Result<Arc<Self>, rustls::Error> {
        Ok(Arc::new(Self {
            keys: ArcSwap::from_pointee(Vec::new()),
            local: rustls::crypto::ring::Ticketer::new()?,
            random: SystemRandom::new(),
        }))
    }

    /// The shared keys as the store has them now, by period; the ones not given
    /// are dropped.
    pub fn install(&self, keys: &[(u64, KeyBytes)]) {
        let keys = keys.iter().map(|(period, bytes)| Key::new(*period, bytes));
        self.keys.store(Arc::new(keys.collect()));
    }

    /// Whether a shared key seals this period's tickets.
    pub fn sealing_shared(&self) -> bool {
        let now = period_at(SystemTime::now());
        self.keys.load().iter().any(|k| k.period == now)
    }
}

impl ProducesTickets for SharedTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        LIFETIME
    }

    /// `name ‖ nonce ‖ sealed ‖ tag`, the name also bound in as associated data.
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.load();
        let now = period_at(SystemTime::now());
        let Some(key) = keys.iter().find(|k| k.period == now) else {
            return self.local.encrypt(plain);
        };
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).ok()?;
        let mut ticket = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        ticket.extend_from_slice(&key.name);
        ticket.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        let nonce = Nonce::assume_unique_for_key(nonce);
        let aad = Aad::from(key.name);
        key.key
            .seal_in_place_append_tag(nonce, aad, &mut sealed)
            .ok()?;
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.load();
        let shared = ticket
            .get(..NAME_LEN)
            .and_then(|name| keys.iter().find(|k| k.name == name));
        let Some(key) = shared else {
            return self.local.decrypt(ticket);
        };
        let rest = &ticket[NAME_LEN..];
        let nonce = Nonce::try_assume_unique_for_key(rest.get(..NONCE_LEN)?).ok()?;
        let mut sealed = rest.get(NONCE_LEN..)?.to_vec();
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(key.name), &mut sealed)
            .ok()?;
        Some(plain.to_vec())
    }
}

/// A fresh random key, for the store to offer when a period has none yet.
pub fn fresh_key() -> Option<KeyBytes> {
    let mut key = [0u8; 32];
    SystemRandom::new().fill(&mut key).ok()?;
    Some(key)
}

/// `key` sealed under `wrap` (derived from `store.secret`) as the store keeps it:
/// reading Redis alone gives no ticket key.
pub fn wrap(wrap: &KeyBytes, key: &KeyBytes) -> Option<Vec<u8>> {
    let sealing = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, wrap).ok()?);
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).ok()?;
    let mut sealed = key.to_vec();
    let aad = Aad::from(b"moodle-gateway ticket key v1");
    sealing
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), aad, &mut sealed)
        .ok()?;
    let mut wrapped = nonce.to_vec();
    wrapped.extend_from_slice(&sealed);
    Some(wrapped)
}

/// The key [`wrap`] sealed; `None` for anything else (another `store.secret`).
pub fn unwrap(wrap: &KeyBytes, wrapped: &[u8]) -> Option<KeyBytes> {
    let opening = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, wrap).ok()?);
    let nonce = Nonce::try_assume_unique_for_key(wrapped.get(..NONCE_LEN)?).ok()?;
    let mut sealed = wrapped.get(NONCE_LEN..)?.to_vec();
    let aad = Aad::from(b"moodle-gateway ticket key v1");
    let key = opening.open_in_place(nonce, aad, &mut sealed).ok()?;
    key.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> u64 {
        period_at(SystemTime::now())
    }

    #[test]
    fn a_ticket_sealed_by_one_gateway_opens_on_another_with_the_same_keys() {
        let key = fresh_key().unwrap();
        let (a, b) = (SharedTickets::new().unwrap(), SharedTickets::new().unwrap());
        a.install(&[(now(), key)]);
        b.install(&[(now() - 1, fresh_key().unwrap()), (now(), key)]);
        let ticket = a.encrypt(b"resumption secret").unwrap();
        assert_eq!(b.decrypt(&ticket).unwrap(), b"resumption secret");
        // Tampered with: refused, not opened.
        let mut bent = ticket.clone();
        *bent.last_mut().unwrap() ^= 1;
        assert_eq!(b.decrypt(&bent), None);
    }

    #[test]
    fn without_this_periods_key_tickets_are_the_gateways_own_and_still_open_here() {
        let (a, b) = (SharedTickets::new().unwrap(), SharedTickets::new().unwrap());
        let key = fresh_key().unwrap();
        // Only last period's key: it opens, but no longer seals.
        a.install(&[(now() - 1, key)]);
        b.install(&[(now() - 1, key)]);
        assert!(!a.sealing_shared());
        let ticket = a.encrypt(b"secret").unwrap();
        assert_eq!(a.decrypt(&ticket).unwrap(), b"secret");
        assert_eq!(b.decrypt(&ticket), None);
    }

    #[test]
    fn a_ticket_whose_key_is_gone_no_longer_opens() {
        let tickets = SharedTickets::new().unwrap();
        tickets.install(&[(now(), fresh_key().unwrap())]);
        let ticket = tickets.encrypt(b"secret").unwrap();
        tickets.install(&[(now(), fresh_key().unwrap())]);
        assert_eq!(tickets.decrypt(&ticket), None);
    }

    #[test]
    fn a_wrapped_key_opens_only_under_its_secret() {
        let (secret, key) = (fresh_key().unwrap(), fresh_key().unwrap());
        let wrapped = wrap(&secret, &key).unwrap();
        assert_eq!(unwrap(&secret, &wrapped), Some(key));
        assert_eq!(unwrap(&fresh_key().unwrap(), &wrapped), None);
        assert!(!wrapped.windows(32).any(|w| w == key));
    }
}
