//! The measuring rig (`ztier_uffd::rig`) on this machine: the floor's bare handler serves
//! every touch, on one CPU, on two and placed as a region's fault thread; the bare unit
//! handler brings every page in where it belongs; the kernel's own
//! path for a region's pages is measured where it exists and refused, saying why, where
//! not.

mod common;

use common::{region, PAGE};

#[test]
fn the_floors_bare_handler_serves_every_touch_on_one_cpu_on_two_and_placed_as_a_region() {
    // A region first, so a process that may not use userfaultfd skips here as everywhere;
    // whether its fault thread may use idle priority (it may leave it again: root here).
    let Some(idle_priority) = region(PAGE, PAGE).map(|r| r.stats().idle_priority_usable) else {
        return;
    };
    let _dog = common::Watchdog::new(common::WATCHDOG);
    let floor = ztier_uffd::rig::floor::bare_fault_latency(300).unwrap();
    assert_eq!(floor.one_cpu.len(), 300);
    assert!(floor.one_cpu.iter().all(|d| !d.is_zero()));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match &floor.two_cpus {
        Some(two) => assert_eq!(two.len(), 300),
        None => assert_eq!(cpus, 1, "two CPUs usable but none measured"),
    }
    // With a CPU latency request too, where the process may make one (root).
    let may_request = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok();
    match &floor.two_cpus_latency_qos {
        Some(two) => assert_eq!(two.len(), 300),
        None => assert!(
            cpus == 1 || !may_request,
            "a request could be made but none measured"
        ),
    }
    // Placed as a region's fault thread places itself, where a region's fault thread may
    // use idle priority and there are two CPUs.
    match &floor.placed_as_region {
        Some(placed) => {
            assert_eq!(placed.len(), 300);
            assert!(placed.iter().all(|d| !d.is_zero()));
        }
        None => assert!(
            cpus == 1 || !idle_priority,
            "idle priority usable on two CPUs but no placed floor measured"
        ),
    }
}

/// The bare handler's fault-in of whole units brings every page in where it belongs, a
/// unit of zeros as zeros, in few faults (a window each), at the page and at 16 pages a
/// unit, write-protected or not; a unit it cannot read ends the pass with that error.
#[test]
fn the_bare_unit_handler_brings_every_page_in_where_it_belongs() {
    use ztier_uffd::rig::unit_fault_in::{sequential_fault_in, UnitRead};
    if region(PAGE, PAGE).is_none() {
        return;
    }
    let _dog = common::Watchdog::new(common::WATCHDOG);
    let ps = ztier_base::os::page_size();
    // Not a whole number of units, every fifth unit all zeros.
    let pages = 1000;
    for (unit_pages, write_protect) in [(1, false), (16, true), (16, false)] {
        let zeros = |u: usize| u % 5 == 3;
        let first_byte = |page: usize| (page % 251 + 1) as u8;
        let expected: u64 = (0..pages)
            .filter(|&q| !zeros(q / unit_pages))
            .map(|q| u64::from(first_byte(q)))
            .sum();
        let mut reads = 0;
        let pass = sequential_fault_in(
            pages,
            unit_pages,
            63,
            write_protect,
            true,
            false,
            |u, buf| {
                reads += 1;
                assert_eq!(buf.len(), unit_pages * ps);
                if zeros(u) {
                    return Ok(UnitRead::Zeros);
                }
                for (k, page) in buf.chunks_exact_mut(ps).enumerate() {
                    page.fill(0xee);
                    page[0] = first_byte(u * unit_pages + k);
                }
                Ok(UnitRead::Content)
            },
        )
        .unwrap();
        assert_eq!(pass.pages_in, pages as u64, "unit of {unit_pages} pages");
        assert_eq!(pass.first_bytes_sum, expected, "unit of {unit_pages} pages");
        // Each unit read once; a window of 63 pages after each fault, so about one fault
        // in 64 pages (and one more each on a page of the window not in yet).
        assert_eq!(
            reads,
            pages.div_ceil(unit_pages),
            "unit of {unit_pages} pages"
        );
        assert!(pass.faults >= (pages / 80) as u64, "{} faults", pass.faults);
        assert!(pass.faults <= (pages / 20) as u64, "{} faults", pass.faults);
        assert!(pass.seconds > 0.0);
    }
    let failed = sequential_fault_in(64, 16, 63, false, true, false, |u, _| match u {
        2 => Err("the store is gone".to_string()),
        _ => Ok(UnitRead::Zeros),
    });
    let e = failed.unwrap_err().to_string();
    assert!(e.contains("the store is gone"), "{e}");
}

/// The kernel's own path for a region's pages: where swap and zswap are on, every page comes
/// back equal (the function checks) with every touch timed; elsewhere it refuses, naming
/// what is missing. Uneven lengths are refused either way. (CI has swap off: there the
/// refusal is what runs; a machine with both on runs the measurement.)
#[test]
fn the_kernels_pageout_path_is_measured_where_it_exists_and_refused_where_not() {
    let ps = ztier_base::os::page_size();
    let pages = 64;
    let mut data = vec![0u8; pages * ps];
    for (i, page) in data.chunks_mut(ps).enumerate().skip(1) {
        // Compressible and distinct (page 0 stays all zero: never drawn for a latency).
        for (j, b) in page.iter_mut().enumerate() {
            *b = ((i * 7 + j / 64) % 251) as u8;
        }
    }
    assert!(matches!(
        ztier_uffd::rig::pageout::kernel_pageout(&data[..ps + 1], 4),
        Err(ztier_uffd::rig::pageout::PageoutError::BadPages { .. })
    ));
    let zswap_on = std::fs::read_to_string("/sys/module/zswap/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    let swap_on = std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1);
    match ztier_uffd::rig::pageout::kernel_pageout(&data, 16) {
        Ok(k) => {
            assert!(
                swap_on && zswap_on,
                "measured with swap {swap_on}, zswap {zswap_on}"
            );
            assert_eq!((k.pages, k.page_size), (pages, ps));
            assert!(k.left_resident < pages, "nothing went out: {k:?}");
            assert!(!k.compressor.is_empty());
            // A page that will not go out is passed over, but most do.
            assert!(!k.latency.is_empty() && k.latency.len() <= 16, "{k:?}");
        }
        Err(ztier_uffd::rig::pageout::PageoutError::Missing(why)) => {
            use ztier_uffd::rig::pageout::NoKernelPath as Why;
            // With both on, only a full swap device (or pages kept in) refuses.
            let expected = match (zswap_on, swap_on) {
                (false, _) => matches!(why, Why::ZswapOff { .. } | Why::NoZswap { .. }),
                (true, false) => matches!(why, Why::NoSwap),
                (true, true) => matches!(
                    why,
                    Why::SwapTooSmall { .. } | Why::NothingMoved | Why::WentToSwapDevice { .. }
                ),
            };
            assert!(expected, "zswap {zswap_on}, swap {swap_on}: {why}");
        }
        Err(e) => panic!("{e}"),
    }
}
