//! The `hurtle` command: `send`, `receive`, `cp` (over ssh), `demo`, `relay`, `completions` and
//! `man` (and the hidden `ssh-serve`, the far side of `cp`).
//!
//! `args` defines the flags and checks their values; `config` adds defaults from the
//! environment and a file; each command lives in `cmd/` and turns flags into a call of the
//! engine; `exit` maps each typed failure to its exit code; `ui` draws progress bars (on a
//! terminal only) and summaries; `interrupt` turns SIGINT and SIGTERM into a clean end of the
//! session; `rendezvous` pairs the two ends by code through a relay; `sshmux` carries a
//! session's connections through the ssh channel of `hurtle cp` when nothing else gets through
//! (it and `cp`'s text lines, `cp_lines`, are in the library, where the fuzz targets reach them).

mod args;
mod cmd;
mod config;
mod exit;
mod interrupt;
mod rendezvous;
mod ui;

use hurtle::{cp_lines, sshmux};

pub use args::{OutputArgs, RateArgs};

use args::{Cli, Command};
use clap::{CommandFactory, Parser};
use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e, &argv),
    };
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    ui::set_color(cli.color, no_color);
    interrupt::install();
    let command = match cli.command {
        // The far side of `hurtle cp`: its stdout belongs to the near side, and it reads no
        // configuration (the near side passes every flag).
        Command::SshServe(a) => return cmd::cp::serve(a),
        c => c,
    };
    let json = command.output().is_some_and(|o| o.json);
    let outcome = config::Defaults::load().and_then(|defaults| match command {
        Command::Receive(a) => cmd::receive::run(a, &defaults),
        Command::Send(a) => cmd::send::run(a, &defaults),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Cp(a) => cmd::cp::run(a, &defaults),
        Command::Relay(a) => cmd::relay::run(a),
        Command::Completions(a) => cmd::docs::completions(a),
        Command::Man(a) => cmd::docs::man(a),
        Command::Keygen(a) => cmd::keys::keygen(a),
        Command::SshServe(_) => unreachable!("served above"),
    });
    match outcome {
        Ok(()) => ExitCode::from(exit::OK),
        Err(f) => fail(f.code, &one_line(&f.error), json),
    }
}

/// Says a failure: `hurtle: error: LINE` on stderr and, with `--json`, the error object on
/// stdout; returns its exit code.
fn fail(code: u8, line: &str, json: bool) -> ExitCode {
    ui::error_line(line);
    if json {
        println!("{}", exit::json_error(code, line));
    }
    ExitCode::from(code)
}

/// A command line clap refused (or `--help` and `--version`, which are no errors): the error
/// on one line with the fix, exit code 2.
fn usage_error(e: &clap::Error, argv: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE));
    }
    let json = argv
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    ui::set_color(args::ColorArg::Auto, no_color);
    fail(
        exit::USAGE,
        &usage_line(&e.render().to_string(), argv),
        json,
    )
}

/// clap's error text (`error: ...`, the tips, the usage) as one line: the error, its tips, and
/// where the help is (`try 'hurtle send --help'`).
fn usage_line(text: &str, argv: &[OsString]) -> String {
    let mut error = Vec::new();
    let mut tips = Vec::new();
    let mut in_error = true;
    for line in text.lines().map(str::trim) {
        if let Some(tip) = line.strip_prefix("tip: ") {
            tips.push(tip);
        } else if line.is_empty() || line.starts_with("Usage:") {
            in_error = false;
        } else if in_error {
            error.push(line);
        }
    }
    let mut one = error.join(" ");
    if let Some(rest) = one.strip_prefix("error: ") {
        one = rest.to_string();
    }
    for tip in tips {
        one = format!("{one}; {tip}");
    }
    let commands = Cli::command();
    let sub = argv.iter().skip(1).filter_map(|a| a.to_str()).find(|a| {
        commands
            .get_subcommands()
            .any(|c| !c.is_hide_set() && c.get_name() == *a)
    });
    match sub {
        Some(sub) => format!("{one}; try 'hurtle {sub} --help'"),
        None => format!("{one}; try 'hurtle --help'"),
    }
}

/// An error and its causes on one line, each cause once: most of the engine's errors already
/// name their cause in their own message, context added with `anyhow` does not.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_engine::SessionError;

    #[test]
    fn clap_errors_become_one_line_with_the_fix() {
        let line = |args: &[&str]| {
            let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
            let e = Cli::try_parse_from(&argv).err().expect("an error");
            usage_line(&e.render().to_string(), &argv)
        };
        assert_eq!(
            line(&["hurtle", "send", "a", "--to", "h", "--zzz"]),
            "unexpected argument '--zzz' found; to pass '--zzz' as a value, use '-- --zzz'; \
             try 'hurtle send --help'"
        );
        assert_eq!(
            line(&["hurtle", "send", "a", "--to", "h", "--rat", "1M"]),
            "unexpected argument '--rat' found; a similar argument exists: '--rate'; \
             try 'hurtle send --help'"
        );
        assert_eq!(
            line(&["hurtle", "send", "--to", "h"]),
            "the following required arguments were not provided: <PATHS>...; \
             try 'hurtle send --help'"
        );
        assert_eq!(
            line(&["hurtle", "sned"]),
            "unrecognized subcommand 'sned'; a similar subcommand exists: 'send'; \
             try 'hurtle --help'"
        );
        let rate = line(&["hurtle", "send", "a", "--to", "h", "--rate", "100Mb"]);
        assert!(
            rate.starts_with("invalid value '100Mb' for '--rate <RATE>': ")
                && rate.ends_with("; try 'hurtle send --help'")
                && !rate.contains('\n'),
            "{rate}"
        );
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        use anyhow::Context;
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let own = anyhow::Error::new(SessionError::io("create /x", io()));
        assert_eq!(one_line(&own), "create /x: gone");
        let added = Err::<(), _>(io()).context("cannot start").unwrap_err();
        assert_eq!(one_line(&added), "cannot start: gone");
    }
}
