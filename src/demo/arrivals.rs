//! While the demo serves, a steady trickle of simulated students: one logs in every
//! [`EVERY`], studies, and stays; once [`STAY`] are logged in, the one who came first
//! logs out. Someone who opens the dashboard sees them arrive, spread over the
//! nodes, and leave.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use super::Students;

/// Time between two arrivals.
pub(super) const EVERY: Duration = Duration::from_secs(2);
/// How many stay logged in at once.
pub(super) const STAY: usize = 40;

/// Runs until the task is aborted: the demo's Ctrl-C.
pub(super) async fn arrive(gateway: SocketAddr, site_path: String, cookie: String) {
    let mut present: VecDeque<Students> = VecDeque::with_capacity(STAY + 1);
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        present.push_back(Students::log_in(gateway, &site_path, &cookie, 1, 1).await);
        if present.len() <= STAY {
            continue;
        }
        let Some(first) = present.pop_front() else {
            continue;
        };
        for failure in first.log_out().await.failures {
            tracing::warn!("demo: a simulated student failed: {failure}");
        }
    }
}
