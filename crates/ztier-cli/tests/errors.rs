//! The mistakes a user commonly makes, each made once against the built `ztier`: each must
//! fail with exit status 1 and one line on stderr (`ztier: ...`) that names what was wrong
//! (the path, address or value given) and says what to do. A missing corpus and one that is
//! not a corpus, a socket, control socket or TCP address in use, a size not a whole number of
//! pages, a backing store that is not there (a file in a missing directory, an NBD export
//! nobody serves, a Ceph URI), a config file that does not parse, `stat` and `ctl` with no
//! server, `--device` of a one-device server, and, as the user `nobody` (the test must be
//! root to become it; it skips otherwise, except under CI), capture without ptrace access and
//! a userfaultfd a seccomp profile refuses.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{serve, temp_dir, ztier, Proc};

/// Runs `command`; it must fail with `status` and one line on stderr
/// (`common::one_line_failure_status`) that starts `ztier: ` and holds every one of `words`.
/// Returns that line.
fn fails_with(status: i32, command: &mut Command, words: &[&str]) -> String {
    let (ended, stderr) = common::one_line_failure_status(command.stdin(Stdio::null()));
    assert_eq!(ended.code(), Some(status), "{command:?}: {stderr}");
    assert!(stderr.starts_with("ztier: "), "{stderr}");
    for word in words {
        assert!(
            stderr.contains(word),
            "{command:?}: no {word:?} in: {stderr}"
        );
    }
    stderr
}

/// A mistake the command finds: status 1, one line with `words`.
fn refused(command: &mut Command, words: &[&str]) -> String {
    fails_with(1, command, words)
}

/// A command line clap refuses: exit status 2 (clap's, as every clap program's), one line on
/// stderr starting `ztier: ` that holds every one of `words` and points at --help.
fn misused(args: &[&str], words: &[&str]) {
    let words: Vec<&str> = words.iter().copied().chain(["try --help"]).collect();
    fails_with(2, &mut run(args), &words);
}

