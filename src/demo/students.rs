//! The student simulator: students log in, study and log out through the gateway,
//! and [`StudentsReport`] says where they landed and whether any step broke.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::standin::{REVISION, SCORM_LAUNCH};
use super::Browser;

/// The sessionless assets a login page pulls in, at the stand-ins' revision (so the
/// gateway's asset cache keeps them): they must not start sessions or move the deal
/// of new sessions.
fn assets() -> [String; 3] {
    [
        format!("/theme/styles.php/boost/{REVISION}_1/all"),
        format!("/lib/javascript.php/{REVISION}/lib/javascript-static.js"),
        format!("/theme/image.php/boost/core/{REVISION}/i/loading"),
    ]
}

/// One step that did not go as Moodle would have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The student, numbered from 1.
    pub student: usize,
    /// What went wrong, starting with the request.
    pub reason: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "student {}: {}", self.student, self.reason)
    }
}

/// What the simulated students experienced.
#[derive(Debug, Clone, Default)]
pub struct StudentsReport {
    /// How many students ran.
    pub students: usize,
    /// Node name (`X-Upstream` of the login POST) → students who logged in there.
    pub logged_in: BTreeMap<String, usize>,
    /// One per student whose flow broke, at the first broken step.
    pub failures: Vec<Failure>,
    /// Requests sent through the gateway.
    pub requests: u64,
    /// Wall time of both phases.
    pub duration: Duration,
}

impl StudentsReport {
    /// Every student logged in, studied and logged out without a hitch.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs `count` students through the whole flow (log in, browse, SCORM, log out),
/// at most `concurrency` at once; with 1 they arrive one after another.
pub async fn simulate_students(
    gateway: SocketAddr,
    site_path: &str,
    cookie: &str,
    count: usize,
    concurrency: usize,
) -> StudentsReport {
    let students = Students::log_in(gateway, site_path, cookie, count, concurrency).await;
    students.log_out().await
}

/// Students between the two phases: logged in and done studying, not yet logged
/// out, so the gateway's table can be inspected with every session live.
pub struct Students {
    students: Vec<Student>,
    concurrency: usize,
    started: Instant,
}

impl Students {
    /// Phase one: each student opens the login form, loads its assets, logs in,
    /// visits their dashboard and course, opens a SCORM file and saves progress.
    pub async fn log_in(
        gateway: SocketAddr,
        site_path: &str,
        cookie: &str,
        count: usize,
        concurrency: usize,
    ) -> Students {
        let started = Instant::now();
        let client = Client::builder(TokioExecutor::new()).build_http();
        let students = (1..=count).map(|index| Student {
            index,
            browser: Browser::with_client(client.clone(), gateway, site_path, cookie),
            login_node: None,
            failure: None,
        });
        let students = run_phase(students.collect(), concurrency, Phase::LogIn).await;
        Students {
            students,
            concurrency,
            started,
        }
    }

    /// Phase two: every student still in good standing logs out.
    pub async fn log_out(self) -> StudentsReport {
        let students = run_phase(self.students, self.concurrency, Phase::LogOut).await;
        let mut report = StudentsReport {
            students: students.len(),
            duration: self.started.elapsed(),
            ..StudentsReport::default()
        };
        for student in students {
            report.requests += student.browser.requests();
            if let Some(node) = student.login_node {
                *report.logged_in.entry(node).or_default() += 1;
            }
            if let Some(reason) = student.failure {
                report.failures.push(Failure {
                    student: student.index,
                    reason,
                });
            }
        }
        report
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    LogIn,
    LogOut,
}

/// Permits are taken in student order before each task starts, so students arrive
/// in order and never more than `concurrency` are mid-flow.
async fn run_phase(students: Vec<Student>, concurrency: usize, phase: Phase) -> Vec<Student> {
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(students.len());
    for mut student in students {
        let permit = gate
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        tasks.push(tokio::spawn(async move {
            student.play(phase).await;
            drop(permit);
            student
        }));
    }
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await.expect("a student task panicked"));
    }
    done
}

struct Student {
    index: usize,
    browser: Browser,
    login_node: Option<String>,
    failure: Option<String>,
}

impl Student {
    async fn play(&mut self, phase: Phase) {
        if self.failure.is_some() {
            return;
        }
        let result = match phase {
            Phase::LogIn => self.log_in().await,
            Phase::LogOut => self.log_out().await,
        };
        self.failure = result.err();
    }

