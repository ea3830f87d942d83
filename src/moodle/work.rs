//! What a logged-in student's request is in the middle of, read from the request
//! alone: the order a busy node's line serves students in on exam day.
//!
//! Why it matters: at a quiz's synchronised start a whole class POSTs
//! `mod/quiz/startattempt.php` within a second, and each start is followed by the
//! attempt's first page, the heaviest page of the quiz. Students who already have
//! their first page are turning pages (`processattempt.php`), being autosaved
//! (`autosave.ajax.php`) and finishing; their clock is running, a start's is not yet
//! (Moodle's timer starts when `startattempt.php` creates the attempt). So work
//! already started goes before new heavy work, and starts themselves are paced.
//!
//! The facts (Moodle 4.5, `mod/quiz`): every request of an attempt in progress
//! carries `attempt=` (`attempt.php?attempt=ID&page=P`, `processattempt.php`,
//! `autosave.ajax.php`, `summary.php`); `startattempt.php` is the only script that
//! creates one, and answers 303 to `attempt.php?attempt=ID&cmid=CMID`, the first
//! page, which alone has no `page=`. Any other POST of a logged-in student saves
//! work already begun (SCORM tracking in `datamodel.php`, `lib/ajax/service.php`,
//! a forum post, an upload), which losing or delaying costs more than a page view.
//!
//! Nothing here routes: the reading only orders students' requests among
//! themselves, so a request that dresses itself up gains its own student nothing
//! over the crowd, which is kept apart by the session's state, not by this.

use super::php::{php_name_is, split_pair};

/// What a logged-in student's request is in the middle of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// Work already started: a quiz attempt's pages, autosave and finish, and any
    /// other write (SCORM tracking, AJAX calls, posts, uploads).
    InProgress,
    /// `POST mod/quiz/startattempt.php`: creates an attempt and starts its timer.
    QuizStart,
    /// New work: a page view, a quiz attempt's first page, the dashboard, a course.
    New,
}

impl Work {
    /// Every kind, for the labels of `/metrics`.
    pub const ALL: [Work; 3] = [Work::InProgress, Work::QuizStart, Work::New];

    /// The label in `/metrics`, the dashboard and the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Work::InProgress => "in_progress",
            Work::QuizStart => "quiz_start",
            Work::New => "new",
        }
    }
}

/// What `rel` (a path relative to the site, as PHP reads it) with `query` is in
/// the middle of, for a POST when `is_post`.
pub(super) fn work(rel: &str, query: Option<&str>, is_post: bool) -> Work {
    match rel {
        "/mod/quiz/startattempt.php" if is_post => Work::QuizStart,
        "/mod/quiz/processattempt.php"
        | "/mod/quiz/autosave.ajax.php"
        | "/mod/quiz/summary.php" => Work::InProgress,
        // The first page follows the start: new heavy work. A later page is a turn.
        "/mod/quiz/attempt.php" if has_parameter(query, "page") => Work::InProgress,
        _ if is_post => Work::InProgress,
        _ => Work::New,
    }
}

/// Whether PHP sees a parameter `name` in `query`.
fn has_parameter(query: Option<&str>, name: &str) -> bool {
    (query.unwrap_or_default().split('&'))
        .any(|pair| php_name_is(split_pair(pair.as_bytes()).0, name))
}
