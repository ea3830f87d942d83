//! A surge on real Moodle, as the people in it live it: logged-in students browse the
//! course and save SCORM tracking at a student's pace, then a crowd of newcomers
//! (fresh browsers, no cookies) arrives within seconds, each opening the login page,
//! following the gateway's waiting page like a browser does (its `Refresh`, with the
//! place cookie it set), logging in and opening the course.
//!
//! Whatever stands in front of the nodes (the gateway with or without a cap, or
//! HAProxy for the measure), the scenario only talks to wwwroot, and it records what
//! a user would see: every answer's status and time, who was let in when, who was
//! logged out. The test judges that record; the measure prints it side by side.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cluster::Gateway;
use crate::site::{Site, StudentAccount};
use crate::student::{between, http_client, requests, Browser, HttpClient, Page};

/// What a browser sends for a page view: the waiting room only stands in for pages.
const PAGE_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

/// How long one request may take, its body included: past every patience of the
/// gateway's line but post_patience, and past `timeout queue` of the HAProxy anchor.
const REQUEST_LIMIT: Duration = Duration::from_secs(90);

/// The most rounds (a course page and a tracking POST, two pauses) one logged-in
/// student makes: a bound should the surge never end.
const MAX_ROUNDS: usize = 200;

/// PHP workers per node in a surge, and the gateway's cap to match: a small PHP-FPM
/// pool that a crowd fills at once.
pub const SMALL_POOL: usize = 2;

/// The surge of the test and the measure: 12 students browse the course and save
/// SCORM tracking (a request, then a second's pause, each), then 120 newcomers
/// arrive within 2 s, each a fresh browser.
pub const EXAM_MORNING: Plan = Plan {
    students: 12,
    newcomers: 120,
    arrivals: Duration::from_secs(2),
    before: Duration::from_secs(10),
    think: Duration::from_secs(1),
    room_cookie: "MoodleGatewayPlace",
    patience: Duration::from_secs(150),
};

/// A bigger morning: 280 newcomers within 3 s, more than a room opening at its
/// default 5 s can let in before the later ones have waited that long.
pub const BIG_MORNING: Plan = Plan {
    newcomers: 280,
    arrivals: Duration::from_secs(3),
    patience: Duration::from_secs(300),
    ..EXAM_MORNING
};

/// The shape of one surge.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Logged-in students browsing throughout.
    pub students: usize,
    /// Newcomers in the surge.
    pub newcomers: usize,
    /// The newcomers' first requests are spread evenly over this.
    pub arrivals: Duration,
    /// How long the students browse before the surge (the "before" figures).
    pub before: Duration,
    /// A student's pause between two requests, as a person reads a page.
    pub think: Duration,
    /// The waiting room's cookie (`surge.room_cookie`): a 503 setting it is the
    /// waiting page, any other 5xx an error.
    pub room_cookie: &'static str,
    /// The longest a newcomer keeps following waiting pages before giving up (an
    /// error).
    pub patience: Duration,
}

/// One answer a logged-in student got, and when the request went.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub sent: Instant,
    pub took: Duration,
}

/// How one logged-in student's browsing went.
#[derive(Debug)]
pub struct Student {
    pub username: String,
    pub samples: Vec<Sample>,
    /// What the last tracking POST Moodle accepted saved: (element, value).
    pub tracked: Vec<(String, String)>,
    /// Each way the session was lost (the browser's record, and the last check).
    pub lost: Vec<String>,
    pub errors: Vec<String>,
}

/// How one newcomer's arrival went.
#[derive(Debug)]
pub struct Newcomer {
    pub username: String,
    /// Their first request.
    pub arrived: Instant,
    /// Their first answer that was not the waiting page.
    pub admitted: Option<Instant>,
    /// The node that sent that answer (Moodle's `X-Moodle-Node`).
    pub node: Option<String>,
    /// From the first request to the dashboard after logging in.
    pub logged_in: Option<Duration>,
    /// Waiting pages they were shown.
    pub waiting_pages: usize,
    pub errors: Vec<String>,
}

