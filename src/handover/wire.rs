//! What the two processes say over the handover socket: the listening sockets
//! (their descriptors by `SCM_RIGHTS`, their roles in the message's bytes), then
//! one line per event.
//!
//! ```text
//! old → new  moodle-gateway handover 1\n listener public\n listener admin\n   + the descriptors
//! old → new  saved\n                        the state file holds the table: load it, then accept
//! new → old  serving\n                      accepting: the old one stops
//! new → old  sync\n                         a session missed: send what you bound so far
//! old → new  synced\n                       ...and now you have it all (in order)
//! old → new  bind <key> <logged-in|anonymous> <node>\n    learned while finishing its requests
//! old → new  forget <key>\n
//!            (end of stream: the old process has exited)
//! ```
//!
//! Lines, not a binary format: a handful of messages per handover and a few per
//! second during the drain, and a person reading `strace` can follow them.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::sessions::affinity::{SessionKey, SessionState};

/// The first line: which protocol this is, and its version.
const HELLO: &str = "moodle-gateway handover 1";

/// The most listening sockets one handover carries (public, admin, redirect).
pub(super) const MAX_SOCKETS: usize = 3;

/// Sends the listening sockets, each with its role.
pub(super) fn send_sockets(to: impl AsFd, sockets: &[(&str, &TcpListener)]) -> io::Result<()> {
    let mut text = format!("{HELLO}\n");
    for (role, _) in sockets {
        text.push_str(&format!("listener {role}\n"));
    }
    let fds: Vec<_> = sockets.iter().map(|(_, l)| l.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(
            "too many listening sockets for one handover",
        ));
    }
    let sent = sendmsg(
        to,
        &[IoSlice::new(text.as_bytes())],
        &mut control,
        SendFlags::empty(),
    )?;
    if sent != text.len() {
        return Err(io::Error::other("the handover's first message was cut"));
    }
    Ok(())
}

/// Receives what [`send_sockets`] sent: each socket with its role.
pub(super) fn receive_sockets(from: impl AsFd) -> io::Result<Vec<(String, TcpListener)>> {
    let mut bytes = [0u8; 512];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = recvmsg(
        from,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            fds.extend(passed);
        }
    }
    let text = std::str::from_utf8(&bytes[..received.bytes])
        .map_err(|_| io::Error::other("the handover's first message is not text"))?;
    let mut lines = text.lines();
    if lines.next() != Some(HELLO) {
        return Err(io::Error::other(
            "the process on the handover socket speaks another handover protocol",
        ));
    }
    let roles: Vec<&str> = lines.filter_map(|l| l.strip_prefix("listener ")).collect();
    if roles.len() != fds.len() {
        return Err(io::Error::other(format!(
            "the handover named {} listeners but passed {} sockets",
            roles.len(),
            fds.len()
        )));
    }
    let sockets = roles.into_iter().map(str::to_owned);
    Ok(sockets
        .zip(fds.into_iter().map(TcpListener::from))
        .collect())
}

/// The line that says the state file is written.
const SAVED: &str = "saved";

/// The line that says the new process accepts.
const SERVING: &str = "serving";

/// One change to the table, by node name (the new process may number its nodes
/// differently, after a config change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Line {
    Saved,
    Serving,
    Sync,
    Synced,
    Bind(SessionKey, SessionState, String),
    Forget(SessionKey),
}

impl Line {
    /// The line as sent, with its newline.
    pub(super) fn text(&self) -> String {
        match self {
            Line::Saved => format!("{SAVED}\n"),
            Line::Serving => format!("{SERVING}\n"),
            Line::Sync => "sync\n".to_owned(),
            Line::Synced => "synced\n".to_owned(),
            Line::Bind(key, state, node) => {
                let state = match state {
                    SessionState::LoggedIn => "logged-in",
                    SessionState::Anonymous => "anonymous",
                };
                format!("bind {key} {state} {node}\n")
            }
            Line::Forget(key) => format!("forget {key}\n"),
        }
    }

    /// A line as received, without its newline; `None` for one this version does
    /// not know (skipped).
    pub(super) fn parse(line: &str) -> Option<Self> {
        let mut words = line.splitn(4, ' ');
        match words.next()? {
            SAVED => Some(Line::Saved),
            SERVING => Some(Line::Serving),
            "sync" => Some(Line::Sync),
            "synced" => Some(Line::Synced),
            "bind" => {
                let key = SessionKey::from_hex(words.next()?)?;
                let state = match words.next()? {
                    "logged-in" => SessionState::LoggedIn,
                    "anonymous" => SessionState::Anonymous,
                    _ => return None,
                };
                Some(Line::Bind(key, state, words.next()?.to_owned()))
            }
            "forget" => Some(Line::Forget(SessionKey::from_hex(words.next()?)?)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn listening_sockets_cross_to_the_other_end_with_their_roles() {
        let public = TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").unwrap();
        let (old, new) = UnixStream::pair().unwrap();

        send_sockets(&old, &[("public", &public), ("admin", &admin)]).unwrap();
        let received = receive_sockets(&new).unwrap();

        let roles: Vec<&str> = received.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(roles, ["public", "admin"]);
        assert_eq!(
            received[0].1.local_addr().unwrap(),
            public.local_addr().unwrap()
        );
        // The same socket: a connection the old one queued is accepted by the new.
        drop(public);
        let client = std::net::TcpStream::connect(received[0].1.local_addr().unwrap()).unwrap();
        let (accepted, _) = received[0].1.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
    }

    #[test]
    fn a_process_speaking_something_else_is_refused() {
        let (old, new) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &old, b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        let error = receive_sockets(&new).unwrap_err();
        assert!(error.to_string().contains("another handover protocol"));
    }

    #[test]
    fn lines_read_back_as_written() {
        let key = SessionKey::from_hex("00000000deadbeef").unwrap();
        let lines = [
            Line::Saved,
            Line::Serving,
            Line::Sync,
            Line::Synced,
            Line::Bind(key, SessionState::LoggedIn, "php 1".into()),
            Line::Forget(key),
        ];
        for line in lines {
            let text = line.text();
            assert_eq!(Line::parse(text.trim_end_matches('\n')), Some(line));
        }
        assert_eq!(Line::parse("promote 00000000deadbeef"), None);
        assert_eq!(Line::parse("bind nothex anonymous php1"), None);
    }
}
