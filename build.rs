//! Writes the man pages, `moodle-gateway(1)` and one per command
//! (`moodle-gateway-run(1)`, ...), from the same clap definitions main.rs parses
//! (src/cli.rs), so the manual cannot drift from `--help`. They go to OUT_DIR and,
//! where `cargo deb` picks them up, to `target/<profile>/man/`, gzipped for
//! /usr/share/man/man1/.

use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "src/cli.rs"]
mod cli;

/// Each page's NAME line: a few words, as `whatis` and `apropos` list them. clap's
/// `about` is a paragraph, which stays the DESCRIPTION.
const NAMES: [(&str, &str); 7] = [
    (
        "moodle-gateway",
        "session-sticky reverse proxy for a Moodle cluster",
    ),
    ("moodle-gateway-run", "run the gateway"),
    (
        "moodle-gateway-check",
        "check a configuration file without starting anything",
    ),
    (
        "moodle-gateway-demo",
        "the whole product on this machine, in front of stand-in Moodle nodes",
    ),
    (
        "moodle-gateway-doctor",
        "ask every Moodle server what its config.php gets wrong",
    ),
    (
        "moodle-gateway-ready",
        "say whether this gateway can serve students now (keepalived's check)",
    ),
    ("moodle-gateway-help", "print the help of a command"),
];

/// Each page's EXIT STATUS; 2 is also clap's for a command line it cannot read.
const EXIT_STATUS: [(&str, &str); 7] = [
    (
        "moodle-gateway",
        r#".TP
\fB0\fR
Success: \fBrun\fR stopped gracefully, \fBcheck\fR accepted the file, \fBdemo\fR lost no session, \fBdoctor\fR found no problem.
.TP
\fB1\fR
\fBrun\fR could not start (a bad file, a port in use), \fBcheck\fR refused the file, \fBdemo\fR lost a session or failed, \fBdoctor\fR found a problem.
.TP
\fB2\fR
A command line that cannot be read, or \fBdoctor\fR could not ask (see \fBmoodle\-gateway\-doctor\fR(1)).
"#,
    ),
    (
        "moodle-gateway-run",
        r#".TP
\fB0\fR
The gateway stopped gracefully (\fBSIGTERM\fR or \fBSIGINT\fR).
.TP
\fB1\fR
It could not start: the file does not load, or a listener cannot bind.
.TP
\fB2\fR
The command line cannot be read.
"#,
    ),
    (
        "moodle-gateway-check",
        r#".TP
\fB0\fR
The file is accepted; warnings, if any, are printed on standard error.
.TP
\fB1\fR
The file is refused: every problem is printed on standard error as \fIfile\fR:\fIline\fR: \fIkey\fR: \fIreason\fR, sorted by line.
.TP
\fB2\fR
The command line cannot be read.
"#,
    ),
    (
        "moodle-gateway-demo",
        r#".TP
\fB0\fR
No session was lost, and every simulated student finished their steps.
.TP
\fB1\fR
A session was lost, a student's step failed, or the demo could not start (a port in use, a \fB\-\-write\-config\fR file it cannot write).
.TP
\fB2\fR
The command line cannot be read.
"#,
    ),
    (
        "moodle-gateway-doctor",
        r#".TP
\fB0\fR
No problem found: the gate before students are sent to the gateway.
.TP
\fB1\fR
Problems found, each printed with the server, what was seen, and the fix.
.TP
\fB2\fR
It could not ask: the file does not load, it has no [site] wwwroot, no node answered, no password was given for \fB\-\-login\fR, or the command line cannot be read.
"#,
    ),
    (
        "moodle-gateway-ready",
        r#".TP
\fB0\fR
Ready: the students' listener accepts connections and the admin listener's \fB/readyz\fR says a node is active and up. keepalived keeps or takes the site's address.
.TP
\fB1\fR
Not ready (the reason is printed), or the file does not load. keepalived gives the address to the other gateway.
.TP
\fB2\fR
The command line cannot be read.
"#,
    ),
    (
        "moodle-gateway-help",
        r#".TP
\fB0\fR
The help was printed.
.TP
\fB2\fR
There is no such command.
"#,
    ),
];

