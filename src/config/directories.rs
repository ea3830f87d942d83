//! The directories a file names for the gateway to write in: the state file's and
//! the access log's. `check` looks at them on the machine it runs on, as `run`
//! would find them: a relative path starts from the working directory (the Debian
//! unit's `WorkingDirectory=/var/lib/moodle-gateway`, where its `ExecStartPre=`
//! check runs too). Only what is certain is reported: a directory that is missing
//! or is a file. One `check` may not read (run as another user) is left to `run`.

use std::io::ErrorKind;
use std::path::Path;

use super::{AccessLogTo, Config, ConfigError, SessionStore};

impl Config {
    /// Without its directory the snapshot is never written: the gateway runs, but
    /// every restart starts it with an empty table. With node-local sessions each
    /// logged-in student is then dealt to a new node and logged out.
    pub(super) fn state_directory_missing(&self) -> Option<ConfigError> {
        let problem = missing_directory(self.state.file.as_deref()?)?;
        let dealt = match self.session.store {
            SessionStore::NodeLocal => {
                "every logged-in student is dealt to a new node and logged out (node-local sessions)"
            }
            SessionStore::Shared => "every student is dealt to a node afresh",
        };
        Some(self.lines.error(
            &["state.file", "state"],
            format!(
                "{problem}: the gateway could not save its session table and would start \
                 with an empty one after every restart, when {dealt}. Create the directory, \
                 writable by the user the gateway runs as, or name another; \"\" keeps no \
                 snapshot"
            ),
        ))
    }

    /// The access log is opened at start: without its directory `run` stops there.
    pub(super) fn access_log_directory_missing(&self) -> Option<ConfigError> {
        let AccessLogTo::File(file) = &self.access_log.to else {
            return None;
        };
        let problem = missing_directory(file)?;
        Some(self.lines.error(
            &["access_log.to", "access_log"],
            format!(
                "{problem}: the gateway could not open its access log and would not start. \
                 Create the directory, writable by the user the gateway runs as (the Debian \
                 package makes /var/log/moodle-gateway), or name another"
            ),
        ))
    }
}

/// What is wrong with the directory `file` goes in; `None` when it is there or
/// cannot be known. A bare file name lives in the working directory, which exists.
fn missing_directory(file: &Path) -> Option<String> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty())?;
    let shown = match std::env::current_dir() {
        Ok(cwd) if dir.is_relative() => format!(
            "{} (relative to the working directory, {})",
            dir.display(),
            cwd.display()
        ),
        _ => dir.display().to_string(),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some(format!("{shown} is not a directory")),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            Some(format!("directory {shown} does not exist"))
        }
        Err(_) => None,
    }
}
