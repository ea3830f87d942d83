//! `[surge]` and `[cache]`: the caps, the line, the waiting room, the asset cache.
//! override, and every message with its line.

use super::*;

fn valid(doc: &str) -> Config {
    parse(&format!("{doc}\n{NODES}{DATA}"), None).unwrap()
}

#[test]
fn without_a_surge_section_no_node_has_a_cap_and_the_room_waits_for_one() {
    let c = valid("");
    assert_eq!(c.nodes[0].cap(&c.surge), 0, "today's behaviour");
    assert_eq!(c.surge.max_waiting, 10_000);
    assert_eq!(c.surge.aging, Duration::from_secs(10));
    assert_eq!(
        [
            c.surge.patience,
            c.surge.post_patience,
            c.surge.anonymous_patience,
            c.surge.newcomer_patience
        ],
        [60, 180, 45, 30].map(Duration::from_secs)
    );
    let room = c
        .surge
        .waiting_room
        .expect("on by default, inert without a cap");
    assert_eq!(room.opens_at, Duration::from_secs(5));
    assert_eq!(room.place_kept, Duration::from_secs(300));
    assert_eq!(room.cookie, "MoodleGatewayPlace");
    assert!(room.page.is_none(), "the built-in page");
}

#[test]
fn a_node_may_have_its_own_cap() {
    let text = format!(
        "[surge]\nmax_active = 8\nwaiting_room = false\n{NODES}\
         [[nodes]]\nname = \"web2\"\nurl = \"http://192.168.1.2\"\nmax_active = 3\n{DATA}"
    );
    let c = parse(&text, None).unwrap();
    let caps: Vec<usize> = c.nodes.iter().map(|n| n.cap(&c.surge)).collect();
    assert_eq!(caps, [8, 3]);
    assert!(c.surge.waiting_room.is_none());
}

#[test]
fn surge_mistakes_name_the_key_and_the_reason() {
    check(
        "[surge]\nmax_active = -1\nmax_waiting = 0\naging = \"11m\"\npatience = \"0s\"\n\
         waiting_room = \"yes\"\nroom_opens_at = \"1h\"\nroom_cookie = \"MoodleSession\"\n\
         room_page = \"missing.html\"\nqueue = 1",
        r#"
2: surge.max_active: must be between 0 and 100000, got -1
3: surge.max_waiting: must be between 1 and 1000000, got 0
4: surge.aging: must be between 1s and 10m
5: surge.patience: "0s" must be greater than 0
6: surge.waiting_room: expected true or false, found string
7: surge.room_opens_at: must be between 1s and 10m
8: surge.room_cookie: must not be the session cookie: the browser would lose its session
9: surge.room_page: cannot read /nonexistent/missing.html: no such file or directory (os error 2)
10: surge.queue: unknown key (expected one of: max_active, max_waiting, aging, patience, post_patience, anonymous_patience, newcomer_patience, quiz_starts, quiz_starts_yield_at, session_max_active, waiting_room, room_opens_at, place_kept, room_cookie, room_page)"#,
    );
    let node = format!("{NODES}max_active = \"8\"\n{DATA}");
    assert_eq!(
        errors(&node),
        "4: nodes[0].max_active: expected an integer, found string"
    );
}

#[test]
fn quiz_starts_are_auto_a_number_per_node_or_off_and_never_past_the_cap() {
    let config = |extra: &str| {
        parse(
            &format!("[surge]\nmax_active = 6\n{extra}\n{NODES}{DATA}"),
            None,
        )
    };
    let c = config("").unwrap();
    assert_eq!(c.surge.quiz_starts, QuizStarts::Auto);
    assert_eq!(c.surge.session_max_active, 6);
    assert_eq!(
        [0, 1, 3, 6].map(|cap| c.surge.start_share(cap)),
        [0, 1, 1, 3],
        "half the cap, at least one, none without a cap"
    );
    let c = config("quiz_starts = 10\nsession_max_active = 0").unwrap();
    assert_eq!([2, 20].map(|cap| c.surge.start_share(cap)), [2, 10]);
    assert_eq!(c.surge.session_max_active, 0);
    let c = config("quiz_starts = 0").unwrap();
    assert_eq!(c.surge.start_share(6), 0, "not paced");
    assert_eq!(
        errors(&format!(
            "[surge]\nquiz_starts = \"fast\"\nsession_max_active = -2\n{NODES}{DATA}"
        )),
        "2: surge.quiz_starts: expected \"auto\" or an integer, found string\n\
         3: surge.session_max_active: must be between 0 and 100000, got -2"
    );
    assert_eq!(
        errors(&format!("[surge]\nquiz_starts = -1\n{NODES}{DATA}")),
        "2: surge.quiz_starts: must be \"auto\" or between 0 and 100000, got -1"
    );
}

