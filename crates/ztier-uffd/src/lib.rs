//! Live memory with a RAM budget: a [`Region`] is an anonymous mapping registered with
//! userfaultfd whose cold pages are kept compressed in a zram device (region page `i` is
//! zram page `i`, reached through the device's public API only), so that at most a budget of
//! its pages is resident while the program sees all of it.
//!
//! Two threads serve a region (three while it is far over budget; and the fault thread's
//! guard where idle priority is usable, see below). The **fault thread** reads the userfaultfd's messages: a fault
//! on a page that is out is served by `UFFDIO_COPY` of its decompressed content, or by
//! `UFFDIO_ZEROPAGE` (a read) or a copy of zeros (a write) for a page never written or
//! dropped; the program's own `MADV_DONTNEED`/`MADV_FREE`, `munmap` and `mremap` arrive as
//! events (`UFFD_FEATURE_EVENT_REMOVE`, `_UNMAP`, `_REMAP`) and drop the stored copies they
//! make stale. It never reads or writes the region itself (a fault it took there would wait
//! for itself). The **reclaim thread** runs once the resident pages exceed the budget, and
//! on until they are a little under it (a sixteenth of the budget, at most 128 pages, so
//! that a program faulting pages in does not wake it again at each fault-around window): it
//! picks cold pages by a clock over the page table (a page faulted in gets a second chance),
//! stores them and drops them; while the region is far over its budget a second evictor
//! takes pages from the same clock beside it (two CPUs compressing), with its own part of
//! the pad.
//!
//! The fault thread keeps to the CPU of the thread that faults, and while a single thread
//! faults it runs at idle priority, so that the faulting thread, woken by the copy, stays
//! on that CPU: on a machine whose idle CPUs halt, a fault's two wake-ups across CPUs cost
//! ten times the rest of it. A guard thread ends idle priority when faults wait for it
//! (`placement.rs`, [`RegionConfig::idle_priority`]). When the two are apart all the same,
//! a CPU latency request the fault thread holds while faults come keeps idle CPUs polling
//! instead of halting, so the crossing costs little (`cpu_latency_qos.rs`,
//! [`RegionConfig::cpu_latency_qos`]; a thread of its own waits on the request's alarm).
//! While faults come, the fault thread waits for the next in a blocking read of the
//! descriptor rather than in `poll`, where the kernel allows it; other threads that need it
//! meanwhile ring it out (`bell.rs`).
//!
//! The measuring rig ([`rig`], not a region's) measures what a region is set beside: the floor
//! under a fault's latency on the machine at hand (the same round trip served by a bare
//! handler: [`rig::floor`]), the kernel's own path for the same pages ([`rig::pageout`]), and
//! the refaults of policies that see more than a region can ([`rig::oracle`]).
//!
//! # Reading order
//!
//! - `region.rs`: the public API ([`Region`]); `config.rs`: how a region is made
//!   ([`RegionConfig`]); `stats.rs`: its figures ([`RegionStats`]); `error.rs`: what it
//!   refuses ([`Error`]); `capi.rs`: the same for C (`include/ztier_uffd.h`).
//! - `page_state.rs`: a page's state, the table below as a type; `page_table.rs`: every
//!   page's state and lock, the gate, and the runs an evictor may move out.
//! - `shared.rs`: what the threads share, grouped by who uses it, and how it is made.
//! - `fault.rs`: the fault thread; `fault_around.rs`: a fault on a stored or zeroed page,
//!   with the neighbours it brings in; `reclaim.rs`: the evictors; `bell.rs`: how others get the
//!   fault thread out of its blocking read.
//! - `autosize.rs`: the stall clock (the region's own PSI "some") and the controller of a
//!   budget that sizes itself from it ([`AutosizeConfig`]).
//! - `placement.rs` and `cpu_latency_qos.rs`: where the fault thread runs, and the CPU
//!   latency request it holds while faults come.
//! - `mapping.rs` and `userfaultfd.rs`: the mappings (on `ztier_base::mapping`) and the
//!   system calls, the only modules that touch memory by address (with `capi.rs`'s C ABI,
//!   the only `unsafe` code; the scheduler's calls are `ztier_base::sched`'s).
//! - [`rig`]: what a region is measured against (not a region's).
//!
//! # The eviction protocol
//!
//! A page is taken out with `UFFDIO_MOVE` into a page of a landing pad (`Pad`, a mapping
//! registered with the same userfaultfd, each evictor moving into a part of its own): the
//! move clears the region's page-table entry and flushes the TLBs before the page appears in
//! the pad, so every write of the program lands either before the move (and is in the stored
//! copy) or after it (and faults, and waits).
//! The reclaim thread moves a run of neighbouring cold pages with one move (one TLB flush
//! for the run), each page locked. The copy in the pad is stable (no one else maps it), so
//! it is compressed from there with no write-protection pass, then the pad is emptied
//! (`MADV_DONTNEED`, a batch at a time; its last few present pages read first, so that the
//! frames the next faults' copies get are warm: `Shared::empty_pad`).
//! The classic alternative (write-protect, copy, `MADV_DONTNEED` the region page) would
//! send the handler a `REMOVE` event for its own drop, indistinguishable from the program's.
//!
//! Per page, a state (`PageState`, a byte of the page table, page_state.rs; changed only under
//! the page's lock):
//!
//! | state | the page-table entry | the store | a fault |
//! |---|---|---|---|
//! | empty | empty, or about to be (a drop whose event was read) | nothing | zeros |
//! | empty, zeroed | empty: an evictor found the page all zeros | nothing | zeros, a refault (a read: with the zeroed pages after it, fault_around.rs) |
//! | resident | present (maybe the zero page; write-protected if it came in with a clean unit's copy, fault_around.rs) | nothing | spurious: wake (nothing there: zeros); a write to one write-protected: the protection goes |
//! | resident, clean | present, write-protected | zram page `i`, the same bytes | a write: the copy goes, then the protection |
//! | stored | empty | zram page `i` | decompress, copy |
//! | held | empty | a heap copy (the store refused it) | copy |
//! | gone | a page the program's `mremap` moved onto the region: the program's own | nothing | wake |
//! | unmapped | unmapped or moved away by the program | nothing | (kept by `MREMAP_DONTUNMAP`) zeros |
//!
//! A resident page is also referenced or not: set when a fault brings it in, cleared once
//! by the clock before it evicts the page (a second chance).
//!
//! The races, and why each is safe:
//! - **Eviction against the program's writes**: the move is atomic (above).
//! - **A fault on a page under eviction**: the evictor holds the page's lock from before the
//!   move until the state says `STORED` (or the page is back); the fault thread waits for
//!   that lock, which is held across the run's move and the compressions of the run's pages
//!   up to its own (each page's released once it is settled, in page order), never across
//!   anything that waits for the fault thread.
//! - **The program's `MADV_DONTNEED`**: the kernel queues `REMOVE`, waits until it is read,
//!   then zaps. The fault thread reads and handles events under `gate` (write), before it
//!   serves any fault read after them: the stored copy is discarded and the page is `EMPTY`
//!   before anything can fault on it again, so nothing stale comes back. A fault on that
//!   page from another thread, served after the event is read and before the kernel zaps,
//!   maps zeros that the zap then removes: the table says resident with nothing mapped. So
//!   a missing page's fault on a page the table holds resident maps zeros (which is what
//!   the program reads there) rather than only waking the thread, which would fault again
//!   for ever; where the page is there after all (`EEXIST`), the fault was spurious.
//! - **`munmap` / `mremap` and a move from a stale address**: from before the kernel
//!   changes the address space until its event has been read, every `UFFDIO_*` of this
//!   descriptor fails with `EAGAIN` (the context's `mmap_changing`). An evictor checks the
//!   state and moves under `gate` (read), and the fault thread reads and handles the event
//!   under `gate` (write), so no move ever sees an address whose unmap it has not seen: a
//!   move never takes a page of a mapping the program put where the region was.
//!   `mremap` moves pages out of the region: their stored copies are copied to the new
//!   place, which is then unregistered (those pages leave the region and its budget).
//! - **`EAGAIN`** from a copy: the fault waits in a queue while the messages are read, then
//!   is served again from its (maybe changed) state. From a move: the page was not moved and
//!   stays resident; the batch ends.
//! - **`EEXIST`** from a copy: the page is present; the stored copy is stale and goes.
//! - **A store that fails** (the device's memory limit, its allocator): the page stays in
//!   memory, kept whole in the heap (`HELD`) until it is touched, when it is copied back; the
//!   error is counted and kept ([`Region::evict`] returns it). It is not moved back into
//!   the region at once: that move would need `gate`, which comes before the page lock the
//!   evictor holds.
//! - **The budget**: the reclaim thread evicts once the resident pages exceed it, down to
//!   its margin under it (a sixteenth of it, at most 128 pages); the fault thread holds
//!   faults that bring a page in back (in its queue, still reading messages) while the
//!   resident pages are more than the margin past it and the reclaim thread is making
//!   progress, and the reclaim thread wakes it after each batch. So the resident pages run
//!   past the budget by at most the margin, one faulting page and its fault-around window
//!   while reclaim catches up, and pages moved out sit in the pad until their batch ends.
//!   While the budget sizes itself the same holds of its cap instead (faults wait only
//!   past the cap and its margin, `Shared::hold_at_least_pages`): below the cap the budget
//!   is what the reclaim thread evicts to, not a limit faults wait on.
//! - **Dropping the region**: the evictors stop first (their drops of the pad need the
//!   fault thread), then the CPU latency request's alarm watcher (a ring of its is read by
//!   the fault thread, still running), then the fault thread, rung out of its read if parked
//!   (it reads every ring made before it ends); the userfaultfd is closed before the mappings are
//!   unmapped (an unmap with the descriptor open would wait for its `UNMAP` event to be read),
//!   and only the pages still the region's are unmapped: what the program unmapped or moved
//!   away may hold its own mappings since.
//!   Threads still touching the region must be gone: the safe API borrows the region.
//! - **`fork`**: the region and the pad are `MADV_DONTFORK`: a child does not have them.
//!
//! # Clean pages
//!
//! A page a *read* fault brings in from the store (with its fault-around neighbours) is
//! installed write-protected (`UFFDIO_COPY_MODE_WP`; the region is registered in
//! write-protect mode too) and keeps its copy in the store: its state says `RESIDENT` +
//! `CLEAN`. Evicting it again is only the move into the pad and the pad's drop: nothing
//! is compressed or written (`evictions_clean`). A *write* fault on a stored page brings it
//! in unprotected, its copy discarded (dirty, as are zero-filled and held pages).
//!
//! The program's first write to a clean page is a write-protect fault that the fault thread
//! serves, synchronously: under the page's lock it discards the copy and clears `CLEAN`,
//! then lifts the protection (`UFFDIO_WRITEPROTECT`), which wakes the writer. **The race
//! between that write and an evictor's decision**: the evictor reads `CLEAN` and moves the
//! page under the same page lock. The write cannot land before the fault thread has taken
//! that lock and discarded the copy (it waits in the kernel, the page still protected), so
//! either the evictor held the lock first and moved the page with no write in it (the
//! writer's fault then finds the page out, and is served as a write fault on a stored page:
//! the copy is its content), or the fault thread did, and the evictor finds the page dirty
//! and compresses what the move took, write included. No copy older than a write is ever
//! kept for a page that is present, so none is served after one.
//!
//! Why not `UFFD_FEATURE_WP_ASYNC` with `PAGEMAP_SCAN` (a write resolved in the kernel
//! without the handler, far cheaper than a fault's round trip): nothing orders such a write
//! against the evictor. A scan before the move can say "not written" and the write land
//! before the move; the move does not carry the write-protect bit into the pad, so after it
//! nothing tells whether the page was written, short of comparing it with its copy
//! (a decompression). The synchronous fault costs one handler round trip per page that is
//! read in and then written; a page faulted in by a write costs none.
//!
//! What else sees a clean page: the program's `MADV_DONTNEED`, `munmap` and `mremap`
//! discard its copy (`drop_stored`) like a stored page's; a page `mremap` moved out that was
//! clean is unprotected when written (its write-protect fault is outside the region) and the
//! new range's unregistering clears the protection; a copy that finds the page present
//! (`EEXIST`) makes it dirty. A user-mode-only userfaultfd cannot serve a write the kernel
//! makes (a `read(2)` into a clean page fails with `EFAULT`), as for missing pages. At
//! larger units a page an evictor found all zeros, inside a unit a fault reads, comes in
//! with the unit's copy, write-protected with it though it has no copy: its first write
//! costs the same fault (counted in `first_write_faults`), where the zero page mapped
//! apart would have been copied by the kernel on its own.
//!
//! **When the store is full** ([`RegionConfig::free_copies_when_full`]): a clean page's
//! copy is memory beside the page itself, which a budget set to save memory does not want.
//! The kernel keeps a page's swap slot after swap-in only while no more than half of swap
//! is used (`vm_swap_full()`), and zswap, whose store is memory, never keeps it (exclusive
//! loads). Told to, a region takes its store to be as large as the pages its budget leaves
//! out and full once it holds copies of more than half that many, stored or clean
//! (`Shared::frees_copies`; at page-sized units only, where a freed copy's memory goes
//! back at once). Then a read fault brings its pages in dirty (their copies freed, counted
//! in `copies_freed`), and the clock frees the copy of a clean page it gives a second
//! chance and lifts its protection, under the page's lock (vmscan's `folio_free_swap()` on
//! activation). A clean page the clock finds cold is evicted as before, its copy kept (it
//! is the page's content). A write already waiting on a page whose copy the clock frees is
//! woken by the lift; its fault, served later, finds the page present and dirty (the
//! protection only lifted again) or out, and brings it in dirty from what its eviction
//! took: no write is lost, and no freed copy is read. The copies grow only by dirty evictions: on a region all of whose
//! pages were written, the pages out are the room's worth less what runs past the budget
//! before the reclaim thread catches up (its margin and a fault-around window, at most
//! 191 pages) and the zero pages, so a budget more than a few hundred pages under every
//! page keeps its store full, and the pages it reads back no second copies. No compaction follows: the
//! evictions that go on under a full store take the freed slots again (the pool held
//! 1.05x its objects' bytes after a million copies freed at random: docs/diary.md,
//! 2026-11-30).
//!
//! # Compression units
//!
//! A region's device stores pages one by one by default (the kernel's zram); with
//! [`RegionConfig::unit_size`] of 16 or 64 KiB it stores units of 4 or 16 pages, each
//! compressed as one object (denser, and faster to compress). Region page `i` is still
//! zram page `i`, and a page's state still says where its content is; what changes:
//! - **A fault** from the store reads its unit whole, decompressed straight into the fault
//!   thread's buffer, and brings in the stored pages after the faulting one at least to
//!   its unit's end (the zeroed pages among them with the unit's copy, as pages of zeros;
//!   those in units of zeros after them as the zero page); a fault-around
//!   window always ends at a unit's end, so a sequential touch decompresses each unit once
//!   (`store_reads` counts the device reads).
//! - **Reclaim** takes runs up to a unit's end where the excess allows, and stores a run's
//!   written pages of one unit with one write: the whole unit where the run holds all of
//!   it, else one read-modify-write of the unit from its first written page to its last,
//!   which keeps the other pages' bytes (the stored and clean ones' copies, which change
//!   only under their own locks). Clean pages, and pages found empty or all zeros, write
//!   nothing of their own, as at page-sized units.
//! - **A dropped copy** (a page faulted in dirty, a clean page's first write) is not
//!   discarded on its own: that would be a read-modify-write of its unit. Its bytes stay in
//!   the unit, stale and never read (the page's state says its content is elsewhere), until
//!   the unit is written again; a unit none of whose pages needs its copy any more is
//!   discarded whole, by a dirty fault that brought it all in, and after the program's
//!   drops, unmaps and moves (checked under all the unit's page locks, so no evictor stores
//!   a page of it in between). A unit whose pages all came back dirty some other way keeps
//!   its stale object until then: memory, never content.
//!
//! # Lock order
//! `gate` (the fault thread's write while it reads and handles messages, and while it is
//! parked in its blocking read; an evictor's read while it checks pages and moves them or
//! frees a clean page's copy and lifts its protection, and `stats()`'s, each taken through
//! `gate_read`, which rings a parked fault thread out first: the ring waits for the fault
//! thread's next read, and its callers hold no lock the fault thread takes before that
//! read) → the page locks (`PageTable`, `page % STRIPES`) →
//! the zram device's own locks, and the held copies (a leaf). Page locks, several at once:
//! the fault thread takes a faulting page's and then its fault-around neighbours' in page
//! order, waiting for each (and, holding none, all of a unit's in page order to discard
//! it: `Shared::discard_unused_units`);
//! an evictor waits only for the first page of its run and takes the others with `try_lock`
//! (a run ends at the first it cannot have), so it never waits holding one, and no cycle
//! can form; everyone else holds one at a time. The reclaim signal's mutex and the
//! helper's are taken alone; `placement`'s guard's (its sleep) is a leaf, which the fault
//! thread may take under `gate` (`placement` is otherwise atomics); the CPU latency
//! request's reason (`cpu_latency_qos.rs`) is a leaf, which the fault thread may take under
//! `serving` or `gate` (when the device refuses a write). The bell (`bell.rs`) is atomics.
//! `Evictors::manual` (the pad part of [`Region::evict`]) is taken before `gate`, and held
//! while those pages are emptied, which waits for the fault thread to read the event (it
//! never takes that lock). `serving` (the fault thread's, while it serves) is taken before
//! the page locks; `stats()` takes it holding nothing. The last error's text is a leaf, and
//! so are the self-sizing budget's controller (`Shared::autosize`, taken alone by the
//! reclaim thread, `stats()`, `set_autosize` and `set_budget`) and its stall clock's second.

mod autosize;
mod bell;
mod capi;
mod config;
mod cpu_latency_qos;
mod error;
mod fault;
mod fault_around;
mod mapping;
mod page_state;
mod page_table;
mod placement;
mod reclaim;
mod region;
pub mod rig;
mod shared;
mod stats;
mod userfaultfd;

pub use autosize::{
    AutosizeConfig, AutosizeState, AutosizeStats, AutosizeStep, HISTORY as AUTOSIZE_HISTORY,
    MIN_GROW_PAGES, PPM,
};
pub use config::{RegionConfig, MAX_AROUND};
pub use cpu_latency_qos::NO_CPU_LATENCY_TARGET_US;
pub use error::{Error, Result, UnmovableReason};
pub use placement::MAX_BACKOFF as IDLE_PRIORITY_MAX_BACKOFF;
pub use region::{Region, RegionPolicy, EVICT_WAITS_OUT};
pub use shared::LATENCY_BUCKETS;
pub use stats::RegionStats;
pub use ztier_zram::{Backing, PageSelector, PolicyConfig, PolicyStats, WbFormat, WbResult};
