//! The slow-link measure: what a student on a slow mobile link waits for on a first
//! visit to the real site, with the gateway's compression off and on.
//!
//! A first visit, as a browser with an empty cache makes it (Chrome's
//! `Accept-Encoding`, six connections at once for a page's assets): the login page
//! and every theme, JavaScript and image asset it links, plus RequireJS's
//! `core/first.js` that its script loads; then, logged in, the course page and
//! whatever it links that the login page did not. For each: the bytes the student
//! received (heads and bodies as they came over the wire) and the time.
//!
//! The link: a relay in this process between the student's connections and the
//! gateway, which holds every chunk for half the round trip and lets the bytes of
//! all the student's connections through one line at the link's rate, each way on
//! its own (`SLOW_LINK`, default "1mbit 100ms": 1 Mbit/s, a 100 ms round trip). At
//! such a rate the line, not TCP's slow start, bounds a page (its bandwidth-delay
//! product, 12.5 KB, is below a first window), so a relay is a fair link; the
//! kernel's `netem` would be truer but is not in every kernel (this machine's has
//! none). `SLOW_LINK=` (empty) measures on loopback, where only the bytes mean
//! anything. Traffic between the gateway and the nodes is not slowed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::cluster::{admin_addr, config_for, Cluster, Gateway, Store};
use crate::site::Site;
use crate::student::{between, exchange, http_client, Browser, HttpClient, Page, BROWSER_LINES};

/// What Chrome accepts.
const CHROME_ENCODINGS: &str = "gzip, deflate, br, zstd";
/// A browser's connections to one host at once.
const CONNECTIONS: usize = 6;
/// The scripts whose answers need no session: what a page links for its looks.
const ASSETS: [&str; 6] = [
    "/theme/styles.php/",
    "/theme/image.php/",
    "/theme/font.php/",
    "/theme/yui_combo.php",
    "/lib/javascript.php/",
    "/lib/requirejs.php/",
];

/// One page of a first visit, measured.
#[derive(Default, Clone, Copy)]
struct Load {
    /// The page's own answer: bytes over the wire, and whether it came compressed.
    html: u64,
    html_encoding: Option<&'static str>,
    /// The page and its assets, all together.
    bytes: u64,
    requests: usize,
    took: Duration,
}

/// Both pages of one side.
struct Side {
    name: &'static str,
    login: Load,
    course: Load,
}

/// Runs the visit with compression off, then on, on one site, and prints the table.
pub fn slow_link() {
    let site = Site::restore();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let link = std::env::var("SLOW_LINK").unwrap_or_else(|_| "1mbit 100ms".to_owned());
    let sides = runtime.block_on(async {
        let cluster = Cluster::start(&site, Store::Shared);
        let client = http_client();
        cluster.warm(&client).await;
        let front = match Link::parse(&link) {
            Some(link) => link.start(cluster.public).await,
            None => cluster.public,
        };
        let mut sides = Vec::new();
        for (name, compress) in [("compression off", false), ("compression on", true)] {
            let admin = admin_addr();
            let config = format!(
                "{}\n[compression]\nenabled = {compress}\n",
                config_for(&cluster, admin)
            );
            let gateway = Gateway::start(&config, cluster.public, admin, &client);
            // A first visitor fills the asset cache: the student measured comes after.
            first_visit(&cluster, front, &site, 0).await;
            let (login, course) = first_visit(&cluster, front, &site, 1).await;
            drop(gateway);
            sides.push(Side {
                name,
                login,
                course,
            });
        }
        sides
    });
    print(&sides, Link::parse(&link).map(|_| link.as_str()));
}

/// One student's first visit: the login page with its assets, a login, the course
/// page with the assets not fetched yet. Which assets a page links is read from an
/// uncompressed copy fetched first, untimed (the timed one may come in any encoding
/// Chrome takes).
async fn first_visit(
    cluster: &Cluster,
    front: SocketAddr,
    site: &Site,
    student: usize,
) -> (Load, Load) {
    let client = http_client();
    let wwwroot = cluster.wwwroot();
    let mut fetched = Vec::new();
    let mut probe = Browser::new(client.clone(), &wwwroot);
    let login_assets = linked(
        &probe.get("/login/index.php").await.pop().unwrap().text(),
        &wwwroot,
    );

    let mut b = Browser::round_robin(client.clone(), &wwwroot, &[front], 0);
    let started = Instant::now();
    let page = b.send(Method::GET, "/login/index.php", &encodings()).await;
    assert_eq!(page.status, StatusCode::OK, "the login page");
    let login = load(
        &client,
        front,
        &wwwroot,
        &page,
        login_assets,
        &mut fetched,
        started,
    )
    .await;

    let form = b.get("/login/index.php").await.pop().unwrap();
    let token = between(&form.text(), "name=\"logintoken\" value=\"", "\"")
        .expect("the form has a logintoken")
        .to_string();
    let account = &site.data.students[student];
    let fields = [
        ("anchor", ""),
        ("logintoken", token.as_str()),
        ("username", account.username.as_str()),
        ("password", account.password.as_str()),
    ];
    let hops = b.post("/login/index.php", &fields).await;
    assert!(
        hops.last().unwrap().request.starts_with("GET /my/"),
        "logged in"
    );
    b.logged_in = true;

    let course = format!("/course/view.php?id={}", site.data.course_id);
    let course_assets = linked(&b.get(&course).await.pop().unwrap().text(), &wwwroot);
    let started = Instant::now();
    let page = b.send(Method::GET, &course, &encodings()).await;
    assert_eq!(page.status, StatusCode::OK, "the course page");
    let course = load(
        &client,
        front,
        &wwwroot,
        &page,
        course_assets,
        &mut fetched,
        started,
    )
    .await;
    assert!(b.lost.is_empty(), "lost sessions: {:?}", b.lost);
    (login, course)
}

