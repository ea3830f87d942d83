//! A timed quiz's start on real Moodle, as the students in it live it: an early
//! group is already answering (page turns, an autosave now and then, a pause to
//! think between), then a class that logged in beforehand and opened the quiz's
//! page clicks "Attempt quiz now" within a second (the time limit's confirmation
//! form, posted as the browser posts it), answers every page and submits.
//!
//! Like the surge, the scenario only talks to wwwroot and records what a user would
//! see: every request's time, latency and status, each class student's click and
//! first question page, errors, lost sessions. The test judges the record (with what
//! Moodle stored, read from the database); the measure prints it side by side.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::site::{Site, StudentAccount};
use crate::student::{between, requests, Browser, Page};
use crate::surge::{percentiles, waiting_page, Stage};

/// What a browser sends for a page view.
const PAGE_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
/// What the quiz's autosave (YUI io) sends.
const AJAX_ACCEPT: &str = "application/json, text/javascript, */*; q=0.01";

/// How long one request may take, its body included: past the gateway's
/// `post_patience` (180 s), which a start waiting at its node's gate is given.
const REQUEST_LIMIT: Duration = Duration::from_secs(200);

/// The gateway's waiting room cookie (`surge.room_cookie`'s default).
const ROOM_COOKIE: &str = "MoodleGatewayPlace";

/// The longest a student follows waiting pages to the login form (an error after).
const ROOM_PATIENCE: Duration = Duration::from_secs(300);

/// The most page turns an early student makes: a bound should the wave never end.
const MAX_TURNS: usize = 400;

/// The exam start of the test: 16 students already answering, then a class of 120
/// clicking within a second and answering as fast as the early group, so that the
/// test's run stays short and the nodes are as busy as they can be made.
pub const EXAM_START: Plan = Plan {
    early: 16,
    class: 120,
    logins: Duration::from_secs(20),
    before: Duration::from_secs(10),
    clicks: Duration::from_secs(1),
    after: Duration::from_secs(5),
    think: (Duration::from_millis(1000), Duration::from_millis(2000)),
    class_think: (Duration::from_millis(1000), Duration::from_millis(2000)),
    autosave_every: 3,
};

/// The exam start of the measure: the same, but the class reads each page before it
/// turns it (two true/false questions: 15 to 45 s), as a class does. With the test's
/// one or two seconds a page, the class's own answers are then the nodes' load
/// and the start wave is lost in it; here the wave is the start itself. The early
/// group keeps its quick turns: they are the measuring probe.
pub const EXAM_READING: Plan = Plan {
    class_think: (Duration::from_secs(15), Duration::from_secs(45)),
    ..EXAM_START
};

/// A small exam start: 4 students answering, a class of 16, short calm before
/// and after. For a warm-up, or a test that checks what happens to each
/// request rather than how the nodes hold a crowd.
pub const SMALL_START: Plan = Plan {
    early: 4,
    class: 16,
    logins: Duration::from_secs(2),
    before: Duration::from_secs(1),
    after: Duration::from_secs(1),
    ..EXAM_START
};

/// The shape of one exam start.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Students answering since before the start (the site's `students`).
    pub early: usize,
    /// The class that starts together (the site's `newcomers` accounts).
    pub class: usize,
    /// The class logs in over this long, each then opening the quiz's page.
    pub logins: Duration,
    /// Calm after the class is ready and before the first click (the "before" turns).
    pub before: Duration,
    /// The class's clicks are spread evenly over this.
    pub clicks: Duration,
    /// The early group keeps answering this long after the class has submitted.
    pub after: Duration,
    /// An early student's pause before each page turn, spread evenly between these.
    pub think: (Duration, Duration),
    /// The same for a class student.
    pub class_think: (Duration, Duration),
    /// Every this many page turns, an autosave goes before the turn.
    pub autosave_every: usize,
}

/// One request (with the redirects it was answered with), as the student saw it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub what: &'static str,
    pub sent: Instant,
    pub took: Duration,
    /// The last hop's status (0: no answer at all).
    pub status: u16,
}

