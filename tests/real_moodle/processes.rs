//! The suite's own processes and scratch directories: each child runs in its own
//! process group and is killed with all its children (php -S forks its workers)
//! when dropped, on success and on panic alike; each scratch directory is removed.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process and every process it forked; killed (`SIGKILL` to the group) on drop.
pub struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Spawns `command` (one process) in a new process group, stdout and stderr into
    /// `log`.
    pub fn spawn(name: &str, command: Command, log: &Path) -> Proc {
        Proc::start(name, guarded(command, false), log)
    }

    /// Like [`Proc::spawn`], for a command that forks children of its own (php -S).
    pub fn spawn_tree(name: &str, command: Command, log: &Path) -> Proc {
        Proc::start(name, guarded(command, true), log)
    }

    fn start(name: &str, mut command: Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("the log file opens");
        let err = out.try_clone().unwrap();
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        Proc {
            name: name.to_string(),
            child,
        }
    }

    /// Asks the process (not its group) to stop with `SIGTERM` and waits up to `limit`:
    /// how MariaDB must be stopped to leave a datadir worth caching.
    pub fn terminate(mut self, limit: Duration) {
        signal(&format!("{}", self.child.id()), "TERM");
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "{} stopped with {status}", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{} did not stop within {limit:?}", self.name);
    }

    /// The process id of the spawned program.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Panics when the process has already exited (it failed to start, usually).
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited early with {status}", self.name);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // The group id is the leader's pid (process_group(0)): this reaches php -S's
        // forked workers too, which a SIGKILL to the leader alone would orphan.
        signal(&format!("-{}", self.child.id()), "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `command` under `setpriv --pdeathsig` (util-linux), so that it dies with this test
/// process even when no `Drop` runs (Ctrl-C, a killed test): its own process group
/// keeps the terminal's signals away from it. A `tree` runs under a shell that, told
/// so, kills its whole group, which reaches the children too (php -S's workers outlive
/// their master otherwise, whatever signal it gets).
fn guarded(command: Command, tree: bool) -> Command {
    if !Path::new("/usr/bin/setpriv").exists() {
        return command;
    }
    let mut guarded = Command::new("/usr/bin/setpriv");
    if tree {
        let script = "trap 'kill -KILL 0' TERM; \"$@\" & wait";
        guarded.args(["--pdeathsig", "TERM", "--", "sh", "-c", script, "sh"]);
    } else {
        guarded.args(["--pdeathsig", "KILL", "--"]);
    }
    guarded.arg(command.get_program()).args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => guarded.env(key, value),
            None => guarded.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        guarded.current_dir(dir);
    }
    guarded
}

fn signal(target: &str, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), "--", target])
        .stderr(Stdio::null())
        .status();
}

/// A scratch directory, removed with everything in it when dropped (kept when
/// `REAL_MOODLE_KEEP` is set, to read the nodes' logs after a failure).
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new empty directory under the system's temp dir (short: MariaDB's socket path
    /// must stay under 108 bytes).
    pub fn new(label: &str) -> Scratch {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == 0 {
            remove_orphans();
        }
        let dir = std::env::temp_dir().join(format!("rm-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes the scratch directories of earlier test processes that died without
/// cleaning up (killed): `rm-{label}-{pid}-{n}` whose pid is gone.
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (Some(_n), Some(pid), Some(label)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let ours = label.starts_with("rm-") && pid.parse::<u32>().is_ok();
        if ours && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("REAL_MOODLE_KEEP").is_some() {
            eprintln!("real-moodle: kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A port nothing listens on right now (bound on port 0, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `command` to completion; its stdout, or a panic naming `what` with its stderr.
pub fn run(what: &str, command: &mut Command) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Waits up to `limit` for `ready`, panicking with `what` when it never is.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