/// Everything the surge left behind.
#[derive(Debug)]
pub struct Record {
    pub students: Vec<Student>,
    pub newcomers: Vec<Newcomer>,
    /// From the first newcomer's request to the last newcomer's course page.
    pub surge: (Instant, Instant),
}

impl Record {
    /// The students' answer times before the surge and during it.
    pub fn logged_in_times(&self) -> (Vec<Duration>, Vec<Duration>) {
        let (start, end) = self.surge;
        let samples = self.students.iter().flat_map(|s| &s.samples);
        let (mut before, mut during) = (Vec::new(), Vec::new());
        for sample in samples {
            if sample.sent < start {
                before.push(sample.took);
            } else if sample.sent <= end {
                during.push(sample.took);
            }
        }
        (before, during)
    }

    /// Every error anyone saw, each named by its user.
    pub fn errors(&self) -> Vec<String> {
        let students = self.students.iter().map(|s| (&s.username, &s.errors));
        let newcomers = self.newcomers.iter().map(|n| (&n.username, &n.errors));
        let all = students.chain(newcomers);
        all.flat_map(|(who, errors)| errors.iter().map(move |e| format!("{who}: {e}")))
            .collect()
    }

    /// Pairs of newcomers (the earlier arrival first) let in, and of those how many
    /// the later one was let in first.
    pub fn admission_order(&self) -> (usize, usize) {
        self.admission_order_of(|_| true)
    }

    /// [`admission_order`](Self::admission_order) among the newcomers `which`
    /// picks alone.
    pub fn admission_order_of(&self, which: impl Fn(&Newcomer) -> bool) -> (usize, usize) {
        let (pairs, swapped, _) = self.swaps_of(which, Duration::MAX);
        (pairs, swapped)
    }

    /// Pairs among the newcomers `which` picks, those let in in the other order,
    /// and of those the pairs that arrived more than `apart` apart (a second: more
    /// than the waiting page's refresh can mix).
    pub fn swaps_of(
        &self,
        which: impl Fn(&Newcomer) -> bool,
        apart: Duration,
    ) -> (usize, usize, usize) {
        let (mut pairs, mut swapped, mut far) = (0, 0, 0);
        self.each_pair(which, |earlier, later, swap| {
            pairs += 1;
            swapped += usize::from(swap);
            far += usize::from(swap && later.arrived - earlier.arrived > apart);
        });
        (pairs, swapped, far)
    }

    /// Pairs of newcomers and those let in out of arrival order, for the pairs let
    /// in by one node and for those let in by two: whether the order is lost within
    /// a node's line or between the lines.
    pub fn swaps_by_node(&self) -> [(usize, usize); 2] {
        let mut split = [(0, 0); 2];
        self.each_pair(
            |_| true,
            |earlier, later, swap| {
                let counted = &mut split[usize::from(earlier.node != later.node)];
                counted.0 += 1;
                counted.1 += usize::from(swap);
            },
        );
        split
    }

    /// Calls `each(earlier, later, swapped)` for every pair of let-in newcomers
    /// `which` picks, the earlier arrival first; `swapped` when the later one was
    /// let in first.
    fn each_pair(
        &self,
        which: impl Fn(&Newcomer) -> bool,
        mut each: impl FnMut(&Newcomer, &Newcomer, bool),
    ) {
        let mut admitted: Vec<(Instant, Instant, &Newcomer)> = (self.newcomers.iter())
            .filter(|n| which(n))
            .filter_map(|n| n.admitted.map(|a| (n.arrived, a, n)))
            .collect();
        admitted.sort_by_key(|&(arrived, a, _)| (arrived, a));
        for (i, &(_, first, earlier)) in admitted.iter().enumerate() {
            for &(_, then, later) in &admitted[i + 1..] {
                each(earlier, later, then < first);
            }
        }
    }

    /// The newcomers' times to log in.
    pub fn login_times(&self) -> Vec<Duration> {
        self.newcomers.iter().filter_map(|n| n.logged_in).collect()
    }

    /// Waiting pages the newcomers were shown, all together.
    pub fn waiting_pages(&self) -> usize {
        self.newcomers.iter().map(|n| n.waiting_pages).sum()
    }
}