/// How one student's quiz went.
#[derive(Debug)]
pub struct Taker {
    pub username: String,
    pub user_id: u64,
    /// Every request after the login, in order.
    pub requests: Vec<Sent>,
    /// The page turns (processattempt.php and the page it led to).
    pub turns: Vec<Sent>,
    /// The click on "Start attempt" (class only), and its wall-clock time.
    pub click: Option<Instant>,
    pub click_unix: Option<f64>,
    /// When the start's own answer came (the redirect to the first page): Moodle
    /// created the attempt, and started its timer, before it.
    pub started: Option<Instant>,
    /// When the first question page came (a 200 of attempt.php).
    pub first_page: Option<Instant>,
    /// The node that served the first question page (the student's node).
    pub node: Option<String>,
    /// The answer to each slot of the last turn or autosave Moodle accepted.
    pub answers: BTreeMap<u32, String>,
    /// Whether "Submit all and finish" led to the review page.
    pub finished: bool,
    pub autosave_failures: usize,
    /// Waiting pages shown on the way to the login form.
    pub waiting_pages: usize,
    pub errors: Vec<String>,
    pub lost: Vec<String>,
}

/// Everything the exam start left behind.
#[derive(Debug)]
pub struct Record {
    pub early: Vec<Taker>,
    pub class: Vec<Taker>,
    /// When the class was ready (logged in, on the quiz's page): the calm begins.
    pub calm: Instant,
    /// From the first click to the last class student's first question page.
    pub wave: (Instant, Instant),
    /// When the last class student was done.
    pub done: Instant,
    /// The quiz's time limit, in seconds.
    pub timelimit: u64,
}

impl Record {
    /// The early group's page-turn times before the wave (after the calm began),
    /// during it, and after it.
    pub fn turn_times(&self) -> [Vec<Duration>; 3] {
        let (start, end) = self.wave;
        let mut split = [Vec::new(), Vec::new(), Vec::new()];
        for turn in self.early.iter().flat_map(|t| &t.turns) {
            if turn.sent < self.calm {
                continue;
            }
            let at = if turn.sent < start {
                0
            } else if turn.sent <= end {
                1
            } else {
                2
            };
            split[at].push(turn.took);
        }
        split
    }

    /// Each class student's time from the click to the first question page.
    pub fn first_page_times(&self) -> Vec<Duration> {
        (self.class.iter())
            .filter_map(|t| Some(t.first_page? - t.click?))
            .collect()
    }

    /// Each class student's exam time spent before the first question showed: from
    /// the start's answer (the attempt made, its timer running) to the first page.
    pub fn exam_time_to_first_page(&self) -> Vec<Duration> {
        (self.class.iter())
            .filter_map(|t| Some(t.first_page? - t.started?))
            .collect()
    }

    /// Every error anyone saw, each named by its user.
    pub fn errors(&self) -> Vec<String> {
        let all = self.early.iter().chain(&self.class);
        all.flat_map(|t| t.errors.iter().map(move |e| format!("{}: {e}", t.username)))
            .collect()
    }

    /// Every lost session, each named by its user.
    pub fn lost(&self) -> Vec<String> {
        let all = self.early.iter().chain(&self.class);
        all.flat_map(|t| t.lost.iter().map(move |e| format!("{}: {e}", t.username)))
            .collect()
    }

    /// Autosaves Moodle did not answer `OK`.
    pub fn autosave_failures(&self) -> usize {
        let all = self.early.iter().chain(&self.class);
        all.map(|t| t.autosave_failures).sum()
    }

    /// Pairs of class students (the earlier click first) whose attempts exist, and
    /// of those how many got the later click's attempt created first (a smaller id).
    pub fn start_order(&self, attempts: &BTreeMap<u64, Attempt>) -> (usize, usize) {
        self.order(attempts, false)
    }

    /// [`start_order`](Self::start_order) of the pairs on one node: the order the
    /// gateway keeps at each node's gate (across nodes, each node's pace decides).
    pub fn start_order_per_node(&self, attempts: &BTreeMap<u64, Attempt>) -> (usize, usize) {
        self.order(attempts, true)
    }

    fn order(&self, attempts: &BTreeMap<u64, Attempt>, same_node: bool) -> (usize, usize) {
        let mut started: Vec<(Instant, u64, Option<&str>)> = (self.class.iter())
            .filter_map(|t| Some((t.click?, attempts.get(&t.user_id)?.id, t.node.as_deref())))
            .collect();
        started.sort();
        let (mut pairs, mut swapped) = (0, 0);
        for (i, (_, first, node)) in started.iter().enumerate() {
            for (_, later, other) in &started[i + 1..] {
                if same_node && node != other {
                    continue;
                }
                pairs += 1;
                swapped += usize::from(later < first);
            }
        }
        (pairs, swapped)
    }
}

