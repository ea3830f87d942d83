//! One installed Moodle site: the code unpacked from the tarball, a private MariaDB and
//! a dataroot. Installing takes a minute or more, so it happens once per tarball and
//! setup version into `target/real-moodle-cache/`; every test restores a copy into its
//! own scratch directory in a few seconds and gets a fresh database and dataroot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::processes::{run, wait_until, Proc, Scratch};

/// Students the generator creates (the scenarios use at most this many).
pub const STUDENTS: usize = 24;
/// Newcomers' accounts the generator creates for the surge (accounts of their own:
/// nobody in the surge logs in as a student who is already logged in), enough for
/// the big surge; the quiz's class uses the first of them.
pub const NEWCOMERS: usize = 280;

/// Bump when the install steps below change in a way the hashed scripts do not show.
const SETUP_VERSION: &str = "real-moodle-setup-1";

/// PHP settings every `php` of the suite runs with (Moodle's installer insists on
/// `max_input_vars`; opcache is off by default on the CLI, which `php -S` is).
pub const PHP_INI: &[&str] = &[
    "-d",
    "max_input_vars=5000",
    "-d",
    "memory_limit=256M",
    "-d",
    "opcache.enable_cli=1",
];

/// What `tests/moodle/generate.php` printed about the site's test data.
#[derive(Debug, Deserialize)]
pub struct SiteData {
    pub course_id: u64,
    pub scorm: Scorm,
    pub resource: Resource,
    pub quiz: Quiz,
    pub students: Vec<StudentAccount>,
    /// The surge's newcomers, enrolled like the students.
    pub newcomers: Vec<StudentAccount>,
}

/// The SCORM activity.
#[derive(Debug, Deserialize)]
pub struct Scorm {
    pub id: u64,
    pub cmid: u64,
    pub context_id: u64,
    pub revision: u64,
    pub launch_path: String,
    pub content: Vec<StoredFile>,
}

/// The file resource.
#[derive(Debug, Deserialize)]
pub struct Resource {
    pub cmid: u64,
    pub file: StoredFile,
}

/// The timed quiz: true/false questions, two a page.
#[derive(Debug, Deserialize)]
pub struct Quiz {
    pub id: u64,
    pub cmid: u64,
    /// Its time limit, in seconds.
    pub timelimit: u64,
    pub pages: u64,
    /// Every slot, in order.
    pub slots: Vec<QuizSlot>,
}

/// One slot of the quiz.
#[derive(Debug, Deserialize)]
pub struct QuizSlot {
    pub slot: u32,
    /// The right answer's value: "1" (true) or "0" (false).
    pub right: String,
}

/// A file in Moodle's `files` table.
#[derive(Debug, Clone, Deserialize)]
pub struct StoredFile {
    pub path: String,
    pub contenthash: String,
    pub size: u64,
    /// Moodle's MIME type, which its Content-Type names.
    pub mimetype: String,
    #[serde(default)]
    pub url: String,
}

/// A student account.
#[derive(Debug, Clone, Deserialize)]
pub struct StudentAccount {
    /// Moodle's user id.
    pub id: u64,
    pub username: String,
    pub password: String,
    pub fullname: String,
    /// The `core_files` user key of `/tokenpluginfile.php/{key}/…`.
    pub files_key: String,
    /// The mobile web-service token of `/webservice/pluginfile.php/…?token=`.
    pub ws_token: String,
}

/// A restored site: its MariaDB runs until the site is dropped.
pub struct Site {
    /// Moodle's code (shared, read-only in practice), with the suite's config.php.
    pub code: PathBuf,
    /// This site's dataroot.
    pub dataroot: PathBuf,
    /// MariaDB's socket.
    pub socket: PathBuf,
    /// The generated test data.
    pub data: SiteData,
    _db: Proc,
    /// Dropped last: the processes above use it.
    _scratch: Scratch,
}

impl Site {
    /// A fresh copy of the cached site (installing it first if there is none), with
    /// its database running.
    pub fn restore() -> Site {
        let started = Instant::now();
        let (code, cached) = ensure_cache();
        let scratch = Scratch::new("site");
        let dir = scratch.path();
        for part in ["db", "dataroot"] {
            run(
                "copying the cached site",
                Command::new("cp")
                    .args(["-a", "--reflink=auto"])
                    .arg(cached.join(part))
                    .arg(dir.join(part)),
            );
        }
        lock_directories_made(&dir.join("dataroot"));
        let data = std::fs::read_to_string(cached.join("data.json")).unwrap();
        let data: SiteData = serde_json::from_str(&data).expect("data.json parses");
        let (db, socket) = start_mariadb(&dir.join("db"), dir);
        eprintln!("real-moodle: site restored in {:.1?}", started.elapsed());
        Site {
            code,
            dataroot: dir.join("dataroot"),
            socket,
            data,
            _db: db,
            _scratch: scratch,
        }
    }

    /// Runs `query` in the site's database; tab-separated rows, no header.
    pub fn sql(&self, query: &str) -> String {
        run(
            "a database query",
            Command::new("mariadb")
                .args(["--no-defaults", "-uroot", "-N", "-B", "moodle", "-S"])
                .arg(&self.socket)
                .arg("-e")
                .arg(query),
        )
    }

