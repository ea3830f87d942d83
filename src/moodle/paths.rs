//! A request path as the web server hands it to PHP, and the URL forms in which
//! Moodle's file scripts serve a SCORM package file (the book's "Moodle behind a proxy",
//! docs/src/moodle.md, lists them all under "SCORM URL forms").

use std::borrow::Cow;
use std::cmp::Ordering;

use percent_encoding::percent_decode_str;

use super::php::{php_name_is, php_urldecode, split_pair};
use super::AmbiguousPath;

/// The scripts that serve stored files through `get_file_argument()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileScript {
    /// `pluginfile.php` and `webservice/pluginfile.php`: `/{ctx}/{component}/…`.
    Plugin,
    /// `tokenpluginfile.php`: `/{token}/{ctx}/{component}/…`.
    Token,
    /// Moodle 1.9 `file.php`: `/{courseid}/moddata/scorm/…`.
    Legacy,
}

const FILE_SCRIPTS: [(&str, FileScript); 4] = [
    ("/pluginfile.php", FileScript::Plugin),
    ("/webservice/pluginfile.php", FileScript::Plugin),
    ("/tokenpluginfile.php", FileScript::Token),
    ("/file.php", FileScript::Legacy),
];

/// The path as the web server hands it to PHP: decoded, `.`/`..` resolved, `//` collapsed.
/// Borrows when there is nothing to do, because this runs on every proxied request.
pub(super) fn normalise_path(raw: &str) -> Result<Cow<'_, str>, AmbiguousPath> {
    // `*` (OPTIONS *) and other non-path targets name no script a node could run.
    if !raw.starts_with('/') {
        return Err(AmbiguousPath);
    }
    // One pass over the bytes: refused bytes, escapes, `//`, `.` and `..` segments.
    // Most bytes are none of the four that matter, and a table says so in one load
    // where a `match` took some eleven instructions a byte.
    let bytes = raw.as_bytes();
    let mut plain = true;
    for (i, &b) in bytes.iter().enumerate() {
        if !NOTABLE[usize::from(b)] {
            continue;
        }
        match b {
            b'%' => plain = false,
            b'/' => {
                if let [b'/', ..]
                | [b'.']
                | [b'.', b'/', ..]
                | [b'.', b'.']
                | [b'.', b'.', b'/', ..] = bytes[i + 1..]
                {
                    plain = false;
                }
            }
            // NUL and `\`.
            _ => return Err(AmbiguousPath),
        }
    }
    if plain {
        return Ok(Cow::Borrowed(raw));
    }
    let decoded = decode_path(raw)?;
    if decoded.contains(['\0', '\\']) {
        return Err(AmbiguousPath);
    }
    resolve_dots(&decoded).map(Cow::Owned)
}

/// The bytes `normalise_path` must look at: NUL and `\` (refused), `%` (an
/// escape) and `/` (a segment that may be empty, `.` or `..`).
static NOTABLE: [bool; 256] = {
    let mut table = [false; 256];
    table[0] = true;
    table[b'\\' as usize] = true;
    table[b'%' as usize] = true;
    table[b'/' as usize] = true;
    table
};

