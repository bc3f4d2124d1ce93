//! The cache of decompressed units on devices of 16 and 64 KiB units: threads writing,
//! rewriting in part, discarding and reading pages (alone and in runs of neighbours, which
//! hit the cache) of units that other threads write, beside compactions and between resets,
//! checked against a model; and the cache's memory bounded, given back on `compact`,
//! `mark_idle` and `reset`, absent at 4 KiB units, and outside every `mm_stat` figure.
//! And threads sharing units, each changing only its own pages inside them (whole pages,
//! 512-byte sectors, discards), each page read back as exactly its owner's last change: a
//! read-modify-write of a unit never puts back a neighbour's older page.
//!
//! Model of the stale-read tests: each unit is written by one thread (unit % threads),
//! which stamps every page it writes with the page's index and a sequence number, and
//! publishes the page's stamp (the sequence, and whether the change was a discard) as
//! started before the device call and as done after it returns. A reader loads the done
//! stamp before its read and the started one after: the page read must carry a sequence
//! between the two (zeros only if a discard or a change lies in that span). A cached copy
//! served after a change it missed carries an older sequence and fails.

use std::sync::atomic::{AtomicU64, Ordering};

use ztier_base::rng::Rng;
use ztier_compress::Algorithm;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::Device;

const PAGE: usize = 4096;

fn device(units: u64, unit: usize, alg: &str) -> Device {
    let pool = Box::new(ZsPool::new(ZsConfig::default().with_max_object(unit)).unwrap());
    Device::with_unit_size(
        units * unit as u64,
        alg.parse::<Algorithm>().unwrap(),
        pool,
        unit,
    )
    .unwrap()
}

/// Page `page`'s bytes at sequence `seq`: the page and the sequence, then text-like bytes
/// (compressible) or, for one sequence in four (by its count, above the writer's byte), noise (stored raw if the whole unit is).
fn page_bytes(page: u64, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PAGE);
    out.extend_from_slice(&page.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    let mut rng = Rng::from_state(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    if (seq >> 8).is_multiple_of(4) {
        out.resize_with(PAGE, || rng.next_u64() as u8);
    } else {
        let words: [&[u8]; 4] = [b"alpha ", b"beta ", b"gamma ", b"delta "];
        while out.len() < PAGE {
            out.extend_from_slice(words[(rng.next_u64() % 4) as usize]);
        }
        out.truncate(PAGE);
    }
    out
}

/// A page's published stamp: its last change's sequence, shifted, and 1 for a discard.
fn stamp(seq: u64, discard: bool) -> u64 {
    seq << 1 | u64::from(discard)
}

/// Checks a page read after stamp `before` was done and before any change after `after`
/// started.
fn check_page(page: u64, got: &[u8], before: u64, after: u64) {
    if got.iter().all(|&b| b == 0) {
        assert!(
            before & 1 == 1 || before == 0 || after != before,
            "page {page}: zeros, but its last change (stamp {before}) wrote it"
        );
        return;
    }
    let seq = u64::from_le_bytes(got[8..16].try_into().unwrap());
    assert_eq!(
        u64::from_le_bytes(got[..8].try_into().unwrap()),
        page,
        "page {page}: another page's bytes"
    );
    assert!(
        (before >> 1) <= seq && seq <= (after >> 1),
        "page {page}: sequence {seq} read, stamps {before}..{after} (a stale copy?)"
    );
    assert_eq!(got, &page_bytes(page, seq)[..], "page {page}: torn bytes");
}

/// A worker thread's count in `done`, made when it ends, even by a failed check, so that
/// the compactor beside it stops.
struct CountedOut<'a>(&'a AtomicU64);

impl Drop for CountedOut<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Compacts `dev` until `workers` threads are counted out in `done`.
fn compact_until_out(dev: &Device, done: &AtomicU64, workers: u64) {
    while done.load(Ordering::Acquire) < workers {
        dev.compact();
        std::thread::yield_now();
    }
}

