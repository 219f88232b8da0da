//! The `hurtle` command: `send`, `receive`, `cp` (over ssh), `demo`, `relay`, `completions` and
//! `man` (and the hidden `ssh-serve`, the far side of `cp`).
//!
//! `args` defines the flags and checks their values; `config` adds defaults from the
//! environment and a file; each command lives in `cmd/` and turns flags into a call of the
//! engine; `exit` maps each typed failure to its exit code; `ui` draws progress bars (on a
//! terminal only) and summaries; `interrupt` turns SIGINT and SIGTERM into a clean end of the
//! session; `rendezvous` pairs the two ends by code through a relay; `sshmux` carries a
//! session's connections through the ssh channel of `hurtle cp` when nothing else gets through.

mod args;
mod cmd;
mod config;
mod exit;
mod interrupt;
mod rendezvous;
mod sshmux;
mod ui;

pub use args::{OutputArgs, RateArgs};

use args::{Cli, Command};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    ui::set_color(cli.color, no_color);
    interrupt::install();
    let command = match cli.command {
        // The far side of `hurtle cp`: its stdout belongs to the near side, and it reads no
        // configuration (the near side passes every flag).
        Command::SshServe(a) => return cmd::cp::serve(a),
        c => c,
    };
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
        Err(f) => {
            ui::error_line(&one_line(&f.error));
            ExitCode::from(f.code)
        }
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
    fn an_error_line_names_each_cause_once() {
        use anyhow::Context;
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let own = anyhow::Error::new(SessionError::io("create /x", io()));
        assert_eq!(one_line(&own), "create /x: gone");
        let added = Err::<(), _>(io()).context("cannot start").unwrap_err();
        assert_eq!(one_line(&added), "cannot start: gone");
    }
}