    /// The SCORM tracking Moodle stored for the site's activity, per username:
    /// (element, value) of the lesson status, the raw score and the suspend data,
    /// sorted.
    pub fn tracking(&self) -> BTreeMap<String, Vec<(String, String)>> {
        let rows = self.sql(&format!(
            "SELECT u.username, e.element, v.value FROM mdl_scorm_scoes_value v \
             JOIN mdl_scorm_attempt a ON a.id = v.attemptid JOIN mdl_scorm_element e ON e.id = v.elementid \
             JOIN mdl_user u ON u.id = a.userid WHERE a.scormid = {} \
             AND e.element IN ('cmi.core.lesson_status', 'cmi.core.score.raw', 'cmi.suspend_data')",
            self.data.scorm.id
        ));
        let mut stored: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for row in rows.lines() {
            let cols: Vec<&str> = row.splitn(3, '\t').collect();
            stored
                .entry(cols[0].to_string())
                .or_default()
                .push((cols[1].to_string(), cols[2].to_string()));
        }
        stored.values_mut().for_each(|rows| rows.sort());
        stored
    }

    /// The bytes Moodle stored for `contenthash` (`filedir/xx/yy/<hash>`).
    pub fn stored(&self, contenthash: &str) -> Vec<u8> {
        let path = self
            .dataroot
            .join("filedir")
            .join(&contenthash[0..2])
            .join(&contenthash[2..4])
            .join(contenthash);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The environment config.php reads, for everything but the per-node keys.
    pub fn env(&self, wwwroot: &str) -> Vec<(String, String)> {
        site_env(&self.code, &self.dataroot, &self.socket, wwwroot)
    }
}

fn site_env(code: &Path, dataroot: &Path, socket: &Path, wwwroot: &str) -> Vec<(String, String)> {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("MOODLE_DIRROOT".into(), path(code)),
        ("MOODLE_WWWROOT".into(), wwwroot.into()),
        ("MOODLE_DATAROOT".into(), path(dataroot)),
        ("MOODLE_DBSOCKET".into(), path(socket)),
    ]
}

/// The tests/moodle/ file `name`.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/moodle")
        .join(name)
}

fn cache_root() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp: the cache sits beside it in target/.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("real-moodle-cache")
}

/// The Moodle tarball: `MOODLE_TARBALL`, else where the project's CI keeps it beside
/// the clone. The book's "Moodle behind a proxy" chapter (docs/src/moodle.md) says
/// which tarball this is and how to make one.
fn tarball() -> PathBuf {
    std::env::var_os("MOODLE_TARBALL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/moodle/moodle-4.5dev-20240903.tar.xz")
        })
}