/// `threads` threads for `rounds` rounds of `ops` operations each on a device of `units`
/// units; one compacting thread beside them; a reset between rounds (each round's threads
/// are new, and joined, so that a failed check ends the test).
fn run(unit: usize, alg: &str, units: u64, threads: u64, rounds: u64, ops: usize) {
    let dev = device(units, unit, alg);
    let ppu = (unit / PAGE) as u64;
    let pages = units * ppu;
    let stamps: Vec<AtomicU64> = (0..pages).map(|_| AtomicU64::new(0)).collect();
    let started: Vec<AtomicU64> = (0..pages).map(|_| AtomicU64::new(0)).collect();
    let seqs: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(1)).collect();
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| compact_until_out(&dev, &done, threads));
            for t in 0..threads {
                let model = Model {
                    done: &stamps,
                    started: &started,
                };
                let (dev, seqs, done) = (&dev, &seqs, &done);
                s.spawn(move || {
                    let _out = CountedOut(done);
                    let seed = (round * threads + t + 1).wrapping_mul(0x1234_5678_9abc_def1);
                    work(dev, &model, &seqs[t as usize], t, threads, seed, ops);
                });
            }
        });
        dev.reset();
        // A reset is a discard of every page, newer than any change before it.
        let seq = seqs
            .iter()
            .map(|s| s.fetch_add(1, Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        for s in stamps.iter().chain(&started) {
            s.store(stamp(seq << 8 | 0xff, true), Ordering::Release);
        }
        // And every writer's next change newer than the reset.
        for s in &seqs {
            s.store(seq + 1, Ordering::Relaxed);
        }
    }
    // Everything read back as the model says.
    let mut page_buf = vec![0u8; PAGE];
    for p in 0..pages {
        dev.read_page(p, &mut page_buf).unwrap();
        let st = stamps[p as usize].load(Ordering::Acquire);
        check_page(p, &page_buf, st, st);
    }
}

/// The pages' stamps: of the last change done, and of the last one started.
struct Model<'a> {
    done: &'a [AtomicU64],
    started: &'a [AtomicU64],
}

impl Model<'_> {
    /// Pages `pages` are being changed, at `stamp`: runs `change`, then marks them done.
    fn change(&self, pages: std::ops::Range<u64>, stamp: u64, change: impl FnOnce()) {
        for p in pages.clone() {
            self.started[p as usize].store(stamp, Ordering::Release);
        }
        change();
        for p in pages {
            self.done[p as usize].store(stamp, Ordering::Release);
        }
    }
    fn before(&self, page: u64) -> u64 {
        self.done[page as usize].load(Ordering::Acquire)
    }
    fn after(&self, page: u64) -> u64 {
        self.started[page as usize].load(Ordering::Acquire)
    }
}

/// One thread's operations: changes to its own units (unit % threads == t), reads of any.
fn work(dev: &Device, model: &Model, seq: &AtomicU64, t: u64, threads: u64, seed: u64, ops: usize) {
    let unit = dev.unit_size();
    let ppu = (unit / PAGE) as u64;
    let units = dev.units();
    let pages = units * ppu;
    let mut rng = Rng::from_state(seed | 1);
    let mut page_buf = vec![0u8; PAGE];
    let next_seq = || seq.fetch_add(1, Ordering::Relaxed) << 8 | t;
    for _ in 0..ops {
        let mine = (rng.next_u64() % (units / threads)) * threads + t;
        match rng.next_u64() % 8 {
            0 => {
                let seq = next_seq();
                let mut data = Vec::with_capacity(unit);
                for p in mine * ppu..(mine + 1) * ppu {
                    data.extend_from_slice(&page_bytes(p, seq));
                }
                model.change(mine * ppu..(mine + 1) * ppu, stamp(seq, false), || {
                    dev.write_unit(mine, &data).unwrap();
                });
            }
            1 | 2 => {
                // Some pages of the unit: a read-modify-write.
                let seq = next_seq();
                let first = mine * ppu + rng.next_u64() % ppu;
                let n = 1 + rng.next_u64() % ((mine + 1) * ppu - first);
                let mut data = Vec::new();
                for p in first..first + n {
                    data.extend_from_slice(&page_bytes(p, seq));
                }
                model.change(first..first + n, stamp(seq, false), || {
                    dev.write_bytes(first * PAGE as u64, &data).unwrap();
                });
            }
            3 => {
                // Discard some pages, or the whole unit.
                let seq = next_seq();
                let (first, n) = if rng.next_u64().is_multiple_of(2) {
                    (mine * ppu, ppu)
                } else {
                    let first = mine * ppu + rng.next_u64() % ppu;
                    (first, 1 + rng.next_u64() % ((mine + 1) * ppu - first))
                };
                model.change(first..first + n, stamp(seq, true), || {
                    dev.discard(first * PAGE as u64, n * PAGE as u64).unwrap();
                });
            }
            4 => {
                // A read of several pages at once.
                let first = rng.next_u64() % pages;
                let n = 1 + rng.next_u64() % (pages - first).min(2 * ppu);
                let before: Vec<u64> = (first..first + n).map(|p| model.before(p)).collect();
                let mut out = vec![0u8; n as usize * PAGE];
                dev.read_bytes(first * PAGE as u64, &mut out).unwrap();
                for (i, got) in out.chunks_exact(PAGE).enumerate() {
                    let p = first + i as u64;
                    check_page(p, got, before[i], model.after(p));
                }
            }
            _ => {
                // A page, then a run of its neighbours (cache hits).
                let first = rng.next_u64() % pages;
                let run = 1 + rng.next_u64() % ppu;
                for p in first..(first + run).min(pages) {
                    let before = model.before(p);
                    dev.read_page(p, &mut page_buf).unwrap();
                    check_page(p, &page_buf, before, model.after(p));
                }
            }
        }
    }
}