/// What the scenario needs of the site and its front.
#[derive(Clone)]
pub struct Stage {
    /// wwwroot: whatever listens there is the front under test.
    pub origin: String,
    pub site: Arc<Site>,
    pub client: HttpClient,
}

/// Runs the surge of `plan` against whatever listens on wwwroot: the students log
/// in and browse for `plan.before`, the newcomers arrive, and once the last of them
/// is done (or gave up) the students stop and each opens the dashboard once more.
pub async fn run(stage: &Stage, plan: Plan) -> Record {
    let accounts = &stage.site.data.students[..plan.students];
    assert!(plan.newcomers <= stage.site.data.newcomers.len());
    let together = Arc::new(Together {
        stop: AtomicBool::new(false),
        primed: watch::channel(false).0,
    });
    let mut students = JoinSet::new();
    for (i, account) in accounts.iter().enumerate() {
        let (stage, account, together) = (stage.clone(), account.clone(), together.clone());
        // Spread over one pause, so that they do not ask in step.
        let offset = plan.think.mul_f64(i as f64 / plan.students as f64);
        let first = i == 0;
        students.spawn(async move {
            let me = Me {
                account: &account,
                offset,
                first,
            };
            browse(&stage, me, plan, &together).await
        });
    }
    tokio::time::sleep(plan.before).await;

    let start = Instant::now();
    let mut newcomers = JoinSet::new();
    for (i, account) in stage.site.data.newcomers[..plan.newcomers]
        .iter()
        .enumerate()
    {
        let (stage, account) = (stage.clone(), account.clone());
        let at = start + plan.arrivals.mul_f64(i as f64 / plan.newcomers as f64);
        newcomers.spawn(async move {
            tokio::time::sleep_until(at).await;
            arrive(&stage, &account, plan).await
        });
    }
    let mut newcomers = joined(newcomers).await;
    let end = Instant::now();
    together.stop.store(true, Ordering::Relaxed);
    newcomers.sort_by_key(|n| n.arrived);
    Record {
        students: joined(students).await,
        newcomers,
        surge: (start, end),
    }
}

async fn joined<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut all = Vec::new();
    while let Some(done) = set.join_next().await {
        all.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
    }
    all
}

/// What the logged-in students share.
///
/// Why `primed`: Moodle 4.5 records each SCORM element's name (`x.start.time` when
/// the player opens, `cmi.core.lesson_status` and the rest at the first tracking
/// POST) the first time anyone uses it, with a plain insert under a unique index
/// (`scorm_get_elementid()`), so two students doing it first at the same moment on a
/// fresh site make one of them fail with a 404 error page (seen once in 16 runs, a
/// gap in `mdl_scorm_element`'s ids). One student goes first; the others open the
/// player once the names are known, as on any site in use.
struct Together {
    /// The surge is over: stop browsing.
    stop: AtomicBool,
    /// The first student has opened the player and saved tracking (or failed to).
    primed: watch::Sender<bool>,
}

/// One student in [`browse`].
struct Me<'a> {
    account: &'a StudentAccount,
    /// When to start, after the others began.
    offset: Duration,
    /// The one who opens the player and saves tracking before the others.
    first: bool,
}

/// Says `primed` when dropped: after the first student's first tracking POST, or
/// as it gives up before.
struct Primes<'a>(Option<&'a watch::Sender<bool>>);

impl Drop for Primes<'_> {
    fn drop(&mut self) {
        if let Some(primed) = self.0 {
            primed.send_replace(true);
        }
    }
}

