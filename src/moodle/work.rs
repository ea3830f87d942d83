//! What a logged-in student's request is in the middle of, read from the request
//! alone: the order a busy node's line serves students in on exam day.
//!
//! Why it matters: at a quiz's synchronised start a whole class POSTs
//! `mod/quiz/startattempt.php` within a second, and each start is followed by the
//! attempt's first page, the heaviest page of the quiz. Students who already have
//! their first page are turning pages (`processattempt.php`), being autosaved
//! (`autosave.ajax.php`) and finishing; their clock is running. So work already
//! started goes before new work, and starts themselves are paced.
//!
//! Where the clock starts decides what is "started": Moodle sets an attempt's
//! `timestart` when `startattempt.php` creates it. The start itself is not yet
//! work in progress (it is paced at its node's gate); everything after it is, the
//! first page included: its student's time is already running. The first page
//! is still the heavier half of starting, so it carries its start's turn at the
//! gate (`gateway::first_pages`), which `opens_first_page` and `is_attempt_page`
//! let the gateway find.
//!
//! The facts (Moodle 4.5, `mod/quiz`): every request of an attempt in progress
//! carries `attempt=` (`attempt.php?attempt=ID&page=P`, `processattempt.php`,
//! `autosave.ajax.php`, `summary.php`); `startattempt.php` is the only script that
//! creates one, and answers 303 to `attempt.php?attempt=ID&cmid=CMID`, the first
//! page. Any other POST of a logged-in student saves work already begun (SCORM
//! tracking in `datamodel.php`, `lib/ajax/service.php`, a forum post, an upload),
//! which losing or delaying costs more than a page view.
//!
//! Nothing here routes: the reading only orders students' requests among
//! themselves, so a request that dresses itself up gains its own student nothing
//! over the crowd, which is kept apart by the session's state, not by this.

use http::header::LOCATION;
use http::{HeaderMap, StatusCode};

use super::{PageKind, RequestKind};

/// What a logged-in student's request is in the middle of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// Work already started: a quiz attempt's pages (the first one included),
    /// autosave and finish, and any other write (SCORM tracking, AJAX calls, posts,
    /// uploads).
    InProgress,
    /// `POST mod/quiz/startattempt.php`: creates an attempt and starts its timer.
    QuizStart,
    /// New work: a page view, the quiz's own page, the dashboard, a course.
    New,
}

/// What a request of kind `kind` is in the middle of, for a POST when `is_post`.
/// A pure reading of what `Site::classify` found: the path is not read again.
pub fn work(kind: RequestKind, is_post: bool) -> Work {
    match kind {
        RequestKind::Page(PageKind::QuizStart) if is_post => Work::QuizStart,
        RequestKind::Page(PageKind::QuizAttempt) => Work::InProgress,
        _ if is_post => Work::InProgress,
        _ => Work::New,
    }
}

/// Whether a request of kind `kind` may be an attempt's first page: a GET of an
/// attempt's script. `startattempt.php` sends its student on to `attempt.php`.
pub fn is_attempt_page(kind: RequestKind, is_post: bool) -> bool {
    kind == RequestKind::Page(PageKind::QuizAttempt) && !is_post
}

/// Whether a start's answer opens its attempt: `startattempt.php` created it and
/// Moodle's `redirect()` answers 303 with the absolute URL of its first page,
/// `mod/quiz/attempt.php?attempt=ID&cmid=CMID`. Any other answer opens no attempt
/// page: the form of an access rule (a password, a browser check) is a 200, and an
/// error or a closed quiz sends the student back to the quiz's own `view.php`.
pub fn opens_first_page(status: StatusCode, headers: &HeaderMap) -> bool {
    let Some(location) = headers.get(LOCATION).and_then(|l| l.to_str().ok()) else {
        return false;
    };
    let target = location.split(['?', '#']).next().unwrap_or_default();
    status.is_redirection() && target.ends_with("/mod/quiz/attempt.php")
}
