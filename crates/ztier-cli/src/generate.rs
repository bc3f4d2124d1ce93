//! `ztier completions SHELL` and `ztier manpages DIR`: the shell completions and the man
//! pages, written from the CLI's own clap definitions (the `Cli` of main.rs), so neither can
//! name a flag the parser does not take. Completions print to stdout, as `rustup completions`
//! and `gh completion` do, for a user to source or save; the man pages are files, one a
//! command (`ztier.1`, `ztier-serve.1`, `ztier-bench-uffd.1`, ...), for the package build
//! (packaging/build-deb.sh), so that command is not one of `Cli`'s: main.rs sends
//! `ztier manpages` here before `Cli` parses, and the completions and pages, made from `Cli`,
//! never offer it (clap_complete offers a hidden subcommand all the same).
//!
//! Invariants: a hidden subcommand gets no page, as clap_mangen's own `generate_to` skips
//! them; the whole text is made in memory before it is written, so a closed stdout is an
//! error returned, not a panic inside the generator.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser};
use clap_complete::Shell;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to complete for. Bash: save as
    /// /usr/share/bash-completion/completions/ztier (or source it); zsh: as _ztier in a
    /// directory of $fpath; fish: as ~/.config/fish/completions/ztier.fish.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Write the man pages, ztier(1) and ztier-SUBCOMMAND(1), to a directory (for packaging).
#[derive(Parser)]
#[command(bin_name = "ztier manpages")]
pub struct ManpagesArgs {
    /// The directory the pages are written to (made if missing): ztier.1 and one page a
    /// subcommand, ztier-SUBCOMMAND.1, in roff, uncompressed.
    pub dir: PathBuf,
}

/// Whether the command line (program name first) is `ztier manpages ...`.
pub fn names_manpages(args: &[std::ffi::OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "manpages")
}

/// Prints the completion script of `args.shell` for `command` (the whole CLI) to stdout.
pub fn completions(args: &CompletionsArgs, mut command: clap::Command) -> anyhow::Result<()> {
    let script = completion_script(args.shell, &mut command);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .context("writing the completion script to stdout")
}

/// The completion script of `shell` for `command`, as bytes.
fn completion_script(shell: Shell, command: &mut clap::Command) -> Vec<u8> {
    let mut script = Vec::new();
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, command, name, &mut script);
    script
}

/// Writes `command`'s page and every visible subcommand's, at any depth, to `args.dir`, and
/// prints each file's path.
pub fn manpages(args: &ManpagesArgs, command: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("making the directory {}", args.dir.display()))?;
    // As clap_mangen's generate_to: `help` is not a command with a page; building the
    // command gives each subcommand its display name, ztier-SUBCOMMAND, the page's name.
    let mut command = command.disable_help_subcommand(true);
    command.build();
    // Every page's footer names the program and its version (a subcommand has none of its own).
    let source = format!("ztier {}", command.get_version().unwrap_or_default());
    write_pages(&command, &source, &args.dir)
}

fn write_pages(command: &clap::Command, source: &str, dir: &Path) -> anyhow::Result<()> {
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_pages(sub, source, dir)?;
    }
    let page = clap_mangen::Man::new(command.clone())
        .source(source)
        .manual("ztier manual");
    let mut roff = Vec::new();
    page.render(&mut roff)
        .context("rendering a man page in memory")?;
    let path = dir.join(page.get_filename());
    std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", path.display());
    Ok(())
}