/// One logged-in student: logs in, opens the SCORM player (the first one before
/// the others), then until `stop` reads the course page and saves tracking, a
/// pause after each; at the end, the dashboard once more, which must still be
/// theirs.
async fn browse(stage: &Stage, me: Me<'_>, plan: Plan, together: &Together) -> Student {
    let Me {
        account,
        offset,
        first,
    } = me;
    let mut primes = Primes(first.then_some(&together.primed));
    let mut me = Student {
        username: account.username.clone(),
        samples: Vec::new(),
        tracked: Vec::new(),
        lost: Vec::new(),
        errors: Vec::new(),
    };
    tokio::time::sleep(offset).await;
    let mut b = Browser::new(stage.client.clone(), &stage.origin);
    b.limit = REQUEST_LIMIT;
    let logged_in = log_in(&mut b, account, &mut me.errors).await;
    if !first {
        let mut primed = together.primed.subscribe();
        let primed = tokio::time::timeout(3 * REQUEST_LIMIT, primed.wait_for(|p| *p));
        let _ = primed.await;
    }
    let player = match logged_in {
        Some(_) => open_player(stage, &mut b, &mut me.errors).await,
        None => None,
    };
    let Some(player) = player else {
        return me;
    };
    let course = format!("/course/view.php?id={}", stage.site.data.course_id);
    for round in 0..MAX_ROUNDS {
        if together.stop.load(Ordering::Relaxed) {
            break;
        }
        if let Some(page) = timed_get(&mut b, &course, &mut me).await {
            names(&page, account, &mut me.lost);
        }
        tokio::time::sleep(plan.think).await;
        let suspend = format!("{} round {round}", account.username);
        if let Some(tracked) = track(stage, &mut b, &player, account, &suspend, &mut me).await {
            me.tracked = tracked;
        }
        drop(std::mem::replace(&mut primes, Primes(None)));
        tokio::time::sleep(plan.think).await;
    }
    match b.try_get("/my/").await {
        Ok(hops) => {
            let last = hops.last().unwrap();
            if last.request.starts_with("GET /login/index.php") {
                me.lost
                    .push(format!("logged out at the end: {:?}", requests(&hops)));
            } else {
                names(last, account, &mut me.lost);
            }
        }
        Err(e) => me.errors.push(e),
    }
    me.lost.extend(b.lost);
    me
}

/// GET `path` as a logged-in student, timed; the page when it is a 200.
async fn timed_get(b: &mut Browser, path: &str, me: &mut Student) -> Option<Page> {
    let sent = Instant::now();
    let hops = b.try_get(path).await;
    let took = sent.elapsed();
    match hops {
        Ok(mut hops) => {
            me.samples.push(Sample { sent, took });
            let page = hops.pop().unwrap();
            if page.status != StatusCode::OK {
                me.errors.push(page.brief());
                return None;
            }
            Some(page)
        }
        Err(e) => {
            me.errors.push(e);
            None
        }
    }
}

/// What a SCORM tracking POST needs, from the player.
struct Player {
    sesskey: String,
    attempt: String,
    scoid: String,
}

/// The SCORM activity's page and player, as the journey opens them.
async fn open_player(stage: &Stage, b: &mut Browser, errors: &mut Vec<String>) -> Option<Player> {
    let scorm = &stage.site.data.scorm;
    let view = ok(
        b.try_get(&format!("/mod/scorm/view.php?id={}", scorm.cmid))
            .await,
        errors,
    )?;
    let text = view.text();
    let scoid = found(
        between(&text, "name=\"scoid\" value=\"", "\""),
        "scoid",
        errors,
    )?;
    let org = found(
        between(&text, "name=\"currentorg\" value=\"", "\""),
        "currentorg",
        errors,
    )?;
    let cm = scorm.cmid.to_string();
    let fields = [
        ("scoid", scoid.as_str()),
        ("cm", &cm),
        ("currentorg", &org),
        ("mode", "normal"),
    ];
    let player = ok(b.try_post("/mod/scorm/player.php", &fields).await, errors)?.text();
    let wwwroot = format!("\"{}\", \"", stage.origin.replace('/', "\\/"));
    let args = found(
        between(&player, &wwwroot, ", \"normal\""),
        "M.scorm_api.init",
        errors,
    )?;
    let args: Vec<&str> = args.split(", ").map(|a| a.trim_matches('"')).collect();
    Some(Player {
        sesskey: args[0].to_string(),
        attempt: args[2].to_string(),
        scoid,
    })
}

