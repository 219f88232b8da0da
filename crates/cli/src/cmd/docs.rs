//! `hurtle completions SHELL` and `hurtle man`: generated from the flag definitions, so they
//! cannot drift from the binary.
//!
//! A manual page is clap_mangen's (NAME, SYNOPSIS, DESCRIPTION, OPTIONS, COMMANDS) with
//! hurtle's own sections before VERSION: NOTES (what `--help` shows after the flags, the exit
//! codes left out), EXIT STATUS (from [`exit::TABLE`]) and EXAMPLES ([`examples`]).

use crate::args::{Cli, CompletionsArgs, ManArgs};
use crate::exit::{self, Failure, Outcome};
use clap::CommandFactory;
use std::path::Path;

/// Prints the completion script for a shell on stdout.
pub fn completions(a: CompletionsArgs) -> Outcome {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "hurtle", &mut std::io::stdout());
    Ok(())
}

/// Writes the manual pages into a directory, or `hurtle.1` on stdout.
pub fn man(a: ManArgs) -> Outcome {
    let storage = |what: String, e: std::io::Error| {
        Failure::new(exit::STORAGE, anyhow::anyhow!("{what}: {e}"))
    };
    let pages = pages();
    match a.out {
        None => {
            let (_, text) = pages.last().expect("the top page comes last");
            std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
                .map_err(|e| storage("cannot write the manual page".into(), e))
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| storage(format!("cannot create {}", dir.display()), e))?;
            for (name, text) in &pages {
                write_page(&dir, name, text)
                    .map_err(|e| storage(format!("cannot write into {}", dir.display()), e))?;
            }
            Ok(())
        }
    }
}

fn write_page(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(name), text)
}

/// Every page, `(file name, roff text)`: one per visible command, then `hurtle.1`.
pub fn pages() -> Vec<(String, String)> {
    fn walk(cmd: &clap::Command, into: &mut Vec<(String, String)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, into);
        }
        into.push(page(cmd.clone()));
    }
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    walk(&cmd, &mut pages);
    pages
}

/// One command's page: clap_mangen's, its after-help (the exit codes) taken out and hurtle's
/// sections put before VERSION.
fn page(cmd: clap::Command) -> (String, String) {
    let name = cmd.get_name().to_string();
    let after = cmd
        .get_after_help()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let notes = after.replace(exit::TABLE, "").trim().to_string();
    let man = clap_mangen::Man::new(cmd.after_help(None::<&str>).after_long_help(None::<&str>));
    let file = man.get_filename();
    let mut text = Vec::new();
    // Rendering into memory cannot fail.
    let _ = man.render(&mut text);
    let text = String::from_utf8_lossy(&text).into_owned();
    let mut ours = String::new();
    if !notes.is_empty() {
        ours += ".SH NOTES\n";
        for block in notes.split("\n\n") {
            ours += &format!(".PP\n.nf\n{}\n.fi\n", roff_text(block));
        }
    }
    ours += &exit_status();
    ours += &examples_section(&name);
    let text = match text.find(".SH VERSION") {
        Some(i) => format!("{}{ours}{}", &text[..i], &text[i..]),
        None => format!("{text}{ours}"),
    };
    (file, text)
}

