//! zram's readers of outside input: a saved state (damaged or crafted, with its pages in
//! memory or on a store) and the sysfs attributes' requests.

/// A zram device of `pages` 4 KiB pages on zsmalloc, compressing with lz4.
fn lz4_device(pages: u64) -> ztier_zram::Device {
    let pool = ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool");
    ztier_zram::Device::new(pages * 4096, "lz4".parse().expect("lz4"), Box::new(pool))
        .expect("device")
}

/// Before the first input, a pool kept for the process: the arena's helper thread starts
/// with the process's first arena and ends with its last, so without one kept alive each
/// input would start and end a thread (which LeakSanitizer, at exit, takes for leaks).
pub fn keep_arena_helper() {
    static KEPT: std::sync::OnceLock<ztier_pool::ZsPool> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool"));
}

/// A saved zram state as outside input: `ztier serve --state PATH` loads whatever file it is
/// pointed at. By the first byte: the rest is the whole state; or its body after a valid
/// header (a device of 16 pages of 4096 bytes, lz4, with zstd as its one secondary
/// algorithm); or, after that header, records made from it (indexes in order, any flags,
/// priority and kind, sizes that agree with the flags, objects of the input's bytes), so the
/// records' checks and the reads of what they install are reached at once; or a real state
/// whose pages are mostly written back to a packed store, loaded with a copy of that store,
/// the input's changes XORed into the one or the other (so the places, the units, the
/// store's header and its reopening are reached). The checksum is made good, so what the
/// loader meets is a crafted file, not only a damaged one.
///
/// A load ends in a summary or a refusal; a refused load leaves the device empty; a loaded
/// device reads every page, takes writes and discards, compacts and saves again with no
/// panic (a page whose bytes do not decompress is an error, not a panic), and its saved
/// state loads into a new device holding the same.
pub fn zram_state(data: &[u8]) {
    const PAGES: u64 = 16;
    const PAGE: usize = 4096;
    let device = || {
        let dev = lz4_device(PAGES);
        dev.set_recomp_algorithms(vec!["zstd".parse().expect("zstd")])
            .expect("secondary");
        dev
    };
    let dev = device();
    let mut state = Vec::new();
    let mode = data.first().map_or(0, |b| b % 4);
    if mode == 3 {
        return zram_state_on_store(&dev, &data[1..], device);
    }
    if mode != 0 {
        let name = |state: &mut Vec<u8>, s: &str| {
            state.extend((s.len() as u16).to_le_bytes());
            state.extend(s.as_bytes());
        };
        state.extend(b"ZTIERST1");
        state.extend(2u32.to_le_bytes());
        state.extend((PAGE as u32).to_le_bytes());
        state.extend(PAGES.to_le_bytes());
        state.extend(0u32.to_le_bytes());
        name(&mut state, &dev.algorithm().to_string());
        let secondary = dev.recomp_algorithms();
        state.push(secondary.len() as u8);
        for a in &secondary {
            name(&mut state, &a.to_string());
        }
        state.push(0); // no backing store
        if mode == 1 {
            state.extend(&data[1..]);
        } else {
            state_records(&mut state, &data[1..], PAGES, PAGE);
        }
    } else {
        state.extend(data);
    }
    state.extend(crc32fast::hash(&state).to_le_bytes());

    let loaded = dev.load_state(&mut &state[..]);
    check_loaded_state(&dev, loaded.is_ok(), device);
}

/// What [`zram_state`] holds of a device after a load: refused, nothing left; loaded, every
/// page read, the state saved again and loaded into `device()` equal, then writes, discards,
/// compaction and reads.
fn check_loaded_state(
    dev: &ztier_zram::Device,
    loaded: bool,
    device: impl Fn() -> ztier_zram::Device,
) {
    let pages = dev.pages();
    let mut page = vec![0u8; dev.page_size()];
    if !loaded {
        let m = dev.mm_stat();
        assert_eq!(
            (
                m.orig_data_size,
                m.compr_data_size,
                m.mem_used_total,
                m.same_pages,
                m.huge_pages
            ),
            (0, 0, 0, 0, 0),
            "a refused state left pages behind"
        );
        return;
    }
    for i in 0..pages {
        let _ = dev.read_page(i, &mut page);
    }
    // A device with a store would save a state naming that store; saved again here only
    // without one.
    if dev.bd_stat().is_none() {
        let mut saved = Vec::new();
        dev.save_state(&mut saved).expect("a loaded state saves");
        let again = device();
        again
            .load_state(&mut &saved[..])
            .expect("a state saved from a loaded one loads");
        assert_eq!(
            again.mm_stat(),
            dev.mm_stat(),
            "the state saved again holds the same pages"
        );
    }
    page.fill(0x5a);
    for i in (0..pages).step_by(3) {
        let _ = dev.write_page(i, &page);
    }
    for i in (1..pages).step_by(3) {
        let _ = dev.discard_page(i);
    }
    dev.compact();
    for i in 0..pages {
        let _ = dev.read_page(i, &mut page);
    }
    dev.reset();
    assert_eq!(dev.mm_stat().mem_used_total, 0);
}

