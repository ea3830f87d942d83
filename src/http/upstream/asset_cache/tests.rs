//! What may be kept, how an entry answers, the bound, and one fill per URL.

use super::*;
use http_body_util::BodyExt;

const CSS: &str = "public, max-age=7776000, immutable";

fn node(status: u16, headers: &[(&str, &str)], body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
        response
            .headers_mut()
            .append(name, HeaderValue::from_str(value).unwrap());
    }
    response
}

fn css() -> Response<Full<Bytes>> {
    node(
        200,
        &[
            ("cache-control", CSS),
            ("content-type", "text/css; charset=utf-8"),
            ("etag", "\"abc\""),
            ("last-modified", "Tue, 01 Dec 2026 09:00:00 GMT"),
            ("x-upstream", "web1"),
        ],
        "body { color: red }",
    )
}

/// Fills `key` with `response`, read to its end as the student would.
async fn fill(
    cache: &Arc<AssetCache>,
    key: &str,
    encoding: &str,
    response: Response<Full<Bytes>>,
) -> Bytes {
    let Lookup::Fill(fill) = cache.lookup(key, &asking(encoding), Role::First) else {
        panic!("expected to fill {key}");
    };
    fill.keep(response)
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
}

/// A request's `Accept-Encoding` of one line, or none for "".
fn asking(line: &str) -> Wants {
    Wants::of((!line.is_empty()).then_some(line.as_bytes()))
}

fn hit(cache: &Arc<AssetCache>, key: &str, encoding: &str) -> Option<Arc<Entry>> {
    match cache.lookup(key, &asking(encoding), Role::Head) {
        Lookup::Hit(entry) => Some(entry),
        _ => None,
    }
}

#[tokio::test]
async fn a_public_revisioned_answer_is_kept_as_moodle_sent_it_and_served_with_an_age() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let sent = fill(&cache, "h/theme/styles.php/boost/1/all", "gzip", css()).await;
    assert_eq!(
        sent.as_ref(),
        b"body { color: red }",
        "the student got it all"
    );
    let entry = hit(&cache, "h/theme/styles.php/boost/1/all", "br").expect("kept");
    let answer = entry.answer(&Method::GET, &HeaderMap::new());
    assert_eq!(answer.status(), 200);
    let h = answer.headers();
    assert_eq!(h["cache-control"], CSS);
    assert_eq!(h["etag"], "\"abc\"");
    assert_eq!(h["content-type"], "text/css; charset=utf-8");
    assert_eq!(h["content-length"], "19");
    assert_eq!(h["age"], "0");
    assert_eq!(h["x-upstream"], "web1", "the node's own lines are kept");
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.as_ref(), b"body { color: red }");
    let head = entry.answer(&Method::HEAD, &HeaderMap::new());
    assert_eq!(head.headers()["content-length"], "19");
    assert!(head
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    assert_eq!(
        (cache.now().hits, cache.now().fills, cache.now().entries),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_matching_condition_gets_304_and_another_gets_the_bytes() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    fill(&cache, "k", "", css()).await;
    let entry = hit(&cache, "k", "").unwrap();
    let asking = |name: &'static str, value: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(value));
        entry.answer(&Method::GET, &headers).status().as_u16()
    };
    assert_eq!(asking("if-none-match", "\"abc\""), 304);
    assert_eq!(
        asking("if-none-match", "\"x\", W/\"abc\""),
        304,
        "weak comparison, lists"
    );
    assert_eq!(asking("if-none-match", "*"), 304);
    assert_eq!(asking("if-none-match", "\"other\""), 200);
    assert_eq!(
        asking("if-modified-since", "Tue, 01 Dec 2026 09:00:00 GMT"),
        304
    );
    assert_eq!(
        asking("if-modified-since", "Mon, 30 Nov 2026 09:00:00 GMT"),
        200,
        "exact, like nginx"
    );
    let mut headers = HeaderMap::new();
    headers.insert("if-none-match", HeaderValue::from_static("\"abc\""));
    let not_modified = entry.answer(&Method::GET, &headers);
    assert_eq!(not_modified.headers()["etag"], "\"abc\"");
    assert!(!not_modified.headers().contains_key("content-type"));
}

