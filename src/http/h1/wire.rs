//! HTTP/1.1 on the wire, the pieces both of the gateway's hand-written sides share:
//! the queue of bytes one `writev` sends (a head written in place, then body
//! pieces with their chunk framing, none of them copied), and the numbers a head
//! carries.
//!
//! The node side ([`crate::http::h1::client`]) writes requests and reads answers; the
//! student side ([`crate::http::h1::server`]) reads requests and writes answers. Both
//! move bodies as the `Bytes` they arrived in.

use std::io::{self, IoSlice};

use bytes::{Buf, Bytes};
use http::header::{HeaderName, HeaderValue};

/// The bytes queued for a socket: a head, then up to `PARTS` body pieces, written
/// together with one `writev`.
pub(crate) struct Outgoing<const PARTS: usize> {
    /// The head, written in place; its allocation is kept for the next message on
    /// the connection unless the head was unusually large.
    pub head: Vec<u8>,
    /// How much of `head` has been written.
    head_at: usize,
    parts: [Bytes; PARTS],
    len: usize,
    /// Body bytes queued in `parts`.
    queued: usize,
}

impl<const PARTS: usize> Default for Outgoing<PARTS> {
    fn default() -> Self {
        Self {
            head: Vec::new(),
            head_at: 0,
            parts: std::array::from_fn(|_| Bytes::new()),
            len: 0,
            queued: 0,
        }
    }
}

impl<const PARTS: usize> Outgoing<PARTS> {
    /// The most slices [`Self::slices`] fills: the head and every part.
    pub(crate) const SLICES: usize = PARTS + 1;
    /// A head allocation larger than this (a very large cookie) is not kept for the
    /// next message.
    const HEAD_KEPT: usize = 4096;

    /// Parts that can still be queued.
    pub(crate) fn room(&self) -> usize {
        PARTS - self.len
    }

    /// Whether no body part is queued (the head may be).
    pub(crate) fn no_parts(&self) -> bool {
        self.len == 0
    }

    /// Body bytes queued.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// Whether nothing is left to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0 && self.head_at == self.head.len()
    }

    /// Queues a body piece after what is queued.
    pub(crate) fn push(&mut self, bytes: Bytes) {
        debug_assert!(self.len < PARTS);
        self.queued += bytes.len();
        self.parts[self.len] = bytes;
        self.len += 1;
    }

    /// Forgets everything queued.
    pub(crate) fn clear(&mut self) {
        self.head.clear();
        self.head_at = 0;
        for part in &mut self.parts[..self.len] {
            *part = Bytes::new();
        }
        self.len = 0;
        self.queued = 0;
    }

    /// Fills `slices` with what is left to write, in order; returns how many.
    pub(crate) fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let head = &self.head[self.head_at..];
        let mut count = 0;
        if !head.is_empty() {
            slices[0] = IoSlice::new(head);
            count = 1;
        }
        for part in &self.parts[..self.len] {
            slices[count] = IoSlice::new(part);
            count += 1;
        }
        count
    }

    /// Drops the first `written` bytes.
    pub(crate) fn advance(&mut self, mut written: usize) {
        let head = self.head.len() - self.head_at;
        if head > 0 {
            if written < head {
                self.head_at += written;
                return;
            }
            written -= head;
            self.head.clear();
            self.head_at = 0;
            if self.head.capacity() > Self::HEAD_KEPT {
                self.head = Vec::new();
            }
        }
        self.queued -= written;
        let mut done = 0;
        for part in &mut self.parts[..self.len] {
            if written >= part.len() {
                written -= part.len();
                done += 1;
            } else {
                part.advance(written);
                break;
            }
        }
        self.parts[..self.len].rotate_left(done);
        for part in &mut self.parts[self.len - done..self.len] {
            *part = Bytes::new();
        }
        self.len -= done;
    }
}

