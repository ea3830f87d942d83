//! HTTP/1.1 on the wire, both sides of it: a student's connection ([`server`], with
//! [`handover`] where it meets hyper's server for the requests it does not take),
//! a node's ([`client`]), what the two share ([`wire`]), and the drain as one
//! connection sees it ([`stopping`]).
//!
//! It knows bodies ([`crate::http::body`]) and nothing above: not the listener that
//! accepts, not the upload or the pool that leases a node connection.

pub mod client;
pub(crate) mod handover;
pub(crate) mod server;
pub(crate) mod stopping;
pub(crate) mod wire;

/// A student's request body, as every layer of the students' path receives it
/// (and as a benchmark of a layer builds one).
pub use server::StudentBody;
