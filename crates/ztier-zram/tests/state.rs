//! A saved state whose written-back pages stay on the backing store: the state names their
//! places (its size falls by the bytes it no longer copies), the store is re-attached as it
//! is with exactly its units in use, and the pages read back; a store that is another one,
//! of another size, changed since the save, or missing is refused with the reason, and the
//! device is left empty with no store set.

mod common;

use std::sync::Arc;

use ztier_base::rng::Rng;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, StateError, StateFile, WbFormat, ZramError};

const PS: usize = 4096;
const PAGES: u64 = 3000;

fn device() -> Device {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    Device::new(
        PAGES * PS as u64,
        "lz4".parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap()
}

/// Compressible and different per page; every 16th zero.
fn page(seed: u64) -> Vec<u8> {
    if seed.is_multiple_of(16) {
        return vec![0; PS];
    }
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(PS);
    while out.len() < PS {
        let x = rng.next_u64();
        out.extend_from_slice(format!("{} ", x % 1000).as_bytes());
    }
    out.truncate(PS);
    out
}

fn verify(dev: &Device, changed: impl Fn(u64) -> Option<Vec<u8>>) {
    let mut out = vec![0u8; PS];
    for i in 0..PAGES {
        dev.read_page(i, &mut out).unwrap();
        assert!(out == changed(i).unwrap_or_else(|| page(i)), "page {i}");
    }
}

fn store() -> Arc<dyn BlockDevice> {
    Arc::new(MemoryDevice::new(Backing::size_for(PAGES * PS as u64)).unwrap())
}

/// A device of every page, all but every 5th written back to `store`.
fn filled_on(store: &Arc<dyn BlockDevice>, format: WbFormat) -> Device {
    let dev = device();
    for i in 0..PAGES {
        dev.write_page(i, &page(i)).unwrap();
    }
    dev.set_backing(Some(Backing::new(Arc::clone(store), format).unwrap()))
        .unwrap();
    // Every 5th page read after the marking: not idle, so it stays in memory.
    dev.mark_idle(None);
    let mut out = vec![0u8; PS];
    for i in (0..PAGES).step_by(5) {
        dev.read_page(i, &mut out).unwrap();
    }
    dev.writeback(PageSelector::Idle, None, None).unwrap();
    dev
}

fn save(dev: &Device) -> Vec<u8> {
    let mut state = Vec::new();
    dev.save_state(&mut state).unwrap();
    state
}

#[test]
fn written_back_pages_stay_on_the_store_across_a_restart() {
    for format in [WbFormat::Packed, WbFormat::Compressed, WbFormat::Page] {
        let store = store();
        let dev = filled_on(&store, format);
        // Overwrites and discards leave dead bytes in units; the live counts must follow.
        dev.write_page(7, &page(70_007)).unwrap();
        dev.discard_page(8).unwrap();
        let changed = |i: u64| match i {
            7 => Some(page(70_007)),
            8 => Some(vec![0; PS]),
            _ => None,
        };
        let before = dev.bd_stat().unwrap();
        let mm_before = dev.mm_stat();
        let state = save(&dev);
        // What the same pages' state took with every page in it (a device with no store).
        let inline = {
            let all = device();
            for i in 0..PAGES {
                all.write_page(i, &changed(i).unwrap_or_else(|| page(i)))
                    .unwrap();
            }
            save(&all).len()
        };
        assert!(
            state.len() * 3 < inline,
            "{format:?}: a state of {} bytes names its written-back pages' places, so it is \
             far under the {inline} bytes of one that holds them",
            state.len()
        );
        drop(dev);

        let dev = device();
        let summary = dev
            .load_state_with_store(&mut &state[..], Arc::clone(&store), format)
            .unwrap();
        assert_eq!(summary.from_backing_store, before.bd_count);
        let after = dev.bd_stat().expect("the store is set");
        assert_eq!(after.bd_count, before.bd_count, "{format:?}");
        assert_eq!(after.bytes_stored, before.bytes_stored, "{format:?}");
        assert_eq!(after.bytes_held, before.bytes_held, "{format:?}");
        assert_eq!(dev.mm_stat().orig_data_size, mm_before.orig_data_size);
        assert_eq!(dev.mm_stat().compr_data_size, mm_before.compr_data_size);
        verify(&dev, changed);

        // The store goes on: its units are freed when their pages go, new pages go out.
        for i in 0..PAGES {
            dev.write_page(i, &page(i + 1)).unwrap();
        }
        let bd = dev.bd_stat().unwrap();
        assert_eq!(bd.bd_count, 0);
        // Kept while the store is as the state says (a restart from it must find them).
        assert_eq!(bd.bytes_held, before.bytes_held, "{format:?}");
        // The next writeback changes the store: they go back first, so every page finds
        // room (in the kernel's formats the old blocks and the new ones would not fit).
        dev.writeback(PageSelector::All, None, None).unwrap();
        let bd = dev.bd_stat().unwrap();
        if format != WbFormat::Packed {
            assert_eq!(bd.bytes_held, bd.bd_count * PS as u64, "{format:?}");
        }
        verify(&dev, |i| Some(page(i + 1)));
    }
}

#[test]
fn a_store_that_is_not_the_saved_one_is_refused() {
    let store = store();
    let dev = filled_on(&store, WbFormat::Packed);
    let state = save(&dev);
    let loads = |dev: &Device, store: Arc<dyn BlockDevice>, format: WbFormat, why: &str| {
        let e = dev
            .load_state_with_store(&mut &state[..], store, format)
            .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
        assert!(dev.bd_stat().is_none(), "a refused state left a store set");
        assert_eq!(
            dev.mm_stat().orig_data_size,
            0,
            "a refused state left pages"
        );
    };
    let fresh = device();
    // Another store of the same size (its own id).
    loads(&fresh, self::store(), WbFormat::Packed, "not the one");
    let other = Arc::new(MemoryDevice::new(Backing::size_for(PAGES * PS as u64)).unwrap());
    Backing::new(other.clone(), WbFormat::Packed).unwrap();
    loads(&fresh, other, WbFormat::Packed, "not the one");
    // Another size, another format, none at all.
    let bigger = Arc::new(MemoryDevice::new(2 * Backing::size_for(PAGES * PS as u64)).unwrap());
    loads(&fresh, bigger, WbFormat::Packed, "different store layout");
    loads(
        &fresh,
        Arc::clone(&store),
        WbFormat::Compressed,
        "Packed format",
    );
    let e = fresh.load_state(&mut &state[..]).unwrap_err();
    assert!(e.to_string().contains("none was given"), "{e}");
    assert!(
        matches!(e, ZramError::BadState(StateError::NoStoreGiven { pages }) if pages > 0),
        "{e:?}"
    );
    // A unit's live count that does not add up is damage, even under a good checksum: the
    // state is rewritten with one count off and its CRC made again.
    let mut bad = state.clone();
    let body = bad.len() - 4;
    bad[body - 4] ^= 1;
    let crc = crc32fast::hash(&bad[..body]);
    bad[body..].copy_from_slice(&crc.to_le_bytes());
    let e = fresh
        .load_state_with_store(&mut &bad[..], Arc::clone(&store), WbFormat::Packed)
        .unwrap_err();
    assert!(e.to_string().contains("damaged"), "{e}");
    // The store was never written by any of it: the good state still loads.
    fresh
        .load_state_with_store(&mut &state[..], Arc::clone(&store), WbFormat::Packed)
        .unwrap();
    verify(&fresh, |_| None);
}

/// A state whose checksum does not match what it holds is refused as damaged, with the
/// device left empty and no store set: here the body is intact, only the stored checksum
/// is off (any of its 32 bits), so nothing but the check itself can find it.
#[test]
fn a_state_that_fails_its_checksum_is_refused() {
    let store = store();
    let dev = filled_on(&store, WbFormat::Packed);
    let state = save(&dev);
    let fresh = device();
    let crc_at = state.len() - 4;
    for bit in [0, 9, 18, 31] {
        let mut bad = state.clone();
        bad[crc_at + bit / 8] ^= 1 << (bit % 8);
        let e = fresh
            .load_state_with_store(&mut &bad[..], Arc::clone(&store), WbFormat::Packed)
            .expect_err("a state with a wrong checksum was loaded");
        assert!(e.to_string().contains("checksum"), "bit {bit}: {e}");
        assert!(
            matches!(e, ZramError::BadState(StateError::Checksum)),
            "{e:?}"
        );
        assert!(
            fresh.bd_stat().is_none(),
            "a refused state left a store set"
        );
        assert_eq!(
            fresh.mm_stat().orig_data_size,
            0,
            "a refused state left pages"
        );
    }
    // The store was never written by any of it: the good state still loads.
    fresh
        .load_state_with_store(&mut &state[..], Arc::clone(&store), WbFormat::Packed)
        .unwrap();
    verify(&fresh, |_| None);
}

#[test]
fn a_state_older_than_the_store_is_refused() {
    let store = store();
    let dev = filled_on(&store, WbFormat::Packed);
    let state = save(&dev);
    // After the save, pages die and more go out: their units may be handed out again, so
    // the saved places may no longer hold what the state says.
    for i in 0..PAGES / 2 {
        dev.write_page(i, &page(i + 9)).unwrap();
    }
    dev.writeback(PageSelector::All, None, None).unwrap();
    drop(dev);
    let fresh = device();
    let e = fresh
        .load_state_with_store(&mut &state[..], Arc::clone(&store), WbFormat::Packed)
        .unwrap_err();
    assert!(
        e.to_string().contains("changed after the state was saved"),
        "{e}"
    );
    assert!(
        matches!(e, ZramError::BadState(StateError::StoreChanged)),
        "{e:?}"
    );

    // Saved again at a clean stop: a restart loads it, and consumes it; the server that
    // loaded it dies (no save): the next start is refused, naming the file, never served
    // the old pages as if nothing had been written since.
    let dir = std::env::temp_dir().join(format!("ztier-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = StateFile::new(dir.join("s.state"));
    let dev = filled_on(&store, WbFormat::Packed);
    file.save(&dev, true).unwrap();
    drop(dev);
    let start = |file: &StateFile| -> ztier_zram::Result<Device> {
        let dev = device();
        let mut f = file.open()?.expect("a state");
        dev.load_state_with_store(&mut f, Arc::clone(&store), WbFormat::Packed)?;
        file.consume(true)?;
        Ok(dev)
    };
    let dev = start(&file).unwrap();
    verify(&dev, |_| None);
    dev.write_page(3, &page(33)).unwrap();
    drop(dev); // killed: no save
    let e = start(&file).err().expect("refused").to_string();
    assert!(
        e.contains("did not stop cleanly") && e.contains("s.state.loaded"),
        "{e}"
    );
    // A save while the server goes on is consumed too; a clean stop's loads again.
    std::fs::rename(file.loaded_path(), file.path()).unwrap();
    let dev = start(&file).unwrap();
    file.save(&dev, false).unwrap();
    assert!(start(&file).is_err());
    file.save(&dev, true).unwrap();
    drop(dev);
    assert!(!file.loaded_path().exists());
    verify(&start(&file).unwrap(), |_| None);
    // A server that started with no state leaves a mark: its death is refused too.
    let none = StateFile::new(dir.join("none.state"));
    assert!(none.open().unwrap().is_none());
    none.consume(false).unwrap();
    let e = none.open().unwrap_err().to_string();
    assert!(e.contains("started with no state"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the property test does to a device.
#[derive(Debug, Clone)]
enum Op {
    Write(u64, u64),
    Discard(u64),
    Writeback(u64, u64),
    /// Saved, dropped, and a new device loaded from the state over the same store.
    Restart,
}

fn op(pages: u64) -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..pages, 1..1_000_000u64).prop_map(|(i, s)| Op::Write(i, s)),
        1 => (0..pages).prop_map(Op::Discard),
        2 => (0..pages, 1..pages).prop_map(|(a, n)| Op::Writeback(a, n)),
        1 => Just(Op::Restart),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Writes, discards, writebacks and restarts in any order, in every format: after each
    /// restart and at the end every page reads as the model says, and `bd_stat`'s count and
    /// bytes are what they were before the restart.
    #[test]
    fn restarts_anywhere_keep_every_page(
        format in proptest::prelude::prop_oneof![
            proptest::prelude::Just(WbFormat::Packed),
            proptest::prelude::Just(WbFormat::Compressed),
            proptest::prelude::Just(WbFormat::Page),
        ],
        ops in proptest::collection::vec(op(200), 1..60),
    ) {
        const N: u64 = 200;
        let new_device = || {
            let pool = ZsPool::new(ZsConfig::default()).unwrap();
            Device::new(N * PS as u64, "lz4".parse::<Algorithm>().unwrap(), Box::new(pool))
                .unwrap()
        };
        let store: Arc<dyn BlockDevice> =
            Arc::new(MemoryDevice::new(Backing::size_for(N * PS as u64)).unwrap());
        let mut dev = new_device();
        dev.set_backing(Some(Backing::new(Arc::clone(&store), format).unwrap())).unwrap();
        let mut model = vec![0u64; N as usize]; // 0: zeros, else page(seed)
        let check = |dev: &Device, model: &[u64]| {
            let mut out = vec![0u8; PS];
            for (i, &seed) in model.iter().enumerate() {
                dev.read_page(i as u64, &mut out).unwrap();
                let want = if seed == 0 { vec![0; PS] } else { page(seed) };
                assert!(out == want, "page {i}");
            }
        };
        for op in ops {
            match op {
                Op::Write(i, seed) => {
                    dev.write_page(i, &page(seed)).unwrap();
                    model[i as usize] = seed;
                }
                Op::Discard(i) => {
                    dev.discard_page(i).unwrap();
                    model[i as usize] = 0;
                }
                Op::Writeback(a, n) => {
                    dev.writeback(PageSelector::All, Some(a..(a + n).min(N)), None).unwrap();
                }
                Op::Restart => {
                    let before = dev.bd_stat().unwrap();
                    let mut state = Vec::new();
                    dev.save_state(&mut state).unwrap();
                    drop(dev);
                    dev = new_device();
                    dev.load_state_with_store(&mut &state[..], Arc::clone(&store), format)
                        .unwrap();
                    let after = dev.bd_stat().unwrap();
                    proptest::prop_assert_eq!(after.bd_count, before.bd_count);
                    proptest::prop_assert_eq!(after.bytes_stored, before.bytes_stored);
                    check(&dev, &model);
                }
            }
        }
        check(&dev, &model);
        // Every unit's live count came out right: once every page is gone and one page is
        // written back (which frees what the last state kept), only its unit is held.
        dev.discard(0, N * PS as u64).unwrap();
        dev.write_page(0, &page(42)).unwrap();
        dev.writeback(PageSelector::All, None, None).unwrap();
        let unit = if format == WbFormat::Packed { 64 << 10 } else { PS as u64 };
        proptest::prop_assert_eq!(dev.bd_stat().unwrap().bytes_held, unit);
    }
}

/// A save that fails (a full disk, a kill before its rename) leaves the last state saved
/// loadable: the store is still as that state says, so it keeps that state's stamp.
#[test]
fn a_failed_save_leaves_the_last_state_loadable() {
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(28))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let store = store();
    let dev = filled_on(&store, WbFormat::Packed);
    let state = save(&dev);
    dev.save_state(&mut Full).unwrap_err();
    drop(dev);
    let dev = device();
    dev.load_state_with_store(&mut &state[..], Arc::clone(&store), WbFormat::Packed)
        .unwrap();
    verify(&dev, |_| None);
}

/// A store whose first data write waits until released: by the test, or by the next write
/// to its header (a save's stamp).
struct Held {
    inner: Arc<dyn BlockDevice>,
    state: std::sync::Mutex<(bool, bool)>, // (a write is waiting, released)
    cv: std::sync::Condvar,
}

impl Held {
    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
    fn wait_held(&self) {
        let mut s = self.state.lock().unwrap();
        while !s.0 {
            s = self.cv.wait(s).unwrap();
        }
    }
}

impl BlockDevice for Held {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        if offset == 0 {
            self.inner.write_at(offset, data, fua)?;
            self.release();
            return Ok(());
        }
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap();
        }
        drop(s);
        self.inner.write_at(offset, data, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        self.inner.flush()
    }
}

/// A save while a writeback is under way waits for it: the state it writes is still the
/// store's when it returns (the writeback's later groups no longer clear the stamp under
/// it). Closing writeback waits for one in progress too, and refuses the next.
#[test]
fn a_save_during_a_writeback_is_valid_when_it_returns() {
    let inner = store();
    let held = Arc::new(Held {
        inner: Arc::clone(&inner),
        state: std::sync::Mutex::new((false, false)),
        cv: std::sync::Condvar::new(),
    });
    let dev = Arc::new(device());
    for i in 0..PAGES {
        dev.write_page(i, &page(i)).unwrap();
    }
    let backing = Backing::new(Arc::clone(&held) as Arc<dyn BlockDevice>, WbFormat::Packed);
    dev.set_backing(Some(backing.unwrap())).unwrap();
    let writeback = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || dev.writeback(PageSelector::All, None, None).unwrap())
    };
    held.wait_held();
    let (tid, saver) = std::sync::mpsc::channel();
    let saved = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            tid.send(common::this_thread()).unwrap();
            save(&dev)
        })
    };
    // The save waits for the writeback (asleep on the gate), or, not waiting, stamps the
    // store, which releases the writeback; either way it is let through only then.
    let saver = saver.recv().unwrap();
    common::wait_until_asleep(saver, || held.state.lock().unwrap().1, "the save");
    held.release();
    let wrote = writeback.join().unwrap();
    assert!(wrote.pages > PAGES / 2, "{wrote:?}");
    let state = saved.join().unwrap();
    dev.close_writeback();
    let e = dev.writeback(PageSelector::All, None, None).unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    drop(dev);
    let dev = device();
    let summary = dev
        .load_state_with_store(&mut &state[..], inner, WbFormat::Packed)
        .unwrap();
    assert!(summary.from_backing_store > PAGES / 2, "{summary:?}");
    verify(&dev, |_| None);
}

