//! The `moodle-gateway` command: parses arguments, loads the config, binds the
//! listeners and hands them to the library. Everything else lives in the library so
//! that the tests run exactly the code that production runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cli::{Cli, Command, ConfigArg, RunArgs};
use moodle_gateway::handover::{self, Handover, Predecessor};
use moodle_gateway::http::accept::inherited::{Inherited, Origin};
use moodle_gateway::{app::Listeners, App, Config};
use sd_notify::NotifyState;
use tokio::net::TcpListener;

mod cli;

/// jemalloc, not the C library's malloc. Why: what a gateway holds most of on exam day
/// is idle keep-alive connections (students reading a page), each a handful of small
/// allocations kept for minutes. glibc puts a header before every one and pads tokio's
/// 128-byte-aligned task cell; jemalloc packs each in a size class of its own: about a
/// fifth less resident memory per idle connection, the CPU per request the same within
/// the bench's noise (the book's Performance page has the figures). The library and its
/// tests run on whatever allocator their binary has.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

impl Default for Command {
    fn default() -> Self {
        Self::Run(RunArgs::default())
    }
}

impl ConfigArg {
    /// The file named after the command, else before it, else `./config.toml`.
    fn or(self, outer: &ConfigArg) -> PathBuf {
        self.config
            .or_else(|| outer.config.clone())
            .unwrap_or_else(|| PathBuf::from("config.toml"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    // Before any thread starts: taking systemd's sockets clears its variables.
    let inherited = Inherited::from_systemd();
    let outer = cli.config;
    match cli.command.unwrap_or_default() {
        Command::Check(arg) => check(&arg.or(&outer), inherited),
        Command::Run(args) => run(&args.config.or(&outer), args.handover, inherited),
        Command::Ready(arg) => ready(&arg.or(&outer)),
        Command::Help { command } => help(command),
        Command::Doctor {
            config,
            login,
            file,
            json,
        } => doctor(&config.or(&outer), login, file, json),
        Command::Demo {
            students,
            concurrency,
            listen,
            admin_listen,
            surge,
            write_config,
        } => demo(moodle_gateway::demo::DemoOptions {
            listen,
            admin_listen,
            students,
            concurrency: concurrency.max(1),
            surge,
            write_config,
        }),
    }
}

/// `help [COMMAND]`: clap prints `[COMMAND] --help` and exits 0, or names an unknown
/// command and exits 2, exactly as `moodle-gateway nope --help` would.
fn help(command: Option<String>) -> ExitCode {
    let name = <Cli as clap::CommandFactory>::command()
        .get_name()
        .to_owned();
    let args = [Some(name), command, Some("--help".to_owned())];
    Cli::parse_from(args.into_iter().flatten());
    ExitCode::SUCCESS
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The file's config, or every problem in it printed as `check` prints them.
fn report(loaded: Result<Config, moodle_gateway::config::ConfigErrors>) -> Option<Config> {
    match loaded {
        Ok(config) => Some(config),
        Err(errors) => {
            eprintln!("{errors}");
            None
        }
    }
}

/// `check` also refuses what parses but cannot work on a real Moodle site, and says
/// every problem of the file, errors and warnings, in one list by line.
fn check(path: &std::path::Path, inherited: Inherited) -> ExitCode {
    match Config::load_for_site(path) {
        Ok((config, warnings)) => {
            print!("{}", config.describe());
            print!("{}", passed_sockets(&config, inherited));
            if let Ok(open_files) = moodle_gateway::open_files::plan(&config) {
                print!("{}", open_files.describe(&config));
            }
            if !warnings.0.is_empty() {
                eprintln!("{warnings}");
            }
            println!("{}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{problems}");
            ExitCode::FAILURE
        }
    }
}

/// `ready`: exit 0 when this machine's gateway can serve, 1 (saying why) when not.
fn ready(path: &std::path::Path) -> ExitCode {
    let Some(config) = report(Config::load(path)) else {
        return ExitCode::FAILURE;
    };
    match moodle_gateway::ready::check(&config) {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("not ready: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Which configured listeners systemd passes a socket for (socket activation);
/// nothing when it passes none.
fn passed_sockets(config: &Config, mut inherited: Inherited) -> String {
    if inherited.is_empty() {
        return String::new();
    }
    let mut lines = String::from("listening sockets from systemd:\n");
    for (role, addr) in listen_addresses(config) {
        let passed = inherited.take(role, addr).is_some();
        let from = if passed {
            "systemd's socket"
        } else {
            "bound by the gateway"
        };
        lines.push_str(&format!("  {role} {addr}: {from}\n"));
    }
    for leftover in inherited.leftovers() {
        lines.push_str(&format!("  {leftover}\n"));
    }
    lines
}

/// Every listener the config asks for, by role.
fn listen_addresses(config: &Config) -> Vec<(&'static str, std::net::SocketAddr)> {
    let admin = config.admin.as_ref().map(|a| ("admin", a.listen));
    let redirect = (config.tls.as_ref().and_then(|t| t.redirect_listen)).map(|a| ("redirect", a));
    [Some(("public", config.listen)), admin, redirect]
        .into_iter()
        .flatten()
        .collect()
}

/// How long a blocking thread (a snapshot, a sweep, a spool's write) waits for more
/// work before it ends; tokio's default is 10 s. While a second thread lives, the
/// process's descriptor table is shared, and the kernel takes and drops a reference
/// on every socket each read and write uses; a snapshot every 30 s kept one alive a
/// third of the time. A spool's writes follow each other far sooner than this.
const BLOCKING_LINGER: Duration = Duration::from_secs(1);

/// The runtime: as many worker threads as `TOKIO_WORKER_THREADS` says, else one per
/// core. With a single worker, tokio's current-thread scheduler does the same work
/// without the multi-thread scheduler's cross-thread bookkeeping.
fn runtime() -> Option<tokio::runtime::Runtime> {
    let workers = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    let mut builder = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    match builder
        .enable_all()
        .thread_keep_alive(BLOCKING_LINGER)
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            None
        }
    }
}

/// `doctor`: the report on stdout, exit 0 (no problem), 1 (problems) or 2 (could not ask).
fn doctor(
    path: &std::path::Path,
    login: Option<String>,
    file: Option<String>,
    json: bool,
) -> ExitCode {
    let Some(config) = report(Config::load(path)) else {
        return ExitCode::from(2);
    };
    let login = match login.map(password_for).transpose() {
        Ok(login) => login,
        Err(error) => {
            eprintln!("doctor: {error}");
            return ExitCode::from(2);
        }
    };
    let options = moodle_gateway::doctor::Options { login, file };
    let Some(runtime) = runtime() else {
        return ExitCode::from(2);
    };
    let report = runtime.block_on(moodle_gateway::doctor::examine(&config, &options));
    if json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    ExitCode::from(report.exit_code())
}

/// The test account's password: `MOODLE_GATEWAY_DOCTOR_PASSWORD`, else asked on the
/// terminal without echo.
fn password_for(username: String) -> Result<moodle_gateway::doctor::Login, String> {
    let password = match std::env::var("MOODLE_GATEWAY_DOCTOR_PASSWORD") {
        Ok(password) if !password.is_empty() => password,
        _ => rpassword::prompt_password(format!("password for {username}: ")).map_err(|e| {
            format!("no password: set MOODLE_GATEWAY_DOCTOR_PASSWORD or run on a terminal ({e})")
        })?,
    };
    Ok(moodle_gateway::doctor::Login { username, password })
}

fn demo(options: moodle_gateway::demo::DemoOptions) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(moodle_gateway::demo::run(options)) {
        Ok(outcome) if outcome.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `run` starts on what `check` refuses (a site with no SCORM activity may live with
/// node-local sessions), but says at once, as an error, who will be logged out.
fn run(path: &std::path::Path, handover: Option<PathBuf>, inherited: Inherited) -> ExitCode {
    let Some(config) = report(Config::load(path)) else {
        return ExitCode::FAILURE;
    };
    let source = path.display().to_string();
    // Only once the config is known good: the old process stops accepting when
    // this one says it serves.
    let predecessor = match handover.as_deref().map(handover::take_over) {
        Some(Ok(predecessor)) => predecessor,
        Some(Err(error)) => {
            tracing::error!("cannot take over from the running gateway: {error}");
            None
        }
        None => None,
    };
    for refusal in config.refusals() {
        let refusal = refusal.in_file(&source);
        tracing::error!("{refusal} (`check` refuses this file)");
    }
    for warning in config.warnings() {
        tracing::warn!("{}", warning.in_file(&source));
    }
    moodle_gateway::open_files::raise_and_log(&config);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let start = Start {
        inherited,
        predecessor,
        handover,
    };
    match runtime.block_on(serve(config, path, start)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Where `run` starts from: sockets systemd passed, the process it takes over
/// from, and where its own successor will find it.
struct Start {
    inherited: Inherited,
    predecessor: Option<Predecessor>,
    handover: Option<PathBuf>,
}

async fn serve(config: Config, path: &std::path::Path, start: Start) -> Result<(), String> {
    let Start {
        mut inherited,
        mut predecessor,
        handover,
    } = start;
    for (role, socket) in predecessor.iter_mut().flat_map(Predecessor::take_sockets) {
        inherited.add(socket, Some(role), Origin::Predecessor);
    }
    let public = inherited.listener("public", config.listen).await?;
    let admin = match &config.admin {
        Some(admin) => Some(inherited.listener("admin", admin.listen).await?),
        None => None,
    };
    let redirect = match config.tls.as_ref().and_then(|t| t.redirect_listen) {
        Some(addr) => Some(inherited.listener("redirect", addr).await?),
        None => None,
    };
    for leftover in inherited.leftovers() {
        tracing::warn!("{leftover}");
    }
    drop(inherited);
    if let Some(acme) = &config.acme {
        // Before the first certificate: a placeholder, so the listener can start.
        moodle_gateway::acme::prepare(acme)?;
    }
    let certificates = match &config.tls {
        Some(tls) => Some(moodle_gateway::http::accept::tls::Certificates::load(
            &tls.cert, &tls.key,
        )?),
        None => None,
    };
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let nodes = config.nodes.len();
    let tls = certificates.is_some();
    // Restores the affinity table from the state file before the first request.
    let mut app = App::new(config).reloading_from(path);
    if let Some(certificates) = certificates {
        app = app.with_tls(certificates);
    }
    tokio::spawn(reload_on_hangup(app.clone()));
    // Before READY: a log file the service may not write must fail the start.
    app.open_access_log().map_err(|error| error.to_string())?;
    app.open_spool().map_err(|error| error.to_string())?;
    let (serving_tx, successor_serving) = tokio::sync::oneshot::channel();
    let handing = match &handover {
        Some(at) => {
            let sockets = [("public", Some(&public)), ("admin", admin.as_ref())]
                .into_iter()
                .chain([("redirect", redirect.as_ref())]);
            let sockets = sockets.filter_map(|(role, l)| Some((role, duplicate(l?).ok()?)));
            let started = Handover::start(at, sockets.collect(), app.clone(), serving_tx);
            Some(started.map_err(|e| format!("cannot listen on {}: {e}", at.display()))?)
        }
        None => None,
    };
    if let Some(predecessor) = predecessor {
        // The old process stops accepting now; these sockets are ours.
        let following = predecessor.follow(app.gateway().clone());
        following.map_err(|e| format!("handover: {e}"))?;
    }
    // The bound addresses, not the configured ones: with port 0 this is how a
    // supervisor (or a test) learns where the gateway listens.
    let listen = public.local_addr().map_err(|e| e.to_string())?;
    let admin_at = admin_addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
    tracing::info!(%listen, admin = %admin_at, tls, nodes, "moodle-gateway ready");
    // Every listener is bound and the table restored: systemd (Type=notify) may now
    // start what depends on the gateway, and `systemctl start` returns.
    let status = format!("students on {listen}");
    let stopped = shutdown_signal();
    notify_systemd(&[NotifyState::Ready, NotifyState::Status(&status)]);
    let listeners = Listeners {
        public,
        admin,
        redirect,
    };
    let stop = async move {
        tokio::select! {
            () = stopped => {}
            Ok(()) = successor_serving => {}
        }
    };
    let served = app.serve_all(listeners, stop).await;
    if let Some(handing) = handing {
        handing.finish().await;
    }
    served.map_err(|error| error.to_string())
}

/// A second descriptor of a listening socket, for the handover.
fn duplicate(listener: &TcpListener) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::AsFd;
    Ok(listener.as_fd().try_clone_to_owned()?.into())
}

/// Re-reads the config file on every `SIGHUP`, the way daemons are told to. The
/// handler is installed when this is called, not when its task first runs: a SIGHUP
/// right after READY=1 (logrotate, a quick `systemctl reload`) must reload, and
/// SIGHUP's default action would end the process.
fn reload_on_hangup(app: App) -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move { watch_hangups(app, hangups).await }
}

/// Reloads (and reopens the access log) on each `SIGHUP`, telling systemd.
#[cfg(unix)]
async fn watch_hangups(app: App, hangups: std::io::Result<tokio::signal::unix::Signal>) {
    let Ok(mut hangups) = hangups else {
        tracing::warn!("cannot listen for SIGHUP: reload with POST /reload instead");
        return;
    };
    while hangups.recv().await.is_some() {
        let app = app.clone();
        // systemd shows "reloading" meanwhile; MONOTONIC_USEC is what systemd 253+
        // matches a reload by.
        let mut reloading = vec![NotifyState::Reloading];
        reloading.extend(NotifyState::monotonic_usec_now().ok());
        notify_systemd(&reloading);
        let _ = tokio::task::spawn_blocking(move || app.reload_and_log()).await;
        notify_systemd(&[NotifyState::Ready]);
    }
}

/// Completes on Ctrl-C or SIGTERM (what systemd and the benchmark send). The
/// handlers are installed when this is called, not when the future is first
/// polled: called before READY=1, a `systemctl stop` right after the start drains
/// as any stop does, where SIGTERM's default action would end the process at once.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let terminate = async {
            match terminate {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            () = ctrl_c => {}
            () = terminate => {}
        }
        notify_systemd(&[NotifyState::Stopping]);
    }
}

/// Tells the service manager about a state change, when one listens (`NOTIFY_SOCKET`,
/// set by systemd for `Type=notify`); without it this does nothing. A failure is
/// logged, never fatal: the gateway serves students whether or not systemd heard.
fn notify_systemd(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd: {error}");
    }
}