/// Writes a function that gives the `HeaderName` of each spelling listed, matched
/// byte for byte (the compiler turns the `match` into a switch on the length), and
/// `None` for any other; and, for its test, the list of those spellings. A header
/// name spelt as the peer usually spells it skips the general parse, which folds
/// the case of every byte and looks the name up.
macro_rules! known_names {
    ($(#[$doc:meta])* fn $known:ident, $spellings:ident; $($spelt:literal => $name:expr,)*) => {
        $(#[$doc])*
        fn $known(name: &[u8]) -> Option<HeaderName> {
            Some(match name {
                $($spelt => $name,)*
                _ => return None,
            })
        }

        /// Every spelling the function above knows.
        #[cfg(test)]
        const $spellings: &[&[u8]] = &[$($spelt),*];
    };
}

pub(crate) use known_names;

/// `n` in decimal, written into `digits`.
pub(crate) fn itoa(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

/// A chunk's size line: its length in hexadecimal and CRLF.
pub(crate) fn chunk_line(len: usize) -> Bytes {
    Bytes::from(format!("{len:x}\r\n"))
}

/// A `Content-Length` value: one number, or the same number repeated in a list.
/// Read digit by digit (every answer has one, and `str::parse` after a UTF-8
/// check and a split cost ten times as much).
pub(crate) fn parse_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for item in value.split(|&b| b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() {
            return None;
        }
        let mut n: u64 = 0;
        for &digit in item {
            if !digit.is_ascii_digit() {
                return None;
            }
            n = n.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        }
        if length.is_some_and(|seen| seen != n) {
            return None;
        }
        length = Some(n);
    }
    length
}

/// One header line, as both sides write them: the name as `http` keeps it (lower
/// case), the value as it came.
pub(crate) fn line(head: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    head.extend_from_slice(name.as_str().as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value.as_bytes());
    head.extend_from_slice(b"\r\n");
}

/// Whether a header name (any case, as a parser accepted it) is `lower`, a name of
/// lower-case letters and dashes. Setting bit 5 lowers a letter and leaves a dash
/// as it is; of the other bytes only CR would become a dash, and no name holds
/// one. Every line of every answer is held against half a dozen names: this way
/// costs about 230 instructions a page less than `eq_ignore_ascii_case`, which
/// lowers both sides.
pub(crate) fn name_is(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower.iter().all(|&b| b.is_ascii_lowercase() || b == b'-'));
    name.len() == lower.len() && name.iter().zip(lower).all(|(&b, &l)| b | 0x20 == l)
}

/// Whether a comma-separated header value lists `token` (any case).
pub(crate) fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Whether a `Connection` value names other lines (anything but `close` and
/// `keep-alive`), which a proxy removes along with it.
pub(crate) fn names_lines(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|token| {
            !(token.is_empty()
                || token.eq_ignore_ascii_case(b"close")
                || token.eq_ignore_ascii_case(b"keep-alive"))
        })
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked` (any case): the
/// last coding is the one that frames the body.
pub(crate) fn ends_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether a failed write means the peer closed its side of the connection.
pub(crate) fn closed(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_parts_advance_across_their_boundaries() {
        let mut out = Outgoing::<3>::default();
        out.head.extend_from_slice(b"head");
        out.push(Bytes::from_static(b"5\r\n"));
        out.push(Bytes::from_static(b"hello"));
        let left = |out: &Outgoing<3>| {
            let mut slices = [IoSlice::new(&[]); Outgoing::<3>::SLICES];
            let count = out.slices(&mut slices);
            slices[..count]
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect::<Vec<u8>>()
        };
        out.advance(2);
        assert_eq!(left(&out), b"ad5\r\nhello");
        out.advance(4);
        assert_eq!(left(&out), b"\nhello");
        assert!(
            out.head.is_empty(),
            "the head is written and its buffer emptied"
        );
        out.advance(6);
        assert!(out.is_empty());
        assert_eq!(out.room(), 3);
        assert_eq!(out.queued(), 0);
    }

    #[test]
    fn names_are_matched_in_any_case_and_only_letter_for_letter() {
        assert!(name_is(b"Content-Length", b"content-length"));
        assert!(name_is(b"X-ACCEL-", b"x-accel-"));
        for other in [&b"content_length"[..], b"content-lengt", b"Content-Length "] {
            assert!(!name_is(other, b"content-length"), "{other:?}");
        }
        // Byte by byte: a letter matches its two cases only, a dash itself and CR,
        // which no parsed name holds.
        for byte in 0..=255u8 {
            let letter = name_is(&[byte], b"q");
            assert_eq!(letter, byte == b'q' || byte == b'Q', "{byte}");
            assert_eq!(
                name_is(&[byte], b"-"),
                byte == b'-' || byte == b'\r',
                "{byte}"
            );
        }
    }

    #[test]
    fn tokens_are_found_in_lists_in_any_case() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(has_token(b"Keep-Alive", b"keep-alive"));
        assert!(!has_token(b"closed", b"close"));
        assert!(ends_chunked(b"gzip, Chunked "));
        assert!(!ends_chunked(b"chunked, gzip"));
    }
}
