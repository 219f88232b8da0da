//! Include and exclude rules (`--exclude PATTERN`, `--include PATTERN`), read as rsync reads
//! them in the common cases.
//!
//! This module owns what a pattern means and which rule decides a path; [`crate::walk`]
//! asks [`Filter::keeps`] for every path it meets, and does not descend into a directory
//! that is left out.
//!
//! A path is matched as the manifest names it: relative to the transfer's root, starting
//! with the argument's name (`send tree` offers `tree/a/b.c`; `cp tree/ host:d` offers
//! `a/b.c`), which is the path `rsync -r` matches for the same arguments.
//!
//! - The rules are tried in the order given, `--include` and `--exclude` mixed; the first
//!   that matches decides; a path no rule matches is sent.
//! - A directory left out is left out with everything below it (an include rule for a file
//!   inside it does not bring it back, as in rsync).
//! - `*` matches any run of characters but `/`; `?` one character but `/`; `[abc]` and
//!   `[a-z]` one of a class; `**` any run of characters, `/` included; `\` quotes the next
//!   character.
//! - A pattern ending in `/` matches only directories (`build/`).
//! - A pattern starting with `/` is anchored at the transfer's root (`/top-only` matches
//!   `top-only`, not `a/top-only`); any other pattern matches the end of the path at a `/`
//!   (`*.tmp` matches `a/b/x.tmp`, `sub/*.c` matches `tree/sub/x.c`, `**/cache` matches
//!   `tree/a/cache`).
//!
//! rsync rules not followed: the `/***` suffix, `+ `/`- ` prefixes and merge files
//! (`--filter`, `--exclude-from`), per-directory `.rsync-filter` files, `**` inside a
//! component (`a**b`, refused), and `--delete-excluded`.

use globset::{GlobBuilder, GlobMatcher};

/// Whether a rule sends or leaves out what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// `--include`: send it (and stop looking at rules).
    Include,
    /// `--exclude`: leave it out (a directory with everything below it).
    Exclude,
}

/// One rule, compiled.
#[derive(Debug, Clone)]
pub struct Rule {
    kind: RuleKind,
    pattern: String,
    dir_only: bool,
    matcher: GlobMatcher,
}

impl Rule {
    /// Compiles `pattern` (see the [module documentation](self) for what it means).
    pub fn new(kind: RuleKind, pattern: &str) -> Result<Rule, FilterError> {
        let bad = |why: String| FilterError::BadPattern {
            pattern: pattern.to_string(),
            why,
        };
        let (body, dir_only) = match pattern.strip_suffix('/') {
            Some(b) => (b, true),
            None => (pattern, false),
        };
        let (body, anchored) = match body.strip_prefix('/') {
            Some(b) => (b, true),
            None => (body, false),
        };
        if body.is_empty() {
            return Err(bad("it matches no name".into()));
        }
        if body.split('/').any(|c| c != "**" && c.contains("**")) {
            return Err(bad(
                "`**` must be a whole path component (as in a/**/b)".into()
            ));
        }
        let glob = if anchored {
            body.to_string()
        } else {
            format!("**/{body}")
        };
        let matcher = GlobBuilder::new(&glob)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| bad(e.kind().to_string()))?
            .compile_matcher();
        Ok(Rule {
            kind,
            pattern: pattern.to_string(),
            dir_only,
            matcher,
        })
    }

    /// Include or exclude.
    pub fn kind(&self) -> RuleKind {
        self.kind
    }

    /// The pattern as the user wrote it.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether the rule matches `rel_path` (`/`-separated, relative to the transfer's root).
    pub fn matches(&self, rel_path: &str, is_dir: bool) -> bool {
        (is_dir || !self.dir_only) && self.matcher.is_match(rel_path)
    }
}

/// An ordered list of rules; the empty one sends everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Rule>,
}

impl PartialEq for Filter {
    fn eq(&self, other: &Filter) -> bool {
        self.rules.len() == other.rules.len()
            && self
                .rules
                .iter()
                .zip(&other.rules)
                .all(|(a, b)| a.kind == b.kind && a.pattern == b.pattern)
    }
}

impl Eq for Filter {}

/// A pattern that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The pattern is not a glob this module reads.
    #[error("bad pattern {pattern:?}: {why}")]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        why: String,
    },
}

impl Filter {
    /// Compiles the rules, in order.
    pub fn new<'a>(
        rules: impl IntoIterator<Item = (RuleKind, &'a str)>,
    ) -> Result<Filter, FilterError> {
        let rules = rules
            .into_iter()
            .map(|(kind, pattern)| Rule::new(kind, pattern))
            .collect::<Result<_, _>>()?;
        Ok(Filter { rules })
    }

