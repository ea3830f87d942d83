//! The waiting room's cookie: a visitor's place in line, kept by the browser.
//!
//! Why a signed cookie and not a table: a refresh, another gateway behind the same
//! address, or a restart must keep the visitor's place, and the gateway must not
//! hold memory for everyone who ever saw the page. The cookie holds the first
//! arrival (wall-clock milliseconds, which mean the same to every gateway and the
//! next process), when the visitor was last seen (a place left for
//! `surge.place_kept` is given up), and a random id that orders two visitors of the
//! same millisecond. An HMAC under the table's secret (shared by every gateway of a
//! `[store]`, and kept in the snapshot across restarts) makes the arrival
//! unforgeable: a visitor cannot move forward by editing it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use http::header::COOKIE;
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Absorbed first, so a tag can never be mistaken for another HMAC of the same
/// secret (the route cookie's, the admin login's).
const DOMAIN: &[u8] = b"moodle-gateway waiting room v1\0";
/// 128 bits, as the route cookie's.
const TAG_BYTES: usize = 16;
/// Longest value worth looking at: three numbers and a tag.
const MAX_VALUE: usize = 3 * 21 + 24;

/// A place in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    /// First arrival, wall-clock milliseconds since the Unix epoch.
    pub arrived: u64,
    /// Orders visitors who arrived in the same millisecond.
    pub id: u64,
    /// Last seen, wall-clock milliseconds.
    pub seen: u64,
}

/// Signs and reads tickets.
#[derive(Clone)]
pub struct Tickets {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tickets(<keyed>)")
    }
}

impl Tickets {
    /// Tickets under `secret` (the table's key secret).
    pub fn new(secret: &[u8]) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
        mac.update(DOMAIN);
        Self { mac }
    }

    /// The cookie value of `ticket`: `arrived.id.seen.tag`.
    pub fn value(&self, ticket: Ticket) -> String {
        let body = format!("{}.{:x}.{}", ticket.arrived, ticket.id, ticket.seen);
        let tag = URL_SAFE_NO_PAD.encode(self.tag(body.as_bytes()));
        format!("{body}.{tag}")
    }

    /// The ticket in cookie `name` of `headers`, if one verifies (the first cookie
    /// of that name decides: a second cannot be slipped in behind a forged one).
    pub fn read(&self, headers: &HeaderMap, name: &str) -> Option<Ticket> {
        let value = cookie(headers, name)?;
        self.parse(value)
    }

    fn parse(&self, value: &[u8]) -> Option<Ticket> {
        if value.len() > MAX_VALUE {
            return None;
        }
        let dot = value.iter().rposition(|&b| b == b'.')?;
        let (body, tag) = (&value[..dot], &value[dot + 1..]);
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        if tag.len() != TAG_BYTES || !bool::from(self.tag(body).ct_eq(&tag)) {
            return None;
        }
        let mut parts = std::str::from_utf8(body).ok()?.split('.');
        let arrived = parts.next()?.parse().ok()?;
        let id = u64::from_str_radix(parts.next()?, 16).ok()?;
        let seen = parts.next()?.parse().ok()?;
        parts
            .next()
            .is_none()
            .then_some(Ticket { arrived, id, seen })
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG_BYTES] {
        let mut mac = self.mac.clone();
        mac.update(body);
        let full = mac.finalize().into_bytes();
        full[..TAG_BYTES].try_into().expect("SHA-256 is longer")
    }
}

/// The first value of cookie `name` in any `Cookie` header, as bytes.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|h| h.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const SECRET: [u8; 16] = [7; 16];

    fn headers(cookie: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(COOKIE, HeaderValue::from_str(cookie).unwrap());
        map
    }

    fn ticket() -> Ticket {
        Ticket {
            arrived: 1_764_000_000_123,
            id: 0xdead_beef,
            seen: 1_764_000_020_000,
        }
    }

    #[test]
    fn a_ticket_reads_back_from_the_cookie_among_others() {
        let tickets = Tickets::new(&SECRET);
        let value = tickets.value(ticket());
        let cookies = format!("MoodleSession=x; Place={value}; other=1");
        assert_eq!(tickets.read(&headers(&cookies), "Place"), Some(ticket()));
    }

    #[test]
    fn a_forged_arrival_another_secret_or_a_broken_value_is_no_ticket() {
        let tickets = Tickets::new(&SECRET);
        let value = tickets.value(ticket());
        let earlier = value.replacen("1764000000123", "1764000000000", 1);
        let other = Tickets::new(&[8; 16]).value(ticket());
        for bad in [
            earlier.as_str(),
            other.as_str(),
            "1.2.3",
            "",
            "1.2.3.4.AAAAAAAAAAAAAAAAAAAAAA",
            &"9".repeat(200),
        ] {
            let cookie = format!("Place={bad}");
            assert_eq!(tickets.read(&headers(&cookie), "Place"), None, "{bad:?}");
        }
    }

    #[test]
    fn the_same_secret_in_another_process_reads_the_ticket() {
        // A restart (the table's secret from the snapshot) or another gateway (the
        // store's secret) keeps the place.
        let value = Tickets::new(&SECRET).value(ticket());
        let cookie = format!("Place={value}");
        let again = Tickets::new(&SECRET);
        assert_eq!(again.read(&headers(&cookie), "Place"), Some(ticket()));
    }

    #[test]
    fn the_first_cookie_of_the_name_decides() {
        let tickets = Tickets::new(&SECRET);
        let value = tickets.value(ticket());
        let cookie = format!("Place=forged; Place={value}");
        assert_eq!(tickets.read(&headers(&cookie), "Place"), None);
    }
}
