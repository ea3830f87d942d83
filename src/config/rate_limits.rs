//! The `[rate_limits]` reader: how many login attempts and anonymous page views
//! the gateway lets through before it answers `429`, per address and per username.
//!
//! The defaults are chosen so that they can never refuse a school: a whole school
//! often reaches the site from one NAT address, hundreds of students logging in
//! within a minute at the start of a lesson, so nothing is limited per address
//! unless the admin says so. Per username is on: one person never tries their own
//! password ten times in a burst, while a botnet spread over thousands of addresses
//! tries one admin account from all of them.

use super::check::{Checker, Section};

const RATE_LIMITS_KEYS: &str =
    "enabled max_keys login_per_address login_per_username pages_per_address";
const RATE_KEYS: &str = "per_minute burst";

/// Highest `per_minute` and `burst`: beyond it a limit limits nothing.
const MAX_RATE: i64 = 1_000_000;

/// `rate_limits.max_keys` default: the addresses (or usernames) each limit
/// remembers at once, some 5 MB for the three limits together when full.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// `rate_limits.login_per_username` default: ten tries at once, then one every
/// 12 seconds, per account, from all addresses together.
pub const DEFAULT_LOGIN_PER_USERNAME: Rate = Rate {
    per_minute: 5,
    burst: 10,
};

/// One limit: a bucket of `burst` requests, refilled at `per_minute`; 0 is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests per minute once the burst is spent; 0: not limited.
    pub per_minute: u32,
    /// Requests let through at once after a quiet spell.
    pub burst: u32,
}

impl Rate {
    /// No limit.
    pub const OFF: Rate = Rate {
        per_minute: 0,
        burst: 0,
    };

    /// Whether this limit limits anything.
    pub fn is_on(self) -> bool {
        self.per_minute > 0
    }
}

/// `[rate_limits]`: login attempts and anonymous page views, limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitsConfig {
    /// `enabled`: default true (only `login_per_username` is on by default).
    pub enabled: bool,
    /// `max_keys`: addresses or usernames each limit remembers; idle ones are
    /// forgotten first. Default 100,000.
    pub max_keys: usize,
    /// `login_per_address`: login attempts per client address (IPv6 per /64). Off.
    pub login_per_address: Rate,
    /// `login_per_username`: login attempts per username. 5 a minute, burst 10.
    pub login_per_username: Rate,
    /// `pages_per_address`: page views without a logged-in session, per client
    /// address (IPv6 per /64). Off.
    pub pages_per_address: Rate,
}

impl Default for RateLimitsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_keys: DEFAULT_MAX_KEYS,
            login_per_address: Rate::OFF,
            login_per_username: DEFAULT_LOGIN_PER_USERNAME,
            pages_per_address: Rate::OFF,
        }
    }
}

impl RateLimitsConfig {
    /// Whether any request can be limited at all.
    pub fn is_on(&self) -> bool {
        self.enabled
            && (self.login_per_address.is_on()
                || self.login_per_username.is_on()
                || self.pages_per_address.is_on())
    }
}

impl Checker<'_> {
    /// `[rate_limits]`; the defaults when absent.
    pub(super) fn rate_limits(&mut self, root: &Section) -> RateLimitsConfig {
        let s = self.open(
            "rate_limits".into(),
            root.get("rate_limits"),
            RATE_LIMITS_KEYS,
        );
        let defaults = RateLimitsConfig::default();
        let enabled = self.typed(&s, "enabled", "true or false", |v| v.as_bool());
        let max_keys = self.int_in(&s, "max_keys", 1_000..=10_000_000);
        RateLimitsConfig {
            enabled: enabled.is_none_or(|(on, _)| on),
            max_keys: max_keys.map_or(defaults.max_keys, |n| n as usize),
            login_per_address: self.rate(&s, "login_per_address", defaults.login_per_address),
            login_per_username: self.rate(&s, "login_per_username", defaults.login_per_username),
            pages_per_address: self.rate(&s, "pages_per_address", defaults.pages_per_address),
        }
    }

    /// `{ per_minute = N, burst = M }`: `burst` defaults to a minute's worth.
    fn rate(&mut self, s: &Section, name: &str, default: Rate) -> Rate {
        if s.get(name).is_none() {
            return default;
        }
        let r = self.open(s.key(name), s.get(name), RATE_KEYS);
        self.require(&r, "per_minute");
        let per_minute = self.int_in(&r, "per_minute", 0..=MAX_RATE);
        let burst = self.int_in(&r, "burst", 1..=MAX_RATE);
        let per_minute = per_minute.map_or(default.per_minute, |n| n as u32);
        let burst = burst.map_or(per_minute.max(1), |n| n as u32);
        Rate { per_minute, burst }
    }
}
