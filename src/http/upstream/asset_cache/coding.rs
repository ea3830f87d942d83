//! Which content coding a request's answer comes in, as the node decides it and as
//! the browser accepts it: the two questions the cache asks of `Accept-Encoding`.
//!
//! Why the cache asks the node in gzip only ([`super::Fill::ask`]): the node
//! decides by its own rule, not by RFC 9110's. Moodle turns on PHP's
//! `zlib.output_compression` for its CSS and JavaScript
//! (`min_enable_zlib_compression()`), and PHP then reads `HTTP_ACCEPT_ENCODING`, the
//! request's `Accept-Encoding` lines joined with ", " by the web server, and
//! compresses with gzip when the text holds `gzip`, else with deflate when it holds
//! `deflate` (a byte search: no q-values, no case folding). Filed under the
//! browser's line, every browser's spelling would cost PHP a run and the cache a
//! copy, and `gzip;q=0` would still get gzip; asked `gzip` alone, PHP answers every
//! fill alike. Whether a kept answer may go to a browser as it is, is the other
//! question, asked by RFC 9110 12.5.3 of the answer's own `Content-Encoding`: the
//! cache never sends a coding the browser did not accept (it gunzips instead).

use http::header::{HeaderMap, HeaderValue, ACCEPT_ENCODING};

/// The coding a Moodle node answers an asset request in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// No compression.
    Identity,
    /// `zlib.output_compression` with gzip.
    Gzip,
    /// `zlib.output_compression` with deflate (the request named no `gzip`).
    Deflate,
}

/// A request's `Accept-Encoding`, every line of it, read both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wants {
    /// The lines joined as the node's web server joins them.
    joined: Vec<u8>,
    /// Whether the request had a line at all.
    any: bool,
}

impl Wants {
    /// A request's `Accept-Encoding` from all its lines, in any order (the node's
    /// rule is a search of the joined text, and RFC 9110's reads a list).
    pub fn of<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut joined = Vec::new();
        let mut any = false;
        for line in lines {
            if any {
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(line);
            any = true;
        }
        Self { joined, any }
    }

    /// A request's `Accept-Encoding`, read from its map: every line of the name.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self::of(
            headers
                .get_all(ACCEPT_ENCODING)
                .iter()
                .map(HeaderValue::as_bytes),
        )
    }

    /// Whether an answer with this `Content-Encoding` value (`None`: none) may go
    /// to the browser (RFC 9110 12.5.3): every coding it lists is named with a
    /// q-value above 0, or is matched by a `*` that is. `identity` is acceptable
    /// unless refused outright. A request without `Accept-Encoding` gets identity
    /// only: RFC 9110 allows any coding then, but a client that says nothing is
    /// most likely one that cannot decode (as nginx's `gunzip` assumes).
    pub fn accepts(&self, content_encoding: Option<&[u8]>) -> bool {
        let codings = content_encoding.unwrap_or_default();
        let mut codings = codings
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
            .peekable();
        if codings.peek().is_none() {
            return self.quality(b"identity") != Some(false);
        }
        self.any && codings.all(|coding| self.quality(coding) == Some(true))
    }

    /// Whether `coding` is accepted (`Some(true)`), refused with `q=0`
    /// (`Some(false)`), or not named at all, a `*` standing for every coding not
    /// named.
    fn quality(&self, coding: &[u8]) -> Option<bool> {
        let mut star = None;
        for item in self.joined.split(|&b| b == b',') {
            let mut parts = item.split(|&b| b == b';');
            let name = parts.next().unwrap_or_default().trim_ascii();
            let accepted = parts.all(|param| !is_zero_q(param.trim_ascii()));
            if same_coding(name, coding) {
                return Some(accepted);
            }
            if name == b"*" {
                star = Some(accepted);
            }
        }
        star
    }
}

/// Whether two coding names are the same coding (any case; `x-gzip` is `gzip`,
/// RFC 9110 8.4.1.3).
fn same_coding(a: &[u8], b: &[u8]) -> bool {
    let plain = |c: &[u8]| -> Vec<u8> {
        let lower = c.to_ascii_lowercase();
        match lower.as_slice() {
            b"x-gzip" => b"gzip".to_vec(),
            b"x-compress" => b"compress".to_vec(),
            _ => lower,
        }
    };
    !a.is_empty() && plain(a) == plain(b)
}

/// Whether a parameter is `q=0` (`0`, `0.`, `0.0`, …, any case of `q`).
fn is_zero_q(param: &[u8]) -> bool {
    let Some(value) = param
        .strip_prefix(b"q=")
        .or_else(|| param.strip_prefix(b"Q="))
    else {
        return false;
    };
    match value.trim_ascii() {
        [b'0'] => true,
        [b'0', b'.', rest @ ..] => rest.iter().all(|&d| d == b'0'),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wants(lines: &[&str]) -> Wants {
        Wants::of(lines.iter().map(|l| l.as_bytes()))
    }

    #[test]
    fn an_answer_goes_only_in_a_coding_the_browser_accepts() {
        let gzip = Some(&b"gzip"[..]);
        assert!(wants(&["gzip, deflate, br"]).accepts(gzip));
        assert!(wants(&["", "gzip"]).accepts(gzip), "any line may name it");
        assert!(wants(&["GZip;q=0.5"]).accepts(gzip));
        assert!(wants(&["x-gzip"]).accepts(gzip));
        assert!(wants(&["*"]).accepts(gzip));
        assert!(!wants(&[]).accepts(gzip), "no Accept-Encoding: identity");
        assert!(!wants(&[""]).accepts(gzip));
        assert!(!wants(&["br"]).accepts(gzip));
        assert!(!wants(&["gzip;q=0"]).accepts(gzip));
        assert!(!wants(&["gzip; q=0.000"]).accepts(gzip));
        assert!(!wants(&["*, gzip;q=0"]).accepts(gzip));
        assert!(!wants(&["*;q=0"]).accepts(gzip));
        assert!(!wants(&["gzip"]).accepts(Some(b"gzip, br")));
        // Identity: always, unless refused outright.
        for asked in [&[][..], &[""], &["gzip"], &["br;q=1"]] {
            assert!(wants(asked).accepts(None), "{asked:?}");
            assert!(wants(asked).accepts(Some(b"identity")), "{asked:?}");
        }
        assert!(!wants(&["identity;q=0"]).accepts(None));
        assert!(!wants(&["gzip, *;q=0"]).accepts(None));
        assert!(wants(&["identity, *;q=0"]).accepts(None));
    }
}
