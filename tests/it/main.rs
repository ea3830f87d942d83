//! Integration tests: a real gateway over real sockets, in front of real upstreams.

mod bad_input;
mod check_cli;
mod dashboard;
mod faults;
mod half_close;
mod memory;
mod offload;
mod open_files;
mod operations;
mod proxying;
mod restarts;
mod scenarios;
mod sessions;
mod signals;
mod slowloris;
mod support;
mod tls;
mod tunnels;
mod uploads;
