//! Bytes in and out: the listeners that accept students, the edge rules a request
//! must pass before anyone looks at it, and the forwarding to one upstream over a
//! kept connection, with bodies streamed and every pause bounded.
//!
//! It owns HTTP mechanics only. It must never import `sessions`, `cluster`,
//! `moodle` or `gateway`: which node a request goes to, and why, is decided above
//! it and handed down as an address and that address's connection list. Of the
//! config it is handed the sections it applies (`[limits]`, `[timeouts]`, the
//! allowed hosts), never the whole `Config`.

pub mod accept;
pub mod body;
pub mod h1;
pub mod upstream;

/// Entry points for the fuzz targets (`fuzz/`) and the differential tests, which
/// feed the HTTP/1.1 parsers and writer bytes without a listener or a node: the
/// request head parser, the node answer reader and the students' side serving one
/// connection. Not for the gateway's use.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::h1::client::fuzzing::*;
    pub use super::h1::server::fuzzing::*;
}