/// A quiz attempt as Moodle stored it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: u64,
    pub state: String,
    pub timestart: u64,
    pub sumgrades: f64,
    /// Its question usage (`uniqueid`).
    pub usage: u64,
    /// Each slot's response summary ("True", "False"; empty for none).
    pub responses: BTreeMap<u32, String>,
}

/// The site quiz's attempts with an id above `after`, by user id (the last one
/// when a user has several).
pub fn attempts(site: &Site, after: u64) -> BTreeMap<u64, Attempt> {
    let quiz = site.data.quiz.id;
    let rows = site.sql(&format!(
        "SELECT id, userid, state, timestart, COALESCE(sumgrades, -1), uniqueid \
         FROM mdl_quiz_attempts WHERE quiz = {quiz} AND id > {after} ORDER BY id"
    ));
    let mut by_user = BTreeMap::new();
    let mut usage_of = BTreeMap::new();
    for row in rows.lines() {
        let cols: Vec<&str> = row.split('\t').collect();
        let user: u64 = cols[1].parse().unwrap();
        usage_of.insert(cols[5].to_string(), user);
        by_user.insert(
            user,
            Attempt {
                id: cols[0].parse().unwrap(),
                state: cols[2].to_string(),
                timestart: cols[3].parse().unwrap(),
                sumgrades: cols[4].parse().unwrap(),
                usage: cols[5].parse().unwrap(),
                responses: BTreeMap::new(),
            },
        );
    }
    if usage_of.is_empty() {
        return by_user;
    }
    let usages: Vec<&str> = usage_of.keys().map(String::as_str).collect();
    let rows = site.sql(&format!(
        "SELECT questionusageid, slot, COALESCE(responsesummary, '') FROM mdl_question_attempts \
         WHERE questionusageid IN ({})",
        usages.join(",")
    ));
    for row in rows.lines() {
        let cols: Vec<&str> = row.splitn(3, '\t').collect();
        let user = usage_of[cols[0]];
        let attempt = by_user.get_mut(&user).unwrap();
        // The user's last attempt only.
        if attempt.usage.to_string() == cols[0] {
            let slot = cols[1].parse().unwrap();
            attempt.responses.insert(slot, cols[2].trim().to_string());
        }
    }
    by_user
}

/// The highest quiz attempt id so far (0 for none).
pub fn last_attempt_id(site: &Site) -> u64 {
    let max = site.sql("SELECT COALESCE(MAX(id), 0) FROM mdl_quiz_attempts");
    max.trim().parse().unwrap()
}

/// What the students share.
struct Together {
    /// The class has submitted and `after` has passed: the early group finishes.
    stop: AtomicBool,
    /// Class students ready (logged in, on the quiz's page).
    ready: watch::Sender<usize>,
    /// When the first click goes (set once everyone is ready).
    go: watch::Sender<Option<Instant>>,
}

/// Runs the exam start of `plan` against whatever listens on wwwroot.
pub async fn run(stage: &Stage, plan: Plan) -> Record {
    assert!(plan.early <= stage.site.data.students.len());
    assert!(plan.class <= stage.site.data.newcomers.len());
    let together = Arc::new(Together {
        stop: AtomicBool::new(false),
        ready: watch::channel(0).0,
        go: watch::channel(None).0,
    });
    let mut early = JoinSet::new();
    for (i, account) in stage.site.data.students[..plan.early].iter().enumerate() {
        let (stage, account, together) = (stage.clone(), account.clone(), together.clone());
        let offset = plan.think.1.mul_f64(i as f64 / plan.early as f64);
        early.spawn(async move {
            tokio::time::sleep(offset).await;
            answer_early(&stage, &account, i, plan, &together).await
        });
    }
    let begun = Instant::now();
    let mut class = JoinSet::new();
    for (i, account) in stage.site.data.newcomers[..plan.class].iter().enumerate() {
        let (stage, account, together) = (stage.clone(), account.clone(), together.clone());
        let login_at = begun + plan.logins.mul_f64(i as f64 / plan.class as f64);
        let click_after = plan.clicks.mul_f64(i as f64 / plan.class as f64);
        class.spawn(async move {
            tokio::time::sleep_until(login_at).await;
            let me = Me {
                account: &account,
                index: plan.early + i,
                click_after,
            };
            take_exam(&stage, me, plan, &together).await
        });
    }
    // Everyone ready (or failed and counted ready), then the calm, then the clicks.
    let mut ready = together.ready.subscribe();
    let _ = ready.wait_for(|n| *n >= plan.class).await;
    let calm = Instant::now();
    let first_click = calm + plan.before;
    together.go.send_replace(Some(first_click));
    let mut class = joined(class).await;
    let done = Instant::now();
    tokio::time::sleep(plan.after).await;
    together.stop.store(true, Ordering::Relaxed);
    let wave_end = (class.iter().filter_map(|t| t.first_page).max()).unwrap_or(first_click);
    class.sort_by_key(|t| t.click);
    Record {
        early: joined(early).await,
        class,
        calm,
        wave: (first_click, wave_end),
        done,
        timelimit: stage.site.data.quiz.timelimit,
    }
}

