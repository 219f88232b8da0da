//! Identity keys, as `hurtle keygen --identity`, `hurtle send --identity/--known-receivers` and
//! `hurtle receive --identity/--authorized` take and make them (docs/identity.md): a side's
//! Ed25519 key in a private file, a receiver's file of authorized senders' public keys, and
//! the sender's known-receivers file where each receiver's key is pinned on first use. The
//! files themselves are the engine's ([`hurtle_engine::identity`]); what is here turns them
//! into a sender's secret and a receiver's keyring, with this library's errors.

use super::error::Error;
use hurtle_engine::identity::{self as files, KnownReceivers};
use hurtle_engine::Keyring;
use std::path::Path;
use std::sync::Arc;

pub use hurtle_proto::secure::{IdentityKey, PublicId};

fn usage(e: files::KeyFileError) -> Error {
    Error::Usage(e.to_string())
}

/// Makes a new identity key in `out` (a new file, mode 0600) and returns its public key.
pub fn new_identity(out: &Path) -> Result<PublicId, Error> {
    let key = IdentityKey::generate();
    files::write_private(out, &format!("{}\n", key.secret_text())).map_err(usage)?;
    Ok(key.public())
}

/// Reads an identity key file, refused when its group or others may read it (a
/// [`Usage`](crate::ErrorKind::Usage) error naming the file and the `chmod` that fixes it).
pub fn read_identity(path: &Path) -> Result<Arc<IdentityKey>, Error> {
    files::read_identity(path).map(Arc::new).map_err(usage)
}

/// A sender's secret from its identity key file: the session is agreed with no shared secret,
/// and the receiver's identity is pinned in `known` (given, else
/// [`KnownReceivers::default_location`]).
pub fn sender(
    identity: &Path,
    known: Option<&Path>,
) -> Result<(hurtle_proto::secure::Secret, KnownReceivers), Error> {
    let key = read_identity(identity)?;
    let known = match known {
        Some(p) => KnownReceivers::at(p),
        None => KnownReceivers::default_location().ok_or_else(|| {
            Error::Usage(
                "no place for the known-receivers file: set HOME or XDG_CONFIG_HOME, or give \
                 --known-receivers FILE"
                    .into(),
            )
        })?,
    };
    Ok((hurtle_proto::secure::Secret::identity(key), known))
}

/// A receiver's keyring with its identity key (`identity`) and the senders it authorizes
/// (`authorized`, a file of public keys) added.
pub fn receiver(
    ring: Keyring,
    identity: Option<&Path>,
    authorized: Option<&Path>,
) -> Result<Keyring, Error> {
    let ring = match identity {
        Some(p) => ring.with_identity(read_identity(p)?),
        None => ring,
    };
    if let Some(path) = authorized {
        if ring.identity().is_none() {
            return Err(Error::Usage(
                "authorized senders need the receiver's own identity key (--identity)".into(),
            ));
        }
        for (name, public) in files::read_authorized(path).map_err(usage)? {
            ring.authorize(name, public);
        }
    }
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_identity_is_private_and_reads_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("me.id");
        let public = new_identity(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_identity(&p).unwrap().public(), public);
        assert!(new_identity(&p).is_err(), "an existing file is kept");
        let auth = dir.path().join("authorized");
        std::fs::write(&auth, format!("{public} me\n")).unwrap();
        let ring = receiver(Keyring::default(), Some(&p), Some(&auth)).unwrap();
        assert!(ring.identity().is_some() && !ring.is_empty());
        let err = receiver(Keyring::default(), None, Some(&auth)).unwrap_err();
        assert!(err.to_string().contains("--identity"), "{err}");
    }
}