/// One tracking POST (`datamodel.php`), timed: what Moodle saved, if it said so.
async fn track(
    stage: &Stage,
    b: &mut Browser,
    player: &Player,
    account: &StudentAccount,
    suspend: &str,
    me: &mut Student,
) -> Option<Vec<(String, String)>> {
    let scorm = &stage.site.data.scorm;
    let score = account.username.trim_start_matches("student").to_string();
    let track = [
        ("cmi__core__lesson_status", "incomplete"),
        ("cmi__core__score__raw", score.as_str()),
        ("cmi__suspend_data", suspend),
    ];
    let (cm, id) = (scorm.cmid.to_string(), scorm.id.to_string());
    let mut fields = vec![
        ("id", cm.as_str()),
        ("a", id.as_str()),
        ("sesskey", player.sesskey.as_str()),
        ("attempt", player.attempt.as_str()),
        ("scoid", player.scoid.as_str()),
    ];
    fields.extend(track);
    let sent = Instant::now();
    let hops = b.try_post("/mod/scorm/datamodel.php", &fields).await;
    let took = sent.elapsed();
    let saved = match hops {
        Ok(hops) => {
            me.samples.push(Sample { sent, took });
            only_ok(hops, &mut me.errors)?
        }
        Err(e) => {
            me.errors.push(e);
            return None;
        }
    };
    if saved.text().trim() != "true\n0" {
        me.errors
            .push(format!("datamodel.php did not store: {}", saved.brief()));
        return None;
    }
    Some(
        (track.iter())
            .map(|(k, v)| (k.replace("__", "."), v.to_string()))
            .collect(),
    )
}

/// One newcomer: the login page (through as many waiting pages as it takes), the
/// login, the course.
async fn arrive(stage: &Stage, account: &StudentAccount, plan: Plan) -> Newcomer {
    let mut b = Browser::new(http_client(), &stage.origin);
    b.accept = Some(PAGE_ACCEPT);
    b.limit = REQUEST_LIMIT;
    let arrived = Instant::now();
    let mut me = Newcomer {
        username: account.username.clone(),
        arrived,
        admitted: None,
        node: None,
        logged_in: None,
        waiting_pages: 0,
        errors: Vec::new(),
    };
    let Some(form) = admitted(&mut b, plan, &mut me).await else {
        return me;
    };
    let text = form.text();
    let Some(token) = between(&text, "name=\"logintoken\" value=\"", "\"") else {
        me.errors.push(format!(
            "the login form has no logintoken: {}",
            form.brief()
        ));
        return me;
    };
    let token = token.to_string();
    let fields = [
        ("anchor", ""),
        ("logintoken", token.as_str()),
        ("username", account.username.as_str()),
        ("password", account.password.as_str()),
    ];
    let hops = b.try_post("/login/index.php", &fields).await;
    let Some(dashboard) = ok(hops, &mut me.errors) else {
        return me;
    };
    if !dashboard.request.starts_with("GET /my/") {
        me.errors
            .push(format!("not logged in: landed on {}", dashboard.request));
        return me;
    }
    me.logged_in = Some(arrived.elapsed());
    b.logged_in = true;
    let mut lost = Vec::new();
    names(&dashboard, account, &mut lost);
    let course = format!("/course/view.php?id={}", stage.site.data.course_id);
    if let Some(page) = ok(b.try_get(&course).await, &mut me.errors) {
        names(&page, account, &mut lost);
    }
    lost.extend(b.lost);
    me.errors.extend(lost);
    me
}

/// The login form, after following every waiting page as a browser does: wait the
/// `Refresh` seconds and ask for the same page again, the place cookie in the jar.
async fn admitted(b: &mut Browser, plan: Plan, me: &mut Newcomer) -> Option<Page> {
    loop {
        let hops = match b.try_get("/login/index.php").await {
            Ok(hops) => hops,
            Err(e) => {
                me.errors.push(e);
                return None;
            }
        };
        let page = hops.last().unwrap();
        if let Some(refresh) = waiting_page(page, plan.room_cookie) {
            me.waiting_pages += 1;
            if me.arrived.elapsed() + refresh > plan.patience {
                me.errors.push(format!(
                    "still in the waiting room after {:?}",
                    me.arrived.elapsed()
                ));
                return None;
            }
            tokio::time::sleep(refresh).await;
            continue;
        }
        me.admitted = Some(Instant::now());
        me.node = page.node().map(str::to_owned);
        return ok(Ok(hops), &mut me.errors);
    }
}

