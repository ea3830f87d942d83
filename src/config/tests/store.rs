//! `[store]`: the memory default, a Redis by URL or by Sentinels, the shared
//! secret's three places, and every mistake named by its key.

use super::*;

const SECRET: &str = "a-site-wide-store-secret-0123456789abcd";

fn parse_with(text: &str, store_secret: Option<&str>) -> Result<Config, ConfigErrors> {
    let env = ConfigEnv {
        admin_token: None,
        route_secret: None,
        store_secret: store_secret.map(String::from),
        store_master_password: None,
        store_sentinel_password: None,
    };
    Config::parse(
        &format!("{text}\n{NODES}{DATA}"),
        Path::new("/nonexistent"),
        env,
    )
}

fn redis(text: &str) -> RedisConfig {
    match parse_with(text, None).unwrap().store {
        StoreConfig::Redis(redis) => *redis,
        StoreConfig::Memory => panic!("not a redis store"),
    }
}

#[test]
fn without_a_store_section_the_table_is_the_gateways_own() {
    assert_eq!(parse_with("", None).unwrap().store, StoreConfig::Memory);
    let memory = parse_with("[store]\nkind = \"memory\"\n", None).unwrap();
    assert_eq!(memory.store, StoreConfig::Memory);
}

#[test]
fn a_redis_store_by_url_gets_its_defaults() {
    let r = redis(&format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://:pw@10.0.0.5:6379/2\"\nname = \"gw-a\"\nsecret = \"{SECRET}\"\n"
    ));
    assert_eq!(
        r.target,
        RedisTarget::Url("redis://:pw@10.0.0.5:6379/2".into())
    );
    assert_eq!(
        (r.name.as_str(), r.prefix.as_str(), r.secret_source),
        ("gw-a", "moodle-gateway:", "store.secret")
    );
    assert_eq!(r.secret, SECRET.as_bytes());
    assert_eq!(
        (r.timeout, r.connect_timeout),
        (Duration::from_millis(50), Duration::from_secs(1))
    );
    // The password and the secret stay out of logs and `check`.
    let shown = format!("{r:?}");
    assert!(
        !shown.contains(":pw@") && !shown.contains(SECRET),
        "{shown}"
    );
}

#[test]
fn a_redis_store_by_sentinels_and_the_secret_from_the_environment() {
    let text = "[store]\nkind = \"redis\"\nsentinels = [\"redis://10.0.0.6:26379\", \"redis://10.0.0.7:26379\"]\n\
                master = \"moodle\"\nname = \"gw-b\"\nprefix = \"site2:\"\ntimeout = \"20ms\"\n";
    let c = parse_with(text, Some(SECRET)).unwrap();
    let StoreConfig::Redis(r) = c.store else {
        panic!("not redis")
    };
    assert_eq!(
        r.target,
        RedisTarget::Sentinel {
            sentinels: vec![
                "redis://10.0.0.6:26379".into(),
                "redis://10.0.0.7:26379".into()
            ],
            master: "moodle".into(),
            master_password: None,
            sentinel_password: None,
        }
    );
    assert_eq!(
        (r.prefix.as_str(), r.timeout),
        ("site2:", Duration::from_millis(20))
    );
    assert_eq!(r.secret_source, STORE_SECRET_ENV);
}

#[test]
fn every_store_mistake_names_its_key() {
    let cases = [
        ("[store]\nkind = \"etcd\"\n", "2: store.kind: unknown kind \"etcd\": use \"memory\" or \"redis\""),
        (
            "[store]\nkind = \"redis\"\nname = \"gw\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n",
            "1: store.url: kind = \"redis\" needs url (like \"redis://10.0.0.5:6379\"), or sentinels with master",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://h\"\nname = \"gw\"\n",
            "1: store.secret: no store secret: set secret, secret_file or MOODLE_GATEWAY_STORE_SECRET",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://h\"\nsentinels = [\"redis://s\"]\nname = \"gw\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n",
            "4: store.sentinels: set either url, or sentinels with master, not both",
        ),
        (
            "[store]\nkind = \"redis\"\nsentinels = [\"redis://s\"]\nname = \"gw\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n",
            "1: store.master: missing: the name the Sentinels monitor the primary under",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://h\"\nname = \"gw\"\nsecret = \"0123456789abcdef0123456789abcdef\"\nconnect_timeout = \"5ms\"\n",
            "6: store.connect_timeout: must be between 10ms and 1m",
        ),
        ("[store]\nprefix = \"x:\"\n", "2: store.prefix: only used with kind = \"redis\": set kind, or remove this key"),
    ];
    for (text, want) in cases {
        let errors = parse_with(text, None).unwrap_err().to_string();
        assert_eq!(errors, want, "for {text:?}");
    }
}

