//! `moodle-gateway ready`: whether the gateway on this machine can serve students
//! now, as keepalived's `vrrp_script` asks it (exit 0: keep or take the site's
//! address; anything else: give it up to the other gateway).
//!
//! Two questions, each answered within a second: does the students' listener
//! accept a connection (a process that hangs, or one whose socket is gone, fails
//! here), and does the admin listener's `GET /readyz` say some node is active
//! and up (a gateway cut off from every node fails there, and the other gateway,
//! which may still reach them, should hold the address). Plain HTTP/1.0 over a
//! blocking socket: the check runs every second, and needs no runtime.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::config::Config;

/// How long each question may take.
const WAIT: Duration = Duration::from_secs(1);

/// `Ok` with what the gateway said, or `Err` with why it cannot serve.
pub fn check(config: &Config) -> Result<String, String> {
    let public = reachable(config.listen);
    TcpStream::connect_timeout(&public, WAIT)
        .map_err(|error| format!("the students' listener {public} does not answer: {error}"))?;
    let Some(admin) = &config.admin else {
        return Ok(format!(
            "listening on {public} (no [admin]: nodes not asked)"
        ));
    };
    let admin = reachable(admin.listen);
    let answer = ask(admin).map_err(|error| format!("the admin listener {admin}: {error}"))?;
    let (status, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    match (status.split(' ').nth(1), text.trim()) {
        (Some("200"), said) => Ok(said.to_owned()),
        (_, "") => Err(format!("{admin}/readyz answered {status:?}")),
        (_, said) => Err(said.to_owned()),
    }
}

/// `GET /readyz` on the admin listener: the whole answer.
fn ask(admin: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&admin, WAIT)?;
    stream.set_read_timeout(Some(WAIT))?;
    stream.set_write_timeout(Some(WAIT))?;
    let host = admin;
    stream.write_all(format!("GET /readyz HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A wildcard listen address is reached on this machine's loopback.
fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listener_is_asked_on_loopback() {
        let wildcard: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(reachable(wildcard), "127.0.0.1:8080".parse().unwrap());
        let specific: SocketAddr = "10.0.0.1:443".parse().unwrap();
        assert_eq!(reachable(specific), specific);
    }
}