/// Each page's EXAMPLES.
const EXAMPLES: [(&str, &str); 7] = [
    (
        "moodle-gateway",
        r#"Check the file, ask the Moodle servers, then start the packaged service:
.PP
.RS
.nf
moodle\-gateway check \-\-config /etc/moodle\-gateway/config.toml
moodle\-gateway doctor \-\-config /etc/moodle\-gateway/config.toml
systemctl enable \-\-now moodle\-gateway
.fi
.RE
.PP
See it all on one machine, with stand-in Moodle nodes:
.PP
.RS
.nf
moodle\-gateway demo
.fi
.RE
"#,
    ),
    (
        "moodle-gateway-run",
        r#"Run in the foreground, then reload the file from another shell:
.PP
.RS
.nf
moodle\-gateway run \-\-config /etc/moodle\-gateway/config.toml
kill \-HUP $(pidof moodle\-gateway)
.fi
.RE
.PP
Under the packaged unit, \fBsystemctl reload moodle\-gateway\fR checks the file first, then sends \fBSIGHUP\fR.
"#,
    ),
    (
        "moodle-gateway-check",
        r#".RS
.nf
moodle\-gateway check \-\-config /etc/moodle\-gateway/config.toml
.fi
.RE
.PP
The shipped file, from a source tree, with the two secrets given by the environment:
.PP
.RS
.nf
MOODLE_GATEWAY_ADMIN_TOKEN=$(openssl rand \-hex 32) \e
MOODLE_GATEWAY_ROUTE_SECRET=$(openssl rand \-hex 32) \e
moodle\-gateway check \-\-config config.toml
.fi
.RE
"#,
    ),
    (
        "moodle-gateway-demo",
        r#"Open the dashboard it prints, and the site on 127.0.0.1:8080:
.PP
.RS
.nf
moodle\-gateway demo
.fi
.RE
.PP
Drive 200 students, 20 at a time, and exit with the table of where they went:
.PP
.RS
.nf
moodle\-gateway demo \-\-students 200 \-\-concurrency 20
.fi
.RE
.PP
Write the config the demo runs, check it, and ask its stand-ins from another shell:
.PP
.RS
.nf
moodle\-gateway demo \-\-write\-config demo.toml
moodle\-gateway check \-\-config demo.toml
MOODLE_GATEWAY_DOCTOR_PASSWORD=x moodle\-gateway doctor \-\-config demo.toml \-\-login student
.fi
.RE
.PP
A surge: slow nodes, a crowd, the line and the waiting room on the dashboard:
.PP
.RS
.nf
moodle\-gateway demo \-\-surge
.fi
.RE
"#,
    ),
    (
        "moodle-gateway-doctor",
        r#"Before students are sent to the gateway:
.PP
.RS
.nf
moodle\-gateway doctor \-\-config /etc/moodle\-gateway/config.toml
.fi
.RE
.PP
Also log in as a test account on each node and fetch a file through the offload:
.PP
.RS
.nf
MOODLE_GATEWAY_DOCTOR_PASSWORD=... moodle\-gateway doctor \e
    \-\-config /etc/moodle\-gateway/config.toml \-\-login doctor\-test
.fi
.RE
"#,
    ),
    (
        "moodle-gateway-ready",
        r#"In keepalived.conf, on each gateway:
.PP
.RS
.nf
vrrp_script gateway {
    script "/usr/bin/moodle\-gateway ready \-\-config /etc/moodle\-gateway/config.toml"
    interval 1
    timeout 2
    fall 2
    rise 2
}
.fi
.RE
"#,
    ),
    (
        "moodle-gateway-help",
        r#".RS
.nf
moodle\-gateway help doctor
.fi
.RE
"#,
    ),
];