/// Percent-decodes a path. An encoded `/` is refused because servers disagree on whether it
/// separates segments; a malformed escape because they answer it 400 or pass it through.
fn decode_path(raw: &str) -> Result<Cow<'_, str>, AmbiguousPath> {
    let bytes = raw.as_bytes();
    for (i, _) in raw.match_indices('%') {
        match bytes.get(i + 1..i + 3) {
            Some([b'2', b'f' | b'F']) => return Err(AmbiguousPath),
            Some([h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {}
            _ => return Err(AmbiguousPath),
        }
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| AmbiguousPath)
}

/// Resolves `.`, `..` and empty segments, keeping a trailing slash (a directory index).
fn resolve_dots(path: &str) -> Result<String, AmbiguousPath> {
    let mut out = String::with_capacity(path.len());
    let mut last = "";
    for seg in path.split('/') {
        last = seg;
        match seg {
            "" | "." => {}
            ".." => out.truncate(out.rfind('/').ok_or(AmbiguousPath)?),
            _ => {
                out.push('/');
                out.push_str(seg);
            }
        }
    }
    if out.is_empty() || matches!(last, "" | "." | "..") {
        out.push('/');
    }
    Ok(out)
}

/// The file-serving script `rel` runs, with its path info.
pub(super) fn file_script(rel: &str) -> Option<(FileScript, &str)> {
    FILE_SCRIPTS.iter().find_map(|&(script, kind)| {
        let info = rel.strip_prefix(script)?;
        (info.is_empty() || info.starts_with('/')).then_some((kind, info))
    })
}

/// Whether the file Moodle will serve belongs to SCORM, following `get_file_argument()`:
/// path info wins only when the raw URI contains `/pluginfile.php/` and the path info has more
/// than two segments; otherwise a non-empty `file` parameter does.
pub(super) fn serves_scorm(
    script: FileScript,
    info: &str,
    raw_path: &str,
    query: Option<&str>,
) -> Result<bool, AmbiguousPath> {
    const FORCED: &str = "/pluginfile.php/";
    let in_uri = raw_path.contains(FORCED) || query.is_some_and(|q| q.contains(FORCED));
    // More than two segments: two slashes or more between them.
    let slashes = info.trim_start_matches('/').bytes().filter(|&b| b == b'/');
    let forced = in_uri && slashes.count() >= 2;
    let param = match query {
        Some(q) if !forced => file_parameter(q)?,
        _ => None,
    };
    let relative = match &param {
        Some(file) if file.bytes().any(|b| !dropped_by_moodle(b)) => file.as_str(),
        _ => info,
    };
    let mut segs = moodle_segments(relative);
    if script == FileScript::Token {
        segs.next();
    }
    Ok(match script {
        FileScript::Plugin | FileScript::Token => {
            matches!((segs.next(), segs.next()), (Some(ctx), Some(component))
                if is_number(ctx) && cleaned_is(component, "mod_scorm"))
        }
        FileScript::Legacy => {
            matches!((segs.next(), segs.next(), segs.next()), (Some(course), Some(m), Some(s))
                if is_number(course) && cleaned_is(m, "moddata") && cleaned_is(s, "scorm"))
        }
    })
}

/// The last `file` query parameter (PHP keeps the last), decoded. Moodle drops `..` segments
/// where the web server would resolve them, and reads `\` as `/`: both refused.
fn file_parameter(query: &str) -> Result<Option<String>, AmbiguousPath> {
    let Some(raw) = query
        .split('&')
        .map(|pair| split_pair(pair.as_bytes()))
        .rfind(|(name, _)| php_name_is(name, "file"))
        .map(|(_, value)| value)
    else {
        return Ok(None);
    };
    let value = String::from_utf8(php_urldecode(raw).collect()).map_err(|_| AmbiguousPath)?;
    if value.contains(['\0', '\\']) || value.contains("..") {
        return Err(AmbiguousPath);
    }
    Ok(Some(value))
}

/// Characters `PARAM_PATH` deletes from every segment of a file path (so `mod_s:corm` is
/// `mod_scorm` to Moodle). All are ASCII, so a path's bytes can be cleaned one by one:
/// no byte of a multi-byte character is ever dropped.
fn dropped_by_moodle(b: u8) -> bool {
    b.is_ascii_control() || matches!(b, b'&' | b'<' | b'>' | b'"' | b'`' | b'|' | b'\'' | b':')
}

/// Whether `segment` is `name` once `PARAM_PATH` has cleaned it. Cleaning only
/// shortens, so a segment as long as `name` must be it byte for byte, and only a
/// longer one (rare: it holds a dropped character) is cleaned. Every request for a
/// file asks this some ten times.
fn cleaned_is(segment: &str, name: &str) -> bool {
    debug_assert!(!name.bytes().any(dropped_by_moodle));
    let (segment, name) = (segment.as_bytes(), name.as_bytes());
    match segment.len().cmp(&name.len()) {
        Ordering::Less => false,
        Ordering::Equal => segment == name,
        Ordering::Greater => segment
            .iter()
            .copied()
            .filter(|&b| !dropped_by_moodle(b))
            .eq(name.iter().copied()),
    }
}

/// Whether `file_pluginfile()` reads the segment as a context (or course) id: it takes
/// `(int)` of it, and PHP's cast skips leading spaces and a `+`, then reads the leading
/// digits, so `1x`, ` 1`, `+1`, `1.5` and `1e1` all name context 1 (or 10); `0`, `-1`
/// and `x1` name none, and Moodle answers them 404 from any node.
fn is_number(segment: &str) -> bool {
    let mut bytes = segment
        .bytes()
        .filter(|&b| !dropped_by_moodle(b))
        .skip_while(|&b| b == b' ')
        .peekable();
    bytes.next_if_eq(&b'+');
    bytes
        .take_while(u8::is_ascii_digit)
        .any(|digit| digit != b'0')
}

/// The segments `file_pluginfile()` explodes, after `PARAM_PATH` has emptied and dropped some.
fn moodle_segments(path: &str) -> impl Iterator<Item = &str> {
    super::split_at(path, b'/')
        .filter(|s| !cleaned_is(s, "") && !cleaned_is(s, ".") && !cleaned_is(s, ".."))
}