async fn joined<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut all = Vec::new();
    while let Some(done) = set.join_next().await {
        all.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
    }
    all
}

/// One class student.
struct Me<'a> {
    account: &'a StudentAccount,
    /// Among every student of the quiz: picks the answers.
    index: usize,
    /// The click's offset after the first one.
    click_after: Duration,
}

/// A student's quiz browser: the browser, the record, the quiz's pages.
struct Exam<'a> {
    stage: &'a Stage,
    b: Browser,
    me: Taker,
    account: &'a StudentAccount,
    index: usize,
    plan: Plan,
    turns: usize,
}

impl<'a> Exam<'a> {
    fn new(stage: &'a Stage, account: &'a StudentAccount, index: usize, plan: Plan) -> Self {
        let mut b = Browser::new(stage.client.clone(), &stage.origin);
        b.accept = Some(PAGE_ACCEPT);
        b.limit = REQUEST_LIMIT;
        Exam {
            stage,
            b,
            me: Taker {
                username: account.username.clone(),
                user_id: account.id,
                requests: Vec::new(),
                turns: Vec::new(),
                click: None,
                click_unix: None,
                started: None,
                first_page: None,
                node: None,
                answers: BTreeMap::new(),
                finished: false,
                autosave_failures: 0,
                waiting_pages: 0,
                errors: Vec::new(),
                lost: Vec::new(),
            },
            account,
            index,
            plan,
            turns: 0,
        }
    }

    /// A request, timed and recorded; the hops, or `None` with the error recorded.
    async fn send(
        &mut self,
        what: &'static str,
        path: &str,
        fields: Option<&[(&str, &str)]>,
    ) -> Option<Vec<Page>> {
        let sent = Instant::now();
        let hops = match fields {
            Some(fields) => self.b.try_post(path, fields).await,
            None => self.b.try_get(path).await,
        };
        let took = sent.elapsed();
        let status = match &hops {
            Ok(hops) => hops.last().unwrap().status.as_u16(),
            Err(_) => 0,
        };
        self.me.requests.push(Sent {
            what,
            sent,
            took,
            status,
        });
        match hops {
            Ok(hops) => Some(hops),
            Err(e) => {
                self.me.errors.push(e);
                None
            }
        }
    }

    /// [`send`](Self::send), the last hop when it is a 200 naming the student.
    async fn page(
        &mut self,
        what: &'static str,
        path: &str,
        fields: Option<&[(&str, &str)]>,
    ) -> Option<Page> {
        self.hops(what, path, fields).await?.pop()
    }

    /// [`send`](Self::send), every hop, when the last is a 200 naming the student.
    async fn hops(
        &mut self,
        what: &'static str,
        path: &str,
        fields: Option<&[(&str, &str)]>,
    ) -> Option<Vec<Page>> {
        let hops = self.send(what, path, fields).await?;
        let last = hops.last().unwrap();
        if last.status != StatusCode::OK {
            let brief = last.brief();
            self.me
                .errors
                .push(format!("{:?}: {brief}", requests(&hops)));
            return None;
        }
        if self.b.logged_in && !last.text().contains(&self.account.fullname) {
            self.me.lost.push(format!(
                "{}: the page does not name the student",
                last.request
            ));
            return None;
        }
        Some(hops)
    }