#[test]
fn command_lines_clap_refuses() {
    misused(
        &["serve", "--page-size", "1000"],
        &["'1000'", "--page-size", "4096 or 16384"],
    );
    misused(
        &["serve", "--device", "vm1,size=1000"],
        &["vm1,size=1000", "4096-byte pages"],
    );
    misused(
        &["bench", "--compressor", "nope"],
        &["'nope'", "known: lzo-rle"],
    );
    misused(&["serve"], &["not provided", "--size"]);
    misused(
        &["sevre"],
        &["'sevre'", "similar subcommand exists: 'serve'"],
    );
    // Help is not an error: it goes to stdout, with status 0.
    let out = run(&["serve", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--size"));
}

/// `ztier ARGS`.
fn run(args: &[&str]) -> Command {
    let mut c = ztier();
    c.args(args);
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_corpus_that_is_missing_or_is_not_one() {
    let dir = temp_dir("errors-corpus");
    let missing = dir.join("missing.pages.zst");
    refused(
        &mut run(&["bench", "--corpus", s(&missing)]),
        &[s(&missing), "No such file", "ztier capture", "--corpus"],
    );
    let short = dir.join("short.pages");
    std::fs::write(&short, b"abc").unwrap();
    refused(
        &mut run(&["bench", "--corpus", s(&short)]),
        &[
            s(&short),
            "whole number of 4096-byte pages",
            "ztier capture",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sockets_and_addresses_in_use() {
    let dir = temp_dir("errors-in-use");
    let socket = dir.join("nbd.sock");
    let control = common::ctl_socket(&socket);
    let log = dir.join("log");
    let server = serve(
        &["--size", "16M", "--socket", s(&socket), "--quiet"],
        &control,
        &log,
    );
    refused(
        &mut run(&["serve", "--size", "16M", "--socket", s(&socket)]),
        &[
            s(&socket),
            "in use",
            "stop it, or pass --socket another path",
        ],
    );
    let other = dir.join("other.sock");
    refused(
        &mut run(&[
            "serve",
            "--size",
            "16M",
            "--socket",
            s(&other),
            "--control",
            s(&control),
        ]),
        &[s(&control), "in use", "pass --control another path"],
    );
    // A one-device server asked for a device of a host.
    refused(
        &mut run(&["ctl", "--socket", s(&socket), "--device", "vm1", "mm_stat"]),
        &["without --device", "leave out --device"],
    );
    server.stop();

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    refused(
        &mut run(&["serve", "--size", "16M", "--listen", &addr]),
        &[
            &addr,
            "in use by another process",
            "pass --listen another address",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host's flag given to a server of one device, which would pass it by: refused, before
/// anything is bound.
#[test]
fn a_host_flag_on_a_server_of_one_device() {
    let dir = temp_dir("errors-host-flag");
    let socket = dir.join("nbd.sock");
    for (flag, value) in [
        ("--metrics", "9999"),
        ("--shared-store", "/tmp/x"),
        ("--host-target", "1G"),
    ] {
        refused(
            &mut run(&[
                "serve",
                "--size",
                "16M",
                "--socket",
                s(&socket),
                flag,
                value,
            ]),
            &[
                flag,
                "a host of devices",
                "--device NAME,size=SIZE",
                "leave",
            ],
        );
        assert!(!socket.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A socket in a directory that is not there (`/run/ztier` before the unit made it), and a
/// config file that is not there: each says what is missing and how to make it.
#[test]
fn a_socket_directory_or_a_config_that_is_missing() {
    let dir = temp_dir("errors-missing-dir");
    let socket = dir.join("no-such-dir").join("vm1.nbd");
    refused(
        &mut run(&["serve", "--size", "16M", "--socket", s(&socket)]),
        &["--socket", "does not exist", "mkdir -p", "no-such-dir"],
    );
    let state = dir.join("no-such-dir").join("vm1.state");
    refused(
        &mut run(&[
            "serve",
            "--size",
            "16M",
            "--socket",
            s(&dir.join("s.sock")),
            "--state",
            s(&state),
        ]),
        &["--state", "does not exist", "mkdir -p"],
    );
    refused(
        &mut run(&["serve", "--size", "16M", "--listen", "127.0.0.1:99999"]),
        &["--listen 127.0.0.1:99999", "port from 1 to 65535"],
    );
    refused(
        &mut run(&[
            "plot",
            s(&dir.join("none.json")),
            "--output",
            s(&dir.join("x.svg")),
        ]),
        &["none.json", "ztier bench --json"],
    );
    let config = dir.join("host.toml");
    refused(
        &mut run(&["serve", "--config", s(&config)]),
        &["--config", "no such file", "examples/host.toml"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_size_not_a_whole_number_of_pages() {
    let dir = temp_dir("errors-size");
    let socket = dir.join("nbd.sock");
    refused(
        &mut run(&["serve", "--size", "1000", "--socket", s(&socket)]),
        &["--size 1000", "multiple of 4096"],
    );
    // Refused before anything was bound.
    assert!(!socket.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_backing_store_that_is_not_there() {
    let dir = temp_dir("errors-store");
    let socket = dir.join("nbd.sock");
    let serve_with = |store: &str| {
        run(&[
            "serve",
            "--size",
            "16M",
            "--socket",
            s(&socket),
            "--backing-dev",
            store,
        ])
    };
    let file = dir.join("no-such-dir/store");
    refused(
        &mut serve_with(s(&file)),
        &[s(&file), "No such file", "a directory that exists"],
    );
    // A port nobody listens on: one the kernel gave and took back.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("nbd://127.0.0.1:{port}/cold");
    let line = refused(
        &mut serve_with(&uri),
        &[&uri, "refused", "start the NBD server that exports it"],
    );
    assert_eq!(line.matches(&uri).count(), 1, "the URI said twice: {line}");
    refused(
        &mut serve_with("rbd://pool/image"),
        &[
            "rbd://pool/image",
            "not a file nor an NBD URI",
            "qemu-storage-daemon",
        ],
    );
    refused(
        &mut run(&["bench", "--writeback-file", s(&file)]),
        &["--writeback-file", s(&file), "a directory that exists"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_config_that_does_not_parse() {
    let dir = temp_dir("errors-config");
    let config = dir.join("host.toml");
    std::fs::write(&config, "[host]\ntarget = \"1G\"\nsocket = [\n").unwrap();
    refused(
        &mut run(&["serve", "--config", s(&config)]),
        &[s(&config), "line 3", "fix the file"],
    );
    std::fs::write(&config, "[host]\ntraget = \"1G\"\n").unwrap();
    refused(
        &mut run(&["serve", "--config", s(&config)]),
        &[
            s(&config),
            "line 2",
            "unknown field `traget`",
            "fix the file",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stat_and_ctl_with_no_server() {
    let dir = temp_dir("errors-no-server");
    let socket = dir.join("nbd.sock");
    let control = common::ctl_socket(&socket);
    for command in [&["stat"][..], &["ctl", "mm_stat"][..]] {
        let mut c = ztier();
        c.arg(command[0])
            .arg("--socket")
            .arg(&socket)
            .args(&command[1..]);
        refused(
            &mut c,
            &[s(&control), "no ztier serve answers", "start `ztier serve`"],
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether this test may become `nobody` (it is root); if not, says so, and fails under CI.
fn root() -> bool {
    let is_root = rustix::process::geteuid().is_root();
    if !is_root {
        ztier_corpus::cannot_test("the permission cases run ztier as nobody, which needs root");
    }
    is_root
}

/// `ztier ARGS` as `nobody`.
fn as_nobody(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_ztier"))
        .args(args);
    c
}

#[test]
fn capture_without_ptrace_access() {
    if !root() {
        return;
    }
    let dir = temp_dir("errors-capture");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // Root's process, which nobody may not read.
    let sleeper = Proc(Command::new("sleep").arg("60").spawn().unwrap());
    let pid = sleeper.0.id().to_string();
    let out = dir.join("x.pages.zst");
    refused(
        &mut as_nobody(&["capture", "--pid", &pid, "-o", s(&out)]),
        &[&pid, "no permission", "root", "ptrace"],
    );
    drop(sleeper);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn userfaultfd_refused() {
    if !root() {
        return;
    }
    // The kernel always lets a process have a user-mode-only userfaultfd; the refusal a
    // user meets is a container's seccomp profile's (Docker's default refuses the call), so
    // the call is refused that way here, to nobody (who may not open /dev/userfaultfd).
    let dir = temp_dir("errors-uffd");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let corpus = dir.join("small.pages");
    let pages: Vec<u8> = (0..64 * 4096u32).map(|i| (i / 7 % 251) as u8).collect();
    std::fs::write(&corpus, pages).unwrap();
    let mut c = as_nobody(&["bench", "uffd", "--corpus", s(&corpus)]);
    seccomp::refuse_userfaultfd(&mut c);
    refused(
        &mut c,
        &[
            "userfaultfd is not permitted",
            "run as root",
            "vm.unprivileged_userfaultfd=1",
            "seccomp",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A seccomp filter that refuses `userfaultfd(2)` with `EPERM`, as a container's profile
/// does, installed in a child between fork and exec (and kept across its exec). The test's
/// only unsafe code: `pre_exec` and `prctl`, which std and rustix do not wrap.
#[allow(unsafe_code)]
mod seccomp {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;

    const fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }

    pub fn refuse_userfaultfd(command: &mut Command) {
        // seccomp_data: nr at offset 0, arch at 4.
        let filter = [
            op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 4),
            op(
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                0,
                3,
                AUDIT_ARCH,
            ),
            op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
            op(
                libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
                0,
                1,
                libc::SYS_userfaultfd as u32,
            ),
            op(
                libc::BPF_RET | libc::BPF_K,
                0,
                0,
                libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            ),
            op(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        // SAFETY: between fork and exec the closure calls only prctl, async-signal-safe,
        // with a program that lives in the closure (moved there) for the duration of the
        // call; the kernel copies it.
        unsafe {
            command.pre_exec(move || {
                let program = libc::sock_fprog {
                    len: filter.len() as u16,
                    filter: filter.as_ptr().cast_mut(),
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &program as *const libc::sock_fprog,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// A report written into a pipe nobody reads (`ztier classes | head` once head is gone)
/// ends the command quietly, as a Unix tool's does: no panic, nothing on stderr.
#[test]
fn a_report_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [&["classes"][..], &["completions", "bash"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = run(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?}",
            out.status
        );
    }
}
