//! When a certificate expires: its `notAfter`, read from the DER with a few lines
//! rather than an X.509 crate, because it is the one field renewal needs.
//!
//! The walk follows RFC 5280: `Certificate ::= SEQUENCE { tbsCertificate, ... }`,
//! `TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature,
//! issuer, validity, ... }`, `Validity ::= SEQUENCE { notBefore, notAfter }`, each
//! time a `UTCTime` (two-digit year, 1950..2049) or a `GeneralizedTime`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The certificate's `notAfter`; `None` for anything that is not a DER certificate.
pub fn not_after(der: &[u8]) -> Option<SystemTime> {
    let (tag, certificate, _) = element(der)?;
    let (tbs_tag, tbs, _) = element(certificate)?;
    if tag != SEQUENCE || tbs_tag != SEQUENCE {
        return None;
    }
    let (first, _, after_first) = element(tbs)?;
    // With a version, the serial follows it; without, the serial is first.
    let mut rest = match first {
        VERSION => after_first,
        _ => tbs,
    };
    // serialNumber, signature, issuer: skipped.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (validity_tag, validity, _) = element(rest)?;
    if validity_tag != SEQUENCE {
        return None;
    }
    let after_not_before = element(validity)?.2;
    let (time_tag, time, _) = element(after_not_before)?;
    parse_time(time_tag, std::str::from_utf8(time).ok()?)
}

/// One DER element: its tag, its content, and what follows it.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x84 => {
            let n = usize::from(first & 0x7f);
            let bytes = rest.get(..n)?;
            let len = bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b));
            (len, &rest[n..])
        }
        _ => return None,
    };
    let content = rest.get(..len)?;
    Some((tag, content, &rest[len..]))
}

/// `YYMMDDHHMMSSZ` or `YYYYMMDDHHMMSSZ`, both in UTC as RFC 5280 requires.
fn parse_time(tag: u8, text: &str) -> Option<SystemTime> {
    let digits = text.strip_suffix('Z')?;
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy: i64 = digits.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (digits.get(..4)?.parse().ok()?, &digits[4..]),
        _ => return None,
    };
    if !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let field = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    let days = days_from_civil(year, month, day);
    let secs = ((days * 24 + hour) * 60 + minute) * 60 + second;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's method).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_until(year: i32, month: u8, day: u8) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["moodle.example".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn unix(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn reads_the_expiry_of_a_certificate_in_either_time_form() {
        // 2030 is written as a UTCTime, 2051 as a GeneralizedTime (RFC 5280 4.1.2.5).
        let utc = certificate_until(2030, 3, 1);
        assert_eq!(not_after(&utc), Some(unix(1_898_553_600)));
        let generalized = certificate_until(2051, 1, 1);
        assert_eq!(not_after(&generalized), Some(unix(2_556_144_000)));
    }

    #[test]
    fn anything_else_has_no_expiry() {
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(b"-----BEGIN CERTIFICATE-----"), None);
        let cut = certificate_until(2030, 3, 1);
        assert_eq!(not_after(&cut[..cut.len() / 3]), None);
    }
}
