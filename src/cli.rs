//! The command line as clap sees it: the `Cli` that main.rs parses and build.rs turns into
//! the `moodle-gateway(1)` man page (clap_mangen), so `--help` and the man page cannot
//! disagree. Only types here: what the commands do is main.rs's.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// A session-sticky reverse proxy for a Moodle cluster: students keep one address (your
/// wwwroot), each new Moodle session is dealt to the next PHP server in turn and stays
/// there, and SCORM files come from the data server.
// One paragraph, and no `about`/`long_about` of clap's own: `-h` and `--help` print
// the same text. clap's built-in `help` takes only command names (`help --help` is an
// error there), so `help` is a command of ours that hands over to `--help`.
#[derive(Parser, Debug)]
#[command(version, disable_help_subcommand = true)]
pub struct Cli {
    #[command(flatten)]
    pub config: ConfigArg,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--config`, accepted before or after `run` and `check` (the demo makes its own).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArg {
    /// The configuration file (see the commented config.toml shipped with the
    /// gateway) [default: config.toml]
    #[arg(long, short, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// `run`'s arguments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Hand over without refusing a connection: if a gateway listens on this Unix
    /// socket, take its listening sockets and its session table (it stops
    /// accepting, finishes its requests and exits); then listen here for the next
    /// one. Start the new binary this way to restart or upgrade outside systemd.
    #[arg(long, value_name = "PATH")]
    pub handover: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the gateway (the default when no command is given).
    Run(RunArgs),
    /// Check the configuration file without starting anything: print the resolved
    /// setup and exit 0, or list every problem with its line and key and exit 1.
    Check(ConfigArg),
    /// Whether this machine's gateway can serve students now, for keepalived's
    /// vrrp_script: exit 0 when its listener accepts and its admin listener's
    /// /readyz says a node is active and up, 1 otherwise (the reason on stderr).
    Ready(ConfigArg),
    /// See the whole product on this machine, set up as the book recommends: four
    /// stand-in Moodle PHP nodes with node-local sessions, a data server whose file
    /// export sends the files each student's own node names (the offload), the gateway
    /// in front of them, and the admin API with its dashboard.
    Demo {
        /// Drive this many simulated students through login, browsing, SCORM and
        /// logout, print the per-node table, and exit (non-zero if a session was lost).
        #[arg(long, value_name = "N")]
        students: Option<usize>,
        /// How many simulated students are active at once (1 = one after another).
        #[arg(long, default_value_t = 8, value_name = "N")]
        concurrency: usize,
        /// Where students reach the demo gateway.
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Where the demo's admin API listens.
        #[arg(long, default_value = "127.0.0.1:9090", value_name = "ADDR")]
        admin_listen: std::net::SocketAddr,
        /// Show a surge: few PHP workers and slow pages on every node, a cap in the
        /// gateway, and a crowd of newcomers arriving in waves, so the line and the
        /// waiting room appear on the dashboard.
        #[arg(long)]
        surge: bool,
        /// Write the config the demo runs to PATH (mode 600: it holds the admin
        /// token), for `check --config PATH`, and `doctor --config PATH` while the
        /// demo runs.
        #[arg(long, value_name = "PATH")]
        write_config: Option<PathBuf>,
    },
    /// Ask the live site, through every node and the data server, what a Moodle expert
    /// would (wwwroot, sslproxy, the session store, the offload, revisions, clocks) and
    /// name the config.php line or gateway key that fixes each problem. Exits 0 when it
    /// found no problem, 1 when it found one, 2 when it could not ask.
    Doctor {
        #[command(flatten)]
        config: ConfigArg,
        /// Also log in as this test account on each node, check a file comes back
        /// accelerated through the offload, and log out again. The password comes from
        /// MOODLE_GATEWAY_DOCTOR_PASSWORD, else from a prompt; never from the command line.
        #[arg(long, value_name = "USER")]
        login: Option<String>,
        /// A file the test account may read (path under wwwroot, e.g.
        /// /pluginfile.php/…), for the offload check; default: the first file resource
        /// in the account's courses.
        #[arg(long, value_name = "PATH", requires = "login")]
        file: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print this help, or the help of the given command (the same as `COMMAND --help`).
    Help {
        /// The command to explain.
        command: Option<String>,
    },
}
