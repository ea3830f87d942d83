//! One student's visit as a browser makes it, through the gateway only: theme assets,
//! login, dashboard, course, the SCORM player and its files and tracking, a file
//! resource, logout. Every step checks what Moodle and the gateway's admin API say.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::Value;

use crate::cluster::{Cluster, Gateway, Store};
use crate::export::pool_path;
use crate::redis::RedisServer;
use crate::site::{Site, StoredFile, StudentAccount};
use crate::student::{between, encode, requests, Browser, HttpClient, Page};

/// What a journey needs.
pub struct Env {
    // Field order is drop order: the gateways first, then Redis, MariaDB last.
    /// One gateway on wwwroot's address; or several behind wwwroot's one name (DNS
    /// round robin), sharing `redis`, the first on wwwroot's address.
    pub gateways: Vec<Gateway>,
    pub redis: Option<RedisServer>,
    pub cluster: Cluster,
    pub site: Site,
    pub client: HttpClient,
    /// Sessionless theme and JavaScript paths the login page links to.
    pub assets: Vec<String>,
    /// Browsers opened so far: with several gateways, each starts at the next one
    /// (a resolver rotates the addresses it hands out).
    pub browsers: AtomicUsize,
}

impl Env {
    /// The gateway on wwwroot's address (the only one, but in the round-robin tests).
    pub fn gateway(&self) -> &Gateway {
        &self.gateways[0]
    }

    /// A new student's browser: to wwwroot, or taking the gateways in turn.
    pub fn browser(&self) -> Browser {
        let wwwroot = self.cluster.wwwroot();
        if self.gateways.len() == 1 {
            return Browser::new(self.client.clone(), &wwwroot);
        }
        let addresses: Vec<_> = self.gateways.iter().map(|g| g.public).collect();
        let first = self.browsers.fetch_add(1, Ordering::Relaxed);
        Browser::round_robin(self.client.clone(), &wwwroot, &addresses, first)
    }

    /// How long a gateway may take to learn what another one changed (pub/sub, a few
    /// milliseconds): nothing at all with one gateway, whose table changes before
    /// the answer leaves.
    pub fn patience(&self) -> Duration {
        match self.gateways.len() {
            1 => Duration::ZERO,
            _ => Duration::from_secs(2),
        }
    }
}