/// The rest of a page's load once its HTML is in: every one of `assets` not in
/// `fetched` yet, six at a time.
async fn load(
    client: &HttpClient,
    front: SocketAddr,
    wwwroot: &str,
    page: &Page,
    mut assets: Vec<String>,
    fetched: &mut Vec<String>,
    started: Instant,
) -> Load {
    assets.retain(|a| !fetched.contains(a));
    fetched.extend(assets.iter().cloned());
    let html_bytes = wire_bytes(page);
    let mut bytes = html_bytes;
    let mut lanes = JoinSet::new();
    for lane in 0..CONNECTIONS {
        let mine: Vec<String> = assets
            .iter()
            .skip(lane)
            .step_by(CONNECTIONS)
            .cloned()
            .collect();
        let (client, host) = (
            client.clone(),
            wwwroot.trim_start_matches("http://").to_owned(),
        );
        lanes.spawn(async move {
            let mut bytes = 0;
            for path in mine {
                let url = format!("http://{front}{path}");
                let mut headers = encodings();
                headers.push(("host", host.clone()));
                headers.extend(BROWSER_LINES.map(|(n, v)| (n, v.to_string())));
                let asset = exchange(&client, Method::GET, &url, &headers, None).await;
                assert_eq!(asset.status, StatusCode::OK, "{path}");
                bytes += wire_bytes(&asset);
            }
            bytes
        });
    }
    while let Some(lane) = lanes.join_next().await {
        bytes += lane.unwrap();
    }
    Load {
        html: html_bytes,
        html_encoding: encoding(page),
        bytes,
        requests: 1 + assets.len(),
        took: started.elapsed(),
    }
}

/// Chrome's `Accept-Encoding`, or `ACCEPT_ENCODING` to compare one coding with another.
fn encodings() -> Vec<(&'static str, String)> {
    let accepted = std::env::var("ACCEPT_ENCODING").unwrap_or_else(|_| CHROME_ENCODINGS.to_owned());
    vec![("accept-encoding", accepted)]
}

/// The sessionless assets a page links, and RequireJS's `core/first.js`, which its
/// script asks for at the page's JavaScript revision.
fn linked(html: &str, wwwroot: &str) -> Vec<String> {
    let html = html.replace("\\/", "/").replace("&amp;", "&");
    let mut found: Vec<String> = (html.split(wwwroot).skip(1))
        .map(|rest| rest.split(['"', '\'', ' ', ')', '<']).next().unwrap_or(""))
        .filter(|path| ASSETS.iter().any(|a| path.starts_with(a)))
        // RequireJS's path table names modules without `.js`: not URLs a browser loads.
        .filter(|path| !path.starts_with("/lib/javascript.php/") || path.ends_with(".js"))
        // A base the page's script builds on (`yui_combo.php?`, `image.php/…/`).
        .filter(|path| !path.ends_with('/') && !path.ends_with('?'))
        .map(str::to_owned)
        .collect();
    if let Some(rev) = between(&html, "\"jsrev\":\"", "\"") {
        found.push(format!("/lib/requirejs.php/{rev}/core/first.js"));
    }
    found.sort();
    found.dedup();
    found
}

fn encoding(page: &Page) -> Option<&'static str> {
    match page.header("content-encoding")? {
        "gzip" => Some("gzip"),
        "br" => Some("br"),
        "zstd" => Some("zstd"),
        "deflate" => Some("deflate"),
        _ => Some("other"),
    }
}

/// An answer's bytes as they crossed the link: status line, header lines, body
/// (chunk framing aside, a few bytes per chunk).
fn wire_bytes(page: &Page) -> u64 {
    let head: usize = (page.headers.iter())
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    (head + "HTTP/1.1 200 OK\r\n\r\n".len() + page.body.len()) as u64
}

/// A slow link: its rate in bits a second, and its round trip.
#[derive(Clone, Copy)]
struct Link {
    bits_per_second: u64,
    round_trip: Duration,
}

