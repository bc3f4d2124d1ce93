//! What the tests that force an interleaving share: a thread's kernel id, and a wait until
//! that thread is asleep in the kernel (on a lock's futex, a condition variable, a blocking
//! read), which is how a test knows that a thread it started has reached the lock it is
//! meant to queue on before it starts the next one. parking_lot wakes the threads parked on
//! a lock in the order they parked, so queueing them one after another orders them.
//! [`StoppedSave`]: a save held where a test wants it. [`writeback`]: what the writeback
//! tests share; [`units`]: what the tests of compression units share.
#![allow(dead_code)] // each test file uses its own part

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub mod units;
pub mod writeback;

/// Far past any scheduling delay; only a thread that never blocks reaches it.
const DEADLINE: Duration = Duration::from_secs(20);

/// The calling thread's kernel id.
pub fn this_thread() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let tid = link.file_name().expect("PID/task/TID").to_string_lossy();
    tid.parse().expect("a thread id")
}

/// Whether thread `tid` of this process is asleep in the kernel (state S or D), or gone.
pub fn asleep(tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return true;
    };
    // The state follows the command name's closing parenthesis.
    let state = stat[stat.rfind(')').expect("a stat line") + 1..].trim_start();
    state.starts_with('S') || state.starts_with('D')
}

/// Waits until thread `tid` is asleep, or `done` says what it was doing is over; panics
/// past a deadline no working build reaches.
pub fn wait_until_asleep(tid: u32, done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    // Twice in a row: a thread may sleep for a moment on its way (a page fault's I/O),
    // but one that waits on a lock stays asleep.
    let mut seen = 0;
    while seen < 2 && !done() {
        seen = if asleep(tid) { seen + 1 } else { 0 };
        assert!(Instant::now() < deadline, "{what} never blocked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A save's writer that stops on one write until released, so the save holds, meanwhile,
/// what it holds there: its store's gate from its first write on; a page's lock while it
/// writes that page's record (which starts with the page's index).
pub struct StoppedSave {
    /// The 8-byte write it stops on; any write if `None`.
    at: Option<[u8; 8]>,
    pub gate: Arc<SaveGate>,
}

/// Where a [`StoppedSave`] stops: whether it has, and whether it is released.
#[derive(Default)]
pub struct SaveGate {
    /// (stopped, released)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl StoppedSave {
    /// Stops on the first write.
    pub fn on_first_write() -> StoppedSave {
        StoppedSave {
            at: None,
            gate: Arc::default(),
        }
    }

    /// Stops on the record of page `index`.
    pub fn at_page(index: u64) -> StoppedSave {
        StoppedSave {
            at: Some(index.to_le_bytes()),
            gate: Arc::default(),
        }
    }
}

impl SaveGate {
    /// Waits until the save has stopped; panics if `gave_up` says it ended first, or past a
    /// deadline no working build reaches.
    pub fn wait_stopped(&self, gave_up: impl Fn() -> bool) {
        let deadline = Instant::now() + DEADLINE;
        let mut s = self.state.lock().unwrap();
        while !s.0 {
            s = self
                .cv
                .wait_timeout(s, Duration::from_millis(10))
                .unwrap()
                .0;
            assert!(s.0 || !gave_up(), "the save ended before it stopped");
            assert!(Instant::now() < deadline, "the save never stopped");
        }
    }

    /// Lets the save go on.
    pub fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Write for StoppedSave {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.at.is_none_or(|at| buf == at) {
            let mut s = self.gate.state.lock().unwrap();
            s.0 = true;
            self.gate.cv.notify_all();
            while !s.1 {
                s = self.gate.cv.wait(s).unwrap();
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
