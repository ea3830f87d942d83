use std::net::IpAddr;
use std::time::Duration;

use http::HeaderMap;

use super::*;
use crate::config::Rate;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn an_ipv6_client_is_keyed_by_its_64_and_an_ipv4_client_by_its_address() {
    let key = |text| address_key(ip(text));
    assert_eq!(
        key("2001:db8:1:2::1"),
        key("2001:db8:1:2:ffff:ffff:ffff:ffff")
    );
    assert_ne!(
        key("2001:db8:1:2::1"),
        key("2001:db8:1:3::1"),
        "another /64"
    );
    assert_ne!(key("192.0.2.1"), key("192.0.2.2"));
    assert_eq!(
        key("::ffff:192.0.2.1"),
        key("192.0.2.1"),
        "a dual-stack listener's IPv4 client is the same client"
    );
    assert_ne!(
        key("192.0.2.1"),
        key("::"),
        "IPv4 never shares a key with IPv6"
    );
}

#[test]
fn a_bucket_lets_its_burst_through_then_says_how_long_to_wait() {
    let rate = Rate {
        per_minute: 6,
        burst: 3,
    };
    let bucket = Bucket::new(rate, 1_000).unwrap();
    for _ in 0..3 {
        assert_eq!(bucket.check(&1u64), Ok(()));
    }
    let wait = bucket.check(&1u64).unwrap_err();
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    assert_eq!(
        bucket.check(&2u64),
        Ok(()),
        "another key has its own bucket"
    );
    assert!(Bucket::<u64>::new(Rate::OFF, 1_000).is_none(), "0 is off");
}

#[test]
fn past_max_keys_idle_keys_go_and_a_full_map_never_grows() {
    let rate = Rate {
        per_minute: 60,
        burst: 2,
    };
    let bucket = Bucket::new(rate, 1_000).unwrap();
    for key in 0..5_000u64 {
        // Two requests each: every key remembered is one that is not idle.
        let _ = bucket.check(&key);
        let _ = bucket.check(&key);
        assert!(bucket.len() <= 1_000, "{} keys at {key}", bucket.len());
    }
    assert_eq!(bucket.len(), 1_000);
    assert_eq!(
        bucket.check(&1_000_000),
        Ok(()),
        "a newcomer to a full map is judged on a full bucket"
    );
    assert_eq!(bucket.len(), 1_000, "and not remembered");
}

#[test]
fn a_limit_that_is_off_makes_no_bucket_and_no_limit_on_makes_none_at_all() {
    let mut config = crate::config::RateLimitsConfig::default();
    let buckets = Buckets::new(&config).unwrap();
    assert!(buckets.login_username.is_some(), "on by default");
    assert!(buckets.login_address.is_none() && buckets.pages_address.is_none());
    config.enabled = false;
    assert!(Buckets::new(&config).is_none());
}

#[test]
fn a_username_key_is_the_same_for_the_same_name_only() {
    let buckets = Buckets::new(&Default::default()).unwrap();
    assert_eq!(buckets.username_key("admin"), buckets.username_key("admin"));
    assert_ne!(
        buckets.username_key("admin"),
        buckets.username_key("admin2")
    );
}

fn forwarded(lines: &[&str]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in lines {
        headers.append("x-forwarded-for", line.parse().unwrap());
    }
    headers
}

#[test]
fn the_client_address_is_the_peer_unless_a_trusted_proxy_forwarded_it() {
    let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
    let headers = forwarded(&["203.0.113.9, 198.51.100.7"]);
    assert_eq!(
        client_address(&headers, ip("192.0.2.1"), &trusted),
        ip("192.0.2.1"),
        "an untrusted peer's X-Forwarded-For is its own invention"
    );
    assert_eq!(
        client_address(&headers, ip("10.0.0.5"), &trusted),
        ip("198.51.100.7"),
        "the address the trusted proxy saw, not what the client wrote before it"
    );
    let chained = forwarded(&["203.0.113.9", "198.51.100.7, 10.0.0.6"]);
    assert_eq!(
        client_address(&chained, ip("10.0.0.5"), &trusted),
        ip("198.51.100.7"),
        "trusted hops are skipped, over every line"
    );
    let junk = forwarded(&["nonsense"]);
    assert_eq!(
        client_address(&junk, ip("10.0.0.5"), &trusted),
        ip("10.0.0.5")
    );
}

#[test]
fn the_429_says_when_to_come_back_in_json_for_the_app_and_in_a_page_for_a_browser() {
    let wait = Duration::from_millis(2_100);
    let app = too_many(Limited::LoginPerUsername, wait, true);
    assert_eq!(app.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(app.headers()[RETRY_AFTER], "3");
    assert!(app.headers()[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let page = too_many(Limited::PagesPerAddress, Duration::from_millis(1), false);
    assert_eq!(page.headers()[RETRY_AFTER], "1", "never 0");
    assert!(page.headers()[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
}
