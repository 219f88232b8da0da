//! Any text given to the path sanitizer (`hurtle_engine::fs::sanitize_rel_path`, which every
//! name a sender offers goes through before the receiver touches its disk): never a panic, and
//! a path it accepts is relative, made only of plain components (no `..`, `.`, root or
//! prefix), holds no NUL, is the name it was given, and stays under any directory it is
//! joined to.
#![no_main]
use hurtle_engine::fs::{sanitize_rel_path, MAX_PATH_LEN};
use libfuzzer_sys::fuzz_target;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(path) = sanitize_rel_path(name) else {
        return;
    };
    assert!(path.is_relative(), "{name:?}");
    assert!(!path.as_os_str().as_bytes().contains(&0), "{name:?}");
    assert!(path.as_os_str().len() <= MAX_PATH_LEN);
    assert_eq!(path.as_os_str().as_bytes(), name.as_bytes());
    let mut count = 0;
    for c in path.components() {
        assert!(matches!(c, Component::Normal(_)), "{name:?}: {c:?}");
        assert_ne!(c.as_os_str(), "..");
        count += 1;
    }
    assert_eq!(count, name.split('/').count(), "{name:?}");
    let root = Path::new("/srv/incoming");
    let joined = root.join(&path);
    assert!(joined.starts_with(root) && joined != root, "{name:?}");
});
