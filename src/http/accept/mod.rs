//! Where a student's connection begins: the listening sockets, the accept loop
//! with its caps and drain, TLS, HTTP/2's streams, and the edge rules a request
//! must pass before anyone looks at it.

pub mod edge;
pub mod inherited;
pub mod listener;
pub(crate) mod streams;
pub mod tickets;
pub mod tls;
