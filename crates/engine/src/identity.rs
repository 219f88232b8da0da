//! Key files, and what a sender remembers of receivers: this module owns reading every file
//! that holds a secret (identity keys, shared keys) with ssh's check of its permissions, the
//! authorized-senders file a receiver reads (public keys), and the known-receivers file where a
//! sender pins each receiver's identity on first use ([`KnownReceivers`]).
//!
//! A private file (an identity key, a key file of `--key` or `--keys`) that its group or others
//! may read is refused, as ssh refuses an unprotected private key, with the `chmod` that fixes
//! it; an authorized-senders file its group or others may write is refused too (whoever can
//! write it can add a sender), as ssh's StrictModes does. The known-receivers file holds one
//! `ADDRESS hurtle-id-...` line per receiver: the first session with a receiver adds its line
//! (and says so), a later one with another key than the line's is refused
//! ([`SessionError::IdentityChanged`]), naming both fingerprints and the line to remove.

use crate::error::SessionError;
use hurtle_proto::secure::{IdentityError, IdentityKey, PublicId};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The environment variable that names the known-receivers file (for tests, and for a user who
/// keeps it elsewhere); `--known-receivers` takes precedence.
pub const KNOWN_RECEIVERS_ENV: &str = "HURTLE_KNOWN_RECEIVERS";

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "write").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A private file its group or others may read.
    #[error("{} holds a private key and is readable by {} (mode {mode:04o}): it is refused, as ssh refuses such a key; run `chmod 600 {}`", path.display(), if mode & 0o007 != 0 { "others" } else { "its group" }, path.display())]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A file that says who may connect (authorized senders) and that its group or others may
    /// write: whoever can write it can add a sender.
    #[error("{} says which senders may connect and is writable by {} (mode {mode:04o}): it is refused, as ssh's StrictModes refuses such an authorized_keys; run `chmod go-w {}`", path.display(), if mode & 0o002 != 0 { "others" } else { "its group" }, path.display())]
    Writable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A line is not a key.
    #[error("{} line {line}: {source}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// Its line number, from 1.
        line: usize,
        /// Why.
        #[source]
        source: IdentityError,
    },
    /// The file holds no key.
    #[error("{}: no key in it", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Reads a file that holds a secret, refusing it if its group or others may read it.
pub fn read_private(path: &Path) -> Result<String, KeyFileError> {
    read_guarded(path, 0o077, |path, mode| KeyFileError::Permissions {
        path,
        mode,
    })
}

/// Reads `path` as text, refusing it (with `refuse`'s error, given the path and the mode)
/// when its mode has any of the `forbidden` bits: the check of what its group and others may
/// do, on the file opened, so that it cannot change between the check and the read.
fn read_guarded(
    path: &Path,
    forbidden: u32,
    refuse: fn(PathBuf, u32) -> KeyFileError,
) -> Result<String, KeyFileError> {
    let io = |source| KeyFileError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mode = f.metadata().map_err(io)?.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(refuse(path.to_path_buf(), mode));
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(io)?;
    Ok(text)
}

/// Writes a new private file (mode 0600; it must not exist).
pub fn write_private(path: &Path, text: &str) -> Result<(), KeyFileError> {
    let io = |source| KeyFileError::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

/// An identity key file (`hurtle keygen --identity`): one `hurtle-identity-secret-...` line.
pub fn read_identity(path: &Path) -> Result<IdentityKey, KeyFileError> {
    let text = read_private(path)?;
    let (line, key) = lines(&text).next().ok_or_else(|| KeyFileError::Empty {
        path: path.to_path_buf(),
    })?;
    IdentityKey::parse(key.0).map_err(|source| KeyFileError::Line {
        path: path.to_path_buf(),
        line,
        source,
    })
}

/// An authorized-senders file: one public key (`hurtle-id-...`) per line, then a name for the
/// logs (else the key's fingerprint); blank lines and `#` comments are skipped. It holds no
/// secret, but says who may connect: refused when its group or others may write it.
pub fn read_authorized(path: &Path) -> Result<Vec<(String, PublicId)>, KeyFileError> {
    let text = read_guarded(path, 0o022, |path, mode| KeyFileError::Writable {
        path,
        mode,
    })?;
    let mut out = Vec::new();
    for (line, (key, name)) in lines(&text) {
        let public = PublicId::parse(key).map_err(|source| KeyFileError::Line {
            path: path.to_path_buf(),
            line,
            source,
        })?;
        let name = name.map_or_else(|| public.fingerprint(), str::to_string);
        out.push((name, public));
    }
    if out.is_empty() {
        return Err(KeyFileError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// The lines of a key file that hold something: (line number, (first word, rest)).
fn lines(text: &str) -> impl Iterator<Item = (usize, (&str, Option<&str>))> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let mut parts = line.splitn(2, char::is_whitespace);
        let first = parts.next().unwrap_or_default();
        let rest = parts.next().map(str::trim).filter(|r| !r.is_empty());
        Some((i + 1, (first, rest)))
    })
}

/// What a sender knows of receivers' identities: a file of `ADDRESS hurtle-id-...` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownReceivers {
    path: PathBuf,
}

/// What [`KnownReceivers::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The receiver's key is the one its line holds.
    Known,
    /// First use: the key was added; the text is the warning to show.
    New(String),
}

impl KnownReceivers {
    /// The file at `path`.
    pub fn at(path: impl Into<PathBuf>) -> KnownReceivers {
        KnownReceivers { path: path.into() }
    }

