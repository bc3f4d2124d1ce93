//! A cgroup whose processes come and go by the hundred, as a build's compilers do: the
//! recording holds open only the processes running, so it outlasts a limit of open files far
//! below the number of processes it meets. (Its own test binary: it lowers the limit for the
//! whole process.)

mod common;

use common::shared::cgroup_for_test;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use ztier_capture::target::Target;
use ztier_capture::{CaptureOptions, Recorder};
use ztier_corpus::trace::Trace;

/// Processes met, one per epoch: each needs two handles while open, so holding every process
/// ever met would pass the limit below by far.
const PROCESSES: usize = 120;
const OPEN_FILES: u64 = 64;

/// A `sleep` in the test's cgroup, ended when dropped (a failing test leaves none behind).
struct Sleeper(std::process::Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_recording_of_a_cgroup_whose_processes_come_and_go_holds_only_the_running_ones_open() {
    let Some(cgroup) = cgroup_for_test("churn") else {
        return;
    };
    let limit = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(OPEN_FILES),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    let dir = common::temp_dir("capture-churn");
    let spawn_into_cgroup = || {
        let child = Sleeper(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap(),
        );
        std::fs::write(cgroup.join("cgroup.procs"), child.0.id().to_string()).unwrap();
        child
    };
    let mut running = spawn_into_cgroup();
    let output = dir.join("churn.pages.zst");
    let mut recorder = Recorder::start(
        Target::Cgroup(cgroup.clone()),
        &output,
        CaptureOptions::default(),
    )
    .unwrap();
    for epoch in 0..PROCESSES {
        let summary = recorder
            .epoch(&mut |_| {})
            .unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
        assert_eq!(summary.processes, 1, "{summary:?}");
        if epoch > 0 {
            // The process before this one went, all its pages with it.
            assert!(summary.went > 0 && summary.appeared > 0, "{summary:?}");
        }
        assert_eq!(recorder.processes_open(), 1, "at epoch {epoch}");
        // The next process starts before this one ends, so the cgroup never empties.
        running = spawn_into_cgroup();
    }
    let manifest = recorder.finish().unwrap();
    assert_eq!(manifest.epochs.len(), PROCESSES);
    assert_eq!(manifest.joined_later.len(), PROCESSES - 1);
    let numbers: std::collections::HashSet<u32> =
        manifest.joined_later.iter().map(|j| j.number).collect();
    assert_eq!(numbers.len(), PROCESSES - 1, "each process its own number");
    assert!(!numbers.contains(&manifest.processes[0].number));
    assert_eq!(
        Trace::read(&dir.join("churn.trace")).unwrap().epochs.len(),
        PROCESSES
    );
    drop(running);
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
