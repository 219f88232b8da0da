//! Which names a sender may offer this receiver, and the one it writes under another name
//! ([`Names`]). `send`/`receive` take any name (the default); `hurtle cp`'s pull takes only
//! the sources it asked for (the class of scp's CVE-2019-6111: a far side that offers other
//! names is refused before anything is written), and gives a single source the name its
//! destination asks for (scp's and rsync's `cp host:f new-name`).

use hurtle_proto::wire::Entry;
use std::borrow::Cow;

/// Most refused names one refusal lists.
const LISTED: usize = 8;

/// The names a receiver takes, by the first component of each manifest path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// The top-level names a sender may offer (what lies below them is theirs); `None`: any.
    pub allowed: Option<Vec<String>>,
    /// A top-level name offered by the sender, and the name it is written under here
    /// (everything below it follows).
    pub rename: Option<(String, String)>,
}

/// The first component of a manifest path, and the rest (with its `/`).
fn split_top(path: &str) -> (&str, &str) {
    match path.find('/') {
        Some(i) => path.split_at(i),
        None => (path, ""),
    }
}

impl Names {
    /// The paths among `entries` whose top-level name was not asked for, in manifest order.
    pub fn unrequested<'a>(&self, entries: &'a [Entry]) -> Vec<&'a str> {
        let Some(allowed) = &self.allowed else {
            return Vec::new();
        };
        entries
            .iter()
            .map(|e| e.path.as_str())
            .filter(|p| !allowed.iter().any(|a| a == split_top(p).0))
            .collect()
    }

    /// Why the sender's `unrequested` paths are refused: the names asked for, and the first
    /// few offered besides (all of them counted).
    pub fn refusal(&self, unrequested: &[&str]) -> String {
        let asked = self.allowed.as_deref().unwrap_or_default().join(", ");
        let mut listed = unrequested
            .iter()
            .take(LISTED)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if unrequested.len() > LISTED {
            listed.push_str(&format!(" and {} more", unrequested.len() - LISTED));
        }
        format!(
            "not asked for: the receiver asked for {asked} only, and the sender offered \
             {listed} as well; nothing was written"
        )
    }

    /// `path` as it is written here.
    pub fn local<'a>(&self, path: &'a str) -> Cow<'a, str> {
        match &self.rename {
            Some((from, to)) => {
                let (top, rest) = split_top(path);
                if top == from {
                    Cow::Owned(format!("{to}{rest}"))
                } else {
                    Cow::Borrowed(path)
                }
            }
            None => Cow::Borrowed(path),
        }
    }

    /// `entries` with their paths as they are written here (borrowed when nothing is renamed).
    pub fn localize<'a>(&self, entries: &'a [Entry]) -> Cow<'a, [Entry]> {
        if self.rename.is_none() {
            return Cow::Borrowed(entries);
        }
        Cow::Owned(
            entries
                .iter()
                .map(|e| Entry {
                    path: self.local(&e.path).into_owned(),
                    ..e.clone()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hurtle_proto::wire::EntryKind;

    fn entry(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            size: 1,
            mode: 0o644,
            mtime_ns: 0,
            holes: Vec::new(),
            target: String::new(),
        }
    }

    #[test]
    fn only_the_top_level_names_asked_for_pass() {
        let names = Names {
            allowed: Some(vec!["wanted.txt".into(), "tree".into()]),
            rename: None,
        };
        let offered: Vec<Entry> = [
            "wanted.txt",
            "tree",
            "tree/a/b",
            "evil.txt",
            ".bashrc",
            ".ssh",
            ".ssh/authorized_keys",
            "wanted.txt2",
            "treex/y",
        ]
        .map(entry)
        .to_vec();
        let refused = names.unrequested(&offered);
        assert_eq!(
            refused,
            [
                "evil.txt",
                ".bashrc",
                ".ssh",
                ".ssh/authorized_keys",
                "wanted.txt2",
                "treex/y"
            ]
        );
        let why = names.refusal(&refused);
        assert!(why.contains("wanted.txt, tree only"), "{why}");
        assert!(why.contains(".ssh/authorized_keys"), "{why}");
        // Any name passes without a list.
        assert!(Names::default().unrequested(&offered).is_empty());
    }

    #[test]
    fn a_long_refusal_is_counted_not_listed() {
        let names = Names {
            allowed: Some(vec!["a".into()]),
            rename: None,
        };
        let offered: Vec<Entry> = (0..20).map(|i| entry(&format!("x{i}"))).collect();
        let why = names.refusal(&names.unrequested(&offered));
        assert!(why.contains("x7 and 12 more"), "{why}");
        assert!(!why.contains("x8"), "{why}");
    }

    #[test]
    fn the_renamed_top_level_name_carries_what_is_below_it() {
        let names = Names {
            allowed: None,
            rename: Some(("big.bin".into(), "renamed.bin".into())),
        };
        assert_eq!(names.local("big.bin"), "renamed.bin");
        assert_eq!(names.local("big.bin/x/y"), "renamed.bin/x/y");
        assert_eq!(names.local("big.bin2"), "big.bin2");
        assert_eq!(names.local("other/big.bin"), "other/big.bin");
        let entries = [entry("big.bin"), entry("z")];
        let local = names.localize(&entries);
        assert_eq!(local[0].path, "renamed.bin");
        assert_eq!(local[1].path, "z");
        assert!(matches!(
            Names::default().localize(&entries),
            Cow::Borrowed(_)
        ));
    }
}
