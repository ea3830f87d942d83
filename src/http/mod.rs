//! Bytes in and out: the listeners that accept students, the edge rules a request
//! must pass before anyone looks at it, and the forwarding to one upstream over a
//! kept connection, with bodies streamed and every pause bounded.
//!
//! It owns HTTP mechanics only. It must never import `sessions`, `cluster`,
//! `moodle` or `gateway`: which node a request goes to, and why, is decided above
//! it and handed down as an address and that address's connection list. Of the
//! config it is handed the sections it applies (`[limits]`, `[timeouts]`, the
//! allowed hosts), never the whole `Config`.
//!
//! Its folders, by role, each importing only those above it in this list (so
//! `http/` has no import cycle; `tests/it/layers.rs` keeps it so):
//!
//! - [`body`]: the bodies that stream through, how they fail, every pause they may
//!   take (a node's, a student's socket), a body moved inside the kernel or kept on
//!   disk, and the request body as the node side sends it;
//! - [`h1`]: HTTP/1.1 on the wire, the students' side and the nodes', the pieces
//!   they share, and the one file that meets hyper's server;
//! - [`accept`] and [`upstream`], the two sides of a proxy, which never import each
//!   other: where a student's connection begins (listeners, TLS, HTTP/2, the edge
//!   rules), and where a request leaves for a node (the upload read ahead, kept
//!   connections, forwarding, tunnels, the file offload, the asset cache).
//!
//! No function here is longer than 80 lines (`clippy::too_many_lines`, with the
//! threshold in `clippy.toml`): a long one is split into named steps, the way
//! hyper's `role.rs` writes a head.

#![warn(unreachable_pub)]
#![warn(clippy::too_many_lines)]

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