    /// Logs in, through the gateway's waiting room if it is open: its page is
    /// followed as a browser follows it (its `Refresh`, the place cookie in the jar).
    async fn log_in(&mut self) -> bool {
        let arrived = Instant::now();
        let form = loop {
            let Some(mut hops) = self.send("login form", "/login/index.php", None).await else {
                return false;
            };
            let page = hops.pop().unwrap();
            match waiting_page(&page, ROOM_COOKIE) {
                Some(_) if arrived.elapsed() > ROOM_PATIENCE => {
                    (self.me.errors).push(format!("still waiting after {:?}", arrived.elapsed()));
                    return false;
                }
                Some(refresh) => {
                    self.me.waiting_pages += 1;
                    tokio::time::sleep(refresh).await;
                }
                None if page.status == StatusCode::OK => break page,
                None => {
                    (self.me.errors).push(format!("the login form: {}", page.brief()));
                    return false;
                }
            }
        };
        let text = form.text();
        let Some(token) = between(&text, "name=\"logintoken\" value=\"", "\"") else {
            self.me
                .errors
                .push("the login form has no logintoken".into());
            return false;
        };
        let token = token.to_string();
        let account = self.account;
        let fields = [
            ("anchor", ""),
            ("logintoken", token.as_str()),
            ("username", account.username.as_str()),
            ("password", account.password.as_str()),
        ];
        let Some(dashboard) = self.page("login", "/login/index.php", Some(&fields)).await else {
            return false;
        };
        if !dashboard.request.starts_with("GET /my/")
            || !dashboard.text().contains(&account.fullname)
        {
            (self.me.errors).push(format!("not logged in: {}", dashboard.request));
            return false;
        }
        self.b.logged_in = true;
        true
    }

    /// The quiz's page, and the fields of its start form (the time limit's
    /// confirmation, which the page holds for its dialog).
    async fn view(&mut self) -> Option<Vec<(String, String)>> {
        let path = format!("/mod/quiz/view.php?id={}", self.stage.site.data.quiz.cmid);
        let view = self.page("view.php", &path, None).await?;
        let text = view.text();
        let Some(mut fields) = form_fields(&text, "id=\"mod_quiz_preflight_form\"") else {
            (self.me.errors).push(format!("{path} has no confirmation form: {}", view.brief()));
            return None;
        };
        fields.push(("submitbutton".into(), "Start attempt".into()));
        Some(fields)
    }

    /// "Start attempt" on the confirmation: the first question page.
    async fn start(&mut self, fields: &[(String, String)]) -> Option<Page> {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let mut hops = self
            .hops(
                "startattempt.php",
                "/mod/quiz/startattempt.php",
                Some(&fields),
            )
            .await?;
        let page = hops.pop().unwrap();
        if !page.request.starts_with("GET /mod/quiz/attempt.php") {
            (self.me.errors).push(format!("the start led to {}", page.request));
            return None;
        }
        // The POST's own answer: the redirect to the page.
        self.me.started = Some(Instant::from_std(hops[0].read));
        self.me.node = page.node().map(str::to_string);
        Some(page)
    }

    /// The answer this student gives to `slot` on its `lap`-th pass over the pages.
    fn answer(&self, slot: u32, lap: usize) -> String {
        let slots = &self.stage.site.data.quiz.slots;
        let right = &slots.iter().find(|s| s.slot == slot).unwrap().right;
        let wrong = (self.index + slot as usize + lap).is_multiple_of(3);
        match (right.as_str(), wrong) {
            ("1", false) | ("0", true) => "1".into(),
            _ => "0".into(),
        }
    }

