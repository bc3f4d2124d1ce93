//! A backing store changed or closed while writeback runs: no page is committed to a store
//! the device no longer has, a writeback that finds its store changed is refused (the
//! interleaving forced), and writeback closed for good takes no new store.

mod common;

use std::sync::{mpsc, Arc, Barrier};

use ztier_blockdev::memory::MemoryDevice;
use ztier_zram::{Backing, Busy, PageSelector, WbFormat, ZramError};

use common::writeback::*;

/// A change of store racing a writeback: either the change waits for the writeback (and is
/// then refused, its pages being on the store) or it goes first (and the writeback, finding
/// the store changed under it, is refused). No page is ever committed to a store the device
/// no longer has: every page reads back, and `bd_count` is what the device's store holds.
#[test]
fn a_store_changed_during_a_writeback_never_strands_a_page() {
    const PAGES: u64 = 64;
    let store = || {
        let ram = MemoryDevice::new(Backing::size_for(PAGES * PS as u64)).unwrap();
        Backing::new(Arc::new(ram), WbFormat::Packed).unwrap()
    };
    let (mut swapped, mut refused) = (0, 0);
    for _ in 0..200 {
        let dev = device(PAGES, "lz4");
        fill(&dev, PAGES);
        dev.set_backing(Some(store())).unwrap();
        let barrier = Barrier::new(2);
        let written = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                barrier.wait();
                dev.writeback(PageSelector::All, None, None)
            });
            barrier.wait();
            let changed = match dev.set_backing(Some(store())) {
                Ok(()) => true,
                Err(ZramError::Busy(_)) => false,
                Err(e) => panic!("{e}"),
            };
            (changed, writer.join().unwrap())
        });
        verify(&dev, PAGES, |_| None);
        let on_store = dev.bd_stat().unwrap().bd_count;
        match written {
            // The change went first: the writeback wrote to the new store, or, finding the
            // store changed under it, nothing.
            (true, Ok(wb)) => {
                assert_eq!(on_store, wb.pages);
                swapped += 1;
            }
            (true, Err(ZramError::Busy(_))) => {
                assert_eq!(on_store, 0);
                swapped += 1;
            }
            // The change was refused: the writeback's pages were on the store by then.
            (false, Ok(wb)) => {
                assert!(
                    wb.pages > 0 && on_store == wb.pages,
                    "{wb:?}, {on_store} on the store"
                );
                refused += 1;
            }
            (changed, Err(e)) => panic!("writeback refused (store changed first: {changed}): {e}"),
        }
    }
    eprintln!("store changed first {swapped} times, refused {refused} times");
}

/// The interleaving the race above finds only now and then, forced: a writeback looks up
/// its store, the store is changed before the writeback has the store's gate, and the
/// writeback, once it has the gate, finds its store is no longer the device's and is
/// refused, writing nothing. A save holds the old store's gate (its writer stopped); the
/// change of store queues on the gate first, the writeback second, and parking_lot wakes
/// the writer first and, once it is done, the reader.
#[test]
fn a_writeback_whose_store_changed_before_its_gate_is_refused() {
    const PAGES: u64 = 64;
    let store = || {
        let ram = MemoryDevice::new(Backing::size_for(PAGES * PS as u64)).unwrap();
        Backing::new(Arc::new(ram), WbFormat::Packed).unwrap()
    };
    let dev = Arc::new(device(PAGES, "lz4"));
    fill(&dev, PAGES);
    dev.set_backing(Some(store())).unwrap();
    // A save holds the store's gate from its first write on.
    let mut out = common::StoppedSave::on_first_write();
    let gate = Arc::clone(&out.gate);
    let saver = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || dev.save_state(&mut out).map(|_| ()))
    };
    gate.wait_stopped(|| saver.is_finished());
    let new_store = store();
    let (tid, rx) = mpsc::channel();
    let change = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            tid.send(common::this_thread()).unwrap();
            dev.set_backing(Some(new_store))
        })
    };
    common::wait_until_asleep(rx.recv().unwrap(), || change.is_finished(), "the change");
    assert!(
        !change.is_finished(),
        "the change of store did not wait for the save"
    );
    let (tid, rx) = mpsc::channel();
    let writeback = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            tid.send(common::this_thread()).unwrap();
            dev.writeback(PageSelector::All, None, None)
        })
    };
    common::wait_until_asleep(
        rx.recv().unwrap(),
        || writeback.is_finished(),
        "the writeback",
    );
    assert!(
        !writeback.is_finished(),
        "the writeback did not wait for the save"
    );
    gate.release();
    saver.join().unwrap().unwrap();
    change.join().unwrap().unwrap();
    match writeback.join().unwrap() {
        Err(ZramError::Busy(why)) => assert_eq!(why, Busy::StoreChanged, "{why}"),
        other => panic!("a writeback to a store the device no longer has: {other:?}"),
    }
    // Nothing was written anywhere: the new store holds nothing, every page is in memory.
    assert_eq!(dev.bd_stat().unwrap().bd_count, 0);
    verify(&dev, PAGES, |_| None);
}

/// Writeback closed for good stays closed: a new store cannot be set in place of the closed
/// one (which would open writeback again), and no writeback runs.
#[test]
fn a_closed_writeback_takes_no_new_store() {
    let dev = device(16, "lz4");
    fill(&dev, 16);
    let store = || {
        let ram = MemoryDevice::new(Backing::size_for(16 * PS as u64)).unwrap();
        Backing::new(Arc::new(ram), WbFormat::Packed).unwrap()
    };
    dev.set_backing(Some(store())).unwrap();
    dev.close_writeback();
    assert!(matches!(
        dev.set_backing(Some(store())),
        Err(ZramError::Busy(_))
    ));
    assert!(matches!(
        dev.writeback(PageSelector::All, None, None),
        Err(ZramError::Busy(_))
    ));
    verify(&dev, 16, |_| None);
}
