//! The documentation's commands cannot rot: every fenced ```sh block of README.md and of
//! each guide in docs/ is run, as a user would paste it, with `bash -euo pipefail` in a
//! directory of its own, the `ztier` this build made first on PATH, within a time bound;
//! its exit status must be 0, and it must leave no process of its own running (a block that
//! starts `ztier serve` in the background stops it in the same block).
//!
//! Blocks a CI machine cannot run in seconds (a guest VM, a Ceph cluster, root-only kernel
//! set-up) are written as ```console or ```text instead, each naming the script or test
//! that CI runs for it; every guide must still hold at least one ```sh block. The README's
//! install block must hold, verbatim, the setup line, the main job and the test command
//! that .ci/run runs. Nothing here skips: a block that needs a tool `scripts/setup.sh`
//! installs fails where it is missing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The longest a block may run, in seconds (`timeout` ends it and its process group after).
const BLOCK_SECONDS: u32 = 180;

/// The guides, each of which must hold at least one runnable block.
const GUIDES: [&str; 7] = [
    "docs/measure.md",
    "docs/vm-swap.md",
    "docs/host.md",
    "docs/region.md",
    "docs/far-tier.md",
    "docs/service.md",
    "docs/fidelity.md",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One fenced block: its info string's first word, its first line's number, its text
/// (the fence's indentation taken off each line).
struct Block {
    lang: String,
    line: usize,
    text: String,
}

/// Every fenced block of a Markdown text, indented ones (inside a list item) included.
fn fenced_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, usize, String)> = None; // indent, lang, line, text
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let lang = info.split_whitespace().next().unwrap_or("").to_string();
                    open = Some((indent, lang, index + 2, String::new()));
                }
            }
            Some((fence_indent, lang, first, text)) => {
                if trimmed.starts_with("```") {
                    blocks.push(Block {
                        lang: std::mem::take(lang),
                        line: *first,
                        text: std::mem::take(text),
                    });
                    open = None;
                } else {
                    let cut = indent.min(*fence_indent);
                    text.push_str(&line[cut..]);
                    text.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "a fenced block is never closed");
    blocks
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fresh directory for one block.
fn scratch_dir(file: &str, line: usize) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "ztier-docs-{}-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        file.replace(['/', '.'], "_"),
        line
    );
    let dir = std::env::temp_dir().join(name);
    fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Runs one block; on failure, panics with what it printed.
fn run_block(file: &str, block: &Block) {
    let binary = Path::new(env!("CARGO_BIN_EXE_ztier"));
    let bin_dir = binary.parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = scratch_dir(file, block.line);
    let script = dir.join("block.sh");
    fs::write(&script, &block.text).expect("the block's script");
    let stdout = fs::File::create(dir.join("stdout")).expect("stdout file");
    let stderr = fs::File::create(dir.join("stderr")).expect("stderr file");
    // `timeout` runs the block in a process group of its own and signals the whole group
    // when the bound passes; output goes to files, so a process the block left running
    // cannot hold a pipe open.
    let mut child = Command::new("timeout")
        .args([
            "-k",
            "10",
            &BLOCK_SECONDS.to_string(),
            "bash",
            "-euo",
            "pipefail",
        ])
        .arg(&script)
        .current_dir(&dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("timeout and bash are installed");
    let group = child.id();
    let status = child.wait().expect("the block's status");
    // A process the block left behind is still in its group.
    let leftover = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let out = fs::read_to_string(dir.join("stdout")).unwrap_or_default();
    let err = fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        status.success(),
        "{file}:{}: the ```sh block exited with {status} (124: it ran past {BLOCK_SECONDS} s)\n\
         --- block ---\n{}--- stdout (last 40 lines) ---\n{}\n--- stderr (last 40 lines) ---\n{}",
        block.line,
        block.text,
        tail(&out),
        tail(&err)
    );
    assert!(
        !leftover,
        "{file}:{}: the ```sh block left a process running (a server started in a block \
         must be stopped in it)",
        block.line
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Runs every ```sh block of one file; returns how many there were.
fn run_file(file: &str) -> usize {
    let all = fenced_blocks(&read(file));
    // A shell block under another name would be passed over: each is `sh` (run) or
    // `console` (shown, with the script or test CI runs for it named beside it).
    for b in &all {
        assert!(
            !["bash", "shell", "zsh", "shell-session"].contains(&b.lang.as_str()),
            "{file}:{}: a ```{} block: tag it sh, to be run, or console, to be shown",
            b.line,
            b.lang
        );
    }
    let blocks: Vec<Block> = all.into_iter().filter(|b| b.lang == "sh").collect();
    for block in &blocks {
        run_block(file, block);
    }
    blocks.len()
}

fn run_guide(file: &str) {
    assert!(GUIDES.contains(&file), "{file} is not in GUIDES");
    let count = run_file(file);
    assert!(
        count > 0,
        "{file} has no ```sh block: a guide shows at least one command CI runs"
    );
}

