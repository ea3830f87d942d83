//! HTTP/1.1 on the wire, both sides of it: the student's connection ([`server`]),
//! the node's ([`client`]), and the pieces they share ([`wire`]).

pub mod client;
pub(crate) mod server;
pub(crate) mod wire;