/// `Some(refresh)` when `page` is the gateway's waiting page: a 503 that sets the
/// place cookie and says when to ask again (`Refresh`, as the meta tag does).
pub fn waiting_page(page: &Page, room_cookie: &str) -> Option<Duration> {
    if page.status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let place = format!("{room_cookie}=");
    let sets_place = (page.headers.get_all("set-cookie").iter())
        .filter_map(|v| v.to_str().ok())
        .any(|line| line.starts_with(&place));
    let refresh = page.header("refresh")?.trim().split(';').next()?;
    let seconds: u64 = refresh.trim().parse().ok()?;
    sets_place.then(|| Duration::from_secs(seconds))
}

/// The last hop when it is a 200; else `None`, the failure in `errors`.
fn ok(hops: Result<Vec<Page>, String>, errors: &mut Vec<String>) -> Option<Page> {
    match hops {
        Ok(mut hops) => {
            let last = hops.pop().unwrap();
            if last.status == StatusCode::OK {
                return Some(last);
            }
            hops.push(last);
            let last = hops.last().unwrap();
            errors.push(format!("{:?}: {}", requests(&hops), last.brief()));
            None
        }
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// The only hop when it is a 200.
fn only_ok(hops: Vec<Page>, errors: &mut Vec<String>) -> Option<Page> {
    if hops.len() != 1 {
        errors.push(format!("redirected: {:?}", requests(&hops)));
        return None;
    }
    ok(Ok(hops), errors)
}

/// Logs `account` in: the form, the POST, the dashboard naming them.
async fn log_in(
    b: &mut Browser,
    account: &StudentAccount,
    errors: &mut Vec<String>,
) -> Option<Page> {
    let form = ok(b.try_get("/login/index.php").await, errors)?;
    let text = form.text();
    let token = found(
        between(&text, "name=\"logintoken\" value=\"", "\""),
        "logintoken",
        errors,
    )?;
    let fields = [
        ("anchor", ""),
        ("logintoken", token.as_str()),
        ("username", account.username.as_str()),
        ("password", account.password.as_str()),
    ];
    let dashboard = ok(b.try_post("/login/index.php", &fields).await, errors)?;
    if !dashboard.request.starts_with("GET /my/") || !dashboard.text().contains(&account.fullname) {
        errors.push(format!("not logged in: {}", dashboard.request));
        return None;
    }
    b.logged_in = true;
    Some(dashboard)
}

/// `what` a page was expected to hold, or an error saying it did not.
fn found(text: Option<&str>, what: &str, errors: &mut Vec<String>) -> Option<String> {
    if text.is_none() {
        errors.push(format!("the page has no {what}"));
    }
    text.map(str::to_string)
}

/// A logged-in page must name its student.
fn names(page: &Page, account: &StudentAccount, lost: &mut Vec<String>) {
    if !page.text().contains(&account.fullname) {
        lost.push(format!(
            "{}: the page does not name the student",
            page.request
        ));
    }
}

/// p50, p95 and max of `times`, in milliseconds (0 for none).
pub fn percentiles(times: &[Duration]) -> (f64, f64, f64) {
    if times.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), ms[ms.len() - 1])
}

