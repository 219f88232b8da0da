//! `--exclude PATTERN` and `--include PATTERN`: rsync's filter rules, kept in the order they
//! were given on the command line (the first matching rule decides, so the order of the two
//! flags matters). Written by hand rather than derived: two flags feed one ordered list,
//! which clap's derive cannot say.

use clap::{Arg, ArgAction, ArgMatches, Command};
use hurtle_engine::filter::{Filter, Rule, RuleKind};

/// The filter rules of a sending command.
#[derive(Debug, Clone, Default)]
pub struct FilterArgs {
    /// The rules, compiled, in command-line order.
    pub filter: Filter,
}

const FLAGS: [(&str, RuleKind); 2] = [
    ("exclude", RuleKind::Exclude),
    ("include", RuleKind::Include),
];

fn check(s: &str) -> Result<String, String> {
    Rule::new(RuleKind::Exclude, s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

impl FilterArgs {
    /// The rules again, as flags for the far side of `hurtle cp` (in order).
    pub fn to_args(&self) -> Vec<String> {
        self.filter
            .rules()
            .iter()
            .map(|r| match r.kind() {
                RuleKind::Exclude => format!("--exclude={}", r.pattern()),
                RuleKind::Include => format!("--include={}", r.pattern()),
            })
            .collect()
    }
}

impl clap::FromArgMatches for FilterArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut rules: Vec<(usize, RuleKind, String)> = Vec::new();
        for (id, kind) in FLAGS {
            if let (Some(values), Some(at)) = (m.get_many::<String>(id), m.indices_of(id)) {
                rules.extend(at.zip(values).map(|(i, v)| (i, kind, v.clone())));
            }
        }
        rules.sort_by_key(|r| r.0);
        let filter = Filter::new(rules.iter().map(|(_, k, p)| (*k, p.as_str())))
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
        Ok(FilterArgs { filter })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for FilterArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new("exclude")
                .long("exclude")
                .value_name("PATTERN")
                .action(ArgAction::Append)
                .value_parser(check)
                .help(
                    "Do not send what PATTERN matches (rsync's rules: '*.tmp', 'build/' for \
                     directories, '/top' from the root, '**/cache'); repeatable, tried in order \
                     with --include, the first match decides",
                ),
        )
        .arg(
            Arg::new("include")
                .long("include")
                .value_name("PATTERN")
                .action(ArgAction::Append)
                .value_parser(check)
                .help("Send what PATTERN matches even if a later --exclude matches it too"),
        )
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn parse(argv: &[&str]) -> Result<FilterArgs, clap::Error> {
        let cmd = FilterArgs::augment_args(Command::new("t"));
        let m = cmd.try_get_matches_from(std::iter::once("t").chain(argv.iter().copied()))?;
        FilterArgs::from_arg_matches(&m)
    }

    #[test]
    fn rules_keep_their_command_line_order() {
        let f = parse(&["--include", "keep.tmp", "--exclude=*.tmp", "--include", "x"]).unwrap();
        let got: Vec<_> = f
            .filter
            .rules()
            .iter()
            .map(|r| (r.kind(), r.pattern()))
            .collect();
        assert_eq!(
            got,
            [
                (RuleKind::Include, "keep.tmp"),
                (RuleKind::Exclude, "*.tmp"),
                (RuleKind::Include, "x"),
            ]
        );
        assert_eq!(
            f.to_args(),
            ["--include=keep.tmp", "--exclude=*.tmp", "--include=x"]
        );
        assert!(parse(&[]).unwrap().filter.is_empty());
    }

    #[test]
    fn a_bad_pattern_is_a_usage_error() {
        let e = parse(&["--exclude", "a**b"]).unwrap_err();
        assert!(e.to_string().contains("a**b"), "{e}");
    }
}
