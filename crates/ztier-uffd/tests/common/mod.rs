//! What the region tests share: making a region where userfaultfd is allowed, and page
//! contents that say which page and which version they are; and a watchdog, so that a test
//! stuck on a fault the handler never serves fails with a message instead of hanging CI.
#![allow(dead_code)]

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::Duration;

use ztier_uffd::{Error, Region, RegionConfig};

pub const PAGE: usize = 4096;
pub const WORDS: usize = PAGE / 8;

/// How long a region may live in a test (its making to the end of its drop) before the
/// watchdog aborts the process: every test here takes a few seconds on an idle 2-core
/// machine, so this is only reached by a thread waiting on a fault no one serves (or a
/// drop waiting on a thread that does not stop).
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// Aborts the process with a message naming the test, unless dropped within its time.
pub struct Watchdog {
    _done: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn new(limit: Duration) -> Watchdog {
        let (done, rx) = mpsc::channel::<()>();
        let test = std::thread::current()
            .name()
            .unwrap_or("a ztier-uffd test")
            .to_owned();
        std::thread::spawn(move || {
            // Ok never comes (nothing is sent); Disconnected is the guard's drop.
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "{test}: still running after {} s: a thread waits on a fault the region's \
                     handler never serves, or the region's drop waits on a thread that does not \
                     stop; aborting",
                    limit.as_secs()
                );
                std::process::abort();
            }
        });
        Watchdog { _done: done }
    }
}

/// A region under a [`Watchdog`] (dropped after the region, so a drop that hangs is
/// caught too).
pub struct Guarded {
    region: Region,
    _dog: Watchdog,
}

impl Deref for Guarded {
    type Target = Region;
    fn deref(&self) -> &Region {
        &self.region
    }
}

/// A region, or `None` (with the reason printed) where this process may not use
/// userfaultfd; under `CI` that fails instead.
pub fn region(len: usize, budget: usize) -> Option<Guarded> {
    region_with(len, budget, &RegionConfig::default())
}

/// [`region`], made as `config` says.
pub fn region_with(len: usize, budget: usize, config: &RegionConfig) -> Option<Guarded> {
    let dog = Watchdog::new(WATCHDOG);
    match Region::with_config(len, budget, config) {
        Ok(region) => Some(Guarded { region, _dog: dog }),
        Err(e @ (Error::NotPermitted(_) | Error::Unsupported(_))) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the region tests: {e}");
            }
            eprintln!("skipped: {e} (run as root or with vm.unprivileged_userfaultfd=1)");
            None
        }
        Err(e) => panic!("making a region: {e}"),
    }
}

/// Word `w` of page `page` at `version` (0: never written, all zeros). Half the words repeat
/// so the page compresses, half do not.
pub fn word(page: u64, version: u64, w: usize) -> u64 {
    if version == 0 {
        return 0;
    }
    match w {
        0 => page,
        1 => version,
        _ if w.is_multiple_of(2) => page ^ (version << 32),
        _ => {
            let mut x = page
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
                .wrapping_add(w as u64);
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^ (x >> 32)
        }
    }
}

pub fn write_page(words: &[AtomicU64], page: u64, version: u64) {
    let base = page as usize * WORDS;
    for w in 0..WORDS {
        words[base + w].store(word(page, version, w), Relaxed);
    }
}

/// The first word of page `page` that is not as `version` wrote it, if any.
pub fn check_page(words: &[AtomicU64], page: u64, version: u64) -> Result<(), String> {
    let base = page as usize * WORDS;
    for w in 0..WORDS {
        let got = words[base + w].load(Relaxed);
        let want = word(page, version, w);
        if got != want {
            return Err(format!(
                "page {page} version {version}: word {w} is {got:#x}, want {want:#x}"
            ));
        }
    }
    Ok(())
}

/// Thread `t` of `threads` owning every `threads`-th page of the first `pages`: `rounds`
/// times it picks one of its pages at random (`Rng` from the state `seed ^ t`) and writes a new
/// version of it (`writes_in_16` times in 16) or checks it holds its last; then checks them
/// all. Panics at the first page that reads back wrong.
pub fn own_pages_at_random(
    words: &[AtomicU64],
    (t, threads): (u64, u64),
    pages: u64,
    rounds: usize,
    seed: u64,
    writes_in_16: u64,
) {
    let mine: Vec<u64> = (t..pages).step_by(threads as usize).collect();
    let mut version = vec![0u64; mine.len()];
    let mut rng = ztier_base::rng::Rng::from_state(seed ^ t);
    for _ in 0..rounds {
        let x = rng.next_u64();
        let i = (x % mine.len() as u64) as usize;
        if x >> 60 < writes_in_16 {
            version[i] += 1;
            write_page(words, mine[i], version[i]);
        } else {
            check_page(words, mine[i], version[i]).unwrap();
        }
    }
    for (i, &page) in mine.iter().enumerate() {
        check_page(words, page, version[i]).unwrap();
    }
}

/// Waits until the region's pad holds no page (emptied by `Region::evict`'s sixteenth call,
/// or by the reclaim thread, idle, within about 0.1 s); fails after 5 s.
pub fn wait_until_pad_empty(r: &ztier_uffd::Region) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rss_of(r.pad_range()) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pad still holds {} bytes",
            rss_of(r.pad_range())
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Bytes resident in the mapping at `range` (`/proc/self/smaps`).
pub fn rss_of(range: std::ops::Range<usize>) -> usize {
    ztier_base::os::rss_within(&[range]).expect("/proc/self/smaps") as usize
}

/// A region of `pages` pages, all of them in budget, every page written (version 1); or
/// `None` as [`region`] says.
pub fn written_region(pages: u64) -> Option<Guarded> {
    written_region_with(pages, &RegionConfig::default())
}

/// [`written_region`], made as `config` says.
pub fn written_region_with(pages: u64, config: &RegionConfig) -> Option<Guarded> {
    let r = region_with(pages as usize * PAGE, pages as usize * PAGE, config)?;
    for page in 0..pages {
        write_page(r.words(), page, 1);
    }
    Some(r)
}