    /// The default file: [`KNOWN_RECEIVERS_ENV`] if set, else `known_receivers` under
    /// `$XDG_CONFIG_HOME/hurtle/`, else under `~/.config/hurtle/`; `None` when neither is set.
    pub fn default_location() -> Option<KnownReceivers> {
        let env = |k| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(p) = env(KNOWN_RECEIVERS_ENV) {
            return Some(KnownReceivers::at(p));
        }
        let dir = env("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(KnownReceivers::at(
            dir.join("hurtle").join("known_receivers"),
        ))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the key a receiver at `address` proved: known, new (then added, with a warning
    /// to show), or another than the one pinned ([`SessionError::IdentityChanged`]).
    pub fn check(&self, address: &str, key: &PublicId) -> Result<Pinned, SessionError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(SessionError::io("the known-receivers file", e)),
        };
        for (line, (addr, rest)) in lines(&text) {
            if addr != address {
                continue;
            }
            let pinned = rest.and_then(|r| PublicId::parse(r).ok());
            if pinned == Some(*key) {
                return Ok(Pinned::Known);
            }
            let was = pinned.map_or_else(|| "an unreadable key".into(), |p| p.fingerprint());
            return Err(SessionError::IdentityChanged(format!(
                "the receiver at {address} proved identity {}, but {} line {line} pins {was} for it: \
                 it may be a man in the middle, or the receiver has a new identity key; nothing was sent. \
                 If you know its key changed, remove line {line} of {} and try again",
                key.fingerprint(),
                self.path.display(),
                self.path.display(),
            )));
        }
        self.add(address, key)
            .map_err(|e| SessionError::io("the known-receivers file", e))?;
        Ok(Pinned::New(format!(
            "first transfer to the receiver at {address}: its identity {} is now pinned in {} \
             (compare the fingerprint with the one `hurtle keygen --identity` printed for it)",
            key.fingerprint(),
            self.path.display()
        )))
    }

    fn add(&self, address: &str, key: &PublicId) -> io::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .open(&self.path)?;
        f.write_all(format!("{address} {}\n", key.text()).as_bytes())
    }
}

/// A sender's check of the identity a receiver at `address` proved, against `known` (none:
/// refused); the first use's warning goes to `warnings`.
pub(crate) fn pin(
    known: Option<&KnownReceivers>,
    address: &str,
    key: &PublicId,
    warnings: &mut Vec<String>,
) -> Result<(), SessionError> {
    let known = known.ok_or_else(|| {
        SessionError::NotAuthenticated(format!(
            "the receiver proved identity {}, and there is no known-receivers file to pin it in \
             (give --known-receivers FILE); nothing was sent",
            key.fingerprint()
        ))
    })?;
    if let Pinned::New(warning) = known.check(address, key)? {
        warnings.push(warning);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_file_readable_by_group_or_others_is_refused_with_the_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("id.key");
        let key = IdentityKey::from_seed([5; 32]);
        write_private(&p, &format!("{}\n", key.secret_text())).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(read_identity(&p).unwrap().public(), key.public());
        for (mode, who) in [(0o640, "its group"), (0o604, "others"), (0o644, "others")] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = read_identity(&p).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, KeyFileError::Permissions { .. }), "{msg}");
            assert!(msg.contains(who) && msg.contains(&format!("chmod 600 {}", p.display())));
        }
        // Existing files are not overwritten.
        assert!(write_private(&p, "x").is_err());
    }

    #[test]
    fn authorized_senders_are_read_with_names_and_bad_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("authorized");
        let (a, b) = (
            IdentityKey::from_seed([1; 32]).public(),
            IdentityKey::from_seed([2; 32]).public(),
        );
        std::fs::write(&p, format!("# senders\n\n{a} alice laptop\n{b}\n")).unwrap();
        let got = read_authorized(&p).unwrap();
        assert_eq!(got[0], ("alice laptop".to_string(), a));
        assert_eq!(got[1], (b.fingerprint(), b));
        std::fs::write(&p, format!("{a} alice\nhurtle-key-00 bob\n")).unwrap();
        let msg = read_authorized(&p).unwrap_err().to_string();
        assert!(msg.contains("line 2"), "{msg}");
        std::fs::write(&p, "# none\n").unwrap();
        assert!(matches!(
            read_authorized(&p),
            Err(KeyFileError::Empty { .. })
        ));
        // Readable by all is fine (public keys); writable by group or others is not.
        std::fs::write(&p, format!("{a} alice\n")).unwrap();
        for (mode, ok) in [(0o644, true), (0o664, false), (0o646, false)] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let got = read_authorized(&p);
            assert_eq!(got.is_ok(), ok, "{mode:o}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("chmod go-w"), "{e}");
            }
        }
    }

    #[test]
    fn a_receiver_is_pinned_on_first_use_and_a_changed_key_refused() {
        let dir = tempfile::tempdir().unwrap();
        let known = KnownReceivers::at(dir.path().join("sub/known_receivers"));
        let (a, b) = (
            IdentityKey::from_seed([1; 32]).public(),
            IdentityKey::from_seed([2; 32]).public(),
        );
        assert!(
            matches!(known.check("10.0.0.1:9000", &a), Ok(Pinned::New(w)) if w.contains(&a.fingerprint()))
        );
        assert_eq!(known.check("10.0.0.1:9000", &a).unwrap(), Pinned::Known);
        // Another address is another receiver.
        assert!(matches!(
            known.check("10.0.0.2:9000", &b),
            Ok(Pinned::New(_))
        ));
        let err = known.check("10.0.0.1:9000", &b).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SessionError::IdentityChanged(_)));
        assert!(
            msg.contains(&a.fingerprint())
                && msg.contains(&b.fingerprint())
                && msg.contains("line 1"),
            "{msg}"
        );
    }
}