    /// Thinks, answers the page's questions (an autosave first, every so often) and
    /// turns to `next` (-1: the summary). The next page, the summary when `next` is -1.
    async fn turn(&mut self, page: &Page, next: Option<i64>, lap: usize) -> Option<Page> {
        let text = page.text();
        let Some(mut fields) = form_fields(&text, "id=\"responseform\"") else {
            (self.me.errors).push(format!("{} has no response form", page.request));
            return None;
        };
        let prefixes: Vec<String> = (fields.iter())
            .filter_map(|(k, _)| k.strip_suffix(":sequencecheck"))
            .map(str::to_string)
            .collect();
        let mut given = Vec::new();
        for prefix in prefixes {
            let slot: u32 = (prefix.split(':').nth(1))
                .and_then(|s| s.trim_end_matches('_').parse().ok())
                .unwrap();
            let answer = self.answer(slot, lap);
            fields.push((format!("{prefix}answer"), answer.clone()));
            given.push((slot, answer));
        }
        if let Some(next) = next {
            fields.retain(|(k, _)| k != "nextpage");
            fields.push(("nextpage".into(), next.to_string()));
        }
        let (low, high) = if self.index < self.plan.early {
            self.plan.think
        } else {
            self.plan.class_think
        };
        let spread = (self.index * 7 + self.turns * 13) % 100;
        let think = low + (high - low).mul_f64(spread as f64 / 100.0);
        self.turns += 1;
        if self.turns.is_multiple_of(self.plan.autosave_every) {
            tokio::time::sleep(think / 2).await;
            self.autosave(&fields, &given).await;
            tokio::time::sleep(think / 2).await;
        } else {
            tokio::time::sleep(think).await;
        }
        fields.push(("next".into(), "Next page".into()));
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let path = format!(
            "/mod/quiz/processattempt.php?cmid={}",
            self.stage.site.data.quiz.cmid
        );
        let sent = Instant::now();
        let next_page = self.page("processattempt.php", &path, Some(&fields)).await;
        self.me.turns.push(Sent {
            what: "page turn",
            sent,
            took: sent.elapsed(),
            status: next_page.as_ref().map_or(0, |p| p.status.as_u16()),
        });
        let next_page = next_page?;
        self.me.answers.extend(given);
        Some(next_page)
    }

    /// The autosave of the page's answers, as the browser posts it.
    async fn autosave(&mut self, fields: &[(String, String)], given: &[(u32, String)]) {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        self.b.accept = Some(AJAX_ACCEPT);
        let hops = self
            .send(
                "autosave.ajax.php",
                "/mod/quiz/autosave.ajax.php",
                Some(&fields),
            )
            .await;
        self.b.accept = Some(PAGE_ACCEPT);
        let Some(hops) = hops else {
            self.me.autosave_failures += 1;
            return;
        };
        let last = hops.last().unwrap();
        if hops.len() != 1 || last.status != StatusCode::OK || !last.text().contains("\"OK\"") {
            self.me.autosave_failures += 1;
            (self.me.errors).push(format!("autosave: {:?}: {}", requests(&hops), last.brief()));
            return;
        }
        self.me.answers.extend(given.iter().cloned());
    }

    /// "Submit all and finish" on the summary page: the review page.
    async fn finish(&mut self, summary: &Page) {
        if !summary.request.starts_with("GET /mod/quiz/summary.php") {
            (self.me.errors).push(format!("expected the summary, got {}", summary.request));
            return;
        }
        let text = summary.text();
        let Some(fields) = form_fields(&text, "id=\"frm-finishattempt\"") else {
            (self.me.errors).push("the summary has no finish form".into());
            return;
        };
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let review = self
            .page("finish", "/mod/quiz/processattempt.php", Some(&fields))
            .await;
        match review {
            Some(page) if page.request.starts_with("GET /mod/quiz/review.php") => {
                self.me.finished = true;
            }
            Some(page) => (self.me.errors).push(format!("the finish led to {}", page.request)),
            None => {}
        }
    }

    fn done(mut self) -> Taker {
        self.me.lost.extend(self.b.lost);
        self.me
    }
}

/// One early student: logs in, starts at once and turns pages (round and round the
/// quiz) until told to stop, then submits.
async fn answer_early(
    stage: &Stage,
    account: &StudentAccount,
    index: usize,
    plan: Plan,
    together: &Together,
) -> Taker {
    let mut exam = Exam::new(stage, account, index, plan);
    let pages = stage.site.data.quiz.pages as i64;
    if !exam.log_in().await {
        return exam.done();
    }
    let Some(fields) = exam.view().await else {
        return exam.done();
    };
    let Some(mut page) = exam.start(&fields).await else {
        return exam.done();
    };
    exam.me.first_page = Some(Instant::now());
    let mut at: i64 = 0;
    for turn in 0..MAX_TURNS {
        let stop = together.stop.load(Ordering::Relaxed);
        let next = if stop { -1 } else { (at + 1) % pages };
        let lap = turn / pages as usize;
        let Some(next_page) = exam.turn(&page, Some(next), lap).await else {
            return exam.done();
        };
        if stop {
            exam.finish(&next_page).await;
            return exam.done();
        }
        page = next_page;
        at = next;
    }
    exam.me.errors.push("the wave never ended".into());
    exam.done()
}