#[test]
fn threads_never_read_a_stale_unit_64k_lz4() {
    run(64 << 10, "lz4", 16, 4, 3, 1500);
}

#[test]
fn threads_never_read_a_stale_unit_16k_zstd() {
    run(16 << 10, "zstd", 32, 4, 3, 1500);
}

#[test]
fn threads_never_read_a_stale_unit_64k_lzo_rle_few_units() {
    // Few units: every thread reads what the others change all the time.
    run(64 << 10, "lzo-rle", 4, 4, 3, 1500);
}

/// Reads a page of each of `units` units from `threads` threads.
fn read_from_threads(dev: &Device, units: u64, threads: usize) {
    let ppu = (dev.unit_size() / PAGE) as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut page = vec![0u8; PAGE];
                for u in 0..units {
                    dev.read_page(u * ppu + t as u64 % ppu, &mut page).unwrap();
                }
            });
        }
    });
}

#[test]
fn the_cache_is_bounded_and_given_back() {
    let unit = 64 << 10;
    let units = 64;
    let dev = device(units, unit, "lz4");
    let fresh = dev.unit_cache_bytes();
    for u in 0..units {
        dev.write_unit(u, &page_bytes(u, u + 1).repeat(unit / PAGE))
            .unwrap();
    }
    let mm = dev.mm_stat();
    // More threads than shards, more units than any shard holds.
    let bound = fresh + (ztier_base::shard::SHARDS * (128 << 10)) as u64;
    read_from_threads(&dev, units, ztier_base::shard::SHARDS + 4);
    let filled = dev.unit_cache_bytes();
    assert!(
        fresh < filled && filled <= bound,
        "cache {filled} bytes: not within {fresh}..={bound}"
    );
    // The cache is not the pool: no mm_stat figure moved for the reads.
    assert_eq!(dev.mm_stat(), mm);
    dev.compact();
    assert_eq!(
        dev.unit_cache_bytes(),
        fresh,
        "compact gives the cache back"
    );
    read_from_threads(&dev, units, 2);
    assert!(dev.unit_cache_bytes() > fresh);
    dev.mark_idle(None);
    assert_eq!(
        dev.unit_cache_bytes(),
        fresh,
        "an aging device gives it back"
    );
    read_from_threads(&dev, units, 2);
    assert!(dev.unit_cache_bytes() > fresh);
    dev.reset();
    assert_eq!(dev.unit_cache_bytes(), fresh, "reset gives it back");
    // What validates it: 8 KiB of counters, nothing more.
    assert!(fresh <= 8 << 10);
}

#[test]
fn page_sized_units_have_no_cache() {
    let dev = device(64, PAGE, "lz4");
    for p in 0..64 {
        dev.write_page(p, &page_bytes(p, 1)).unwrap();
    }
    read_from_threads(&dev, 64, 3);
    assert_eq!(dev.unit_cache_bytes(), 0);
}

#[test]
fn a_cached_unit_follows_writes_and_discards_in_one_thread() {
    let unit = 64 << 10;
    let dev = device(2, unit, "lz4");
    let ppu = (unit / PAGE) as u64;
    let mut page = vec![0u8; PAGE];
    let data: Vec<u8> = (0..ppu).flat_map(|p| page_bytes(p, 1)).collect();
    dev.write_unit(0, &data).unwrap();
    dev.read_page(0, &mut page).unwrap(); // fills the cache
    dev.write_bytes(3 * PAGE as u64, &page_bytes(3, 2)).unwrap();
    dev.read_page(3, &mut page).unwrap();
    assert_eq!(page, page_bytes(3, 2), "a partial write after the fill");
    dev.read_page(4, &mut page).unwrap();
    assert_eq!(page, page_bytes(4, 1));
    dev.discard_page(4).unwrap();
    dev.read_page(4, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0), "a discard after the fill");
    dev.write_unit(0, &data).unwrap();
    dev.read_page(4, &mut page).unwrap();
    assert_eq!(page, page_bytes(4, 1), "a whole-unit write after the fill");
    dev.discard(0, unit as u64).unwrap();
    dev.read_page(5, &mut page).unwrap();
    assert!(
        page.iter().all(|&b| b == 0),
        "a discard of the unit after the fill"
    );
}

