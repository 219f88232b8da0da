//! `hurtle cp`: copy to or from a host reached with ssh, which starts hurtle on the far side
//! (`hurtle ssh-serve`, hidden), as scp and rsync do.
//!
//! **Push** (`cp SRC... [user@]host:DEST`): this side runs
//! `ssh [opts] [user@]host HURTLE ssh-serve receive --out DEST`. The far side binds a one-shot
//! receiver on an ephemeral port on all its addresses, prints one line on stdout,
//! `HURTLE-SSH <PROTOCOL> <port> <secret>`, and waits for one line on its stdin. This side
//! reads the far line, checks the protocol, and tries to connect to the host ssh connected to
//! (its name as `ssh -G` resolves it, then resolved here) at that port, within
//! [`DIRECT_TRY`]. Connected, it writes `direct` and sends over that connection (and the data
//! paths the session finds, UDP or parallel TCP); refused or unanswered (or `--via-ssh`), it
//! writes `ssh`, and both processes turn the ssh channel into a [`Mux`]: this side dials
//! every connection of the session through it, the far side connects each to its own
//! receiver on loopback.
//!
//! **Pull** (`cp [user@]host:SRC... DEST`): this side binds a one-shot receiver on an ephemeral
//! port, runs `ssh ... HURTLE ssh-serve send [flags] -- SRC...`, reads the far side's
//! `HURTLE-SSH <PROTOCOL> ready`, and writes `<port> <secret> <auto|ssh>` to its stdin (never on
//! a command line). The far side tries to dial back to the address ssh saw this side at (the
//! first field of `SSH_CONNECTION`) within [`DIRECT_TRY`] and says which path it takes:
//! `HURTLE-SSH <PROTOCOL> direct`, or `HURTLE-SSH <PROTOCOL> ssh <why>` after which its stdout
//! and stdin are the [`Mux`] (it dials, this side connects each stream to its receiver on
//! loopback).
//!
//! **The retry.** A direct session can get its control connection through and still fail in
//! its data path (UDP blocked and the receiver's TCP data ports too: a firewall that lets only
//! ssh and the control port through). When the sender's session fails so, before any file
//! data reached the receiver ([`retry_reason`]), the transfer is retried once through the ssh
//! channel, by the same two processes, to the same receiver, with the same secret (it never
//! left the ssh channel). Push: the near sender writes `ssh` (else `end`) after its failed
//! session; the far side, whose thread reading stdin ([`Watch`]) takes the word, answers
//! `HURTLE-SSH <PROTOCOL> ssh` and its stdout and stdin become the mux, whose connections wait
//! at the receiver's door until its failed session has ended (within its 10 s wait for TCP
//! data connections). Pull: the far sender says `HURTLE-SSH <PROTOCOL> ssh <why>` and waits;
//! the near side writes `ssh` and both become the mux, and its receiver's next session is the
//! retry. A far side whose direct session failed waits for that word (at most
//! [`VERDICT_WAIT`]); `end`, EOF or no word ends it with its own session's exit code.
//!
//! Through the ssh channel the session is parallel TCP inside one TCP connection and ssh's
//! own flow control: slow, and the summary says so (`path: through the ssh channel`,
//! `"path": "ssh"`).
//!
//! The far process never outlives the session: a thread reads its stdin (the ssh channel; the
//! mux's reader when it carries the session) and, at EOF, ends the session as a signal would
//! (`interrupt::hang_up`), unless the direct session is over and waits for the near side's
//! word on a retry (EOF is `end` then).
//!
//! The secret is 32 random bytes in hex, made by whichever side listens and carried over the ssh
//! channel, which ssh authenticates and encrypts. [`send_options`] and [`receive_options`] hand
//! it to the engine's key agreement as a key: the session is authenticated and its data
//! encrypted as any other, with no code to type.
//!
//! Directories follow rsync's trailing-slash rule ([`expand_sources`]); DEST follows scp's
//! and rsync's destination rules ([`place`]): a directory (existing, or written `DEST/`) takes
//! the sources into it, and a single source is otherwise named DEST. The receiving side
//! places them (this side for a pull; for a push the far side, to which this side first
//! writes the sources' [`Shape`] on its stdin, before the far side binds its receiver).
//!
//! **A pull takes only what it asked for.** The far side is not trusted with names: this
//! side's receiver takes only the top-level names of the sources it asked for (a `SRC/`, or
//! `host:`, asks for whatever is in that directory), and a manifest that offers any other
//! name is refused whole before anything is written, naming what was offered
//! ([`hurtle_engine::receive::Names`]; the class of scp's CVE-2019-6111).
//!
//! What each part owns:
//! - [`operands`]: the command line's operands (`[user@]host:path`, read as scp reads it) and
//!   whether they ask for a push or a pull.
//! - [`sources`]: the sender's paths under rsync's trailing-slash rule, on either side.
//! - [`dest`]: where the files land (scp's and rsync's destination rules), on the receiving
//!   side.
//! - [`options`]: the session's secret and the engine's options that carry it, on either side.
//! - [`far`]: this side's hold on the far side: running ssh, the far side's lines, its stdin,
//!   its mux, and what ssh's exit status means.
//! - [`route`]: the path a session takes (direct or through the ssh channel), the retry through
//!   the ssh channel and its warnings, and what either side needs to take a path.
//! - [`push`](mod@push): local to remote (this side sends).
//! - [`pull`](mod@pull): remote to local (this side receives).
//! - [`serve`](mod@serve): the far side itself, `hurtle ssh-serve receive|send` ([`serve()`]).
//!
//! This file: the conversation's constants ([`PROTOCOL`], [`BANNER`], [`DIRECT_TRY`]) and the
//! command's entry, [`run`].
//!
//! [`Mux`]: crate::sshmux::Mux
//! [`retry_reason`]: route::retry_reason
//! [`Watch`]: serve::Watch
//! [`VERDICT_WAIT`]: serve::VERDICT_WAIT
//! [`send_options`]: options::send_options
//! [`receive_options`]: options::receive_options
//! [`expand_sources`]: sources::expand_sources
//! [`place`]: dest::place
//! [`Shape`]: dest::Shape

mod dest;
mod far;
mod operands;
mod options;
mod pull;
mod push;
mod route;
mod serve;
mod sources;

pub use serve::serve;

use crate::args::{parse_channels, parse_rate, CpArgs};
use crate::config::Defaults;
use crate::exit::Outcome;
use operands::{plan, Plan};
use pull::pull;
use push::push;
use std::time::Duration;

/// The conversation's version and first word (with its text lines in [`crate::cp_lines`]).
pub use crate::cp_lines::{BANNER, PROTOCOL};
/// How long a direct connection to the other side's port may take (refused at once, or no
/// answer: a firewall that drops) before the ssh channel carries the session instead.
pub const DIRECT_TRY: Duration = Duration::from_secs(3);

/// Runs `hurtle cp`.
pub fn run(a: CpArgs, defaults: &Defaults) -> Outcome {
    let mut flags = a.send.clone();
    if flags.channels.is_none() {
        flags.channels = defaults.get("channels", parse_channels)?;
    }
    if flags.rate.rate.is_none() && flags.rate.rate_fixed.is_none() && !flags.rate.fair {
        flags.rate.rate = defaults.get("rate", parse_rate)?;
    }
    match plan(&a.operands)? {
        Plan::Push { sources, dest } => push(&a, &flags, &sources, &dest),
        Plan::Pull { sources, dest } => pull(&a, &flags, &sources, &dest),
    }
}
