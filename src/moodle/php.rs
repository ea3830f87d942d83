//! How PHP reads the names and values of cookies and query strings: the decoding
//! that decides which cookie is the session and which parameter names the file.

/// Splits `name=value`; a bare `name` has an empty value, as in PHP.
pub(super) fn split_pair(pair: &[u8]) -> (&[u8], &[u8]) {
    match pair.iter().position(|&b| b == b'=') {
        Some(i) => (&pair[..i], &pair[i + 1..]),
        None => (pair, b""),
    }
}

/// Whether PHP registers a raw cookie or query name as `name`: it URL-decodes it, skips leading
/// spaces, stops at NUL and turns `.` and ` ` into `_` (so `Moodle%53ession` is `MoodleSession`).
pub(super) fn php_name_is(raw: &[u8], name: &str) -> bool {
    // Every request's cookies pass through here: a name with nothing PHP would
    // decode or replace is compared as it is.
    if !raw
        .iter()
        .any(|&b| matches!(b, b'%' | b'+' | b'.' | b' ' | 0))
    {
        return raw == name.as_bytes();
    }
    php_urldecode(raw)
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0)
        .map(|b| if b == b'.' || b == b' ' { b'_' } else { b })
        .eq(name.bytes())
}

/// PHP's `urldecode()`: `+` is a space, `%XX` a byte, a malformed `%` stays itself.
pub(super) fn php_urldecode(s: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *s.get(i)?;
        i += 1;
        let hex = |at: usize| (*s.get(at)? as char).to_digit(16);
        Some(match (b, hex(i), hex(i + 1)) {
            (b'+', ..) => b' ',
            (b'%', Some(h), Some(l)) => {
                i += 2;
                (h * 16 + l) as u8
            }
            _ => b,
        })
    })
}
