//! Whose fault a failed connect is: the gateway's own, a node that is there but not
//! listening for a moment, or the node.
//!
//! Why it matters: a failed connect counts against the node's health, and `fall` of
//! them take it down, which moves its students (with node-local sessions, a logout).
//! But at the open-file limit `connect` fails for *every* upstream at once with
//! `EMFILE`, and blaming the nodes for that would take a healthy cluster down because
//! of the gateway's own limit. So the errors that say "this process or this host ran
//! out of something" (descriptors, buffers, memory, local ports) are the gateway's:
//! the student gets a 503 and no node gets a mark. A refusal (nothing listens on the
//! port: Apache or PHP-FPM restarting) is the node's, but nothing reached it, so a
//! request for a student bound there can wait and try again.

use std::error::Error;
use std::io;

use crate::error::GatewayError;

/// The cause of a failed connect, as far as the caller must act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFault {
    /// The gateway ran out of something of its own (`EMFILE`, `ENFILE`, `ENOBUFS`,
    /// `ENOMEM`, `EADDRNOTAVAIL`): says nothing about the upstream.
    Gateway,
    /// The upstream's host answered that nothing listens there (`ECONNREFUSED`), or
    /// reset the connection before it was established (`ECONNRESET`): its web
    /// server is (re)starting. Nothing was sent.
    Refused,
    /// Anything else: unreachable, timed out, not resolvable.
    Upstream,
}

/// `errno` values that name the gateway's own resources (libc's numbering, which
/// differs between systems).
const LOCAL_ERRNOS: [i32; 5] = [
    libc::EMFILE,
    libc::ENFILE,
    libc::ENOBUFS,
    libc::ENOMEM,
    libc::EADDRNOTAVAIL,
];

impl ConnectFault {
    /// The fault behind one I/O error of `socket`/`connect`.
    pub fn of(error: &io::Error) -> Self {
        if error
            .raw_os_error()
            .is_some_and(|errno| LOCAL_ERRNOS.contains(&errno))
        {
            return Self::Gateway;
        }
        match error.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => Self::Refused,
            _ => match error.get_ref().and_then(|inner| inner.downcast_ref()) {
                Some(inner) => Self::of(inner),
                None => Self::Upstream,
            },
        }
    }

    /// The fault behind an error that wraps an I/O error somewhere in its source
    /// chain (a client library's connect error); [`ConnectFault::Upstream`] if none.
    pub fn in_chain(error: &(dyn Error + 'static)) -> Self {
        io_in_chain(error).map_or(Self::Upstream, Self::of)
    }

    /// What a student sees when the request goes nowhere else.
    pub fn error(self) -> GatewayError {
        match self {
            Self::Gateway => GatewayError::OutOfConnections,
            Self::Refused | Self::Upstream => GatewayError::UpstreamUnreachable,
        }
    }
}

/// The first I/O error in `error`'s source chain, itself included.
pub fn io_in_chain<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a io::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            return Some(io);
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn running_out_of_descriptors_buffers_memory_or_ports_is_the_gateways_fault() {
        for errno in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert_eq!(
                ConnectFault::of(&os(errno)),
                ConnectFault::Gateway,
                "{errno}"
            );
        }
        assert_eq!(
            ConnectFault::Gateway.error(),
            GatewayError::OutOfConnections
        );
        assert!(!ConnectFault::Gateway.error().is_upstream_failure());
    }

    #[test]
    fn a_refused_or_reset_connect_is_a_node_that_is_not_listening() {
        assert_eq!(
            ConnectFault::of(&os(libc::ECONNREFUSED)),
            ConnectFault::Refused
        );
        assert_eq!(
            ConnectFault::of(&os(libc::ECONNRESET)),
            ConnectFault::Refused
        );
        assert!(ConnectFault::Refused.error().is_upstream_failure());
    }

    #[test]
    fn anything_else_is_the_upstreams() {
        for errno in [libc::EHOSTUNREACH, libc::ENETUNREACH, libc::ETIMEDOUT] {
            assert_eq!(
                ConnectFault::of(&os(errno)),
                ConnectFault::Upstream,
                "{errno}"
            );
        }
        let unresolvable = io::Error::other("failed to lookup address information");
        assert_eq!(ConnectFault::of(&unresolvable), ConnectFault::Upstream);
        assert!(ConnectFault::Upstream.error().is_upstream_failure());
    }

    /// A client library's error (hyper-util's `ConnectError`) keeps the I/O error as
    /// its source, sometimes behind another wrapper.
    #[test]
    fn the_io_error_is_found_in_a_wrapped_chain() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("tcp open error")
            }
        }
        impl Error for Wrapper {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = Wrapper(os(libc::EMFILE));
        assert_eq!(ConnectFault::in_chain(&wrapped), ConnectFault::Gateway);
        let boxed = io::Error::other(os(libc::ECONNREFUSED));
        assert_eq!(ConnectFault::in_chain(&boxed), ConnectFault::Refused);
        let plain = std::fmt::Error;
        assert_eq!(ConnectFault::in_chain(&plain), ConnectFault::Upstream);
    }
}