/// The most a link carries as one piece: an Ethernet frame's payload.
const SEGMENT: usize = 1460;

impl Link {
    /// "RATE DELAY" ("1mbit 100ms", "512kbit 300ms"); `None` for "" (no link).
    fn parse(text: &str) -> Option<Link> {
        let (rate, round_trip) = text.trim().split_once(' ')?;
        let (digits, unit) = rate.split_at(rate.find(|c: char| !c.is_ascii_digit())?);
        let scale = match unit {
            "kbit" => 1_000,
            "mbit" => 1_000_000,
            _ => panic!("SLOW_LINK's rate {rate:?}: a number of kbit or mbit"),
        };
        Some(Link {
            bits_per_second: digits.parse::<u64>().expect("SLOW_LINK's rate") * scale,
            round_trip: humantime::parse_duration(round_trip.trim()).expect("SLOW_LINK's delay"),
        })
    }

    /// Listens on a port of its own and carries every connection to `to` over this
    /// link; the address to connect to.
    async fn start(self, to: SocketAddr) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        // One line each way, shared by all the student's connections.
        let (down, up) = (Line::default(), Line::default());
        tokio::spawn(async move {
            while let Ok((student, _)) = listener.accept().await {
                let Ok(gateway) = TcpStream::connect(to).await else {
                    continue;
                };
                let (student_in, student_out) = student.into_split();
                let (gateway_in, gateway_out) = gateway.into_split();
                tokio::spawn(self.carry(student_in, gateway_out, up.clone()));
                tokio::spawn(self.carry(gateway_in, student_out, down.clone()));
            }
        });
        at
    }

    /// Carries one direction of one connection: each piece waits for the line, takes
    /// its time on it at the rate, and arrives half a round trip after that.
    async fn carry(
        self,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        line: Line,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let deliver = tokio::spawn(async move {
            while let Some((at, piece)) = rx.recv().await {
                tokio::time::sleep_until(at.into()).await;
                if to.write_all(&piece).await.is_err() {
                    return;
                }
            }
            let _ = to.shutdown().await;
        });
        let mut buf = vec![0; SEGMENT];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let on_the_line = Duration::from_secs_f64((n * 8) as f64 / self.bits_per_second as f64);
            let sent = line.take(on_the_line);
            if tx
                .send((sent + self.round_trip / 2, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
        drop(tx);
        let _ = deliver.await;
    }
}

/// When one direction of the link is next free.
#[derive(Clone, Default)]
struct Line(Arc<Mutex<Option<Instant>>>);

impl Line {
    /// Books the line for `time` from when it is next free; when the piece is off it.
    fn take(&self, time: Duration) -> Instant {
        let mut free = self.0.lock().unwrap();
        let now = Instant::now();
        let start = free.map_or(now, |f| f.max(now));
        let done = start + time;
        *free = Some(done);
        done
    }
}

fn print(sides: &[Side], link: Option<&str>) {
    eprintln!(
        "\nmeasure_slow_link: a first visit (Accept-Encoding: {}, {CONNECTIONS} connections), the link: {}",
        encodings()[0].1,
        link.map_or_else(|| "loopback (SLOW_LINK is empty: only the bytes mean anything)".to_owned(), |l| format!("{l} (rate each way, round trip)"))
    );
    eprintln!(
        "{:<16} {:>12} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10} {:>9}",
        "side",
        "login HTML",
        "login all",
        "requests",
        "login s",
        "course HTML",
        "course all",
        "requests",
        "course s"
    );
    let kb = |b: u64| format!("{:.1} KB", b as f64 / 1000.0);
    for side in sides {
        let (l, c) = (side.login, side.course);
        let html = |load: Load| match load.html_encoding {
            Some(coding) => format!("{} ({coding})", kb(load.html)),
            None => kb(load.html),
        };
        eprintln!(
            "{:<16} {:>12} {:>10} {:>10} {:>9.2} {:>12} {:>10} {:>10} {:>9.2}",
            side.name,
            html(l),
            kb(l.bytes),
            l.requests,
            l.took.as_secs_f64(),
            html(c),
            kb(c.bytes),
            c.requests,
            c.took.as_secs_f64(),
        );
    }
    if let [off, on] = sides {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        eprintln!(
            "{:<16} {:>12.3} {:>10.3} {:>10} {:>9.3} {:>12.3} {:>10.3} {:>10} {:>9.3}\n",
            "on / off",
            ratio(on.login.html as f64, off.login.html as f64),
            ratio(on.login.bytes as f64, off.login.bytes as f64),
            "",
            ratio(on.login.took.as_secs_f64(), off.login.took.as_secs_f64()),
            ratio(on.course.html as f64, off.course.html as f64),
            ratio(on.course.bytes as f64, off.course.bytes as f64),
            "",
            ratio(on.course.took.as_secs_f64(), off.course.took.as_secs_f64()),
        );
    }
}