/// The figures of one surge, for `--nocapture`: the students' answer times before
/// and during it, the newcomers' times to log in, the waiting pages, the order.
pub fn figures(record: &Record) -> Vec<String> {
    let (before, during) = record.logged_in_times();
    let ms = |(p50, p95, max): (f64, f64, f64)| {
        format!("p50 {p50:.0} ms, p95 {p95:.0} ms, max {max:.0} ms")
    };
    let (pairs, swapped) = record.admission_order();
    let second = Duration::from_secs(1);
    let roomed = record.swaps_of(|n| n.waiting_pages > 0, second);
    let lined = record.swaps_of(|n| n.waiting_pages == 0, second);
    let [one_node, two_nodes] = record.swaps_by_node();
    let logged_in = record.login_times();
    let first_page: Vec<Duration> = (record.newcomers.iter())
        .filter_map(|n| n.admitted.map(|a| a - n.arrived))
        .collect();
    let (start, end) = record.surge;
    vec![
        format!(
            "logged-in students ({}): before the surge {} ({} answers), during it {} ({} answers)",
            record.students.len(),
            ms(percentiles(&before)),
            before.len(),
            ms(percentiles(&during)),
            during.len(),
        ),
        format!(
            "newcomers: {} of {} logged in, time to log in {}; the surge lasted {:.1?}",
            logged_in.len(),
            record.newcomers.len(),
            ms(percentiles(&logged_in)),
            end - start,
        ),
        format!(
            "newcomers' first page (the login form, after any waiting pages) {}",
            ms(percentiles(&first_page)),
        ),
        format!(
            "waiting pages: {} shown to {} newcomers; admitted out of arrival order: {swapped} of {pairs} pairs \
             (within each group: {} of {} among those shown the room, {} of them arrived over a second apart; \
             {} of {} among the others, {} over a second apart)",
            record.waiting_pages(),
            record.newcomers.iter().filter(|n| n.waiting_pages > 0).count(),
            roomed.1,
            roomed.0,
            roomed.2,
            lined.1,
            lined.0,
            lined.2,
        ),
        format!(
            "newcomers let in out of arrival order, by node: {} of {} pairs let in by one node, \
             {} of {} by two",
            one_node.1, one_node.0, two_nodes.1, two_nodes.0,
        ),
        format!("errors: {}", record.errors().len()),
    ]
}

/// The gateway's line as `/metrics` showed it every 200 ms during a surge.
#[derive(Debug, Default, Clone)]
pub struct LineSeen {
    /// The most requests waiting for a slot at once, every node's.
    pub waiting: f64,
    /// The room's longest expected wait for a newcomer, in seconds.
    pub expected_wait: f64,
    /// Whether the room was open at any look.
    pub room_opened: bool,
    /// The site's share of quiz starts: looks at which starts waited for it, of
    /// all looks, and the fewest and most starts at once it let run then.
    pub site_starts: ShareSeen,
    /// Looks the gateway did not answer (the first one's error): a test asserts
    /// there were none, a measure prints them and goes on.
    pub unanswered: (usize, Option<String>),
}

/// The site's share of quiz starts as the looks at `/metrics` saw it.
#[derive(Debug, Default, Clone)]
pub struct ShareSeen {
    /// Every look.
    pub looks: usize,
    /// Looks at which the gateway exported the share at all (a build from before
    /// it has none).
    pub exported: usize,
    /// Looks at which a start waited for the share.
    pub held: usize,
    /// The fewest and the most starts at once the share allowed at those looks.
    pub least: Option<f64>,
    pub most: Option<f64>,
}

impl ShareSeen {
    /// One look: starts `waiting` for the share, which allows `limit` at once
    /// (negative: not narrowed, so none waits).
    fn look(&mut self, waiting: f64, limit: Option<f64>) {
        self.looks += 1;
        self.exported += usize::from(limit.is_some());
        if waiting <= 0.0 {
            return;
        }
        self.held += 1;
        if let Some(limit) = limit.filter(|limit| *limit >= 0.0) {
            self.least = Some(self.least.map_or(limit, |least| least.min(limit)));
            self.most = Some(self.most.map_or(limit, |most| most.max(limit)));
        }
    }

    fn describe(&self) -> String {
        let (held, looks) = (self.held, self.looks);
        if self.exported == 0 {
            return "the site's quiz starts: this build has no site's share".to_string();
        }
        if held == 0 {
            return format!(
                "the site's quiz starts: none waited for the site's share in {looks} looks"
            );
        }
        let at_once = |n: Option<f64>| n.map_or("?".to_string(), |n| n.to_string());
        format!(
            "the site's quiz starts: some waited for the site's share at {held} of {looks} looks, \
             while it let {} to {} run at once",
            at_once(self.least),
            at_once(self.most),
        )
    }
}

