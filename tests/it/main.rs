//! Integration tests: a real gateway over real sockets, in front of real upstreams.

mod memory;
mod proxying;
mod support;