    /// No rules at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules as a mirror sends them to the receiver ([`hurtle_proto::wire::Control::Mirror`]):
    /// `"+ PATTERN"` or `"- PATTERN"`, in order.
    pub fn to_wire(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| match r.kind {
                RuleKind::Include => format!("+ {}", r.pattern),
                RuleKind::Exclude => format!("- {}", r.pattern),
            })
            .collect()
    }

    /// The rules a sender gave in [`Filter::to_wire`]'s form; a rule without its `+ ` or `- `
    /// is a [`FilterError::BadPattern`].
    pub fn from_wire(rules: &[String]) -> Result<Filter, FilterError> {
        let parsed = rules
            .iter()
            .map(|r| match (r.strip_prefix("+ "), r.strip_prefix("- ")) {
                (Some(p), _) => Ok((RuleKind::Include, p)),
                (None, Some(p)) => Ok((RuleKind::Exclude, p)),
                (None, None) => Err(FilterError::BadPattern {
                    pattern: r.clone(),
                    why: "a rule must start with \"+ \" or \"- \"".into(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Filter::new(parsed)
    }

    /// Whether `rel_path` is sent: the first matching rule decides, and a path no rule
    /// matches is sent.
    pub fn keeps(&self, rel_path: &str, is_dir: bool) -> bool {
        self.rules
            .iter()
            .find(|r| r.matches(rel_path, is_dir))
            .is_none_or(|r| r.kind == RuleKind::Include)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RuleKind::{Exclude, Include};

    fn filter(rules: &[(RuleKind, &str)]) -> Filter {
        Filter::new(rules.iter().copied()).unwrap()
    }

    #[test]
    fn a_name_without_a_slash_matches_at_any_depth() {
        let f = filter(&[(Exclude, "*.tmp")]);
        for p in ["x.tmp", "t/x.tmp", "t/a/b/.tmp"] {
            assert!(!f.keeps(p, false), "{p}");
        }
        for p in ["t/x.tmpl", "t/x.tmp/y", "t"] {
            assert!(f.keeps(p, false), "{p}");
        }
        // A star stops at a slash.
        let f = filter(&[(Exclude, "a*b")]);
        assert!(!f.keeps("t/axxb", false));
        assert!(f.keeps("t/a/b", false));
    }

    #[test]
    fn a_trailing_slash_matches_directories_only() {
        let f = filter(&[(Exclude, "build/")]);
        assert!(!f.keeps("t/build", true));
        assert!(f.keeps("t/build", false));
        assert!(f.keeps("t/rebuild", true));
    }

    #[test]
    fn a_leading_slash_anchors_at_the_root() {
        let f = filter(&[(Exclude, "/top-only")]);
        assert!(!f.keeps("top-only", false));
        assert!(f.keeps("t/top-only", false));
        let f = filter(&[(Exclude, "/t/sub/")]);
        assert!(!f.keeps("t/sub", true));
        assert!(f.keeps("t/a/sub", true));
    }

    #[test]
    fn slashes_and_double_stars_match_the_end_of_the_path() {
        let f = filter(&[(Exclude, "**/cache")]);
        for p in ["cache", "t/cache", "t/a/b/cache"] {
            assert!(!f.keeps(p, true), "{p}");
        }
        assert!(f.keeps("t/cache2", true));
        let f = filter(&[(Exclude, "sub/*.c")]);
        assert!(!f.keeps("t/sub/x.c", false));
        assert!(f.keeps("t/sub/d/x.c", false));
        assert!(f.keeps("t/xsub/x.c", false));
        let f = filter(&[(Exclude, "a/**/z")]);
        assert!(!f.keeps("t/a/z", false));
        assert!(!f.keeps("t/a/b/c/z", false));
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let f = filter(&[(Include, "keep.tmp"), (Exclude, "*.tmp")]);
        assert!(f.keeps("t/keep.tmp", false));
        assert!(!f.keeps("t/other.tmp", false));
        let f = filter(&[(Exclude, "*.tmp"), (Include, "keep.tmp")]);
        assert!(!f.keeps("t/keep.tmp", false));
        // Include some, exclude the rest.
        let f = filter(&[(Include, "*/"), (Include, "*.c"), (Exclude, "*")]);
        assert!(f.keeps("t/d", true));
        assert!(f.keeps("t/d/x.c", false));
        assert!(!f.keeps("t/d/x.h", false));
        assert!(Filter::default().keeps("anything", false));
    }

    #[test]
    fn the_wire_form_gives_the_same_rules_back() {
        let f = filter(&[(Include, "keep.tmp"), (Exclude, "*.tmp"), (Exclude, "/b/")]);
        let wire = f.to_wire();
        assert_eq!(wire, ["+ keep.tmp", "- *.tmp", "- /b/"]);
        assert_eq!(Filter::from_wire(&wire).unwrap(), f);
        assert!(Filter::from_wire(&["*.tmp".to_string()]).is_err());
    }

    #[test]
    fn bad_patterns_are_refused_with_the_pattern() {
        for p in ["/", "", "a**b", "[z-"] {
            let e = Filter::new([(Exclude, p)]).unwrap_err();
            assert!(e.to_string().contains(&format!("{p:?}")), "{e}");
        }
    }
}
