//! The sender's paths, on either side of `hurtle cp`: rsync's trailing-slash rule
//! ([`expand_sources`]).

use crate::exit::{self, Failure};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The sender's paths under rsync's rule: `SRC/` (a directory named with a trailing slash)
/// stands for what is in it, each entry sent under its own name (sorted, symbolic links among
/// them skipped with a warning unless `follow_symlinks`); any other path is sent as itself, a
/// directory with everything below it. A path that does not exist is a storage failure
/// (exit 6) before anything starts.
pub fn expand_sources(
    paths: &[PathBuf],
    follow_symlinks: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<PathBuf>, Failure> {
    let storage = |what: String| Failure::new(exit::STORAGE, anyhow::anyhow!(what));
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p);
        if meta.is_err() && std::fs::symlink_metadata(p).is_err() {
            return Err(storage(format!(
                "no such file or directory: {}",
                p.display()
            )));
        }
        let contents = p.as_os_str().as_bytes().ends_with(b"/");
        if !(contents && meta.is_ok_and(|m| m.is_dir())) {
            out.push(p.clone());
            continue;
        }
        let mut entries = std::fs::read_dir(p)
            .and_then(|d| d.collect::<Result<Vec<_>, _>>())
            .map_err(|e| storage(format!("cannot read {}: {e}", p.display())))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = p.join(e.file_name());
            if !follow_symlinks && e.file_type().is_ok_and(|t| t.is_symlink()) {
                warnings.push(format!(
                    "skipping symbolic link {} (--follow-symlinks follows it)",
                    path.display()
                ));
                continue;
            }
            out.push(path);
        }
    }
    Ok(out)
}
