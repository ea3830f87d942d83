//! Integration tests: a real gateway over real sockets, in front of real upstreams.

mod bad_input;
mod check_cli;
mod cli;
mod dashboard;
mod dashboard_store;
mod faults;
mod half_close;
mod memory;
mod observability;
mod offload;
mod open_files;
mod operations;
mod proxying;
mod restarts;
mod scenarios;
mod sessions;
mod signals;
mod site;
mod slowloris;
mod store;
mod support;
mod systemd;
mod tls;
mod toolchain;
mod tunnels;
mod uploads;
