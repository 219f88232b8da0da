//! hurtle as a library: fast, verified file transfer over long, fat, lossy networks, from a
//! program instead of the `hurtle` command.
//!
//! A [`Receiver`] listens and serves one transfer per [`Receiver::receive`]; a [`Sender`]
//! sends files and directories to it ([`Sender::send`]). Both are made with builders whose
//! options are the command's flags, checked the same way ([`ErrorKind::Usage`] for a bad
//! value). A transfer runs on a thread of its own: its [`Transfer`] handle waits for the
//! summary (the `--json` summary as a typed struct), yields progress [`Event`]s, and cancels it
//! ([`Transfer::cancel`]: what was verified is kept, as with Ctrl-C, and the same transfer
//! again resumes). Every [`Error`] has a [`kind`](Error::kind), which is one of the command's
//! exit codes.
//!
//! Sending (here to a receiver on this machine, with the code it was given):
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let file = dir.path().join("genome.fa");
//! # std::fs::write(&file, vec![7u8; 300_000])?;
//! # let receiver = hurtle::Receiver::builder()
//! #     .out(dir.path().join("in")).listen("127.0.0.1:0").code("7-acid-acorn").build()?;
//! # let receiving = receiver.receive()?;
//! let sender = hurtle::Sender::builder()
//!     .to(receiver.local_addr())
//!     .code("7-acid-acorn")
//!     .channels(2)
//!     .rate("800M")
//!     .cold_start(true)
//!     .build()?;
//! let summary = sender.send([&file])?.wait()?;
//! assert_eq!(summary.bytes, 300_000);
//! println!("{} files in {:.2} s", summary.files, summary.seconds);
//! # receiving.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Receiving, with progress events as they come:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # std::fs::write(dir.path().join("a.bin"), vec![1u8; 200_000])?;
//! let receiver = hurtle::Receiver::builder()
//!     .out(dir.path().join("incoming"))
//!     .listen("127.0.0.1:0")
//!     .build()?;
//! let code = receiver.code().expect("a new code").to_string();
//! # let sender = hurtle::Sender::builder().to(receiver.local_addr()).code(&code)
//! #     .cold_start(true).build()?;
//! # let sending = sender.send([dir.path().join("a.bin")])?;
//! let transfer = receiver.receive()?;
//! for event in transfer.iter() {
//!     if let hurtle::Event::FileStarted(name) = event {
//!         println!("receiving {name}");
//!     }
//! }
//! let summary = transfer.wait()?;
//! assert_eq!(summary.files, 1);
//! # sending.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The parts of the library are described in [`api`]; the command itself (`src/main.rs`) is
//! built beside it. [`sshmux`] (the multiplexer `hurtle cp` runs over its ssh channel) and
//! [`cp_lines`] (the text lines of `cp`'s conversation) are the command's, here so that the
//! fuzz targets reach them.

#![deny(missing_docs)]

pub mod api;
pub mod cp_lines;
pub mod sshmux;

pub use api::{
    Canceller, Error, ErrorKind, Event, Phase, ReceiveSummary, Receiver, ReceiverBuilder,
    SendSummary, Sender, SenderBuilder, Snapshot, Transfer, Transport, Waiting,
};
