//! Writes the man pages, `moodle-gateway(1)` and one per command
//! (`moodle-gateway-run(1)`, ...), from the same clap definitions main.rs parses
//! (src/cli.rs), so the manual cannot drift from `--help`. They go to OUT_DIR and,
//! where `cargo deb` picks them up, to `target/<profile>/man/`, gzipped for
//! /usr/share/man/man1/.

use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "src/cli.rs"]
mod cli;

/// What clap cannot know: where the files are and where the manual is.
const FILES_AND_SEE_ALSO: &str = r#".SH FILES
.TP
\fI/etc/moodle\-gateway/config.toml\fR
The configuration: every key is explained in its comments, the reference of the
configuration. Check it with \fBmoodle\-gateway check \-\-config\fR \fIFILE\fR.
.TP
\fI/etc/moodle\-gateway/admin.token\fR, \fI/etc/moodle\-gateway/route.secret\fR
The admin API's token and the route cookie's secret, made at install, mode 0600.
.TP
\fI/var/lib/moodle\-gateway/moodle\-gateway.state\fR
The session table's snapshot, read back at start.
.SH ENVIRONMENT
.TP
\fBMOODLE_GATEWAY_ADMIN_TOKEN\fR, \fBMOODLE_GATEWAY_ROUTE_SECRET\fR
Override the admin token and the route cookie's secret of the file.
.TP
\fBMOODLE_GATEWAY_DOCTOR_PASSWORD\fR
The test account's password for \fBdoctor \-\-login\fR (else it is asked for).
.TP
\fBRUST_LOG\fR
The log level (default \fBinfo\fR).
.TP
\fBTOKIO_WORKER_THREADS\fR
Worker threads (default: one per core).
.SH SIGNALS
\fBSIGHUP\fR reloads the configuration and reopens the access log; \fBSIGTERM\fR and
\fBSIGINT\fR stop the gateway gracefully, saving the session table.
.SH SEE ALSO
The manual, an HTML book: \fI/usr/share/doc/moodle\-gateway/book/index.html\fR
(in a source tree, \fBmdbook build docs\fR writes it to \fIdocs/book/\fR).
"#;

fn main() {
    println!("cargo:rerun-if-changed=src/cli.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut command = <cli::Cli as clap::CommandFactory>::command();
    command.build();
    let mut pages = vec![(command.get_name().to_owned(), page(&command, true))];
    // After build(), a command's display name is its page's: moodle-gateway-run.
    for sub in command.get_subcommands() {
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_owned();
        let sub = sub.clone().version(env!("CARGO_PKG_VERSION"));
        pages.push((name, page(&sub, false)));
    }
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<package>-<hash>/out.
    let profile_dir = out.ancestors().nth(3).map(Path::to_path_buf);
    for (name, roff) in &pages {
        write(&out.join(format!("{name}.1")), roff);
        if let Some(dir) = &profile_dir {
            let page = dir.join("man").join(format!("{name}.1"));
            write(&page, roff);
            gzip(&page);
        }
    }
}

/// One man page; the top one also says where the files and the manual are.
fn page(command: &clap::Command, top: bool) -> Vec<u8> {
    let man = clap_mangen::Man::new(command.clone()).manual("moodle-gateway manual");
    let mut roff = Vec::new();
    let rendered = (|| -> std::io::Result<()> {
        man.render_title(&mut roff)?;
        man.render_name_section(&mut roff)?;
        man.render_synopsis_section(&mut roff)?;
        man.render_description_section(&mut roff)?;
        man.render_options_section(&mut roff)?;
        man.render_subcommands_section(&mut roff)?;
        if top {
            roff.extend_from_slice(FILES_AND_SEE_ALSO.as_bytes());
        }
        man.render_version_section(&mut roff)
    })();
    rendered.expect("writing to a Vec");
    roff
}

/// `NAME.1.gz` beside `NAME.1`, as Debian wants manuals (cargo-deb 3.8 ships them as
/// given). gzip is on every Debian system; without it only the .deb lacks its pages,
/// so the build goes on.
fn gzip(page: &Path) {
    let gz = page.with_extension("1.gz");
    let out = std::process::Command::new("gzip")
        .args(["-9nc"])
        .arg(page)
        .output();
    match out {
        Ok(out) if out.status.success() => write(&gz, &out.stdout),
        _ => println!("cargo:warning=gzip failed: no {}", gz.display()),
    }
}

fn write(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
