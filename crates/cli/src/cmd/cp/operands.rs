//! The operands of `hurtle cp`: each read as scp reads it, a local path or
//! `[user@]host:path` ([`parse_operand`]), and what they ask for together ([`plan`]): local
//! sources to a remote directory (a push), or sources on one remote host to a local directory
//! (a pull).

use crate::exit::Failure;

/// One operand of `hurtle cp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// A path on this host.
    Local(String),
    /// `[user@]host:path`.
    Remote(Remote),
}

/// A remote operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The user, when given.
    pub user: Option<String>,
    /// The host (an IPv6 address without its brackets).
    pub host: String,
    /// The path on the far host (`.` for `host:`), relative to the far user's home.
    pub path: String,
}

impl Remote {
    /// What ssh is given: `user@host` or `host`.
    pub(super) fn destination(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }
}

/// Parses an operand as scp does: remote when a `:` comes before the first `/` (brackets
/// around an IPv6 address hide its colons), so `./a:b` is local and so is `:x`.
pub fn parse_operand(s: &str) -> Result<Operand, String> {
    let local = || Ok(Operand::Local(s.to_string()));
    // Where the host starts: after `user@`, when the `@` comes before any `:` or `/`.
    let host_start = match s.find(['@', ':', '/']) {
        Some(at) if s.as_bytes()[at] == b'@' => at + 1,
        _ => 0,
    };
    let (host, path) = if s[host_start..].starts_with('[') {
        let Some(close) = s[host_start..].find(']') else {
            return local();
        };
        let after = host_start + close + 1;
        match s[after..].strip_prefix(':') {
            Some(path) => (&s[host_start + 1..host_start + close], path),
            None => return local(),
        }
    } else {
        match s.find([':', '/']) {
            Some(i) if s.as_bytes()[i] == b':' && i > 0 => (&s[host_start..i], &s[i + 1..]),
            _ => return local(),
        }
    };
    let user = (host_start > 0).then(|| s[..host_start - 1].to_string());
    if let Some(u) = &user {
        if u.is_empty() || u.starts_with('-') || u.contains(char::is_whitespace) {
            return Err(format!("{s:?}: {u:?} is not a user name"));
        }
    }
    if host.is_empty() {
        return Err(format!("{s:?}: no host before the ':'"));
    }
    if host.starts_with('-') || host.contains(char::is_whitespace) || host.contains('@') {
        return Err(format!("{s:?}: {host:?} is not a host name"));
    }
    Ok(Operand::Remote(Remote {
        user,
        host: host.to_string(),
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
    }))
}

/// What a `hurtle cp` does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Local sources to a remote directory.
    Push { sources: Vec<String>, dest: Remote },
    /// Remote sources (one host) to a local directory.
    Pull { sources: Vec<Remote>, dest: String },
}

/// What `operands` (`SRC... DEST`) ask for: a push or a pull; anything else is a usage error.
pub(super) fn plan(operands: &[String]) -> Result<Plan, Failure> {
    let parsed = operands
        .iter()
        .map(|o| parse_operand(o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::usage)?;
    let Some((dest, sources)) = parsed.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(Failure::usage(
            "hurtle cp needs SRC... DEST: at least two operands",
        ));
    };
    let remote_sources: Vec<&Remote> = sources
        .iter()
        .filter_map(|s| match s {
            Operand::Remote(r) => Some(r),
            Operand::Local(_) => None,
        })
        .collect();
    match dest {
        Operand::Remote(dest) => {
            if !remote_sources.is_empty() {
                return Err(Failure::usage(
                    "hurtle cp copies between this host and one other: a remote SRC and a \
                     remote DEST (remote to remote) is not supported; copy to one of them first",
                ));
            }
            let sources = sources
                .iter()
                .filter_map(|s| match s {
                    Operand::Local(l) => Some(l.clone()),
                    Operand::Remote(_) => None,
                })
                .collect();
            Ok(Plan::Push {
                sources,
                dest: dest.clone(),
            })
        }
        Operand::Local(dest) => {
            if remote_sources.is_empty() {
                return Err(Failure::usage(
                    "hurtle cp copies between this host and another over ssh, and no operand is \
                     remote (HOST:PATH); for a local copy use cp -r or rsync",
                ));
            }
            if remote_sources.len() != sources.len() {
                return Err(Failure::usage(
                    "hurtle cp: the sources are either all local (a push) or all on one remote \
                     host (a pull), not both",
                ));
            }
            let first = remote_sources[0];
            if let Some(other) = remote_sources
                .iter()
                .find(|r| r.host != first.host || r.user != first.user)
            {
                return Err(Failure::usage(format!(
                    "hurtle cp: all remote sources must be on one host (given {} and {})",
                    first.destination(),
                    other.destination()
                )));
            }
            Ok(Plan::Pull {
                sources: remote_sources.into_iter().cloned().collect(),
                dest: dest.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit;

    fn remote(user: Option<&str>, host: &str, path: &str) -> Operand {
        Operand::Remote(Remote {
            user: user.map(str::to_string),
            host: host.into(),
            path: path.into(),
        })
    }

    #[test]
    fn operands_parse_as_scp_reads_them() {
        let p = |s| parse_operand(s).unwrap();
        assert_eq!(p("host:/data"), remote(None, "host", "/data"));
        assert_eq!(p("me@host:x/y"), remote(Some("me"), "host", "x/y"));
        assert_eq!(p("host:"), remote(None, "host", "."));
        assert_eq!(p("[::1]:/d"), remote(None, "::1", "/d"));
        assert_eq!(p("me@[fe80::1]:d"), remote(Some("me"), "fe80::1", "d"));
        assert_eq!(p("host:a:b"), remote(None, "host", "a:b"));
        for local in ["./a:b", "a/b:c", "plain", "/abs/x:y", ":x", "[::1]/x", "[x"] {
            assert_eq!(p(local), Operand::Local(local.into()), "{local}");
        }
        for bad in ["-oProxyCommand=x:y", "@host:x", "me@-x:y", "[]:x"] {
            assert!(parse_operand(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exactly_one_side_is_remote() {
        let ops = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let code = |v: &[&str]| plan(&ops(v)).unwrap_err().code;
        assert_eq!(code(&["a", "b"]), exit::USAGE);
        assert_eq!(code(&["h:a"]), exit::USAGE);
        assert_eq!(code(&["h:a", "g:b"]), exit::USAGE);
        assert_eq!(code(&["h:a", "b", "c"]), exit::USAGE);
        assert_eq!(code(&["h:a", "g:b", "c"]), exit::USAGE);
        assert!(matches!(
            plan(&ops(&["a", "b", "h:d"])),
            Ok(Plan::Push { .. })
        ));
        assert!(matches!(
            plan(&ops(&["h:a", "h:b", "d"])),
            Ok(Plan::Pull { .. })
        ));
    }
}
