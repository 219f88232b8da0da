//! The guard that keeps the library whole: every flag of `hurtle send` and `hurtle receive` is
//! either a setter of the library's builder ([`hurtle::SenderBuilder`],
//! [`hurtle::ReceiverBuilder`]) or listed here with the reason it is the command's alone. A
//! flag added to the command without either fails this test.
//!
//! Where a new flag goes: its check in `hurtle::api::values` (or `keys`), a setter on the
//! builder that checks it the same way, and one line in [`SEND`] or [`RECEIVE`] below (the
//! clap id, which is the field's name, and the setter with a value). A flag only a terminal
//! needs goes in [`SEND_CLI_ONLY`] or [`RECEIVE_CLI_ONLY`], with why.

use crate::args::Cli;
use clap::CommandFactory;
use hurtle::{ReceiverBuilder, SenderBuilder, Transport};
use std::collections::BTreeSet;
use std::time::Duration;

type SendSetter = fn(SenderBuilder) -> SenderBuilder;
type ReceiveSetter = fn(ReceiverBuilder) -> ReceiverBuilder;
/// Rows of flag id and builder setter.
type Table<B> = [(&'static str, fn(B) -> B)];

/// `hurtle send`'s flags (clap ids) and the builder setter each one is.
const SEND: &[(&str, SendSetter)] = &[
    ("to", |b| b.to("127.0.0.1:7400")),
    ("code", |b| b.code("7-acid-acorn")),
    ("key", |b| b.key_file("keys")),
    ("identity", |b| b.identity_file("me.id")),
    ("known_receivers", |b| b.known_receivers("known_receivers")),
    ("wait", |b| b.wait(Duration::from_secs(5))),
    ("relay", |b| b.relay("127.0.0.1")),
    ("relay_only", |b| b.relay_only(true)),
    ("no_encryption", |b| b.no_encryption(true)),
    ("channels", |b| b.channels(3)),
    ("transport", |b| b.transport(Transport::Tcp)),
    ("chunk_size", |b| b.chunk_size(64 << 10)),
    ("rate", |b| b.rate("800M")),
    ("rate_fixed", |b| b.rate_fixed("800M")),
    ("fair", |b| b.fair(true)),
    ("cold_start", |b| b.cold_start(true)),
    ("payload", |b| b.payload(1200)),
    ("follow_symlinks", |b| b.follow_symlinks(true)),
    ("checksum", |b| b.checksum(true)),
    ("no_sparse", |b| b.no_sparse(true)),
    ("no_fec", |b| b.fec(false)),
    ("dry_run", |b| b.dry_run(true)),
    ("delete", |b| b.delete(true)),
    ("exclude", |b| b.exclude("*.tmp")),
    ("include", |b| b.include("keep.tmp")),
    ("log_dir", |b| b.log_dir("logs")),
];

/// `hurtle send`'s flags that are the command's alone, and why.
const SEND_CLI_ONLY: &[(&str, &str)] = &[
    ("paths", "the operands: the paths of Sender::send"),
    (
        "name",
        "`send -` spools standard input into a file of this name; a program passes a file",
    ),
    ("json", "output: a program has the summary as SendSummary"),
    ("quiet", "output: a program prints what it wants"),
    (
        "verbose",
        "output: a program has every file's report in the summary",
    ),
    ("color", "output: terminal colors"),
];

/// `hurtle receive`'s flags (clap ids) and the builder setter each one is.
const RECEIVE: &[(&str, ReceiveSetter)] = &[
    ("listen", |b| b.listen("127.0.0.1:0")),
    ("relay", |b| b.relay("127.0.0.1")),
    ("out", |b| b.out("elsewhere")),
    ("overwrite", |b| b.overwrite(true)),
    ("allow_delete", |b| b.allow_delete(true)),
    ("buffer_memory", |b| b.buffer_memory(64 << 20)),
    ("code", |b| b.code("7-acid-acorn")),
    ("sender_code", |b| b.sender_code("7-acid-acorn")),
    ("keys", |b| b.keys_file("keys")),
    ("identity", |b| b.identity_file("me.id")),
    ("authorized", |b| b.authorized_file("authorized")),
    ("no_encryption", |b| b.no_encryption(true)),
    ("log_dir", |b| b.log_dir("logs")),
];

/// `hurtle receive`'s flags that are the command's alone, and why.
const RECEIVE_CLI_ONLY: &[(&str, &str)] = &[
    (
        "serve",
        "a program calls Receiver::receive again for each transfer",
    ),
    (
        "write_queue",
        "hidden, for tests and comparisons of the writer thread",
    ),
    (
        "json",
        "output: a program has the summary as ReceiveSummary",
    ),
    ("quiet", "output: a program prints what it wants"),
    (
        "verbose",
        "output: a program has every file's report in the summary",
    ),
    ("color", "output: terminal colors"),
];

/// The ids of a command's flags and operands (clap's own help and version left out).
fn flags(command: &str) -> BTreeSet<String> {
    let cli = Cli::command();
    let sub = cli
        .find_subcommand(command)
        .unwrap_or_else(|| panic!("no command {command}"));
    sub.get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| id != "help" && id != "version")
        .collect()
}

/// What is wrong between a command's flags and its two lists: a flag in neither, an entry for
/// no flag, or a flag in both.
fn gaps(command: &str, setters: &[&str], cli_only: &[&str]) -> Vec<String> {
    let flags = flags(command);
    let mut wrong = Vec::new();
    for f in &flags {
        match (
            setters.contains(&f.as_str()),
            cli_only.contains(&f.as_str()),
        ) {
            (false, false) => wrong.push(format!(
                "hurtle {command}: flag {f} has no builder setter and no reason to be the \
                 command's alone (see the module docs of cmd/api_parity.rs)"
            )),
            (true, true) => wrong.push(format!("hurtle {command}: flag {f} is in both lists")),
            _ => {}
        }
    }
    for id in setters.iter().chain(cli_only) {
        if !flags.contains(*id) && *id != "color" {
            wrong.push(format!("hurtle {command}: {id} is listed but is no flag"));
        }
    }
    wrong
}

#[test]
fn every_send_and_receive_flag_is_a_builder_setter_or_says_why_not() {
    let ids = |t: &[(&'static str, _)]| t.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    let mut wrong = gaps(
        "send",
        &SEND.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        &ids(SEND_CLI_ONLY),
    );
    wrong.extend(gaps(
        "receive",
        &RECEIVE.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        &ids(RECEIVE_CLI_ONLY),
    ));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The rows of `table` whose setter leaves a default builder as it was.
fn setting_nothing<B: Default + std::fmt::Debug>(table: &Table<B>) -> Vec<&'static str> {
    let before = format!("{:?}", B::default());
    table
        .iter()
        .filter(|(_, set)| format!("{:?}", set(B::default())) == before)
        .map(|(id, _)| *id)
        .collect()
}

#[test]
fn each_setter_in_the_table_sets_something() {
    // A table entry that sets nothing (a setter that ignores its value, a copy-paste of the
    // wrong one) would hide a flag the API lacks.
    assert_eq!(setting_nothing(SEND), Vec::<&str>::new(), "send");
    assert_eq!(setting_nothing(RECEIVE), Vec::<&str>::new(), "receive");
}

#[test]
fn the_guard_finds_a_flag_with_neither() {
    let ids: Vec<&str> = SEND_CLI_ONLY.iter().map(|(id, _)| *id).collect();
    let mut setters: Vec<&str> = SEND.iter().map(|(id, _)| *id).collect();
    let before = gaps("send", &setters, &ids);
    setters.retain(|id| *id != "fair");
    let after = gaps("send", &setters, &ids);
    let new: Vec<_> = after.iter().filter(|w| !before.contains(w)).collect();
    assert_eq!(new.len(), 1, "{after:?}");
    assert!(
        new[0].contains("flag fair has no builder setter"),
        "{new:?}"
    );
}
