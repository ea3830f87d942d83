//! The `[cache]` reader: whether the gateway keeps Moodle's revisioned assets, and
//! how much of them.

use super::check::{Checker, Section};
use super::CacheConfig;

const CACHE_KEYS: &str = "enabled max_bytes max_entry_bytes";

/// `cache.max_bytes` default: every theme's CSS, JavaScript, icons and fonts of a
/// site many times over.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// `cache.max_entry_bytes` default: boost's compiled CSS is several hundred KiB.
pub const DEFAULT_CACHE_ENTRY: u64 = 2 * 1024 * 1024;

impl Checker<'_> {
    /// `[cache]`; on, with the defaults, when absent.
    pub(super) fn cache(&mut self, root: &Section) -> CacheConfig {
        let s = self.open("cache".into(), root.get("cache"), CACHE_KEYS);
        let enabled = self.typed(&s, "enabled", "true or false", |v| v.as_bool());
        let max_bytes = self.size_in(&s, "max_bytes", 0..=16 << 30);
        let max_entry = self.size_in(&s, "max_entry_bytes", 1..=1 << 30);
        let config = CacheConfig {
            enabled: enabled.is_none_or(|(on, _)| on),
            max_bytes: max_bytes.as_ref().map_or(DEFAULT_CACHE_BYTES, |v| v.0),
            max_entry_bytes: max_entry.as_ref().map_or(DEFAULT_CACHE_ENTRY, |v| v.0),
        };
        if let Some((entry, span)) = max_entry.filter(|(entry, _)| *entry > config.max_bytes) {
            let message = format!(
                "{entry} bytes is more than cache.max_bytes ({}): one entry must fit",
                config.max_bytes
            );
            self.error(s.key("max_entry_bytes"), Some(span), message);
        }
        config
    }
}
