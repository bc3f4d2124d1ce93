//! A region whose pages the kernel's own reclaim pushes out to swap (`MADV_PAGEOUT`, as a
//! memory cgroup at its limit would) while the region's evictors move them out and threads
//! write and check them: every page reads back as last written. Linux 6.18's `UFFDIO_MOVE`
//! can then move a page and say `EEXIST` or `ENOENT` for it (after a step it retried: a
//! page being pushed to swap); taking the kernel's word, the region left such a page in
//! its pad to be dropped and read it back as zeros (lost in 5 to 50 s in every run of this
//! test), until it looked in the pad (`RegionStats::unreported_moves`).
//!
//! It needs swap: the machine's, or a swap file this test makes, turns on and off again
//! (root, `mkswap`, `swapon`); without them it says so and skips, and under `CI` fails.
//! Alone in its own test binary, so that no other test runs while swap is on.
#![allow(unsafe_code)] // MADV_PAGEOUT of the region's pages: the program's own call.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use common::{own_pages_at_random, region_with, PAGE};
use ztier_base::rng::Rng;
use ztier_uffd::RegionConfig;

/// Swap turned on by this test, turned off (and its file removed) when dropped.
struct OwnSwap(PathBuf);

impl Drop for OwnSwap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

fn swap_is_on() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// Swap to push pages out to: `Ok(None)` if the machine has some on, `Ok(Some(_))` if this
/// test turned on a file of its own, `Err(why)` if it could not.
fn swap() -> Result<Option<OwnSwap>, String> {
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernel-reclaim.swap");
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    if swaps
        .lines()
        .any(|l| l.starts_with(&*file.to_string_lossy()))
    {
        // Left on by a run of this test that was killed: this run turns it off.
        return Ok(Some(OwnSwap(file)));
    }
    if swap_is_on() {
        return Ok(None);
    }
    if ztier_base::os::effective_uid() != 0 {
        return Err("no swap is on, and turning a swap file on needs root".into());
    }
    let _ = std::fs::remove_file(&file);
    // Written, not only sized: swapon refuses a file with holes.
    let written = std::fs::File::create(&file).and_then(|mut f| {
        use std::io::Write;
        let zeros = vec![0u8; 1 << 20];
        (0..256).try_for_each(|_| f.write_all(&zeros))?;
        f.sync_all()
    });
    written.map_err(|e| format!("making {}: {e}", file.display()))?;
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", file.display()))?;
    for (tool, args) in [
        ("mkswap", vec![file.as_os_str()]),
        ("swapon", vec![file.as_os_str()]),
    ] {
        let ok = Command::new(tool)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("{tool}: {e}"))?;
        if !ok.success() {
            let _ = std::fs::remove_file(&file);
            return Err(format!("{tool} {} failed ({ok})", file.display()));
        }
    }
    let own = OwnSwap(file);
    if !swap_is_on() {
        return Err(format!("swapon {} left no swap on", own.0.display()));
    }
    Ok(Some(own))
}

#[test]
fn pages_the_kernel_pushes_to_swap_while_they_are_evicted_read_back_exact() {
    let _swap = match swap() {
        Ok(swap) => swap,
        Err(why) if std::env::var_os("CI").is_some() => panic!("CI must run this test: {why}"),
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    const PAGES: u64 = 8192;
    const THREADS: u64 = 4;
    let mut unreported = 0;
    let swapped_out = || {
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        vmstat
            .lines()
            .find_map(|l| l.strip_prefix("pswpout ")?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let swapped_before = swapped_out();
    for round in 0..2u64 {
        for unit in [PAGE, 64 << 10] {
            let config = RegionConfig {
                unit_size: unit,
                ..RegionConfig::default()
            };
            let Some(r) = region_with(PAGES as usize * PAGE, PAGES as usize * PAGE / 4, &config)
            else {
                return;
            };
            let words = r.words();
            let base = r.as_ptr() as usize;
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let stop = &stop;
                // The kernel's reclaim, 64 pages at a time, anywhere in the region.
                s.spawn(move || {
                    let mut rng = Rng::from_state(0x5A4D + round);
                    while !stop.load(Relaxed) {
                        let at = (rng.next_u64() % (PAGES - 64)) as usize * PAGE;
                        // SAFETY: a range inside the region's mapping; MADV_PAGEOUT keeps
                        // every byte (what a swapped-out page holds is read back on touch).
                        unsafe {
                            libc::madvise(
                                (base + at) as *mut libc::c_void,
                                64 * PAGE,
                                libc::MADV_PAGEOUT,
                            )
                        };
                    }
                });
                let owners: Vec<_> = (0..THREADS)
                    .map(|t| {
                        s.spawn(move || {
                            own_pages_at_random(
                                words,
                                (t, THREADS),
                                PAGES,
                                40_000,
                                0xF00D + round,
                                6,
                            )
                        })
                    })
                    .collect();
                let outcomes: Vec<_> = owners.into_iter().map(|o| o.join()).collect();
                stop.store(true, Relaxed);
                for outcome in outcomes {
                    if let Err(panic) = outcome {
                        std::panic::resume_unwind(panic);
                    }
                }
            });
            let s = r.stats();
            assert!(s.evictions > 1000 && s.faults > 1000, "{unit}: {s:?}");
            assert_eq!(
                s.evict_failures + s.poisoned_pages + s.held_pages + s.lost_pages,
                0,
                "{unit}: {s:?}"
            );
            unreported += s.unreported_moves;
        }
    }
    // The kernel's reclaim did push pages to swap (else nothing here was tested).
    let swapped = swapped_out() - swapped_before;
    assert!(
        swapped > 1000,
        "pages written to swap during the test: {swapped}"
    );
    // What the kernel did: a kernel without the fault moves nothing uncounted.
    eprintln!("pages moved without being counted, found in the pad: {unreported}");
}