#[test]
fn readme_blocks_run() {
    run_file("README.md");
}

#[test]
fn measure_guide_runs() {
    run_guide("docs/measure.md");
}

#[test]
fn vm_swap_guide_runs() {
    run_guide("docs/vm-swap.md");
}

#[test]
fn host_guide_runs() {
    run_guide("docs/host.md");
}

#[test]
fn region_guide_runs() {
    run_guide("docs/region.md");
}

#[test]
fn far_tier_guide_runs() {
    run_guide("docs/far-tier.md");
}

#[test]
fn service_guide_runs() {
    run_guide("docs/service.md");
}

#[test]
fn fidelity_guide_runs() {
    run_guide("docs/fidelity.md");
}

/// Every guide the README's table points to is one this test runs, and every guide is
/// named in the README.
#[test]
fn readme_links_every_guide() {
    let readme = read("README.md");
    for guide in GUIDES {
        assert!(readme.contains(guide), "README.md does not link {guide}");
    }
    let entries = fs::read_dir(repo_root().join("docs")).expect("docs/");
    for entry in entries {
        let name = entry.expect("a docs/ entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") && name != "diary.md" && name != "benchmarks.md" {
            let path = format!("docs/{name}");
            assert!(
                GUIDES.contains(&path.as_str()),
                "{path} is a guide this test does not run: add it to GUIDES"
            );
        }
    }
}

/// The command on the first line after `.ci/run`'s `echo "== NAME` heading that is not an
/// echo or a comment, without a `| tee ...` after it.
fn ci_command_after(ci: &str, heading: &str) -> String {
    let mut lines = ci.lines().skip_while(|l| !l.contains(heading));
    assert!(lines.next().is_some(), ".ci/run has no heading {heading:?}");
    let command = lines
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("echo") && !l.starts_with('#'))
        .unwrap_or_else(|| panic!(".ci/run has no command after {heading:?}"));
    command
        .split(" | tee")
        .next()
        .expect("split yields one part")
        .to_string()
}

/// The README's install-from-source block holds exactly the commands .ci/run runs for the
/// setup line, the main job and the tests, so the two cannot drift apart.
#[test]
fn readme_install_commands_are_what_ci_runs() {
    let ci = read(".ci/run");
    let readme = read("README.md");
    let block_lines: Vec<String> = fenced_blocks(&readme)
        .into_iter()
        .flat_map(|b| b.text.lines().map(str::to_string).collect::<Vec<_>>())
        .map(|l| {
            let l = l.trim_start_matches("$ ");
            l.split("  #").next().unwrap_or("").trim().to_string()
        })
        .collect();
    for heading in [
        "== setup (the README's setup line)",
        "== main job (the README's main-job command)",
        "== tests (the README's test command)",
    ] {
        let command = ci_command_after(&ci, heading);
        assert!(
            block_lines.contains(&command),
            "README.md shows no line `{command}` (what .ci/run runs after {heading:?})"
        );
    }
}

/// The extractor itself: indented blocks, languages, line numbers.
#[test]
fn fenced_blocks_are_found() {
    let text = "a\n```sh\necho one\n```\n- item\n\n  ```console\n  $ two\n  ```\n```\nthree\n```\n";
    let blocks = fenced_blocks(text);
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0].lang, "sh");
    assert_eq!(blocks[0].line, 3);
    assert_eq!(blocks[0].text, "echo one\n");
    assert_eq!(blocks[1].lang, "console");
    assert_eq!(blocks[1].text, "$ two\n");
    assert_eq!(blocks[2].lang, "");
}

/// Every `ztier ...` command written inline in the README's tables (`ztier serve --size 4G
/// ...`, with placeholders for a user's own names): its subcommand exists and every flag it
/// names is one that subcommand's `--help` lists, so the table cannot name a flag that was
/// renamed or never was.
#[test]
fn readme_inline_commands_name_real_flags() {
    let readme = read("README.md");
    let mut checked = 0;
    for cell in readme.split('`').skip(1).step_by(2) {
        let Some(rest) = cell.strip_prefix("ztier ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        // The subcommand words: up to the first flag or argument that is not a plain word
        // of the command tree (`bench zswap`, `swap-alloc-bench`).
        let mut command: Vec<&str> = Vec::new();
        for w in &words {
            if w.starts_with('-') || command.len() == 2 {
                break;
            }
            let mut probe = command.clone();
            probe.push(w);
            let ok = Command::new(env!("CARGO_BIN_EXE_ztier"))
                .args(&probe)
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                break;
            }
            command.push(w);
        }
        let help = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(&command)
            .arg("--help")
            .output()
            .expect("ztier --help");
        assert!(help.status.success(), "`ztier {rest}`: no such command");
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            let flag = flag.split('=').next().unwrap_or(flag);
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "README's `ztier {rest}`: `ztier {}` has no {flag}",
                command.join(" ")
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 10,
        "only {checked} inline commands found in README.md"
    );
}