#[tokio::test]
async fn an_answer_that_says_it_is_not_for_sharing_is_never_kept() {
    let never = [
        node(
            200,
            &[("cache-control", CSS), ("set-cookie", "MoodleSession=x")],
            "a",
        ),
        node(
            200,
            &[("cache-control", "private, max-age=7776000, immutable")],
            "a",
        ),
        node(
            200,
            &[("cache-control", "public, max-age=60, no-cache")],
            "a",
        ),
        node(
            200,
            &[("cache-control", "public, no-store, max-age=60")],
            "a",
        ),
        node(200, &[("cache-control", "public")], "a"),
        node(200, &[("expires", "Tue, 01 Dec 2099 09:00:00 GMT")], "a"),
        node(404, &[("cache-control", CSS)], "a"),
        node(303, &[("cache-control", CSS)], ""),
        node(200, &[("cache-control", CSS), ("vary", "Cookie")], "a"),
        node(200, &[("cache-control", CSS), ("vary", "*")], "a"),
    ];
    let cache = AssetCache::new(1 << 20, 1 << 16);
    for (i, response) in never.into_iter().enumerate() {
        let key = format!("k{i}");
        let sent = fill(&cache, &key, "", response).await;
        assert!(!sent.is_empty() || i == 7, "passed on to the student");
        assert!(hit(&cache, &key, "").is_none(), "answer {i} kept");
    }
    assert_eq!(cache.now().entries, 0);
}

/// A node's CSS as PHP's `zlib.output_compression` sends it.
fn zipped(headers: &[(&str, &str)]) -> Response<Full<Bytes>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(b"body { color: red }").unwrap();
    let mut response = node(200, headers, "");
    *response.body_mut() = Full::new(Bytes::from(encoder.finish().unwrap()));
    response
}

const GZIP_VARIES: [(&str, &str); 3] = [
    ("cache-control", CSS),
    ("vary", "Accept-Encoding"),
    ("content-encoding", "gzip"),
];

#[tokio::test]
async fn one_gzip_entry_serves_every_accept_encoding_gunzipped_where_gzip_is_not_taken() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    fill(&cache, "js", "identity", zipped(&GZIP_VARIES)).await;
    for asked in ["gzip, deflate, br", "identity", "", "br", "gzip;q=0"] {
        let entry = hit(&cache, "js", asked).unwrap_or_else(|| panic!("{asked:?}"));
        let answer = entry.answer_for(&Method::GET, &HeaderMap::new(), &asking(asked));
        let gzip = asked.starts_with("gzip,");
        assert_eq!(
            answer.headers().contains_key("content-encoding"),
            gzip,
            "{asked:?}"
        );
        assert_eq!(answer.headers()["vary"], "Accept-Encoding");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body == "body { color: red }", !gzip, "{asked:?}");
    }
    assert_eq!(cache.now().entries, 1, "one copy");
}

#[tokio::test]
async fn the_bound_lets_the_least_recently_used_go_and_a_too_large_answer_is_not_kept() {
    let cache = AssetCache::new(40, 20);
    let body = |text: &'static str| node(200, &[("cache-control", CSS)], text);
    fill(&cache, "a", "", body("aaaaaaaaaaaaaaaaaaa")).await;
    fill(&cache, "b", "", body("bbbbbbbbbbbbbbbbbbb")).await;
    assert!(hit(&cache, "a", "").is_some(), "a is now the more recent");
    fill(&cache, "c", "", body("ccccccccccccccccccc")).await;
    assert!(hit(&cache, "b", "").is_none(), "b went first");
    assert!(hit(&cache, "a", "").is_some() && hit(&cache, "c", "").is_some());
    assert_eq!((cache.now().evictions, cache.now().bytes), (1, 38));
    let sent = fill(
        &cache,
        "big",
        "",
        body("this one is longer than twenty bytes"),
    )
    .await;
    assert_eq!(sent.len(), 36, "streamed whole to the student");
    assert!(hit(&cache, "big", "").is_none(), "but not kept");
    cache.purge();
    assert_eq!((cache.now().entries, cache.now().bytes), (0, 0));
}