/// The variables the gateway reads, on every page of a command that reads the file.
const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
\fBMOODLE_GATEWAY_ADMIN_TOKEN\fR
The admin API's token; beats \fBadmin.token\fR and \fBadmin.token_file\fR of the file.
.TP
\fBMOODLE_GATEWAY_ROUTE_SECRET\fR
The route cookie's secret; beats \fBroute_cookie.secret\fR and \fBsecret_file\fR.
.TP
\fBMOODLE_GATEWAY_STORE_SECRET\fR
The secret every gateway of a site shares through Redis; beats \fBstore.secret\fR and \fBsecret_file\fR.
.TP
\fBMOODLE_GATEWAY_STORE_MASTER_PASSWORD\fR
Redis's password; beats \fBstore.master_password\fR and its file.
.TP
\fBMOODLE_GATEWAY_STORE_SENTINEL_PASSWORD\fR
Redis Sentinel's password; beats \fBstore.sentinel_password\fR and its file.
.TP
\fBMOODLE_GATEWAY_DOCTOR_PASSWORD\fR
The test account's password for \fBdoctor \-\-login\fR (else it is asked for).
.TP
\fBRUST_LOG\fR
The log level (default \fBinfo\fR).
.TP
\fBTOKIO_WORKER_THREADS\fR
Worker threads (default: one per core).
"#;

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
.SH SIGNALS
\fBSIGHUP\fR reloads the configuration and reopens the access log; \fBSIGTERM\fR and
\fBSIGINT\fR stop the gateway gracefully, saving the session table.
.SH SEE ALSO
The manual, an HTML book: \fI/usr/share/doc/moodle\-gateway/book/index.html\fR
(in a source tree, \fBmdbook build docs\fR writes it to \fIdocs/book/\fR); its chapter
"Deployment" is the path from the servers you have to students using the gateway.
"#;

fn main() {
    println!("cargo:rerun-if-changed=src/cli.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut command = <cli::Cli as clap::CommandFactory>::command();
    command.build();
    let top = command.get_name().to_owned();
    let mut pages = vec![(top.clone(), page(&command, &top))];
    // After build(), a command's display name is its page's: moodle-gateway-run.
    for sub in command.get_subcommands() {
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_owned();
        let sub = sub.clone().version(env!("CARGO_PKG_VERSION"));
        let roff = page(&sub, &name);
        pages.push((name, roff));
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

/// One man page: clap's synopsis, description and options, our NAME, EXIT STATUS
/// and EXAMPLES; the top one also lists the commands and says where the files and
/// the manual are. No heading is written without something under it.
fn page(command: &clap::Command, name: &str) -> Vec<u8> {
    let man = clap_mangen::Man::new(command.clone()).manual("moodle-gateway manual");
    let top = name == "moodle-gateway";
    let mut roff = Vec::new();
    let rendered = (|| -> std::io::Result<()> {
        man.render_title(&mut roff)?;
        roff.extend_from_slice(
            format!(
                ".SH NAME\n{} \\- {}\n",
                escape(name),
                escape(entry(&NAMES, name))
            )
            .as_bytes(),
        );
        man.render_synopsis_section(&mut roff)?;
        man.render_description_section(&mut roff)?;
        man.render_options_section(&mut roff)?;
        if command.has_subcommands() {
            man.render_subcommands_section(&mut roff)?;
        }
        roff.extend_from_slice(
            format!(".SH EXIT STATUS\n{}", entry(&EXIT_STATUS, name)).as_bytes(),
        );
        roff.extend_from_slice(format!(".SH EXAMPLES\n{}", entry(&EXAMPLES, name)).as_bytes());
        if name != "moodle-gateway-help" {
            roff.extend_from_slice(ENVIRONMENT.as_bytes());
        }
        if top {
            roff.extend_from_slice(FILES_AND_SEE_ALSO.as_bytes());
        } else {
            roff.extend_from_slice(b".SH SEE ALSO\n\\fBmoodle\\-gateway\\fR(1)\n");
        }
        man.render_version_section(&mut roff)
    })();
    rendered.expect("writing to a Vec");
    roff
}

/// `name`'s text in `table`; a command without one fails the build, so a new
/// command cannot ship a page without its NAME, EXIT STATUS and EXAMPLES.
fn entry(table: &[(&str, &'static str)], name: &str) -> &'static str {
    match table.iter().find(|(n, _)| *n == name) {
        Some((_, text)) => text,
        None => panic!(
            "build.rs: no man page text for {name}: add it to NAMES, EXIT_STATUS and EXAMPLES"
        ),
    }
}

/// Plain text as roff reads it: a hyphen is `\-`, a backslash `\e`.
fn escape(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
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