    /// Phase one for this student; the first unexpected answer ends it.
    async fn log_in(&mut self) -> Result<(), String> {
        let (token, guest) = self.open_login_form().await?;
        let form = format!(
            "username=student{}&password=x&logintoken={token}",
            self.index
        );
        let reply = self.browser.post("/login/index.php", &form).await?;
        let rotated = reply.issued.as_ref().is_some_and(|id| *id != guest);
        if reply.status != StatusCode::SEE_OTHER || !rotated {
            return Err(reply.unexpected("POST /login/index.php", "303 and a new session id"));
        }
        self.login_node = Some(reply.upstream().to_owned());
        self.page(Method::GET, "/my/", "Hello").await?;
        self.page(Method::GET, "/course/view.php?id=2", "Hello")
            .await?;
        // From the data server, whichever way: straight, or named by the node.
        let file = self.browser.get(SCORM_LAUNCH).await?;
        if file.status != StatusCode::OK || !file.text().ends_with(" from data\n") {
            let what = format!("GET {SCORM_LAUNCH}");
            return Err(file.unexpected(&what, "200 with the data server's bytes"));
        }
        self.page(Method::GET, "/mod/scorm/player.php?a=1", "Hello")
            .await?;
        self.page(Method::POST, "/mod/scorm/datamodel.php", "true")
            .await
    }

    /// The login form and the assets it pulls in; returns the logintoken and the
    /// guest session id the form was served in.
    async fn open_login_form(&mut self) -> Result<(String, String), String> {
        let form = self.browser.get("/login/index.php").await?;
        let (Some(token), Some(guest)) = (logintoken(&form.text()), form.issued.clone()) else {
            return Err(form.unexpected("GET /login/index.php", "a logintoken and a session"));
        };
        for asset in assets() {
            let reply = self.browser.get(&asset).await?;
            if reply.status != StatusCode::OK || reply.issued.is_some() {
                return Err(reply.unexpected(&format!("GET {asset}"), "200 without a session"));
            }
        }
        Ok((token, guest))
    }

    /// A page behind `require_login()`: a bounce to the login page is a lost session.
    async fn page(&mut self, method: Method, path: &str, expect: &str) -> Result<(), String> {
        let form = (method == Method::POST).then_some("cmi.core.lesson_status=completed");
        let what = format!("{method} {path}");
        let reply = self.browser.send(method, path, form, &[]).await?;
        if reply.sent_to_login() {
            return Err(format!(
                "{what}: lost session: {} sent the student to log in",
                reply.upstream()
            ));
        }
        if reply.status != StatusCode::OK || !reply.text().starts_with(expect) {
            return Err(reply.unexpected(&what, &format!("{expect:?}")));
        }
        Ok(())
    }

    /// Moodle's logout starts a new anonymous session rather than clearing the cookie.
    async fn log_out(&mut self) -> Result<(), String> {
        let before = self.browser.session().map(str::to_owned);
        let reply = self.browser.get("/login/logout.php?sesskey=x").await?;
        let anonymous = reply.issued.is_some() && reply.issued != before;
        if reply.status != StatusCode::SEE_OTHER || !anonymous {
            let want = "303 and a new anonymous session";
            return Err(reply.unexpected("GET /login/logout.php", want));
        }
        Ok(())
    }
}

/// The token after `logintoken=` in a login page.
pub(super) fn logintoken(page: &str) -> Option<String> {
    let (_, rest) = page.split_once("logintoken=")?;
    let token: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;
    use crate::demo::standin::Cluster;
    use crate::App;

    /// The real gateway (no admin listener) before `cluster`, until the test ends.
    async fn gateway(cluster: &Cluster) -> SocketAddr {
        let toml = cluster.config_toml("127.0.0.1:0", None, "");
        let app = App::new(crate::demo::demo_config(&toml).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(app.serve(listener, None, std::future::pending()));
        addr
    }

    #[tokio::test]
    async fn eight_students_keep_their_sessions_through_the_gateway() {
        let cluster = Cluster::spawn(4, "/moodle", "MoodleSessionlms").unwrap();
        let addr = gateway(&cluster).await;
        let report = simulate_students(addr, "/moodle", "MoodleSessionlms", 8, 4).await;
        assert!(report.ok(), "{:?}", report.failures);
        let spread: Vec<_> = report.logged_in.values().copied().collect();
        assert_eq!(spread, [2, 2, 2, 2], "{:?}", report.logged_in);
        assert_eq!(cluster.lost_sessions(), 0);
        assert_eq!(report.requests, 8 * 11);
        assert_eq!(cluster.data().request_count(), 8);
    }

    #[test]
    fn logintoken_is_read_from_the_page() {
        let page = "<input name=\"logintoken\" value=\"Ab12\">\n<!-- logintoken=Ab12 -->";
        assert_eq!(logintoken(page).as_deref(), Some("Ab12"));
        assert_eq!(logintoken("nothing"), None);
    }
}