/// Threads that share units, each owning its own pages inside every unit (page % threads),
/// write whole pages, write 512-byte sectors, discard pages and read runs across the units,
/// a compactor beside them. Every change here is to a page of a 16 or 64 KiB unit, so each
/// is a read-modify-write of the whole unit, and one done without the unit held would put
/// back a neighbour's older page (the stale-read tests write and discard whole units). Each thread knows its own pages exactly (no one
/// else changes them), so every read of one must be exactly the owner's last change, during
/// the run and at its end.
fn threads_owning_pages_of_shared_units(unit: usize, alg: &str) {
    const SECTOR: usize = 512;
    const THREADS: u64 = 4;
    const OPS: usize = 3000;
    let units = 4;
    let dev = device(units, unit, alg);
    let ppu = (unit / PAGE) as u64;
    let pages = units * ppu;
    let done = AtomicU64::new(0);
    let finals: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        s.spawn(|| compact_until_out(&dev, &done, THREADS));
        let owners: Vec<_> = (0..THREADS)
            .map(|t| {
                let (dev, done) = (&dev, &done);
                s.spawn(move || {
                    let _out = CountedOut(done);
                    let mine: Vec<u64> = (0..pages).filter(|p| p % THREADS == t).collect();
                    // The model: each of my pages as I last left it (zeros at first).
                    let mut model = vec![vec![0u8; PAGE]; mine.len()];
                    let mut rng = Rng::from_state((t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut got = vec![0u8; PAGE];
                    for op in 0..OPS as u64 {
                        let i = (rng.next_u64() % mine.len() as u64) as usize;
                        let page = mine[i];
                        let at = page * PAGE as u64;
                        match rng.next_u64() % 6 {
                            0 | 1 => {
                                let bytes = page_bytes(page, op << 8 | t);
                                dev.write_bytes(at, &bytes).unwrap();
                                model[i] = bytes;
                            }
                            2 | 3 => {
                                let sector = (rng.next_u64() % (PAGE / SECTOR) as u64) as usize;
                                let bytes = &page_bytes(page, op << 8 | t)[..SECTOR];
                                dev.write_bytes(at + (sector * SECTOR) as u64, bytes)
                                    .unwrap();
                                model[i][sector * SECTOR..][..SECTOR].copy_from_slice(bytes);
                            }
                            4 => {
                                dev.discard(at, PAGE as u64).unwrap();
                                model[i].fill(0);
                            }
                            _ => {
                                // A run of pages across units: mine in it checked.
                                let first = rng.next_u64() % pages;
                                let n = 1 + rng.next_u64() % (pages - first).min(ppu + 1);
                                let mut out = vec![0u8; n as usize * PAGE];
                                dev.read_bytes(first * PAGE as u64, &mut out).unwrap();
                                for (k, bytes) in out.chunks_exact(PAGE).enumerate() {
                                    let p = first + k as u64;
                                    if p % THREADS == t {
                                        let j = (p / THREADS) as usize;
                                        assert!(
                                            bytes == model[j],
                                            "page {p} of thread {t}: not its last change \
                                             (a neighbour's write put back an older unit?)"
                                        );
                                    }
                                }
                            }
                        }
                        dev.read_page(page, &mut got).unwrap();
                        assert!(
                            got == model[i],
                            "page {page} of thread {t}: not its last change"
                        );
                    }
                    model
                })
            })
            .collect();
        owners.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut got = vec![0u8; PAGE];
    for p in 0..pages {
        dev.read_page(p, &mut got).unwrap();
        let last = &finals[(p % THREADS) as usize][(p / THREADS) as usize];
        assert!(
            got == *last,
            "page {p}: not its owner's last change at the end"
        );
    }
}

#[test]
fn threads_owning_pages_of_shared_64k_units_lose_nothing() {
    threads_owning_pages_of_shared_units(64 << 10, "lz4");
}

#[test]
fn threads_owning_pages_of_shared_16k_units_lose_nothing() {
    threads_owning_pages_of_shared_units(16 << 10, "zstd");
}