#[test]
fn check_describes_a_redis_store_without_its_password_or_secret() {
    let c = parse_with(
        &format!("[store]\nkind = \"redis\"\nurl = \"redis://:pw@10.0.0.5\"\nname = \"gw-a\"\nsecret = \"{SECRET}\"\n"),
        None,
    )
    .unwrap();
    let described = c.describe();
    assert!(
        described.contains(
            "table store: redis at redis://:***@10.0.0.5, as gateway \"gw-a\", keys under \"moodle-gateway:\"; \
             requests wait at most 50ms for it (secret: set, from store.secret)"
        ),
        "{described}"
    );
    assert!(!described.contains(SECRET));
}

const SENTINEL: &str = "[store]\nkind = \"redis\"\nsentinels = [\"redis://10.0.0.6:26379\"]\n\
                        master = \"moodle\"\nname = \"gw\"\n";

fn sentinel_passwords(text: &str, env: &ConfigEnv) -> (Option<String>, Option<String>) {
    let text = format!("{SENTINEL}secret = \"{SECRET}\"\n{text}\n{NODES}{DATA}");
    let c = Config::parse(&text, Path::new("/nonexistent"), env.clone()).unwrap();
    let StoreConfig::Redis(redis) = c.store else {
        panic!("not redis")
    };
    match redis.target {
        RedisTarget::Sentinel {
            master_password,
            sentinel_password,
            ..
        } => (master_password, sentinel_password),
        other => panic!("not behind Sentinels: {other:?}"),
    }
}

#[test]
fn behind_sentinels_the_primarys_and_the_sentinels_passwords_are_two_settings() {
    let none = ConfigEnv::default();
    assert_eq!(sentinel_passwords("", &none), (None, None));
    let both = "master_password = \"primary-pw\"\nsentinel_password = \"sentinel-pw\"";
    assert_eq!(
        sentinel_passwords(both, &none),
        (Some("primary-pw".into()), Some("sentinel-pw".into()))
    );
    // The environment beats the inline key, as for every other secret.
    let env = ConfigEnv {
        store_master_password: Some("from-env".into()),
        ..ConfigEnv::default()
    };
    assert_eq!(
        sentinel_passwords(both, &env),
        (Some("from-env".into()), Some("sentinel-pw".into()))
    );
    assert_eq!(
        sentinel_passwords("", &env),
        (Some("from-env".into()), None)
    );
}

#[test]
fn the_primarys_password_is_read_from_its_file_relative_to_the_config() {
    let dir = std::env::temp_dir().join(format!("mgw-master-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("primary.password"), "from-the-file\n").unwrap();
    let text = format!(
        "{SENTINEL}secret = \"{SECRET}\"\nmaster_password_file = \"primary.password\"\n\n{NODES}{DATA}"
    );
    let c = Config::parse(&text, &dir, ConfigEnv::default());
    std::fs::remove_dir_all(&dir).unwrap();
    let StoreConfig::Redis(r) = c.unwrap().store else {
        panic!("not redis")
    };
    let RedisTarget::Sentinel {
        master_password, ..
    } = &r.target
    else {
        panic!("not behind Sentinels")
    };
    assert_eq!(master_password.as_deref(), Some("from-the-file"));
    let described = format!("{r:?} {}", r.target.redacted());
    assert!(!described.contains("from-the-file"), "{described}");
    assert!(
        described.contains("(primary's password: set, Sentinels' password: none)"),
        "{described}"
    );
}

#[test]
fn every_sentinel_password_mistake_names_its_key() {
    let url = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://h\"\nname = \"gw\"\nsecret = \"{SECRET}\"\n"
    );
    let sentinel = format!("{SENTINEL}secret = \"{SECRET}\"\n");
    let cases = [
        (
            format!("{url}master_password = \"pw\"\n"),
            "6: store.master_password: only used with sentinels: with url, the password goes in it \
             (redis://:password@host:6379)",
        ),
        (
            format!("{url}sentinel_password_file = \"f\"\n"),
            "6: store.sentinel_password_file: only used with sentinels: with url, the password goes \
             in it (redis://:password@host:6379)",
        ),
        (
            format!("{sentinel}master_password = \"\"\n"),
            "7: store.master_password: is empty: remove it if the primary's password has none",
        ),
        (
            format!("{sentinel}sentinel_password = \"a\"\nsentinel_password_file = \"f\"\n"),
            "8: store.sentinel_password_file: set either sentinel_password or sentinel_password_file, not both",
        ),
        (
            format!("{sentinel}master_password_file = \"missing.password\"\n"),
            "7: store.master_password_file: cannot read /nonexistent/missing.password: no such file or directory (os error 2)",
        ),
    ];
    for (text, want) in cases {
        let errors = parse_with(&text, None).unwrap_err().to_string();
        assert_eq!(errors, want, "for {text:?}");
    }
}
