//! The cluster's shared registry of issued session ids, like Moodle's `sessions`
//! table: who owns each live session, and how many sessions were lost to misrouting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One session: the `sessions` row (owner) plus the node's session data.
struct Session {
    node: String,
    user: Option<String>,
    logintoken: String,
}

#[derive(Default)]
struct Sessions {
    by_id: HashMap<String, Session>,
    lost: u64,
}

/// Every session any node of one cluster issued, like Moodle's `sessions` table: a
/// cheap-clone handle over one mutex, never held across an `.await`. No `Debug`:
/// session ids are credentials, even in a stand-in's test output.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Sessions>>);

/// The session a request runs in, and whether the response must set its cookie.
pub(super) struct Current {
    pub(super) id: String,
    pub(super) user: Option<String>,
    pub(super) logintoken: String,
    pub(super) issue: bool,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests that reached a node other than the one holding their live session:
    /// each one logged a student out (with node-local sessions, the row is deleted).
    pub fn lost_sessions(&self) -> u64 {
        self.lock().lost
    }

    /// Deletes session `id`, as Moodle's `kill_session()` does (an admin's "log out
    /// everywhere", a changed password, a session store that lost its rows): its
    /// next request gets a new guest session and the login page.
    pub fn kill(&self, id: &str) -> bool {
        self.lock().by_id.remove(id).is_some()
    }

    /// The node holding session `id`, if it is live.
    pub fn owner(&self, id: &str) -> Option<String> {
        self.lock().by_id.get(id).map(|s| s.node.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Sessions> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn count(&self, node: &str) -> usize {
        self.lock()
            .by_id
            .values()
            .filter(|s| s.node == node)
            .count()
    }

    /// `core\session\manager::start()`: the cookie's session if `node` holds it, else a
    /// new guest session. A live id held by another node is a lost session: Moodle
    /// finds the row without session data and regenerates; a logged-in session's row
    /// is deleted (the student is logged out everywhere), a visitor's is left to its
    /// own node (as `doctor` relies on when it shows one node's visitor to the others).
    pub(super) fn resolve(&self, node: &str, id: Option<&str>) -> Current {
        let mut sessions = self.lock();
        if let Some(id) = id {
            match sessions.by_id.get(id) {
                Some(s) if s.node == node => {
                    let (user, logintoken) = (s.user.clone(), s.logintoken.clone());
                    let (id, issue) = (id.to_owned(), false);
                    return Current {
                        id,
                        user,
                        logintoken,
                        issue,
                    };
                }
                // Moodle deletes a logged-in session found without its data; a
                // visitor's row (no user) stays, and its own node keeps serving it.
                Some(s) => {
                    let logged_in = s.user.is_some();
                    sessions.lost += 1;
                    if logged_in {
                        sessions.by_id.remove(id);
                    }
                }
                None => {}
            }
        }
        let (id, session) = fresh(node, None);
        let logintoken = session.logintoken.clone();
        sessions.by_id.insert(id.clone(), session);
        Current {
            id,
            user: None,
            logintoken,
            issue: true,
        }
    }

    /// `session_regenerate_id(true)`: the old id is gone everywhere.
    pub(super) fn rotate(&self, node: &str, current: &mut Current, user: Option<String>) {
        let mut sessions = self.lock();
        sessions.by_id.remove(&current.id);
        let (id, session) = fresh(node, user.clone());
        current.logintoken = session.logintoken.clone();
        sessions.by_id.insert(id.clone(), session);
        (current.id, current.user, current.issue) = (id, user, true);
    }
}

fn fresh(node: &str, user: Option<String>) -> (String, Session) {
    let logintoken = random_alnum(32);
    (
        random_alnum(26),
        Session {
            node: node.to_owned(),
            user,
            logintoken,
        },
    )
}

/// `[a-z0-9]{len}` from the OS generator, by rejection so every character is equally likely.
fn random_alnum(len: usize) -> String {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random generator works");
        let usable = bytes.iter().filter(|&&b| b < 252).take(len - out.len());
        out.extend(usable.map(|&b| ALPHABET[usize::from(b % 36)] as char));
    }
    out
}
