//! The affinity table (which node holds each Moodle session) and how it outlives a
//! process: the snapshot file, its load and save, and the signed route cookie that
//! lets any gateway recover a session's node.
//!
//! It owns session state only. It must never import `http` or `gateway`: it knows
//! a node only as a [`NodeId`](crate::node_id::NodeId), never its
//! address, health or connections, and it is fed what the gateway learned from a
//! response, never a response.

pub mod affinity;
pub mod clock;
pub mod route_cookie;
pub mod snapshot;
pub mod state;
