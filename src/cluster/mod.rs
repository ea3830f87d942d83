//! The nodes: who they are (stable ids, addresses, weights, admin state), whether
//! they are up (active probes, passive marks), and who gets the next session (the
//! lock-free deal), and how many requests each works on at once (its slots, and
//! the line of requests waiting for them), and how a node back in the deal warms
//! up (`slow_start`). Beside them, the data server's file
//! export, watched by the same probes (`export`).
//!
//! It owns the nodes only. It must never import `sessions` or `gateway`: it does
//! not know which sessions a node holds. Of `http` it uses only the keep-alive
//! connection list each upstream owns ([`Conns`](crate::http::upstream::pool::Conns)) and
//! whose fault a failed connect is ([`fault`](crate::http::upstream::fault)), and the [`Held`](crate::http::upstream::pool::Held)
//! a node's response body keeps its slot with.

pub mod balancer;
pub mod export;
pub mod health;
pub mod slots;
pub mod slow_start;
pub mod upstreams;