/// Records for [`zram_state`] made from `data`, 8 bytes a record (and an object's bytes taken
/// from what follows): page indexes in order, then any of the flags' 7 bits, any priority,
/// a kind (same-filled or stored), a size the flags agree with; then the end mark.
fn state_records(state: &mut Vec<u8>, mut data: &[u8], pages: u64, page: usize) {
    let mut index = 0u64;
    while data.len() >= 8 && index < pages {
        let (r, rest) = data.split_at(8);
        data = rest;
        let size = (u16::from_le_bytes([r[4], r[5]]) as usize % page) + 1;
        // Same-filled or stored: the header says there is no store, so a record on one
        // would only ever be refused.
        let kind = 1 + r[3] % 2;
        let size = if kind == 1 { 0 } else { size };
        let flags = size as u64 | u64::from(r[1] & 0x7f) << 16 | u64::from(r[2] % 4) << 23;
        state.extend(index.to_le_bytes());
        state.extend(flags.to_le_bytes());
        state.extend(u32::from(r[6]).to_le_bytes());
        state.push(kind);
        match kind {
            1 => {
                state.extend(u64::from_le_bytes([r[7], r[0], r[1], r[2], 0, 0, 0, 0]).to_le_bytes())
            }
            2 => {
                state.extend((size as u16).to_le_bytes());
                let take = size.min(data.len());
                state.extend(&data[..take]);
                state.resize(state.len() + size - take, r[7]);
                data = &data[take..];
            }
            _ => {
                state.extend(u64::from_le_bytes([r[7], r[0], 0, 0, 0, 0, 0, 0]).to_le_bytes());
                state.extend((size as u16).to_le_bytes());
            }
        }
        index += 1 + u64::from(r[0] % 3);
    }
    state.extend(u64::MAX.to_le_bytes());
}

/// [`zram_state`]'s fourth kind of input: a real state of a device whose pages are mostly on
/// a packed store (made once), and a fresh copy of the store as the save left it; `data`'s
/// changes (a place of 4 bytes, a value to XOR) go into the state (its checksum made good)
/// or into the store (a store that lies: a remote one, a damaged file), then the state is
/// loaded with the store. A device loaded so is not saved again (its state would name the
/// store).
fn zram_state_on_store(
    dev: &ztier_zram::Device,
    data: &[u8],
    device: impl Fn() -> ztier_zram::Device,
) {
    use std::sync::{Arc, OnceLock};
    use ztier_blockdev::{memory::MemoryDevice, BlockDevice};
    use ztier_zram::{Backing, PageSelector, WbFormat};
    const PAGE: usize = 4096;
    // The saved state and the store's bytes as the save left them.
    static SAVED: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    let store_of = |bytes: &[u8]| {
        let store = MemoryDevice::new(bytes.len() as u64).expect("store");
        store.write_at(0, bytes, false).expect("store written");
        Arc::new(store) as Arc<dyn BlockDevice>
    };
    let (state, store_bytes) = SAVED.get_or_init(|| {
        let size = Backing::size_for(dev.pages() * PAGE as u64);
        let store = store_of(&vec![0u8; size as usize]);
        // A device like `dev` (made by the same `device`).
        let full = device();
        for i in 0..dev.pages() {
            let mut page = vec![(i % 5) as u8; PAGE];
            for (j, b) in page.iter_mut().enumerate().step_by(7) {
                *b = (i as usize * 31 + j) as u8;
            }
            full.write_page(i, &page).expect("write");
        }
        full.set_backing(Some(
            Backing::new(Arc::clone(&store), WbFormat::Packed).expect("backing"),
        ))
        .expect("set backing");
        full.mark_idle(None);
        let mut page = vec![0u8; PAGE];
        full.read_page(0, &mut page).expect("read");
        full.writeback(PageSelector::Idle, None, None)
            .expect("writeback");
        let mut state = Vec::new();
        full.save_state(&mut state).expect("save");
        let mut bytes = vec![0u8; size as usize];
        store.read_at(0, &mut bytes).expect("store read");
        (state, bytes)
    });
    let mut state = state.clone();
    let mut store_bytes = store_bytes.clone();
    let body = state.len() - 4;
    // The first byte: the changes go to the state (even) or to the store (odd: its header
    // and its segments, written-back pages among them).
    let (on_store, data) = match data.split_first() {
        Some((b, rest)) => (b & 1 == 1, rest),
        None => (false, data),
    };
    for change in data.chunks_exact(5) {
        let at = u32::from_le_bytes([change[0], change[1], change[2], change[3]]) as usize;
        if on_store {
            let len = store_bytes.len();
            store_bytes[at % len] ^= change[4];
        } else {
            state[at % body] ^= change[4];
        }
    }
    let crc = crc32fast::hash(&state[..body]);
    state[body..].copy_from_slice(&crc.to_le_bytes());
    let loaded =
        dev.load_state_with_store(&mut &state[..], store_of(&store_bytes), WbFormat::Packed);
    if loaded.is_err() {
        assert!(dev.bd_stat().is_none(), "a refused state left a store set");
    }
    check_loaded_state(dev, loaded.is_ok(), device);
}

