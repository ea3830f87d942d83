//! Moodle's revisioned theme and JavaScript from the gateway's memory, on the real
//! site: after the first visitor, the next ones get Moodle's bytes and headers with
//! no PHP request at all; in theme designer mode (revision -1) nothing is kept.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::cluster::{admin_addr, config_for, Cluster, Gateway, Store};
use crate::site::Site;
use crate::student::{exchange, http_client};

/// Visitors after the first, each fetching every asset of the login page.
const LATER: usize = 5;

/// How many requests each node ran for one of `scripts` (prepend.php logs every
/// script it runs, one `<microseconds> <URI>` line each).
fn php_requests(cluster: &Cluster, scripts: &[String]) -> usize {
    let lines: usize = (cluster.all())
        .map(|node| {
            let log = std::fs::read_to_string(&node.requests).unwrap_or_default();
            (log.lines())
                .filter(|line| scripts.iter().any(|s| line.contains(s.as_str())))
                .count()
        })
        .sum();
    lines
}

/// Runs the scenario; `designer` turns on theme designer mode first.
pub async fn first_visits(designer: bool) {
    let site = Site::restore();
    if designer {
        // Designer mode for the theme, and JavaScript caching off as a theme developer
        // has it: Moodle then links revision -1 everywhere.
        site.sql("UPDATE mdl_config SET value = '1' WHERE name = 'themedesignermode'");
        site.sql(
            "DELETE FROM mdl_config WHERE name = 'cachejs'; \
             INSERT INTO mdl_config (name, value) VALUES ('cachejs', '0')",
        );
        // The config is cached in the dataroot's application cache: let it go.
        let _ = std::fs::remove_dir_all(site.dataroot.join("cache"));
    }
    let cluster = Cluster::start(&site, Store::Shared);
    let client = http_client();
    let assets = if designer {
        linked_assets(&cluster, &client).await
    } else {
        cluster.warm(&client).await
    };
    let revisioned = assets
        .iter()
        .all(|a| !a.contains("/-1/") && !a.contains("_debug"));
    assert_eq!(revisioned, !designer, "the login page links {assets:?}");
    let admin = admin_addr();
    let gateway = Gateway::start(&config_for(&cluster, admin), cluster.public, admin, &client);
    let host = [("host", cluster.public.to_string())];
    let direct = cluster.nodes[0].addr;
    let through = |path: &str| format!("{}{path}", cluster.wwwroot());
    // The first visitor's fetches fill the cache (or, in designer mode, nothing).
    for path in &assets {
        let page = exchange(&client, Method::GET, &through(path), &[], None).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = php_requests(&cluster, &assets);
    for _ in 0..LATER {
        for path in &assets {
            let page = exchange(&client, Method::GET, &through(path), &[], None).await;
            let moodle = exchange(
                &client,
                Method::GET,
                &format!("http://{direct}{path}"),
                &host,
                None,
            )
            .await;
            assert_eq!(page.status, StatusCode::OK, "{path}");
            assert_eq!(page.body, moodle.body, "Moodle's bytes for {path}");
            for name in ["content-type", "cache-control"] {
                assert_eq!(page.header(name), moodle.header(name), "{name} of {path}");
            }
            // The cache keeps Moodle's gzip copy and gunzips it for this client, which
            // sends no Accept-Encoding: the same tag, made weak as nginx's gunzip does.
            let opaque = |p: &crate::student::Page| {
                p.header("etag")
                    .map(|t| t.trim_start_matches("W/").to_owned())
            };
            assert_eq!(opaque(&page), opaque(&moodle), "etag of {path}");
            // A hit keeps the node's end-to-end headers, the test nodes' own
            // `X-Moodle-Node` included: `Age` says memory, and the count of PHP
            // requests below says that no node ran.
            if designer {
                assert!(page.header("age").is_none(), "{path} from a node")
            } else {
                assert!(page.header("age").is_some(), "{path} from memory")
            }
        }
    }
    // The direct fetches are PHP requests too: count only the gateway's.
    let direct_fetches = LATER * assets.len();
    let through_gateway = php_requests(&cluster, &assets) - before - direct_fetches;
    let expected = if designer { direct_fetches } else { 0 };
    eprintln!(
        "real-moodle assets (designer mode {designer}): {} assets, {LATER} later visitors, \
         {through_gateway} PHP requests for them through the gateway",
        assets.len()
    );
    assert_eq!(
        through_gateway, expected,
        "PHP requests for revisioned assets"
    );
    let metrics = gateway.metrics().await;
    let hits = metrics
        .get("moodle_gateway_asset_cache_hits_total")
        .copied()
        .unwrap_or(0.0);
    let answered_from_memory = if designer { 0 } else { direct_fetches };
    assert_eq!(
        hits as usize, answered_from_memory,
        "asset_cache_hits_total"
    );
}

/// The theme and JavaScript URLs (as paths) the login page links, whatever their
/// form: in designer mode Moodle links `styles_debug.php` and revision `-1`.
async fn linked_assets(cluster: &Cluster, client: &crate::student::HttpClient) -> Vec<String> {
    let host = [("host", cluster.public.to_string())];
    let url = format!("http://{}/login/index.php", cluster.nodes[0].addr);
    let page = exchange(client, Method::GET, &url, &host, None).await;
    let html = page.text().replace("\\/", "/");
    let wwwroot = cluster.wwwroot();
    // One of each script the page links.
    let scripts = ["/theme/styles", "/lib/javascript.php/", "/theme/image.php"];
    let mut found: Vec<String> = html
        .split(&format!("{wwwroot}/"))
        .skip(1)
        .map(|rest| rest.split(['"', '\'', ' ']).next().unwrap_or(""))
        .map(|path| format!("/{}", path.replace("&amp;", "&")))
        .filter(|path| scripts.iter().any(|s| path.starts_with(s)))
        // RequireJS's path table names modules without `.js`: not URLs a browser loads.
        .filter(|path| !path.starts_with("/lib/javascript.php/") || path.ends_with(".js"))
        .collect();
    found.sort();
    found.dedup_by(|a, b| scripts.iter().any(|s| a.starts_with(s) && b.starts_with(s)));
    assert!(
        found.len() >= 2,
        "the login page links its theme: {found:?}"
    );
    found
}

/// Moodle's all-AMD bundle, `lib/requirejs.php/REV/core/first.js` (3.2 MB plain,
/// some 650 KB gzipped), which every first visit loads: asked with gzip, without,
/// and with Chrome's line, it costs PHP one run, each browser gets it in a coding
/// it takes, and the plain bytes are the gzip copy's. And the login page, which
/// Moodle sends uncompressed, arrives gzipped when asked, smaller than plain.
pub async fn first_js_once() {
    let site = Site::restore();
    let cluster = Cluster::start(&site, Store::Shared);
    let client = http_client();
    cluster.warm(&client).await;
    let admin = admin_addr();
    let _gateway = Gateway::start(&config_for(&cluster, admin), cluster.public, admin, &client);
    let through = |path: &str| format!("{}{path}", cluster.wwwroot());
    let login = exchange(
        &client,
        Method::GET,
        &through("/login/index.php"),
        &[],
        None,
    )
    .await;
    let html = login.text().replace("\\/", "/");
    let rev = between(&html, "/lib/requirejs.php/", "/")
        .unwrap_or_else(|| panic!("the login page names requirejs.php's revision"));
    let path = format!("/lib/requirejs.php/{rev}/core/first.js");
    let before = php_requests(&cluster, std::slice::from_ref(&path));
    let asking = |coding: Option<&'static str>| {
        let url = through(&path);
        let client = client.clone();
        async move {
            let headers: Vec<(&str, String)> = coding
                .map(|c| ("accept-encoding", c.to_owned()))
                .into_iter()
                .collect();
            exchange(&client, Method::GET, &url, &headers, None).await
        }
    };
    let zipped = asking(Some("gzip")).await;
    assert_eq!(zipped.status, StatusCode::OK);
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    let plain = gunzip(&zipped.body);
    assert!(
        plain.len() > 2 << 20,
        "first.js is {} bytes plain",
        plain.len()
    );
    assert!(zipped.body.len() < 2 << 20, "its gzip fits an entry");
    let identity = asking(None).await;
    assert_eq!(identity.header("content-encoding"), None);
    assert_eq!(
        identity.body.as_ref(),
        plain.as_slice(),
        "the gzip copy, gunzipped"
    );
    assert!(identity.header("age").is_some(), "from memory");
    let chrome = asking(Some("gzip, deflate, br, zstd")).await;
    assert!(chrome.header("age").is_some(), "from memory");
    let through_gateway = php_requests(&cluster, std::slice::from_ref(&path)) - before;
    eprintln!(
        "real-moodle first.js: {} bytes plain, {} gzipped; {through_gateway} PHP run(s) for \
         three browsers",
        plain.len(),
        zipped.body.len()
    );
    assert_eq!(
        through_gateway, 1,
        "PHP runs for first.js through the gateway"
    );

    let asked = [("accept-encoding", "gzip, deflate".to_owned())];
    let login_zipped = exchange(
        &client,
        Method::GET,
        &through("/login/index.php"),
        &asked,
        None,
    )
    .await;
    assert_eq!(login_zipped.header("content-encoding"), Some("gzip"));
    let login_plain = gunzip(&login_zipped.body);
    assert!(String::from_utf8_lossy(&login_plain).contains("name=\"username\""));
    eprintln!(
        "real-moodle login page: {} bytes plain, {} gzipped",
        login.body.len(),
        login_zipped.body.len()
    );
    assert!(login_zipped.body.len() < login.body.len() / 2);
}

/// `zipped`, gunzipped as a browser does.
fn gunzip(zipped: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(zipped)
        .read_to_end(&mut plain)
        .expect("a whole gzip body");
    plain
}

/// The text of `html` between `start` and the next `end`.
fn between<'a>(html: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &html[html.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}
