//! A private `redis-server` for the gateways that share a store: on a free loopback
//! port, nothing saved to disk, killed (with its scratch directory removed) on drop.
//! The `it` suite has a richer one (kill, restart, replicas); this suite only needs
//! one that runs for the length of a test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::processes::{free_port, wait_until, Proc, Scratch};

/// One `redis-server --save "" --appendonly no` on `127.0.0.1:port`.
pub struct RedisServer {
    port: u16,
    proc: Proc,
    /// Dropped after the process.
    _dir: Scratch,
}

impl RedisServer {
    /// Starts one and waits until it answers `PING`.
    pub fn start() -> RedisServer {
        let dir = Scratch::new("redis");
        let port = free_port();
        let mut command = Command::new("redis-server");
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path());
        let log = dir.path().join("redis.log");
        let mut server = RedisServer {
            port,
            proc: Proc::spawn("redis-server", command, &log),
            _dir: dir,
        };
        wait_until("redis-server answers PING", Duration::from_secs(10), || {
            server.proc.assert_running();
            server.pong()
        });
        server
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether it answers an inline `PING` with `+PONG`.
    fn pong(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut answer).is_ok()
            && &answer == b"+PONG\r\n"
    }
}
