//! The `[compression]` reader: whether the gateway compresses the answers a node
//! left uncompressed, how hard, which, and whether `no-transform` stops it.

use toml::de::DeValue;

use super::check::{Checker, Section};
use super::CompressionConfig;

const COMPRESSION_KEYS: &str = "enabled level min_length types honour_no_transform";

/// `compression.level` default: gzip's 5 takes Moodle's login page from 22 KB to
/// 6 KB at a fraction of a millisecond; 9 gains a few percent more for twice the CPU.
pub const DEFAULT_LEVEL: u32 = 5;
/// `compression.min_length` default: below a kilobyte the headers outweigh what
/// compression saves (a TCP segment carries 1.4 KB either way).
pub const DEFAULT_MIN_LENGTH: u64 = 1024;
/// `compression.types` default: what Moodle sends as text (pages, AJAX and web
/// service JSON, JavaScript, CSS, SVG icons, XML feeds and manifests).
pub const DEFAULT_TYPES: [&str; 12] = [
    "text/html",
    "text/css",
    "text/plain",
    "text/xml",
    "text/javascript",
    "application/javascript",
    "application/x-javascript",
    "application/json",
    "application/xml",
    "application/rss+xml",
    "application/manifest+json",
    "image/svg+xml",
];

impl Checker<'_> {
    /// `[compression]`; on, with the defaults, when absent.
    pub(super) fn compression(&mut self, root: &Section) -> CompressionConfig {
        let s = self.open(
            "compression".into(),
            root.get("compression"),
            COMPRESSION_KEYS,
        );
        let enabled = self.typed(&s, "enabled", "true or false", |v| v.as_bool());
        let level = self.int_in(&s, "level", 1..=9);
        let min_length = self.size_in(&s, "min_length", 0..=1 << 30);
        let honour = self.typed(&s, "honour_no_transform", "true or false", |v| v.as_bool());
        CompressionConfig {
            enabled: enabled.is_none_or(|(on, _)| on),
            level: level.map_or(DEFAULT_LEVEL, |n| n as u32),
            min_length: min_length.map_or(DEFAULT_MIN_LENGTH, |v| v.0),
            types: self.media_types(&s),
            honour_no_transform: honour.is_some_and(|(on, _)| on),
        }
    }

    /// `compression.types`: media types, lowercased, no repeats, no parameters.
    fn media_types(&mut self, s: &Section) -> Vec<String> {
        let Some((items, _)) = self.typed(s, "types", "an array", |v| v.as_array()) else {
            return DEFAULT_TYPES.map(str::to_owned).to_vec();
        };
        let mut types: Vec<String> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let key = format!("{}[{i}]", s.key("types"));
            let media = match item.get_ref() {
                DeValue::String(raw) => media_type(raw),
                v => Err(format!("expected a string, found {}", v.type_str())),
            };
            let media = media.and_then(|m| match types.contains(&m) {
                true => Err(format!("{m:?} is listed twice")),
                false => Ok(m),
            });
            match media {
                Ok(m) => types.push(m),
                Err(m) => self.error(key, Some(item.span()), m),
            }
        }
        types
    }
}

/// A media type as `types` lists it: `type/subtype`, lowercased.
fn media_type(raw: &str) -> Result<String, String> {
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match raw.split_once('/') {
        Some((kind, sub)) if token(kind) && token(sub) => Ok(raw.to_ascii_lowercase()),
        _ => Err(format!(
            "{raw:?} is not a media type: write it as type/subtype, like \"text/html\", \
             without parameters or wildcards"
        )),
    }
}