#[test]
fn the_sites_starts_give_way_at_a_ratio_of_the_turns_calm_or_not_at_all() {
    let config = |extra: &str| {
        parse(
            &format!("[surge]\nmax_active = 2\n{extra}\n{NODES}{DATA}"),
            None,
        )
    };
    let c = config("").unwrap();
    assert_eq!(c.surge.quiz_starts_yield_at, 1.5);
    assert!(c.describe().contains("while they take over 1.5 × it"));
    assert_eq!(
        config("quiz_starts_yield_at = 2")
            .unwrap()
            .surge
            .quiz_starts_yield_at,
        2.0
    );
    let off = config("quiz_starts_yield_at = 0").unwrap();
    assert_eq!(off.surge.quiz_starts_yield_at, 0.0);
    assert!(off
        .describe()
        .contains("the site's starts do not follow the page turns"));
    assert_eq!(
        errors(&format!(
            "[surge]\nquiz_starts_yield_at = 1.05\n{NODES}{DATA}"
        )),
        "2: surge.quiz_starts_yield_at: must be 0 (off) or between 1.1 and 100, got 1.05"
    );
    assert_eq!(
        errors(&format!(
            "[surge]\nquiz_starts_yield_at = \"fast\"\n{NODES}{DATA}"
        )),
        "2: surge.quiz_starts_yield_at: expected a number, found string"
    );
}

#[test]
fn the_room_page_is_read_once_and_must_be_small_utf8() {
    let dir = std::env::temp_dir().join(format!("mg-room-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let thai = "<p>ลำดับที่ {{place}}</p>";
    std::fs::write(dir.join("room.html"), thai).unwrap();
    std::fs::write(dir.join("latin1.html"), b"caf\xe9").unwrap();
    std::fs::write(dir.join("big.html"), vec![b'x'; 64 * 1024 + 1]).unwrap();
    let parse_in = |page: &str| {
        let text = format!("[surge]\nroom_page = {page:?}\n{NODES}{DATA}");
        Config::parse(&text, &dir, ConfigEnv::default())
    };
    let room = parse_in("room.html").unwrap().surge.waiting_room.unwrap();
    assert_eq!(room.page.as_deref(), Some(thai));
    let latin1 = parse_in("latin1.html").unwrap_err().to_string();
    assert!(
        latin1.contains("surge.room_page:") && latin1.contains("is not UTF-8"),
        "{latin1}"
    );
    let big = parse_in("big.html").unwrap_err().to_string();
    assert!(big.contains("is 65537 bytes: at most 65536"), "{big}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_asset_cache_is_on_by_default_and_its_bounds_name_their_key() {
    let c = valid("");
    assert!(c.cache.enabled);
    assert_eq!(
        (c.cache.max_bytes, c.cache.max_entry_bytes),
        (64 << 20, 2 << 20)
    );
    let c = valid("[cache]\nenabled = false\nmax_bytes = \"1MiB\"\nmax_entry_bytes = \"512KiB\"");
    assert_eq!(
        (c.cache.enabled, c.cache.max_bytes, c.cache.max_entry_bytes),
        (false, 1 << 20, 512 << 10)
    );
    check(
        "[cache]\nenabled = 1\nmax_bytes = \"1MiB\"\nmax_entry_bytes = \"2MiB\"\nsize = 3",
        r#"
2: cache.enabled: expected true or false, found integer
4: cache.max_entry_bytes: 2097152 bytes is more than cache.max_bytes (1048576): one entry must fit
5: cache.size: unknown key (expected one of: enabled, max_bytes, max_entry_bytes)"#,
    );
}

#[test]
fn compression_is_on_by_default_and_a_bad_value_names_its_key_and_why() {
    let c = valid("");
    let compression = &c.compression;
    assert!(compression.enabled && !compression.honour_no_transform);
    assert_eq!((compression.level, compression.min_length), (5, 1024));
    assert!(compression.types.iter().any(|t| t == "text/html"));
    assert!(compression.types.iter().any(|t| t == "image/svg+xml"));
    let c = valid(
        "[compression]\nenabled = false\nlevel = 9\nmin_length = \"0B\"\n\
         types = [\"Text/HTML\"]\nhonour_no_transform = true",
    );
    let compression = &c.compression;
    assert!(!compression.enabled && compression.honour_no_transform);
    assert_eq!((compression.level, compression.min_length), (9, 0));
    assert_eq!(compression.types, ["text/html"]);
    check(
        "[compression]\nlevel = 0\nmin_length = -1\ntypes = [\"text\", \"text/html\", \"TEXT/html\", 3]\nbrotli = true",
        r#"
2: compression.level: must be between 1 and 9, got 0
3: compression.min_length: must be between 0B and 1GiB, got -1
4: compression.types[0]: "text" is not a media type: write it as type/subtype, like "text/html", without parameters or wildcards
4: compression.types[2]: "text/html" is listed twice
4: compression.types[3]: expected a string, found integer
5: compression.brotli: unknown key (expected one of: enabled, level, min_length, types, honour_no_transform)"#,
    );
}