/// One class student: logs in, opens the quiz's page, waits for the clicks, starts,
/// answers every page in turn and submits.
async fn take_exam(stage: &Stage, me: Me<'_>, plan: Plan, together: &Together) -> Taker {
    let mut exam = Exam::new(stage, me.account, me.index, plan);
    let fields = match exam.log_in().await {
        true => exam.view().await,
        false => None,
    };
    together.ready.send_modify(|n| *n += 1);
    let mut go = together.go.subscribe();
    let first_click = go.wait_for(|at| at.is_some()).await.unwrap().unwrap();
    let Some(fields) = fields else {
        return exam.done();
    };
    tokio::time::sleep_until(first_click + me.click_after).await;
    exam.me.click = Some(Instant::now());
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    exam.me.click_unix = Some(unix.as_secs_f64());
    let Some(mut page) = exam.start(&fields).await else {
        return exam.done();
    };
    exam.me.first_page = Some(Instant::now());
    let pages = stage.site.data.quiz.pages as i64;
    for at in 0..pages {
        let next = if at + 1 == pages { -1 } else { at + 1 };
        let Some(next_page) = exam.turn(&page, Some(next), 0).await else {
            return exam.done();
        };
        page = next_page;
    }
    exam.finish(&page).await;
    exam.done()
}

/// The hidden fields of the form whose opening tag holds `marker`, in page order.
fn form_fields(html: &str, marker: &str) -> Option<Vec<(String, String)>> {
    let at = html.find(marker)?;
    let start = html[..at].rfind("<form")?;
    let end = start + html[start..].find("</form>")?;
    let form = &html[start..end];
    let mut fields = Vec::new();
    for input in form.split("<input").skip(1) {
        let tag = &input[..input.find('>').unwrap_or(input.len())];
        if !tag.contains("type=\"hidden\"") {
            continue;
        }
        let (Some(name), Some(value)) = (attr(tag, "name"), attr(tag, "value")) else {
            continue;
        };
        fields.push((name.to_string(), value.replace("&amp;", "&")));
    }
    Some(fields)
}

/// The value of attribute `name` in a tag's text.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    between(tag, &key, "\"")
}

/// The figures of one exam start, for `--nocapture`.
pub fn figures(record: &Record) -> Vec<String> {
    let ms = |(p50, p95, max): (f64, f64, f64)| {
        format!("p50 {p50:.0} ms, p95 {p95:.0} ms, max {max:.0} ms")
    };
    let [before, during, after] = record.turn_times();
    let first = record.first_page_times();
    let (start, end) = record.wave;
    let starts: Vec<Duration> = (record.class.iter().flat_map(|t| &t.requests))
        .filter(|r| r.what == "startattempt.php")
        .map(|r| r.took)
        .collect();
    let all = record.early.iter().chain(&record.class);
    let sent: Vec<&Sent> = all.flat_map(|t| &t.requests).collect();
    let failed = sent.iter().filter(|r| r.status != 200).count();
    let waiting: usize = (record.early.iter().chain(&record.class))
        .map(|t| t.waiting_pages)
        .sum();
    vec![
        format!(
            "a {}-minute quiz; {} requests, {failed} not answered 200 in the end ({waiting} of them waiting pages); \
             the class was done {:.1?} after the first click",
            record.timelimit / 60,
            sent.len(),
            record.done - start,
        ),
        format!(
            "early students ({}): page turns before the wave {} ({}), during it {} ({}), after it {} ({})",
            record.early.len(),
            ms(percentiles(&before)),
            before.len(),
            ms(percentiles(&during)),
            during.len(),
            ms(percentiles(&after)),
            after.len(),
        ),
        format!(
            "class ({}): click to first question page {}; the wave lasted {:.1?}",
            record.class.len(),
            ms(percentiles(&first)),
            end - start,
        ),
        format!("startattempt.php and its first page: {}", ms(percentiles(&starts))),
        format!(
            "exam time before the first question (the start's answer to its first page): {}",
            ms(percentiles(&record.exam_time_to_first_page()))
        ),
        format!(
            "finished: {} of {} in the class, {} of {} early; autosave failures {}; errors {}; lost sessions {}; \
             waiting pages on the way to log in {}",
            record.class.iter().filter(|t| t.finished).count(),
            record.class.len(),
            record.early.iter().filter(|t| t.finished).count(),
            record.early.len(),
            record.autosave_failures(),
            record.errors().len(),
            record.lost().len(),
            waiting,
        ),
    ]
}
