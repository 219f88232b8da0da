//! `hurtle completions SHELL` and `hurtle man`: generated from the flag definitions, so they
//! cannot drift from the binary.

use crate::args::{Cli, CompletionsArgs, ManArgs};
use crate::exit::{self, Failure, Outcome};
use clap::CommandFactory;

/// Prints the completion script for a shell on stdout.
pub fn completions(a: CompletionsArgs) -> Outcome {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "hurtle", &mut std::io::stdout());
    Ok(())
}

/// Writes the manual pages into a directory, or `hurtle.1` on stdout.
pub fn man(a: ManArgs) -> Outcome {
    let cmd = Cli::command();
    let storage = |what: String, e: std::io::Error| {
        Failure::new(exit::STORAGE, anyhow::anyhow!("{what}: {e}"))
    };
    match a.out {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .map_err(|e| storage("cannot write the manual page".into(), e)),
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| storage(format!("cannot create {}", dir.display()), e))?;
            clap_mangen::generate_to(cmd, &dir)
                .map_err(|e| storage(format!("cannot write into {}", dir.display()), e))
        }
    }
}