/// What a user without the tarball needs to hear: which one, where to get it, and
/// how to point the suite at it.
fn no_tarball(tarball: &Path, error: &std::io::Error) -> String {
    let named = if std::env::var_os("MOODLE_TARBALL").is_some() {
        "MOODLE_TARBALL names"
    } else {
        "MOODLE_TARBALL is not set, and the default is"
    };
    format!(
        "the real-Moodle suite needs a Moodle tarball: {named} {path}: {error}\n\
         It was made for moodle-4.5dev-20240903.tar.xz (45 MB, sha256 c84913b7...48606): \
         Moodle core 4.5dev Build 20240903, the folder server/moodle of \
         https://github.com/AAU-P5-Moodle/moodle-1 at commit 2b070b78 without mod/livequiz \
         and local/adminer, packed as one folder moodle/ (a Moodle 4.5 release .tgz from \
         download.moodle.org is expected to work too, untested).\n\
         Make or download one, then: MOODLE_TARBALL=/path/to/moodle.tar.xz tests/moodle/run.sh\n\
         The book's chapter \"Moodle behind a proxy\" (docs/src/moodle.md) has the commands.",
        path = tarball.display()
    )
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The unpacked code and the installed site, each made once: (code, site dir).
fn ensure_cache() -> (PathBuf, PathBuf) {
    static ONCE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let tarball = tarball();
    let bytes = std::fs::read(&tarball).unwrap_or_else(|e| panic!("{}", no_tarball(&tarball, &e)));
    let tar_sha = hex(&Sha256::digest(&bytes));
    let code = ensure_code(&tarball, &tar_sha);

    let mut key = Sha256::new();
    key.update(&tar_sha);
    key.update(SETUP_VERSION);
    key.update(STUDENTS.to_string());
    key.update(NEWCOMERS.to_string());
    for name in ["config.php", "generate.php"] {
        key.update(std::fs::read(script(name)).unwrap());
    }
    key.update(run(
        "mariadbd --version",
        Command::new("mariadbd").arg("--version"),
    ));
    let site = cache_root().join(format!("site-{}", &hex(&key.finalize())[..16]));
    if !site.join("data.json").exists() {
        install(&code, &site);
    }
    (code, site)
}

/// Makes the 256 directories of the file cache store's locks, as a site that has
/// been serving for a while has them. Moodle 4.5 makes each on the first lock of a
/// key under it, with `check_dir_exists`: `is_dir`, then `mkdir`, which fails for
/// the second of two processes that get there at once. The file lock factory takes
/// that failure for a lock it cannot have, and the page is "Unable to acquire a lock
/// for caching" (Moodle's error page: a 500 during the page's header, else a 404).
/// On the copied site a test's first course builds come all at once (a class's
/// dashboards after their logins): the low-priority pools' test met the race in
/// about one run in fifteen.
fn lock_directories_made(dataroot: &Path) {
    let locks = dataroot.join("cache/cachestore_file/default_application/filelocks");
    for prefix in 0..=0xffu8 {
        std::fs::create_dir_all(locks.join(format!("{prefix:02x}"))).unwrap();
    }
}

/// `moodle-<sha>/moodle`, unpacked from the tarball if missing; config.php refreshed.
fn ensure_code(tarball: &Path, tar_sha: &str) -> PathBuf {
    let dir = cache_root().join(format!("moodle-{}", &tar_sha[..16]));
    if !dir.join("moodle/version.php").exists() {
        let started = Instant::now();
        let partial = cache_root().join(format!("moodle-partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).unwrap();
        run(
            "unpacking Moodle",
            // `xf`, not `xJf`: tar tells xz from gzip itself, so a release .tgz
            // unpacks as well as the .tar.xz.
            Command::new("tar")
                .arg("xf")
                .arg(tarball)
                .arg("-C")
                .arg(&partial),
        );
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir).unwrap();
        eprintln!("real-moodle: Moodle unpacked in {:.1?}", started.elapsed());
    }
    let code = dir.join("moodle");
    let config = std::fs::read(script("config.php")).unwrap();
    if std::fs::read(code.join("config.php")).ok().as_ref() != Some(&config) {
        let tmp = code.join(format!("config.php.{}", std::process::id()));
        std::fs::write(&tmp, &config).unwrap();
        std::fs::rename(&tmp, code.join("config.php")).unwrap();
    }
    code
}

/// Installs a site into `site` (db/, dataroot/, data.json), building it beside and
/// renaming it into place at the end, so an interrupted install leaves no cache.
fn install(code: &Path, site: &Path) {
    let started = Instant::now();
    eprintln!(
        "real-moodle: installing Moodle into {} (once)",
        site.display()
    );
    let build = site.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(build.join("dataroot")).unwrap();
    run(
        "mariadb-install-db",
        Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", build.join("db").display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db"),
    );
    let (db, socket) = start_mariadb(&build.join("db"), &build);
    run(
        "creating the database",
        Command::new("mariadb")
            .args(["--no-defaults", "-uroot", "-S"])
            .arg(&socket)
            .args([
                "-e",
                "CREATE DATABASE moodle DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
            ]),
    );
    let env = site_env(code, &build.join("dataroot"), &socket, "http://127.0.0.1:9");
    run(
        "Moodle's install_database.php",
        Command::new("php")
            .args(PHP_INI)
            .arg(code.join("admin/cli/install_database.php"))
            .args(["--agree-license", "--lang=en", "--adminuser=admin"])
            .args(["--adminpass=Admin-pass-1", "--adminemail=admin@example.com"])
            .args(["--fullname=Gateway test site", "--shortname=gwtest"])
            .envs(env.clone()),
    );
    let data = run(
        "tests/moodle/generate.php",
        Command::new("php")
            .args(PHP_INI)
            .arg(script("generate.php"))
            .arg(format!("--students={STUDENTS}"))
            .arg(format!("--newcomers={NEWCOMERS}"))
            .envs(env),
    );
    serde_json::from_str::<SiteData>(&data).expect("generate.php prints the site's data");
    std::fs::write(build.join("data.json"), data).unwrap();
    db.terminate(Duration::from_secs(60));
    let _ = std::fs::remove_file(build.join("mariadb.sock"));
    std::fs::rename(&build, site).unwrap();
    eprintln!("real-moodle: installed in {:.1?}", started.elapsed());
}

/// Starts MariaDB on `datadir`, socket and log in `dir`, no TCP at all.
fn start_mariadb(datadir: &Path, dir: &Path) -> (Proc, PathBuf) {
    let socket = dir.join("mariadb.sock");
    let mut command = Command::new("mariadbd");
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .args(["--skip-networking", "--user=root", "--skip-log-bin"])
        // Throwaway data: trade durability for speed.
        .args([
            "--innodb-log-file-size=16M",
            "--innodb-buffer-pool-size=128M",
        ])
        .args([
            "--innodb-flush-log-at-trx-commit=0",
            "--innodb-flush-method=nosync",
        ])
        .args(["--innodb-doublewrite=0", "--max-connections=200"])
        // A deadlock Moodle reports as a database error names its statements here.
        .arg("--innodb-print-all-deadlocks=ON");
    let mut db = Proc::spawn("mariadbd", command, &dir.join("mariadb.log"));
    wait_until(
        "MariaDB accepts connections",
        Duration::from_secs(60),
        || {
            db.assert_running();
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        },
    );
    (db, socket)
}