/// Asks every gateway for `id`'s entry until `holds` is true of it, within
/// [`Env::patience`]; panics naming `what` and the last answer.
pub async fn on_every_gateway(
    env: &Env,
    id: &str,
    what: &str,
    holds: impl Fn(&Option<Value>) -> bool,
) {
    for gateway in &env.gateways {
        let started = Instant::now();
        loop {
            let entry = gateway.lookup(id).await;
            if holds(&entry) {
                break;
            }
            assert!(
                started.elapsed() < env.patience(),
                "{what}, on the gateway on {}: {entry:?}",
                gateway.public
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// How one student's visit went.
#[derive(Debug)]
pub struct Outcome {
    pub username: String,
    /// The node the gateway dealt the student's first session to.
    pub dealt: String,
    pub requests: usize,
    /// Each way the student's logged-in session was lost (should be none).
    pub lost: Vec<String>,
    /// The anonymous session left after logout.
    pub after_logout: String,
    /// What the student's SCORM tracking POST saved: (element, value).
    pub tracked: Vec<(String, String)>,
    /// Offload mode: each file fetch the gateway must have made from the export for
    /// this student, as (pool path, status).
    pub fetched: Vec<(String, u16)>,
}

/// Where a file must come from, and what the journey expects of the export.
struct Files<'a> {
    env: &'a Env,
    /// The student's node (offload mode: the one that authorises cookie requests).
    node: &'a str,
    fetched: Vec<(String, u16)>,
}

/// Runs one student's whole visit.
pub async fn journey(env: &Env, account: &StudentAccount) -> Outcome {
    let mut b = env.browser();

    // The theme and JavaScript a page pulls need no session: none is started.
    for path in &env.assets {
        let page = b.get_bare(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert_eq!(page.sets_session(), None, "{path} started a session");
    }

    let LoggedIn {
        anonymous,
        session,
        node,
    } = log_in(env, &mut b, account).await;
    on_every_gateway(
        env,
        &anonymous,
        "the pre-login id is forgotten",
        Option::is_none,
    )
    .await;

    let course = page(
        &mut b,
        &format!("/course/view.php?id={}", env.site.data.course_id),
    )
    .await;
    shows_name(&mut b, &course, env, account);

    let mut files = Files {
        env,
        node: &node,
        fetched: Vec::new(),
    };
    let tracked = scorm(&mut files, &mut b, account).await;
    resource(&mut files, &mut b, account).await;
    let fetched = files.fetched;

    // Log out with the sesskey of the last page: a new anonymous session, same node.
    let sesskey = sesskey(&course);
    b.logged_in = false;
    let hops = b.get(&format!("/login/logout.php?sesskey={sesskey}")).await;
    assert_eq!(
        hops[0].status,
        StatusCode::SEE_OTHER,
        "{:?}",
        requests(&hops)
    );
    let after_logout = hops[0].sets_session().expect("logout starts a new session");
    assert_ne!(after_logout, session);
    on_every_gateway(
        env,
        &session,
        "the logged-in id is forgotten",
        Option::is_none,
    )
    .await;
    agree(env, &after_logout, &node, "anonymous").await;
    let hops = b.get("/my/").await;
    assert!(
        hops.last()
            .unwrap()
            .request
            .starts_with("GET /login/index.php"),
        "logged out: /my/ sends to the login page: {:?}",
        requests(&hops)
    );

    one_node(&b, &env.cluster, &node, &account.username);
    Outcome {
        username: account.username.clone(),
        dealt: node,
        requests: b.requests,
        lost: b.lost,
        after_logout,
        tracked,
        fetched,
    }
}

/// A student's session ids either side of logging in, and the node dealt.
pub struct LoggedIn {
    pub anonymous: String,
    pub session: String,
    pub node: String,
}

/// Loads the login form (the first visit: the gateway deals a node) and logs in,
/// checking what Moodle and the admin API say at each step.
pub async fn log_in(env: &Env, b: &mut Browser, account: &StudentAccount) -> LoggedIn {
    // The login form: the first visit, where the gateway deals a node.
    let hops = b.get("/login/index.php").await;
    let form = only(hops, "the login form");
    let anonymous = form
        .sets_session()
        .expect("the first visit starts a session");
    let node = form.node().expect("Moodle names its node").to_string();
    // Moodle read the browser's User-Agent, which passes the gateway's map by.
    let text = form.text();
    let body = between(&text, "<body", ">").unwrap_or_default();
    let classes = body.split(|c: char| c.is_whitespace() || c == '"');
    assert!({ classes }.any(|class| class == "gecko"), "<body{body}>");
    let token = between(&form.text(), "name=\"logintoken\" value=\"", "\"")
        .expect("the form has a logintoken")
        .to_string();
    agree(env, &anonymous, &node, "anonymous").await;

    // Log in: Moodle rotates the id on the POST, then 303s via ?testsession to /my/.
    let hops = b
        .post(
            "/login/index.php",
            &[
                ("anchor", ""),
                ("logintoken", &token),
                ("username", &account.username),
                ("password", &account.password),
            ],
        )
        .await;
    assert_eq!(
        hops[0].status,
        StatusCode::SEE_OTHER,
        "{:?}",
        requests(&hops)
    );
    let session = hops[0].sets_session().expect("login rotates the session");
    assert_ne!(session, anonymous);
    let dashboard = hops.last().unwrap();
    assert!(
        dashboard.request.starts_with("GET /my/"),
        "{:?}",
        requests(&hops)
    );
    for hop in &hops {
        assert_eq!(hop.node(), Some(node.as_str()), "{}", hop.request);
    }
    b.logged_in = true;
    shows_name(b, dashboard, env, account);
    agree(env, &session, &node, "logged-in").await;
    LoggedIn {
        anonymous,
        session,
        node,
    }
}

/// The player, the SCORM files (not with node-local sessions and no offload), and a
/// tracking POST.
async fn scorm(
    files: &mut Files<'_>,
    b: &mut Browser,
    account: &StudentAccount,
) -> Vec<(String, String)> {
    let env = files.env;
    let scorm = &env.site.data.scorm;
    let view = page(b, &format!("/mod/scorm/view.php?id={}", scorm.cmid)).await;
    shows_name(b, &view, env, account);
    let text = view.text();
    let scoid = between(&text, "name=\"scoid\" value=\"", "\"").expect("the player form");
    let org = between(&text, "name=\"currentorg\" value=\"", "\"").expect("the player form");
    let cm = scorm.cmid.to_string();
    let fields = [
        ("scoid", scoid),
        ("cm", &cm),
        ("currentorg", org),
        ("mode", "normal"),
    ];
    let player = only(b.post("/mod/scorm/player.php", &fields).await, "the player").text();
    assert!(
        player.contains(&account.fullname),
        "the player names the student"
    );
    // M.scorm_api.init(…, "wwwroot", "sesskey", "scoid", "attempt", "normal", cmid, …)
    let wwwroot = format!("\"{}\", \"", env.cluster.wwwroot().replace('/', "\\/"));
    let args = between(&player, &wwwroot, ", \"normal\"").expect("M.scorm_api.init's arguments");
    let args: Vec<&str> = args.split(", ").map(|a| a.trim_matches('"')).collect();
    let (sesskey, attempt) = (args[0].to_string(), args[2].to_string());
    assert_eq!(args[1], scoid);

    let load = format!(
        "/mod/scorm/loadSCO.php?a={}&scoid={scoid}&currentorg={org}&mode=normal&attempt={attempt}",
        scorm.id
    );
    let load = page(b, &load).await.text();
    let launch = between(&load, "location = \"", "\"").expect("loadSCO sends to the SCO");
    let launch = b.path_of(launch);
    let expected = format!(
        "/pluginfile.php/{}/mod_scorm/content/{}/{}",
        scorm.context_id, scorm.revision, scorm.launch_path
    );
    assert_eq!(launch, expected, "the SCO's launch URL");

    match (env.cluster.store, &env.cluster.offload) {
        (Store::Shared, _) | (_, Some(_)) => scorm_files(files, b, account, &launch).await,
        (Store::NodeLocal, None) => {
            // NODE-LOCAL + SCORM FILES, NO OFFLOAD: the gateway sends SCORM files to the
            // data server, which has no node-local session, so Moodle logs the student
            // out (see check_refuses_node_local_sessions_with_scorm_on_a_moodle_data_server).
            // The offload mode lets the student's node authorise them instead.
        }
    }

    let score = account.username.trim_start_matches("student").to_string();
    let suspend = format!("{} was here", account.username);
    let track = [
        ("cmi__core__lesson_status", "completed"),
        ("cmi__core__score__raw", score.as_str()),
        ("cmi__suspend_data", suspend.as_str()),
    ];
    let scorm_id = scorm.id.to_string();
    let mut fields = vec![
        ("id", cm.as_str()),
        ("a", scorm_id.as_str()),
        ("sesskey", sesskey.as_str()),
        ("attempt", attempt.as_str()),
        ("scoid", scoid),
    ];
    fields.extend(track);
    let saved = only(
        b.post("/mod/scorm/datamodel.php", &fields).await,
        "datamodel.php",
    );
    assert_eq!(
        saved.text().trim(),
        "true\n0",
        "Moodle stored the tracking data"
    );
    track
        .iter()
        .map(|(k, v)| (k.replace("__", "."), v.to_string()))
        .collect()
}

/// The SCO's launch page and a few files in every URL form: each byte for byte what
/// Moodle stored, and no session disturbed; served by the data server (shared store)
/// or authorised by the student's node and fetched from the export (offload).
async fn scorm_files(
    files: &mut Files<'_>,
    b: &mut Browser,
    account: &StudentAccount,
    launch: &str,
) {
    let env = files.env;
    let scorm = &env.site.data.scorm;
    let content = &scorm.content;
    let find = |want: &dyn Fn(&StoredFile) -> bool| content.iter().find(|f| want(f)).unwrap();
    let launch_file = find(&|f| f.path == scorm.launch_path);
    let page = only(b.get(launch).await, "the SCO");
    files.check(&page, launch_file, launch, Via::Cookie);
    let jpg = find(&|f| f.path.ends_with(".jpg"));
    let js = find(&|f| f.path.ends_with(".js"));
    let picks = [launch_file, jpg, js, find(&|f| f.path == "imsmanifest.xml")];
    for file in picks {
        let path: Vec<String> = file.path.split('/').map(encode).collect();
        let relative = format!(
            "/{}/mod_scorm/content/{}/{}",
            scorm.context_id,
            scorm.revision,
            path.join("/")
        );
        let with_cookie = [
            format!("/pluginfile.php{relative}"),
            format!("/pluginfile.php?file={relative}"),
            format!("/pluginfile.php?file={}", encode(&relative)),
        ];
        for url in &with_cookie {
            let page = only(b.get(url).await, url);
            files.check(&page, file, url, Via::Cookie);
        }
        let tokens = [
            format!("/tokenpluginfile.php/{}{relative}", account.files_key),
            format!(
                "/webservice/pluginfile.php{relative}?token={}",
                account.ws_token
            ),
        ];
        for url in &tokens {
            let page = b.get_bare(url).await;
            files.check(&page, file, url, Via::Token);
            assert_eq!(page.sets_session(), None, "{url} started a session");
        }
    }
    if env.cluster.offload.is_some() {
        let url = |f: &StoredFile| {
            format!(
                "/pluginfile.php/{}/mod_scorm/content/{}/{}",
                scorm.context_id, scorm.revision, f.path
            )
        };
        files.range(b, jpg, &url(jpg)).await;
        files.head(b, js, &url(js)).await;
    }
}

/// How a file request authenticates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The student's session cookie: the student's node must authorise it.
    Cookie,
    /// A token in the URL, no cookie: any web node.
    Token,
}

impl Files<'_> {
    /// `page` is `file` in full, served where the mode says, with Moodle's headers.
    fn check(&mut self, page: &Page, file: &StoredFile, url: &str, via: Via) {
        let stored = self.env.site.stored(&file.contenthash);
        assert_eq!(stored.len() as u64, file.size, "{}", file.path);
        assert_eq!(page.status, StatusCode::OK, "{url}: {}", page.text());
        assert!(page.body == stored, "{url}: the bytes Moodle stored");
        if self.env.cluster.offload.is_none() {
            let scorm = file.url.is_empty();
            if scorm && self.env.cluster.store == Store::Shared {
                assert_eq!(page.node(), Some("data"), "{url} goes to the data server");
            }
            return;
        }
        self.node_headers(page, file, url, via);
        assert_eq!(
            page.header("content-length"),
            Some(file.size.to_string().as_str()),
            "{url}: the export's length"
        );
        self.fetched.push((pool_path(&file.contenthash), 200));
    }

    /// The node authorised `page` and its headers are Moodle's, not the export's.
    fn node_headers(&self, page: &Page, file: &StoredFile, url: &str, via: Via) {
        match via {
            Via::Cookie => assert_eq!(page.node(), Some(self.node), "{url}: the student's node"),
            Via::Token => assert!(
                page.node().is_some_and(|n| n != "data"),
                "{url}: a web node authorises a token form, not {:?}",
                page.node()
            ),
        }
        let content_type = page.header("content-type").unwrap_or("");
        assert!(
            content_type.starts_with(&file.mimetype),
            "{url}: Moodle's Content-Type {}, not {content_type:?}",
            file.mimetype
        );
        let etag = format!("\"{}\"", file.contenthash);
        assert_eq!(
            page.header("etag"),
            Some(etag.as_str()),
            "{url}: Moodle's ETag"
        );
        assert!(
            page.header("cache-control").is_some(),
            "{url}: Moodle's Cache-Control"
        );
        assert_eq!(
            page.header("x-accel-redirect"),
            None,
            "{url}: the gateway keeps X-Accel-Redirect to itself"
        );
    }

    /// `Range: bytes=0-99` through the gateway: 206, the first 100 stored bytes; with
    /// `If-Range`, judged by Moodle's ETag; a revalidation, answered by Moodle.
    async fn range(&mut self, b: &mut Browser, file: &StoredFile, url: &str) {
        let stored = self.env.site.stored(&file.contenthash);
        assert!(stored.len() > 100, "{}: big enough for a range", file.path);
        let range = [("range", "bytes=0-99".to_string())];
        let page = b.send(Method::GET, url, &range).await;
        assert_eq!(
            page.status,
            StatusCode::PARTIAL_CONTENT,
            "{url}: {}",
            page.text()
        );
        assert!(
            page.body == stored[..100],
            "{url}: the first 100 stored bytes"
        );
        let content_range = format!("bytes 0-99/{}", stored.len());
        assert_eq!(
            page.header("content-range"),
            Some(content_range.as_str()),
            "{url}"
        );
        assert_eq!(page.header("content-length"), Some("100"), "{url}");
        self.node_headers(&page, file, url, Via::Cookie);
        self.fetched.push((pool_path(&file.contenthash), 206));

        // If-Range is judged against the node's ETag (Moodle's), never the export's.
        let etag = format!("\"{}\"", file.contenthash);
        let same = [range[0].clone(), ("if-range", etag.clone())];
        let page = b.send(Method::GET, url, &same).await;
        assert_eq!(
            page.status,
            StatusCode::PARTIAL_CONTENT,
            "{url}, If-Range: Moodle's ETag"
        );
        assert!(
            page.body == stored[..100],
            "{url}, If-Range: the first 100 bytes"
        );
        self.fetched.push((pool_path(&file.contenthash), 206));
        let other = [range[0].clone(), ("if-range", "\"changed\"".to_string())];
        let page = b.send(Method::GET, url, &other).await;
        assert_eq!(page.status, StatusCode::OK, "{url}, If-Range: another ETag");
        assert!(
            page.body == stored,
            "{url}, If-Range: another ETag: the whole file"
        );
        self.node_headers(&page, file, url, Via::Cookie);
        self.fetched.push((pool_path(&file.contenthash), 200));

        // A revalidation: Moodle answers 304 itself, nothing is fetched.
        let page = b.send(Method::GET, url, &[("if-none-match", etag)]).await;
        assert_eq!(
            page.status,
            StatusCode::NOT_MODIFIED,
            "{url}, If-None-Match"
        );
        assert!(page.body.is_empty(), "{url}: a 304 has no body");
    }

    /// HEAD through the gateway: 200, no body, the file's length.
    async fn head(&mut self, b: &mut Browser, file: &StoredFile, url: &str) {
        let page = b.send(Method::HEAD, url, &[]).await;
        assert_eq!(page.status, StatusCode::OK, "HEAD {url}");
        assert!(page.body.is_empty(), "HEAD {url}: a body");
        assert_eq!(
            page.header("content-length"),
            Some(file.size.to_string().as_str()),
            "HEAD {url}: the file's length"
        );
        self.node_headers(&page, file, url, Via::Cookie);
        self.fetched.push((pool_path(&file.contenthash), 200));
    }
}

/// The file resource: its page, and the file from the student's own node (offload
/// mode: authorised there, fetched from the export).
async fn resource(files: &mut Files<'_>, b: &mut Browser, account: &StudentAccount) {
    let env = files.env;
    let resource = &env.site.data.resource;
    let hops = b
        .get(&format!("/mod/resource/view.php?id={}", resource.cmid))
        .await;
    let last = hops.last().unwrap();
    assert_eq!(last.status, StatusCode::OK, "{:?}", requests(&hops));
    if last
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/html"))
    {
        shows_name(b, last, env, account);
    } else {
        // view.php redirected to the file itself.
        files.check(last, &resource.file, &last.request, Via::Cookie);
    }
    let file = only(b.get(&resource.file.url).await, &resource.file.url);
    files.check(&file, &resource.file, &resource.file.url, Via::Cookie);
    assert_ne!(
        file.node(),
        Some("data"),
        "a resource file stays on the student's node"
    );
}

/// GET `path` expecting a 200 with no redirect.
async fn page(b: &mut Browser, path: &str) -> Page {
    let mut hops = b.get(path).await;
    assert_eq!(hops.len(), 1, "{path}: {:?}", requests(&hops));
    let page = hops.pop().unwrap();
    assert_eq!(page.status, StatusCode::OK, "{path}");
    page
}

fn only(mut hops: Vec<Page>, what: &str) -> Page {
    assert_eq!(hops.len(), 1, "{what}: {:?}", requests(&hops));
    assert_eq!(hops[0].status, StatusCode::OK, "{what}: {}", hops[0].text());
    hops.pop().unwrap()
}

/// A logged-in page must name its student, and no one else.
fn shows_name(b: &mut Browser, page: &Page, env: &Env, account: &StudentAccount) {
    let text = page.text();
    if !text.contains(&account.fullname) {
        b.lost.push(format!(
            "{}: the page does not name the student",
            page.request
        ));
    }
    for other in &env.site.data.students {
        if other.username != account.username && text.contains(&other.fullname) {
            panic!(
                "{} shows {}'s name to {}",
                page.request, other.username, account.username
            );
        }
    }
}

/// `M.cfg.sesskey` of a page.
fn sesskey(page: &Page) -> String {
    between(&page.text(), "\"sesskey\":\"", "\"")
        .expect("the page's M.cfg has a sesskey")
        .to_string()
}

/// Every gateway's table and Moodle's session files agree that `id` lives on `node`.
async fn agree(env: &Env, id: &str, node: &str, state: &str) {
    on_every_gateway(env, id, "the gateway knows the session", Option::is_some).await;
    for gateway in &env.gateways {
        let entry = gateway.lookup(id).await.expect("still bound");
        assert_eq!(entry["node"], node, "{}: {entry}", gateway.public);
        assert_eq!(entry["state"], state, "{}: {entry}", gateway.public);
    }
    let file = format!("sess_{id}");
    // PHP writes the session as the script ends, just after the answer has gone.
    let holders = || -> Vec<String> {
        match env.cluster.store {
            Store::Shared => {
                let shared = env.site.dataroot.join("sessions").join(&file);
                if shared.exists() {
                    vec!["shared".into()]
                } else {
                    vec![]
                }
            }
            Store::NodeLocal => env
                .cluster
                .all()
                .filter(|n| n.sessions.as_ref().unwrap().join(&file).exists())
                .map(|n| n.name.clone())
                .collect(),
        }
    };
    let want = match env.cluster.store {
        Store::Shared => "shared",
        Store::NodeLocal => node,
    };
    for _ in 0..40 {
        if holders() == [want] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{file} is held by {:?}, not {want}", holders());
}

/// Every script of the logged-in student ran on `node`, and with a shared store (no
/// offload) every SCORM file on the data server.
fn one_node(b: &Browser, cluster: &Cluster, node: &str, username: &str) {
    let to_data = cluster.store == Store::Shared && cluster.offload.is_none();
    for (request, served) in &b.served {
        let scorm_file =
            request.contains("mod_scorm/content") || request.contains("mod_scorm%2Fcontent");
        let want = if scorm_file && to_data { "data" } else { node };
        if let Some(served) = served {
            assert_eq!(served, want, "{username}: {request}");
        }
    }
}
