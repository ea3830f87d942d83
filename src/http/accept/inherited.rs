//! Listening sockets the gateway did not open itself: the ones systemd passes by
//! socket activation (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`), and the ones a
//! previous gateway process hands over ([`crate::handover`]).
//!
//! Why: a socket that outlives the process means a restart or an upgrade refuses
//! nobody. While no process accepts, the kernel queues new connections in the
//! socket's backlog, and the next process answers them.
//!
//! Each passed socket is matched to a configured listener (`listen`,
//! `admin.listen`, `tls.redirect_listen`) by its local address first, then by its
//! name (systemd's `FileDescriptorName=`, or the role the previous process gave
//! it: `public`, `admin`, `redirect`), which is how `listen = "0.0.0.0:8080"`
//! finds systemd's dual-stack `ListenStream=8080`. A configured listener with no
//! passed socket is bound as usual; a passed socket that matches nothing is
//! closed, with a warning.

use std::net::{SocketAddr, TcpListener};

/// Where a passed socket came from, as the logs and `check` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// systemd socket activation.
    Systemd,
    /// The previous gateway process, by handover.
    Predecessor,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Systemd => "systemd",
            Origin::Predecessor => "the previous process",
        })
    }
}

/// One passed socket, not yet matched.
#[derive(Debug)]
struct Passed {
    listener: TcpListener,
    name: Option<String>,
    origin: Origin,
}

/// The passed sockets still waiting for a configured listener.
#[derive(Debug, Default)]
pub struct Inherited {
    passed: Vec<Passed>,
    /// Problems met while taking them (a passed descriptor that is no TCP socket).
    problems: Vec<String>,
}

impl Inherited {
    /// The sockets systemd passed to this process, if any. Call it before any
    /// thread starts: it clears `LISTEN_FDS` and `LISTEN_PID` from the environment
    /// (so no child process takes them for its own), and the environment is not
    /// safe to change while other threads read it.
    pub fn from_systemd() -> Self {
        let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
        let names: Vec<&str> = names.split(':').collect();
        let mut fds = listenfd::ListenFd::from_env();
        let mut inherited = Self::default();
        for index in 0..fds.len() {
            let name = names.get(index).filter(|n| !n.is_empty());
            match fds.take_tcp_listener(index) {
                Ok(Some(listener)) => {
                    let name = name.map(|n| (*n).to_owned());
                    inherited.add(listener, name, Origin::Systemd);
                }
                Ok(None) => {}
                Err(error) => inherited
                    .problems
                    .push(format!("systemd's socket {}: {error}", index + 3)),
            }
        }
        std::env::remove_var("LISTEN_FDNAMES");
        inherited
    }

    /// Adds a socket passed some other way.
    pub fn add(&mut self, listener: TcpListener, name: Option<String>, origin: Origin) {
        self.passed.push(Passed {
            listener,
            name,
            origin,
        });
    }

    /// Whether no socket was passed.
    pub fn is_empty(&self) -> bool {
        self.passed.is_empty()
    }

    /// The passed socket for the listener `role` configured at `addr`: the one
    /// listening on exactly `addr`, else the one named `role`.
    pub fn take(&mut self, role: &str, addr: SocketAddr) -> Option<(TcpListener, Origin)> {
        let at = |p: &Passed| p.listener.local_addr().ok() == Some(addr);
        let named = |p: &Passed| p.name.as_deref() == Some(role);
        let index =
            (self.passed.iter().position(at)).or_else(|| self.passed.iter().position(named))?;
        let passed = self.passed.swap_remove(index);
        Some((passed.listener, passed.origin))
    }

    /// The listener for `role` at `addr`: the passed socket (said in the log), else
    /// a new one bound there. The error names the address.
    pub async fn listener(
        &mut self,
        role: &str,
        addr: SocketAddr,
    ) -> Result<tokio::net::TcpListener, String> {
        let cannot = |error: std::io::Error| format!("cannot listen on {addr}: {error}");
        let Some((passed, origin)) = self.take(role, addr) else {
            return tokio::net::TcpListener::bind(addr).await.map_err(cannot);
        };
        let at = passed.local_addr().map_err(cannot)?;
        tracing::info!(listener = role, %at, "listening socket from {origin}");
        passed.set_nonblocking(true).map_err(cannot)?;
        tokio::net::TcpListener::from_std(passed).map_err(cannot)
    }

    /// What is left unmatched, and what could not be taken, one line each: said
    /// as warnings once every listener has taken its socket. The unmatched
    /// sockets close when this is dropped.
    pub fn leftovers(&self) -> Vec<String> {
        let unmatched = self.passed.iter().map(|p| {
            let at = (p.listener.local_addr()).map_or_else(|e| e.to_string(), |a| a.to_string());
            let name = p.name.as_deref().unwrap_or("unnamed");
            format!(
                "a listening socket from {} on {at} ({name}) matches no configured listener: \
                 closed; its address or FileDescriptorName= must be the config's",
                p.origin
            )
        });
        self.problems.iter().cloned().chain(unmatched).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").expect("bind on loopback")
    }

    #[test]
    fn a_socket_goes_to_the_listener_configured_at_its_address() {
        let (public, admin) = (bound(), bound());
        let (public_at, admin_at) = (public.local_addr().unwrap(), admin.local_addr().unwrap());
        let mut inherited = Inherited::default();
        inherited.add(admin, None, Origin::Systemd);
        inherited.add(public, None, Origin::Systemd);

        let (taken, origin) = inherited.take("public", public_at).expect("public");
        assert_eq!(taken.local_addr().unwrap(), public_at);
        assert_eq!(origin, Origin::Systemd);
        let (taken, _) = inherited.take("admin", admin_at).expect("admin");
        assert_eq!(taken.local_addr().unwrap(), admin_at);
        assert!(inherited.is_empty());
    }

    #[test]
    fn a_wildcard_address_finds_its_socket_by_name() {
        let public = bound();
        let mut inherited = Inherited::default();
        inherited.add(public, Some("public".into()), Origin::Predecessor);
        let configured: SocketAddr = "0.0.0.0:8080".parse().unwrap();

        assert!(inherited.take("admin", configured).is_none());
        let (_, origin) = inherited.take("public", configured).expect("by name");
        assert_eq!(origin, Origin::Predecessor);
    }

    #[test]
    fn a_socket_nobody_configured_is_named_in_a_warning() {
        let stray = bound();
        let at = stray.local_addr().unwrap();
        let mut inherited = Inherited::default();
        inherited.add(stray, Some("metrics".into()), Origin::Systemd);

        assert!(inherited
            .take("public", "0.0.0.0:8080".parse().unwrap())
            .is_none());
        let warnings = inherited.leftovers();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains(&at.to_string()), "{warnings:?}");
        assert!(warnings[0].contains("metrics"), "{warnings:?}");
    }
}