#[test]
fn saves_at_the_same_time_each_leave_a_state_that_loads() {
    // A `ctl save` beside the stop's: both write PATH.tmp and rename it. One at a time, each
    // succeeds and what is left loads; together, one renamed the other's file away (ENOENT)
    // or left a mix of both that failed its checksum.
    let dir = std::env::temp_dir().join(format!("ztier-state-saves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = StateFile::new(dir.join("s.state"));
    let store = store();
    let dev = filled_on(&store, WbFormat::Packed);
    std::thread::scope(|s| {
        for stopped in [false, true, false, true] {
            let (file, dev) = (&file, &dev);
            s.spawn(move || {
                for _ in 0..10 {
                    file.save(dev, stopped).unwrap();
                }
            });
        }
    });
    drop(dev);
    let fresh = device();
    let mut f = std::fs::File::open(file.path()).unwrap();
    fresh
        .load_state_with_store(&mut f, Arc::clone(&store), WbFormat::Packed)
        .unwrap();
    verify(&fresh, |_| None);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A state is outside input (`ztier serve --state PATH` loads whatever file it is given), and
/// its checksum finds damage, not design: a record whose flags name a secondary algorithm
/// the state does not have, a huge page whose size is not a page, or a same-filled page
/// with a size, is refused with the reason under a good checksum, and the device is left
/// empty. (Loaded, the first panicked at its first read, the second read back a page of
/// one object's bytes and stale ones.)
#[test]
fn a_crafted_state_with_impossible_flags_is_refused() {
    let dev = device();
    dev.write_page(0, &page(1)).unwrap();
    let state = save(&dev);
    // The header: magic, version, page size, pages, oldest age, "lz4", no secondary
    // algorithm, no store; then the first record: page 0's index, then its flags.
    let flags_at = 8 + 4 + 4 + 8 + 4 + (2 + 3) + 1 + 1 + 8;
    let flags = u64::from_le_bytes(state[flags_at..flags_at + 8].try_into().unwrap());
    // The same for a device whose page 0 is same-filled (`page(0)` is all zeros).
    let same = device();
    same.write_page(0, &page(0)).unwrap();
    let same_state = save(&same);
    let same_flags = u64::from_le_bytes(same_state[flags_at..flags_at + 8].try_into().unwrap());
    let crafted_from = |state: &Vec<u8>, flags: u64| {
        let mut bad = state.clone();
        bad[flags_at..flags_at + 8].copy_from_slice(&flags.to_le_bytes());
        let body = bad.len() - 4;
        let crc = crc32fast::hash(&bad[..body]);
        bad[body..].copy_from_slice(&crc.to_le_bytes());
        bad
    };
    let crafted = |flags: u64| crafted_from(&state, flags);
    let huge = 1 << 19; // ZRAM_HUGE: the flags' fourth bit after the 16-bit size
    for (bad, why) in [
        (crafted(flags | 1 << 23), "secondary algorithm 1"),
        (crafted(flags | 3 << 23), "secondary algorithm 3"),
        (crafted(flags | huge), "huge"),
        (
            crafted_from(&same_state, same_flags | 100),
            "same-filled with a size",
        ),
    ] {
        let fresh = device();
        let e = fresh.load_state(&mut &bad[..]).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(
            fresh.mm_stat().orig_data_size,
            0,
            "a refused state left pages"
        );
        assert_eq!(fresh.mm_stat().mem_used_total, 0);
    }
    // The state as saved still loads and reads back.
    let fresh = device();
    fresh.load_state(&mut &state[..]).unwrap();
    let mut out = vec![0u8; PS];
    fresh.read_page(0, &mut out).unwrap();
    assert_eq!(out, page(1));
}