/// The device's controls as `ztier serve`'s control socket takes them (`ztier ctl ATTR
/// VALUE`): `data` is a series of requests, split at 0xff bytes, each a byte naming an
/// attribute (a writable one, a readable one, or, past them, a name and value from the
/// input) and a value (its bytes read as the words and edge numbers the attributes take,
/// [`attr_value`], or as themselves), run in order on a device of 16 pages with a packed
/// backing store, half of them written. Every request ends in an answer or an error, never
/// a panic (an overflow included: fuzz builds check arithmetic), and every page still reads.
pub fn zram_attrs(data: &[u8]) {
    use std::sync::Arc;
    use ztier_blockdev::memory::MemoryDevice;
    use ztier_zram::{Backing, WbFormat};
    const PAGES: u64 = 16;
    const PAGE: usize = 4096;
    const WRITABLE: [&str; 9] = [
        "idle",
        "writeback",
        "writeback_limit",
        "writeback_limit_enable",
        "recomp_algorithm",
        "recompress",
        "compact",
        "mem_limit",
        "mem_used_max",
    ];
    const READABLE: [&str; 8] = [
        "mm_stat",
        "io_stat",
        "bd_stat",
        "debug_stat",
        "writeback_limit",
        "writeback_limit_enable",
        "recomp_algorithm",
        "backing_dev",
    ];
    let dev = lz4_device(PAGES);
    let store = Arc::new(MemoryDevice::new(Backing::size_for(PAGES * PAGE as u64)).expect("store"));
    dev.set_backing(Some(
        Backing::new(store, WbFormat::Packed).expect("backing"),
    ))
    .expect("set backing");
    for i in (0..PAGES).step_by(2) {
        let mut page = vec![(i % 7) as u8; PAGE];
        for (j, b) in page.iter_mut().enumerate().step_by(11) {
            *b = (i as usize + j) as u8;
        }
        dev.write_page(i, &page).expect("write");
    }
    for request in data.split(|&b| b == 0xff).take(32) {
        let Some((&which, value)) = request.split_first() else {
            continue;
        };
        let value = attr_value(&value[..value.len().min(64)]);
        let which = which as usize;
        if which < WRITABLE.len() {
            let _ = dev.store_attr(WRITABLE[which], &value);
        } else if which < WRITABLE.len() + READABLE.len() {
            let _ = dev.show_attr(READABLE[which - WRITABLE.len()]);
        } else if which & 1 == 0 {
            let (name, rest) = value.split_once(' ').unwrap_or((&value, ""));
            let _ = dev.store_attr(name, rest);
        } else {
            let _ = dev.show_attr(&value);
        }
    }
    let mut page = vec![0u8; PAGE];
    for i in 0..PAGES {
        dev.read_page(i, &mut page).expect("every page still reads");
    }
}

/// A control value from `bytes`: each byte below the table's length is a word or number the
/// attributes take (their keys, modes, edge numbers), any other is itself, so that values
/// like `page_indexes=2-18446744073709551615` are a few bytes away, not a few million runs.
fn attr_value(bytes: &[u8]) -> String {
    const WORDS: [&str; 32] = [
        "page=",
        "page_indexes=",
        "type=",
        "threshold=",
        "priority=",
        "algo=",
        "all",
        "idle",
        "huge",
        "huge_idle",
        "incompressible",
        "lz4",
        "zstd",
        "lzo-rle",
        "zstd:level=",
        "deflate",
        "0",
        "1",
        "2",
        "3",
        "63",
        "64",
        "4096",
        "4294967295",
        "4294967297",
        "18446744073709551615",
        "-",
        " ",
        "=",
        "K",
        "0x",
        "E",
    ];
    let mut value = String::new();
    for &b in bytes {
        match WORDS.get(b as usize) {
            Some(word) => value.push_str(word),
            None => value.push(b as char),
        }
    }
    value
}