#[tokio::test]
async fn while_one_request_fills_a_url_the_others_wait_and_then_read_it_from_memory() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let Lookup::Fill(filler) = cache.lookup("u", &asking(""), Role::First) else {
        panic!()
    };
    let Lookup::Wait(mut waiting) = cache.lookup("u", &asking(""), Role::First) else {
        panic!("one fill at a time")
    };
    assert!(
        matches!(cache.lookup("u", &asking(""), Role::Head), Lookup::Pass),
        "a HEAD never waits"
    );
    let body = filler.keep(css()).into_body();
    assert!(!*waiting.borrow(), "not done before the body ends");
    body.collect().await.unwrap();
    waiting.changed().await.unwrap();
    assert!(matches!(
        cache.lookup("u", &asking(""), Role::Waited),
        Lookup::Hit(_)
    ));
    assert_eq!(
        cache.now().misses,
        2,
        "the filler and the HEAD asked a node"
    );
}

#[tokio::test]
async fn a_fill_that_keeps_nothing_sends_every_waiter_to_the_node_at_once() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let Lookup::Fill(filler) = cache.lookup("u", &asking(""), Role::First) else {
        panic!()
    };
    let Lookup::Wait(mut waiting) = cache.lookup("u", &asking(""), Role::First) else {
        panic!()
    };
    let cookie = node(200, &[("cache-control", CSS), ("set-cookie", "a=b")], "x");
    drop(filler.keep(cookie));
    waiting.changed().await.unwrap();
    // The first waiter back fills again; the next does not wait behind it.
    assert!(matches!(
        cache.lookup("u", &asking(""), Role::Waited),
        Lookup::Fill(_)
    ));
    let Lookup::Fill(again) = cache.lookup("u", &asking(""), Role::Waited) else {
        panic!()
    };
    let Lookup::Pass = cache.lookup("u", &asking(""), Role::Waited) else {
        panic!("no second wait")
    };
    drop(again);
}

#[tokio::test]
async fn a_body_with_a_length_is_kept_once_that_much_came_as_hyper_stops_polling_there() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let Lookup::Fill(fill) = cache.lookup("k", &asking(""), Role::First) else {
        panic!()
    };
    let mut sized = css();
    sized
        .headers_mut()
        .insert("content-length", HeaderValue::from_static("19"));
    let mut body = fill.keep(sized).into_body();
    // hyper reads the one frame a length says there is, and never asks again.
    body.frame().await.unwrap().unwrap();
    assert!(hit(&cache, "k", "").is_some());
    let Lookup::Fill(fill) = cache.lookup("short", &asking(""), Role::First) else {
        panic!()
    };
    let mut short = css();
    short
        .headers_mut()
        .insert("content-length", HeaderValue::from_static("40"));
    fill.keep(short).into_body().collect().await.unwrap();
    assert!(hit(&cache, "short", "").is_none(), "cut short: not kept");
}

#[tokio::test]
async fn two_accept_encoding_lines_fill_the_one_entry_every_browser_shares() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    // An empty line, then `gzip`: the browser takes gzip, and gets the node's bytes.
    let Lookup::Fill(fill) = cache.lookup("js", &Wants::of([&b""[..], b"gzip"]), Role::First)
    else {
        panic!()
    };
    let sent = fill.keep(zipped(&GZIP_VARIES)).into_body().collect().await;
    assert_ne!(
        sent.unwrap().to_bytes(),
        "body { color: red }",
        "gzip as it came"
    );
    let entry = hit(&cache, "js", "").expect("one entry for every browser");
    let plain = entry.answer_for(&Method::GET, &HeaderMap::new(), &asking(""));
    assert!(!plain.headers().contains_key("content-encoding"));
    let body = plain.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "body { color: red }");
}

