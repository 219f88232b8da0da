//! The engine's options of a `hurtle cp` session, on either side, and where the session's
//! [`Secret`] is handed over: made by whichever side listens and carried over the ssh channel,
//! [`send_options`] and [`receive_options`] give it to the key agreement as a key.

use crate::args::SendFlags;
use hurtle_engine::receive::Names;
use hurtle_engine::{ReceiveOptions, SendOptions};
use std::path::{Path, PathBuf};

pub use crate::cp_lines::Secret;

/// The sender's options from the flags, for either side.
pub(super) fn send_options(
    flags: &SendFlags,
    log_dir: Option<PathBuf>,
    secret: &Secret,
) -> SendOptions {
    // The session's secret came over the authenticated ssh channel: the key agreement uses it
    // as a key (no code to type, and only the two ends of this ssh session hold it).
    SendOptions {
        secret: Some(hurtle_proto::secure::Secret::key(secret.0)),
        ..flags.options(log_dir)
    }
}

/// Whether a mirror (`--delete`) of `sources` mirrors the destination itself: one of them
/// stands for a directory's contents (`SRC/`), as rsync's `--delete` does for the same
/// arguments.
pub(super) fn mirror_root<'a>(mut sources: impl Iterator<Item = &'a str>) -> bool {
    sources.any(|s| super::sources::source_kind(s) == super::sources::Kind::Contents)
}

/// The receiver's options, for either side: `names`, the names it takes and the one it
/// renames (see [`super::dest`] and [`Names`]); `allow_delete` for a mirror (`cp --delete`,
/// whose user is both sides).
pub(super) fn receive_options(
    (out, names): (&Path, Names),
    (overwrite, allow_delete): (bool, bool),
    log_dir: Option<PathBuf>,
    secret: &Secret,
) -> ReceiveOptions {
    // The session's secret, as in `send_options`.
    let keys = hurtle_engine::Keyring::default();
    keys.add("ssh", hurtle_proto::secure::Secret::key(secret.0));
    ReceiveOptions {
        keys,
        out_dir: out.to_path_buf(),
        names,
        overwrite,
        allow_delete,
        log_dir,
        ..ReceiveOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_32_bytes_in_hex() {
        let secret = Secret::new();
        let s = secret.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(Secret::parse(&s).map(|p| p.0), Some(secret.0));
        assert!(Secret::parse("abc").is_none());
        assert!(Secret::parse(&"+f".repeat(32)).is_none());
    }
}