/// [`run`], with `gateway` in front, looking at its line every 200 ms meanwhile.
pub async fn run_watched(stage: &Stage, plan: Plan, gateway: &Gateway) -> (Record, LineSeen) {
    watched(gateway, run(stage, plan)).await
}

/// Runs `scenario` with `gateway` in front, looking at its line every 200 ms until
/// the scenario is over.
pub async fn watched<T>(
    gateway: &Gateway,
    scenario: impl std::future::Future<Output = T>,
) -> (T, LineSeen) {
    let done = AtomicBool::new(false);
    let scenario = async {
        let out = scenario.await;
        done.store(true, Ordering::Relaxed);
        out
    };
    let watch = async {
        let mut seen = LineSeen::default();
        while !done.load(Ordering::Relaxed) {
            let metrics = match gateway.try_metrics().await {
                Ok(metrics) => metrics,
                Err(error) => {
                    seen.unanswered.0 += 1;
                    seen.unanswered.1.get_or_insert(error);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let queued =
                (metrics.iter()).filter(|(k, _)| k.starts_with("moodle_gateway_queue_length{"));
            seen.waiting = seen.waiting.max(queued.map(|(_, v)| v).sum());
            let wait = metrics.get("moodle_gateway_waiting_room_expected_wait_seconds");
            seen.expected_wait = seen.expected_wait.max(wait.copied().unwrap_or(0.0));
            seen.room_opened |= metrics.get("moodle_gateway_waiting_room_open") == Some(&1.0);
            let share = |key: &str| metrics.get(key).copied();
            seen.site_starts.look(
                share("moodle_gateway_quiz_starts_site_waiting").unwrap_or(0.0),
                share("moodle_gateway_quiz_starts_site_limit"),
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        seen
    };
    tokio::join!(scenario, watch)
}

/// What the gateway saw and counted of a surge: its line, the room, the requests
/// turned away, and each class's wait for a slot (mean, and how many waited past
/// 5 s, the default `room_opens_at`).
pub async fn gateway_figures(gateway: &Gateway, seen: LineSeen) -> Vec<String> {
    let metrics = match gateway.try_metrics().await {
        Ok(metrics) => metrics,
        Err(error) => return vec![format!("gateway's /metrics unanswered at the end: {error}")],
    };
    let get = |key: &str| metrics.get(key).copied().unwrap_or(0.0);
    let sum = |prefix: &str| -> f64 {
        let series = metrics.iter().filter(|(key, _)| key.starts_with(prefix));
        series.map(|(_, value)| value).sum()
    };
    let mut waits = String::from("gateway's queue wait per class:");
    for class in ["working", "logged_in", "anonymous", "newcomer"] {
        let label = format!("{{class=\"{class}\"}}");
        let total = get(&format!("moodle_gateway_queue_wait_seconds_sum{label}"));
        let count = get(&format!("moodle_gateway_queue_wait_seconds_count{label}"));
        let under_5s = get(&format!(
            "moodle_gateway_queue_wait_seconds_bucket{{class=\"{class}\",le=\"5\"}}"
        ));
        let mean = if count > 0.0 {
            total / count * 1000.0
        } else {
            0.0
        };
        waits.push_str(&format!(
            " {class} mean {mean:.0} ms over {count} waits, {} past 5 s;",
            count - under_5s
        ));
    }
    let unanswered = match &seen.unanswered {
        (0, _) => String::new(),
        (n, first) => format!("; {n} looks unanswered, the first: {first:?}"),
    };
    vec![
        format!(
            "gateway's line, every 200 ms: at most {} waiting, the room's expected wait at most {:.1} s, the room {}{unanswered}",
            seen.waiting,
            seen.expected_wait,
            if seen.room_opened { "opened" } else { "never opened" },
        ),
        seen.site_starts.describe(),
        format!(
            "gateway's room: {} waiting pages, {} admitted; {} requests turned away",
            get("moodle_gateway_waiting_room_pages_total"),
            get("moodle_gateway_waiting_room_admitted_total"),
            sum("moodle_gateway_queue_turned_away_total{"),
        ),
        waits,
    ]
}
