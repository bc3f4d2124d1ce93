//! A recording whose process ends under it: a child that exits during an epoch (an error,
//! nothing written, or the epochs before kept whole), one that exits between epochs (the
//! recording ends, not as an error), and a process of 512 MiB killed while it is read (an
//! error, though while the kernel tears its memory down the process still looks alive); and a
//! cgroup's process that exits while an epoch reads it (the epoch is read again without it,
//! its pages go; the first epoch's too, its pages dropped from the corpus), and one that runs
//! another program (read afresh, as a new process).

mod common;

use std::io::Write;

use common::shared::{
    big_holder, cgroup_for_test, files_in, kill_and_wait_for_exit, serve_memory_child, MemoryChild,
};
use ztier_capture::target::Target;
use ztier_capture::{CaptureError, CaptureOptions, Recorder};
use ztier_corpus::trace::Trace;
use ztier_corpus::Corpus;

/// Not a test: the child the other tests capture (see `serve_memory_child`).
#[test]
#[ignore = "the child process the capture tests run, not a test"]
fn not_a_test_memory_child() {
    serve_memory_child();
}

#[test]
fn a_process_that_exits_mid_capture_is_one_clear_error_and_leaves_no_files() {
    let dir = common::temp_dir("capture-exit");
    let mut child = MemoryChild::spawn();
    let output = dir.join("gone.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    let mut exited = false;
    let err = recorder
        .epoch(&mut |_| {
            if !exited {
                writeln!(child.stdin, "exit").unwrap();
                child.child.wait().unwrap();
                exited = true;
            }
        })
        .expect_err("the capture fails");
    assert!(matches!(err, CaptureError::Exited { .. }), "{err:?}");
    assert!(
        err.to_string().contains("exited during the capture"),
        "{err}"
    );
    drop(recorder);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "nothing written: {left:?}");

    // Exiting during a later epoch: the epochs before are kept whole, nothing of the one
    // cut short is in the corpus or the trace.
    let mut child = MemoryChild::spawn();
    let output = dir.join("later.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    recorder.epoch(&mut |_| {}).unwrap();
    child.command("change");
    let mut exited = false;
    let err = recorder
        .epoch(&mut |_| {
            if !exited {
                writeln!(child.stdin, "exit").unwrap();
                child.child.wait().unwrap();
                exited = true;
            }
        })
        .expect_err("the second epoch fails");
    assert!(matches!(err, CaptureError::Exited { .. }), "{err:?}");
    let manifest = recorder.finish().unwrap();
    assert_eq!(manifest.epochs.len(), 1);
    assert_eq!(manifest.pages, manifest.first_capture_pages);
    let trace = Trace::read(&dir.join("later.trace")).unwrap();
    assert_eq!(trace.epochs.len(), 1);
    assert_eq!(
        Corpus::load(&output).unwrap().pages() as u64,
        trace.corpus_pages()
    );
    for f in ["later.pages.zst", "later.trace", "later.capture.json"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_recording_whose_process_exits_between_epochs_keeps_the_epochs_before() {
    let dir = common::temp_dir("capture-exit-between");
    // The child exits, and is reaped, after the second epoch and before the third: the
    // third finds no /proc/PID at all.
    let mut child = MemoryChild::spawn();
    let output = dir.join("between.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    let mut seen = 0;
    recorder
        .record(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(600),
            &mut |e| {
                seen += 1;
                if e.epoch == 1 {
                    writeln!(child.stdin, "exit").unwrap();
                    child.child.wait().unwrap();
                }
            },
        )
        .expect("the process's exit ends the recording, not as an error");
    assert_eq!(seen, 2);
    let manifest = recorder.finish().unwrap();
    assert!(manifest.ended_by_exit);
    assert_eq!(manifest.epochs.len(), 2);
    let trace = Trace::read(&dir.join("between.trace")).unwrap();
    assert_eq!(trace.epochs.len(), 2);
    assert_eq!(
        Corpus::load(&output).unwrap().pages() as u64,
        trace.corpus_pages()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_process_killed_while_it_is_read_is_an_error_and_leaves_no_file() {
    if !common::have("python3") {
        return;
    }
    let dir = common::temp_dir("capture-killed");
    // Killed from inside the read (the observer runs between two chunks), and the read
    // resumed as soon as the kernel has begun the exit: while it tears the 512 MiB down, the
    // process reads as running (state R or D) and its memory reads as empty. Before, that was
    // taken for memory unmapped meanwhile, and the capture succeeded with a truncated corpus;
    // the state caught below proves the read resumed inside that window, so this cannot pass
    // by the process being a plain zombie already.
    let (holder, first_vpn) = big_holder(512);
    let pid = holder.0.id();
    let output = dir.join("killed.pages.zst");
    let mut recorder = Recorder::start(pid, &output, CaptureOptions::default()).unwrap();
    let mut caught = None;
    let err = recorder
        .epoch(&mut |key| {
            if key == first_vpn + 1000 && caught.is_none() {
                caught = Some(kill_and_wait_for_exit(pid));
            }
        })
        .expect_err("a capture of a killed process fails");
    let caught = caught.expect("the capture read the big mapping");
    assert_ne!(
        caught, 'Z',
        "the read resumed while the kernel tore the memory down"
    );
    assert!(matches!(err, CaptureError::Exited { .. }), "{err:?}");
    drop(recorder);
    assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two children moved into `cgroup`, the lower pid first: an epoch reads its processes in
/// increasing pid order, so the first read is the first child's.
fn two_children_in(cgroup: &std::path::Path) -> [MemoryChild; 2] {
    let mut children = [MemoryChild::spawn(), MemoryChild::spawn()];
    for child in &children {
        std::fs::write(cgroup.join("cgroup.procs"), child.pid().to_string()).unwrap();
    }
    children.sort_by_key(MemoryChild::pid);
    children
}

#[test]
fn a_cgroup_process_exiting_while_an_epoch_reads_it_has_the_epoch_read_again_without_it() {
    let Some(cgroup) = cgroup_for_test("exit-read") else {
        return;
    };
    let dir = common::temp_dir("capture-cgroup-exit");
    let [mut leaving, staying] = two_children_in(&cgroup);
    let output = dir.join("cg.pages.zst");
    let mut recorder = Recorder::start(
        Target::Cgroup(cgroup.clone()),
        &output,
        CaptureOptions::default(),
    )
    .unwrap();
    let first = recorder.epoch(&mut |_| {}).unwrap().clone();
    assert_eq!(first.processes, 2);
    let mut exited = false;
    let second = recorder
        .epoch(&mut |_| {
            // At the first page read: the process being read exits under the read.
            if !exited {
                writeln!(leaving.stdin, "exit").unwrap();
                leaving.child.wait().unwrap();
                exited = true;
            }
        })
        .expect("the epoch is read again without the process that exited")
        .clone();
    assert_eq!(second.read_again, 1, "{second:?}");
    assert_eq!(second.processes, 1, "{second:?}");
    // Every page of the one that exited went; the pages present are the others'.
    assert_eq!(
        second.present + second.went,
        first.present + second.appeared,
        "{second:?}"
    );
    let manifest = recorder.finish().unwrap();
    let leaving_pages = manifest
        .processes
        .iter()
        .find(|p| p.pid == leaving.pid())
        .expect("the first epoch read both")
        .pages_read;
    assert!(leaving_pages > 0);
    assert!(second.went >= leaving_pages, "{second:?}, {leaving_pages}");
    assert_eq!(manifest.epochs_read_again, 1);
    assert!(!manifest.ended_by_exit);
    // Nothing of the read cut short is in the corpus or the trace.
    let trace = Trace::read(&dir.join("cg.trace")).unwrap();
    assert_eq!(trace.epochs.len(), 2);
    assert_eq!(trace.epochs[1].went.len() as u64, second.went);
    assert_eq!(
        Corpus::load(&output).unwrap().pages() as u64,
        trace.corpus_pages()
    );
    assert_eq!(
        manifest.pages,
        manifest.first_capture_pages + second.appeared + second.changed
    );
    drop(staying);
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cgroup_process_exiting_while_the_first_epoch_reads_it_has_the_first_epoch_read_again() {
    let Some(cgroup) = cgroup_for_test("exit-first") else {
        return;
    };
    let dir = common::temp_dir("capture-cgroup-exit-first");
    let [mut leaving, staying] = two_children_in(&cgroup);
    let output = dir.join("first.pages.zst");
    let mut recorder = Recorder::start(
        Target::Cgroup(cgroup.clone()),
        &output,
        CaptureOptions::default(),
    )
    .unwrap();
    let mut exited = false;
    let first = recorder
        .epoch(&mut |_| {
            // At the first page read, the lower pid's: it exits under the read.
            if !exited {
                writeln!(leaving.stdin, "exit").unwrap();
                leaving.child.wait().unwrap();
                exited = true;
            }
        })
        .expect("the first epoch is read again without the process that exited")
        .clone();
    assert_eq!((first.read_again, first.processes), (1, 1), "{first:?}");
    let manifest = recorder.finish().unwrap();
    assert_eq!(manifest.epochs_read_again, 1);
    let pids: Vec<u32> = manifest.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [staying.pid()]);
    // The pages written by the read cut short are gone from the corpus: it holds the
    // second read's alone, as the trace says.
    let trace = Trace::read(&dir.join("first.trace")).unwrap();
    let corpus_pages = Corpus::load(&output).unwrap().pages() as u64;
    assert_eq!(corpus_pages, trace.corpus_pages());
    assert_eq!(corpus_pages, manifest.first_capture_pages);
    assert_eq!(corpus_pages, manifest.processes[0].pages_read);
    drop(staying);
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cgroup_process_that_runs_another_program_is_read_afresh_as_a_new_process() {
    let Some(cgroup) = cgroup_for_test("exec") else {
        return;
    };
    let dir = common::temp_dir("capture-cgroup-exec");
    // A shell that, given a line, runs `sleep` in its place (the same pid).
    let mut shell = std::process::Command::new("sh")
        .args(["-c", "read line; exec sleep 600"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = shell.id();
    std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
    let output = dir.join("exec.pages.zst");
    let mut recorder = Recorder::start(
        Target::Cgroup(cgroup.clone()),
        &output,
        CaptureOptions::default(),
    )
    .unwrap();
    let first = recorder.epoch(&mut |_| {}).unwrap().clone();
    assert_eq!(first.processes, 1);
    writeln!(shell.stdin.as_mut().unwrap(), "go").unwrap();
    let comm = format!("/proc/{pid}/comm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&comm).unwrap().trim() != "sleep" {
        assert!(std::time::Instant::now() < deadline, "sh never ran sleep");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The shell's handle reads nothing of the new program: the epoch is read again with
    // the pid opened afresh, its old pages gone and the new program's appeared.
    let second = recorder
        .epoch(&mut |_| {})
        .expect("the process running sleep is read as a new one")
        .clone();
    assert_eq!((second.read_again, second.processes), (1, 1), "{second:?}");
    assert!(second.went > 0 && second.appeared > 0, "{second:?}");
    assert_eq!(recorder.processes_open(), 1, "the shell's handles dropped");
    let manifest = recorder.finish().unwrap();
    assert_eq!(manifest.epochs_read_again, 1);
    let joined: Vec<_> = manifest
        .joined_later
        .iter()
        .map(|j| (j.pid, j.name.as_str(), j.epoch))
        .collect();
    assert_eq!(joined, [(pid, "sleep", 1)]);
    let _ = shell.kill();
    let _ = shell.wait();
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
