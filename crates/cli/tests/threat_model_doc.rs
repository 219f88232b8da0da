//! Keeps [docs/threat-model.md](../../../docs/threat-model.md) true to the tests: every pointer
//! it gives (`FILE::FUNCTION`, or a fuzz target's `FILE`) names a file of the repository and a
//! test function in it (`#[test]`, not `#[ignore]`d; a fuzz target's file has its
//! `fuzz_target!`), and every line of an attacker's list points at a test or says it is *not
//! covered*. The page's own links to other docs must name files that exist.

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `crates/cli`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A pointer of the page: a file, and the test function in it when one is named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pointer {
    file: String,
    function: Option<String>,
}

/// The pointers in `text`: code spans that name a `.rs` file under `crates/` or `fuzz/`, with
/// `::function` after it or not.
fn pointers(text: &str) -> Vec<Pointer> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("crates/") || span.starts_with("fuzz/"))
        .filter_map(|span| {
            let (file, function) = match span.split_once("::") {
                Some((f, func)) => (f, Some(func.to_owned())),
                None => (span, None),
            };
            file.ends_with(".rs").then(|| Pointer {
                file: file.to_owned(),
                function,
            })
        })
        .collect()
}

/// Why `p` does not hold in the repository at `root`, if it does not.
fn check_pointer(root: &Path, p: &Pointer) -> Option<String> {
    let Ok(source) = std::fs::read_to_string(root.join(&p.file)) else {
        return Some(format!("{}: no such file", p.file));
    };
    let Some(function) = &p.function else {
        return (p.file.starts_with("fuzz/") && !source.contains("fuzz_target!"))
            .then(|| format!("{}: not a fuzz target", p.file));
    };
    if !function
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Some(format!("{}::{function}: not a function name", p.file));
    }
    let lines: Vec<&str> = source.lines().collect();
    let declared = |l: &str| {
        let l = l.trim_start();
        [format!("fn {function}("), format!("fn {function}<")]
            .iter()
            .any(|d| l.starts_with(d.as_str()) || l.contains(&format!(" {d}")))
    };
    let Some(at) = lines.iter().position(|l| declared(l)) else {
        return Some(format!("{}::{function}: no such function", p.file));
    };
    // The attributes and comments right above it.
    let above: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .collect();
    if !above.contains(&"#[test]") {
        return Some(format!("{}::{function}: not a #[test]", p.file));
    }
    if above.iter().any(|l| l.starts_with("#[ignore")) {
        return Some(format!("{}::{function}: ignored", p.file));
    }
    None
}

/// The lines of the attackers' lists (bullets under each `## ` heading, continuation lines
/// joined) that neither point at a test nor say they are not covered.
fn unbacked_lines(text: &str) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    let mut in_list = false;
    for line in text.lines() {
        if line.starts_with("## ") {
            in_list = true;
            items.push(String::new());
        } else if !in_list {
            continue;
        } else if let Some(rest) = line.strip_prefix("- ") {
            items.push(rest.to_owned());
        } else if line.starts_with("  ") && !line.trim().is_empty() {
            if let Some(last) = items.last_mut() {
                last.push(' ');
                last.push_str(line.trim());
            }
        } else {
            // A paragraph (an attacker's description) or a blank line ends the item.
            items.push(String::new());
        }
    }
    items
        .into_iter()
        .filter(|i| !i.is_empty())
        .filter(|i| pointers(i).is_empty() && !i.to_lowercase().contains("not covered"))
        .collect()
}

/// The relative `.md` links of `text` (`](name.md)`) that name no file beside `page`.
fn broken_links(text: &str, page: &Path) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.contains("://") && target.ends_with(".md"))
        .filter(|target| !page.parent().unwrap().join(target).exists())
        .map(String::from)
        .collect()
}

#[test]
fn every_pointer_of_the_threat_model_names_a_test_and_every_line_has_one() {
    let root = root();
    let page = root.join("docs/threat-model.md");
    let text = std::fs::read_to_string(&page).expect("docs/threat-model.md");
    let all = pointers(&text);
    assert!(all.len() >= 60, "only {} pointers read", all.len());
    let wrong: Vec<String> = all.iter().filter_map(|p| check_pointer(&root, p)).collect();
    assert!(
        wrong.is_empty(),
        "pointers that do not hold:\n{}",
        wrong.join("\n")
    );
    let unbacked = unbacked_lines(&text);
    assert!(
        unbacked.is_empty(),
        "lines with no test and not said to be not covered:\n{}",
        unbacked.join("\n")
    );
    let broken = broken_links(&text, &page);
    assert!(broken.is_empty(), "links to no file: {broken:?}");
    // Each attacker the page names has a section.
    for attacker in [
        "On-path network attacker",
        "Relay operator",
        "Stranger at the door",
        "Hostile sender",
        "Hostile receiver",
        "Hostile far side of `cp`",
        "Local user on the same machine",
        "Thief of a key file",
    ] {
        assert!(text.contains(&format!("\n## {attacker}\n")), "{attacker}");
    }
}

/// The check itself catches what it is for: a missing file or function, a function that is
/// not a test or is ignored, a line without a pointer, a broken link.
#[test]
fn the_check_catches_missing_tests_unbacked_lines_and_broken_links() {
    let root = root();
    let p = |s: &str| pointers(&format!("`{s}`")).remove(0);
    let this = "crates/cli/tests/threat_model_doc.rs";
    assert_eq!(
        check_pointer(
            &root,
            &p(&format!(
                "{this}::the_check_catches_missing_tests_unbacked_lines_and_broken_links"
            ))
        ),
        None
    );
    for (bad, why) in [
        (format!("{this}::no_test_of_this_name"), "no such function"),
        (format!("{this}::check_pointer"), "not a #[test]"),
        (
            "crates/cli/tests/no_such_file.rs::x".to_owned(),
            "no such file",
        ),
        (format!("fuzz/{this}"), "no such file"),
        (
            "crates/cli/tests/support/mod.rs::tempdir".to_owned(),
            "not a #[test]",
        ),
    ] {
        let got = check_pointer(&root, &p(&bad));
        assert!(
            got.as_deref().is_some_and(|g| g.contains(why)),
            "{bad}: {got:?}"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("t.rs"), "#[test]\n#[ignore]\nfn skipped() {}\n").unwrap();
    let ignored = Pointer {
        file: "t.rs".into(),
        function: Some("skipped".into()),
    };
    assert!(check_pointer(dir, &ignored).is_some_and(|g| g.contains("ignored")));
    let page = "# T\n\nintro `x`\n\n## A\n\nWho.\n\n- Can do this.\n- Cannot do that.\n  `crates/a.rs::b`\n- Can the rest: *not covered*.\n";
    assert_eq!(unbacked_lines(page), vec!["Can do this.".to_owned()]);
    assert_eq!(
        broken_links(
            "[a](no-such-page.md) [b](threat-model.md)",
            &root.join("docs/x.md")
        ),
        vec!["no-such-page.md".to_owned()]
    );
}
