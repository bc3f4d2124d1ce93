//! The man pages (`ztier manpages DIR`) and shell completions (`ztier completions SHELL`) the
//! Debian package installs: a page for the program and for every command its `--help`
//! lists (and every front `ztier bench --help` lists), each page naming its own command
//! and flags; none for the hidden `manpages` or for `help`; completions that name the
//! commands and flags, in each shell's own form.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn ztier(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(args)
        .output()
        .expect("run ztier");
    assert!(
        output.status.success(),
        "ztier {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(args: &[&str]) -> String {
    String::from_utf8(ztier(args).stdout).expect("UTF-8 output")
}

/// The command names a `--help` lists under its heading that starts with `heading`, as
/// clap prints them ("  NAME  description"), without `help`.
fn listed_commands(help: &str, heading: &str) -> Vec<String> {
    let mut lines = help.lines().skip_while(|l| !l.starts_with(heading)).skip(1);
    let mut names = Vec::new();
    for line in lines.by_ref() {
        if !line.starts_with("  ") {
            break;
        }
        let name = line
            .split_whitespace()
            .next()
            .expect("a command's line")
            .to_owned();
        if name != "help" && !line.starts_with("   ") {
            names.push(name);
        }
    }
    assert!(
        !names.is_empty(),
        "no commands under {heading:?} in:\n{help}"
    );
    names
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_command_and_front_has_a_page_naming_it_and_its_flags() {
    let dir = fresh_dir("manpages");
    ztier(&["manpages", dir.to_str().unwrap()]);

    let commands = listed_commands(&stdout(&["--help"]), "Commands:");
    let fronts = listed_commands(&stdout(&["bench", "--help"]), "Fronts");
    assert!(commands.iter().any(|c| c == "serve"), "{commands:?}");
    assert!(fronts.iter().any(|f| f == "uffd"), "{fronts:?}");
    let mut expected: Vec<(String, Vec<String>)> = vec![("ztier".into(), vec![])];
    for command in &commands {
        expected.push((format!("ztier-{command}"), vec![command.clone()]));
    }
    for front in &fronts {
        expected.push((
            format!("ztier-bench-{front}"),
            vec!["bench".into(), front.clone()],
        ));
    }

    for (page, words) in &expected {
        let path = dir.join(format!("{page}.1"));
        let roff =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            roff.starts_with(&format!(
                ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n.TH {page} 1 "
            )),
            "{page}: no .TH naming it in section 1:\n{}",
            &roff[..roff.len().min(300)]
        );
        assert!(roff.contains(".SH NAME"), "{page}: no NAME section");
        // Every long flag the command's own --help shows is on its page (roff escapes '-').
        let mut help_args: Vec<&str> = words.iter().map(String::as_str).collect();
        help_args.push("--help");
        let help = stdout(&help_args);
        let flags: Vec<&str> = help
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')', '`']))
            .filter(|w| w[2..].chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            .collect();
        assert!(
            !flags.is_empty() || page == "ztier",
            "{page}: no flags in its --help"
        );
        for flag in flags {
            let escaped = flag.replace('-', "\\-");
            assert!(roff.contains(&escaped), "{page}: {flag} is not on the page");
        }
    }

    let mut written: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    written.sort();
    let mut wanted: Vec<String> = expected.iter().map(|(p, _)| format!("{p}.1")).collect();
    wanted.sort();
    assert_eq!(written, wanted, "pages for exactly the visible commands");
    assert!(!written
        .iter()
        .any(|p| p.contains("manpages") || p.contains("help")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn completions_name_the_commands_and_flags_in_each_shell_s_form() {
    let bash = stdout(&["completions", "bash"]);
    assert!(
        bash.contains("complete -F _ztier"),
        "bash: no `complete -F _ztier`"
    );
    for word in [
        "serve",
        "bench",
        "swap-alloc-bench",
        "--compressor",
        "--socket",
    ] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(
        !bash.contains("manpages"),
        "the hidden command is offered in bash"
    );

    let zsh = stdout(&["completions", "zsh"]);
    assert!(
        zsh.starts_with("#compdef ztier\n"),
        "zsh: not a #compdef file"
    );
    assert!(zsh.contains("'serve:"), "zsh completion lacks serve");

    let fish = stdout(&["completions", "fish"]);
    assert!(
        fish.contains("complete -c ztier"),
        "fish: no `complete -c ztier`"
    );
    assert!(fish.contains("-a \"serve\""), "fish completion lacks serve");
    assert!(
        fish.contains("-l compressor"),
        "fish completion lacks --compressor"
    );
}

#[test]
fn an_unknown_shell_is_refused_with_the_shells_listed() {
    let output = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["completions", "tcsh"])
        .output()
        .expect("run ztier");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bash") && stderr.contains("zsh") && stderr.contains("fish"),
        "{stderr}"
    );
}

#[test]
fn a_closed_stdout_is_an_error_not_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["completions", "zsh"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ztier");
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