/// Text for roff: backslashes, dashes and apostrophes escaped (clap_mangen's page defines
/// `\*(Aq`), and a line that would read as a request made plain.
fn roff_text(s: &str) -> String {
    s.lines()
        .map(|l| {
            let l = l
                .replace('\\', "\\\\")
                .replace('-', "\\-")
                .replace('\'', "\\*(Aq");
            if l.starts_with('.') {
                format!("\\&{l}")
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// EXIT STATUS: [`exit::TABLE`]'s rows, each code a tagged paragraph.
fn exit_status() -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    for line in exit::TABLE.lines().skip(1) {
        let t = line.trim();
        match t.split_once(char::is_whitespace) {
            Some((code, text)) if code.starts_with(|c: char| c.is_ascii_digit()) => {
                rows.push((code.to_string(), text.trim().to_string()));
            }
            _ => {
                if let Some((_, text)) = rows.last_mut() {
                    text.push(' ');
                    text.push_str(t);
                }
            }
        }
    }
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    for (code, text) in rows {
        s += &format!(".TP\n.B {code}\n{}\n", roff_text(&text));
    }
    s
}

/// Examples for a command (`hurtle` for the top page): what each does, and the command.
pub fn examples(command: &str) -> &'static [(&'static str, &'static str)] {
    match command {
        "hurtle" => &[
            (
                "On the receiving host: wait for one transfer into ./incoming; it prints a code.",
                "hurtle receive --out ./incoming",
            ),
            (
                "On the sending host: send a file and a directory with that code.",
                "hurtle send big.iso photos/ --to receiver.example --code 4821-purple-sausage-river",
            ),
            (
                "Copy to a host you reach with ssh (hurtle is started there by ssh).",
                "hurtle cp big.iso user@host:/data/",
            ),
        ],
        "receive" => &[
            (
                "Receive one transfer into ./incoming; the code for the sender is printed.",
                "hurtle receive --out ./incoming",
            ),
            (
                "Register with a relay, for a sender that cannot reach this host.",
                "hurtle receive --relay relay.example --out ./incoming",
            ),
            (
                "Serve transfers until interrupted, from senders holding a key of keys.txt.",
                "hurtle receive --serve --keys keys.txt --out /srv/incoming",
            ),
        ],
        "send" => &[
            (
                "Send a file and a directory to a receiver that printed this code.",
                "hurtle send big.iso photos/ --to receiver.example --code 4821-purple-sausage-river",
            ),
            (
                "Find the receiver through a relay by its code.",
                "hurtle send big.iso --code 4821-purple-sausage --relay relay.example",
            ),
            (
                "Never more than 100 megabytes per second (800 Mbit/s), the code from the environment.",
                "HURTLE_CODE=4821-purple-sausage-river hurtle send big.iso --to receiver.example --rate 100MB/s",
            ),
        ],
        "cp" => &[
            (
                "Push a file into /data on a host you reach with ssh.",
                "hurtle cp big.iso user@host:/data/",
            ),
            (
                "Pull a directory's contents into ./photos, ssh on port 2222.",
                "hurtle cp -P 2222 user@host:photos/ ./photos",
            ),
        ],
        "demo" => &[(
            "Send 1 GiB of random bytes to a receiver on this machine and compare with plain TCP.",
            "hurtle demo --size 1G",
        )],
        "relay" => &[(
            "Pair senders with receivers by code on port 7401.",
            "hurtle relay --listen 0.0.0.0:7401",
        )],
        "completions" => &[(
            "Install bash completions for this user.",
            "hurtle completions bash > ~/.local/share/bash-completion/completions/hurtle",
        )],
        "man" => &[(
            "Install the manual pages for this user.",
            "hurtle man --out ~/.local/share/man/man1",
        )],
        "keygen" => &[(
            "Make a key for a sender; its line goes into the receiver's --keys file.",
            "hurtle keygen --out sender.key",
        )],
        _ => &[],
    }
}

/// EXAMPLES: each example's sentence, then its command, indented and unfilled.
fn examples_section(command: &str) -> String {
    let list = examples(command);
    if list.is_empty() {
        return String::new();
    }
    let mut s = String::from(".SH EXAMPLES\n");
    for (what, cmd) in list {
        s += &format!(
            ".PP\n{}\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            roff_text(what),
            roff_text(cmd)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_has_exit_status_and_examples_and_no_extra() {
        let pages = pages();
        assert_eq!(pages.last().unwrap().0, "hurtle.1");
        for (name, text) in &pages {
            assert!(
                text.contains(".SH \"EXIT STATUS\"\n.TP\n.B 0\nsuccess\n"),
                "{name}"
            );
            assert!(text.contains(".TP\n.B 130\n"), "{name}");
            assert!(text.contains(".SH EXAMPLES\n"), "{name}");
            assert!(!text.contains(".SH EXTRA"), "{name}");
            assert!(!text.contains("Exit codes:"), "{name}: the table as text");
            if let Some(version) = text.find(".SH VERSION") {
                assert!(text.find("EXIT STATUS").unwrap() < version, "{name}");
            }
        }
        let send = &pages.iter().find(|(n, _)| n == "hurtle-send.1").unwrap().1;
        assert!(send.contains("\\-\\-rate 100MB/s"), "{send}");
        let cp = &pages.iter().find(|(n, _)| n == "hurtle-cp.1").unwrap().1;
        assert!(cp.contains(".SH NOTES\n"), "cp keeps its operand rules");
    }

    #[test]
    fn every_example_parses() {
        use clap::Parser;
        for cmd in [
            "hurtle",
            "receive",
            "send",
            "cp",
            "demo",
            "relay",
            "completions",
            "man",
            "keygen",
        ] {
            for (_, line) in examples(cmd) {
                let words: Vec<&str> = line
                    .split_whitespace()
                    .skip_while(|w| w.contains('='))
                    .take_while(|w| *w != ">")
                    .collect();
                assert!(Cli::try_parse_from(&words).is_ok(), "{line}");
            }
        }
    }

    #[test]
    fn roff_text_escapes_what_roff_reads() {
        assert_eq!(roff_text("--out a\\b"), "\\-\\-out a\\\\b");
        assert_eq!(roff_text(".hidden\nit's"), "\\&.hidden\nit\\*(Aqs");
    }
}
