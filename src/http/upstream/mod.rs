//! Where a request leaves for a node: the student's body read ahead, the kept
//! connections, the forwarding with its header rules, whose fault a failure is,
//! WebSocket tunnels, the file offload, and the asset cache that keeps what the
//! nodes answered.

pub mod asset_cache;
pub mod fault;
pub mod offload;
pub mod pool;
pub mod proxy;
pub mod tunnel;
pub mod upload;
