//! The command line as a new admin meets it: `help` and `--help` behave as in any
//! clap program, `-h` and `--help` say the same thing, and a demo that cannot bind
//! says which address and which flag moves it.

use std::net::TcpListener;
use std::process::{Command, Output};

fn gateway(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn dash_h_and_dash_dash_help_print_the_same_text_for_every_command() {
    for command in [&[][..], &["run"], &["check"], &["demo"], &["help"]] {
        let short = gateway(&[command, &["-h"]].concat());
        let long = gateway(&[command, &["--help"]].concat());
        assert!(
            short.status.success() && long.status.success(),
            "{command:?}"
        );
        assert_eq!(stdout(&short), stdout(&long), "{command:?}");
    }
    let top = stdout(&gateway(&["--help"]));
    assert!(top.contains("session-sticky reverse proxy"), "{top}");
}

#[test]
fn help_works_as_clap_users_expect() {
    let cases: [(&[&str], &[&str]); 3] = [
        (&["help"], &["--help"]),
        (&["help", "check"], &["check", "--help"]),
        (&["help", "help"], &["help", "--help"]),
    ];
    for (asked, same_as) in cases {
        let (asked_out, expected) = (gateway(asked), gateway(same_as));
        assert!(asked_out.status.success(), "{asked:?}");
        assert_eq!(stdout(&asked_out), stdout(&expected), "{asked:?}");
    }
    let help_of_help = stdout(&gateway(&["help", "--help"]));
    assert!(
        help_of_help.contains("Usage: moodle-gateway help [COMMAND]"),
        "{help_of_help}"
    );
    let unknown = gateway(&["help", "nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("unrecognized subcommand 'nope'"),
        "{stderr}"
    );
}

#[test]
fn a_demo_whose_port_is_taken_names_the_address_and_the_flag_to_change_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let addr = addr.as_str();
    let cases = [
        (
            ["--listen", addr, "--admin-listen", "127.0.0.1:0"],
            "--listen ADDR",
        ),
        (
            ["--listen", "127.0.0.1:0", "--admin-listen", addr],
            "--admin-listen ADDR",
        ),
    ];
    for (flags, hint) in cases {
        let output = gateway(&[&["demo", "--students", "1"][..], &flags].concat());
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("on {addr}: ")), "{stderr}");
        assert!(stderr.contains(hint), "{stderr}");
    }
}
