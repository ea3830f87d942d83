//! Integration tests: a real gateway over real sockets, in front of real upstreams.

mod check_cli;
mod memory;
mod proxying;
mod scenarios;
mod sessions;
mod shutdown;
mod support;