#[tokio::test]
async fn a_browser_that_takes_no_gzip_filling_the_entry_gets_it_gunzipped_and_gzip_is_kept() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let Lookup::Fill(fill) = cache.lookup("js", &asking(""), Role::First) else {
        panic!()
    };
    let mut request = HeaderMap::new();
    fill.ask(&mut request);
    assert_eq!(
        request["accept-encoding"], "gzip",
        "the node is asked for gzip"
    );
    let answer = fill.keep(zipped(&[
        ("cache-control", CSS),
        ("etag", "\"js\""),
        ("content-encoding", "gzip"),
    ]));
    assert!(!answer.headers().contains_key("content-encoding"));
    assert_eq!(answer.headers()["etag"], "W/\"js\"");
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "body { color: red }");
    let entry = hit(&cache, "js", "gzip").expect("kept");
    let kept = entry.answer(&Method::GET, &HeaderMap::new());
    assert_eq!(kept.headers()["content-encoding"], "gzip");
    assert_eq!(kept.headers()["etag"], "\"js\"", "kept as the node sent it");
}

#[tokio::test]
async fn a_coding_the_gateway_cannot_undo_goes_only_to_a_browser_that_accepts_it() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    // A web server that answered brotli to a request for gzip, and said no `Vary`.
    let brotli = node(
        200,
        &[("cache-control", CSS), ("content-encoding", "br")],
        "br",
    );
    fill(&cache, "css", "br", brotli).await;
    assert!(hit(&cache, "css", "br").is_some());
    for refusing in ["", "identity", "gzip", "br;q=0", "*;q=0"] {
        assert!(hit(&cache, "css", refusing).is_none(), "{refusing:?}");
    }
    assert!(matches!(
        cache.lookup("css", &asking("gzip"), Role::First),
        Lookup::Pass
    ));
}

#[tokio::test]
async fn a_hit_carries_the_nodes_end_to_end_lines_and_none_of_its_hop_by_hop_ones() {
    let cache = AssetCache::new(1 << 20, 1 << 16);
    let kept = [
        ("x-content-type-options", "nosniff"),
        ("access-control-allow-origin", "*"),
        ("content-security-policy", "default-src 'self'"),
        ("strict-transport-security", "max-age=31536000"),
        ("accept-ranges", "none"),
        ("x-site", "moodle.example.edu"),
        ("server", "Apache"),
        ("content-language", "en"),
    ];
    let dropped = [
        ("connection", "x-hop"),
        ("x-hop", "1"),
        ("keep-alive", "timeout=5"),
        ("proxy-authenticate", "Basic"),
        ("proxy-connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("trailer", "x-checksum"),
        ("upgrade", "h2c"),
        ("te", "trailers"),
        ("age", "50"),
        ("date", "Tue, 01 Dec 2026 09:00:00 GMT"),
    ];
    let lines: Vec<_> = [("cache-control", CSS)]
        .into_iter()
        .chain(kept)
        .chain(dropped)
        .collect();
    fill(&cache, "k", "", node(200, &lines, "body")).await;
    let answer = hit(&cache, "k", "")
        .unwrap()
        .answer(&Method::GET, &HeaderMap::new());
    let h = answer.headers();
    for (name, value) in kept {
        assert_eq!(
            h.get(name).map(|v| v.to_str().unwrap()),
            Some(value),
            "{name}"
        );
    }
    for (name, _) in dropped.into_iter().filter(|(n, _)| *n != "age") {
        assert!(!h.contains_key(name), "{name}");
    }
    assert_eq!(h["age"], "0", "its own age, not the node's");
    assert_eq!(h["content-length"], "4");
}
