/* ztier_uffd.h: a userfaultfd region with a RAM budget, for C and C++ programs.
 *
 * A region is an anonymous mapping whose pages beyond a budget are kept compressed (lz4 on
 * zsmalloc, in a zram device of ztier's) and brought back when touched. Link with
 * -lztier_uffd (the crate's cdylib). The process needs userfaultfd: root (CAP_SYS_PTRACE),
 * vm.unprivileged_userfaultfd=1, or access to /dev/userfaultfd; else only faults taken in
 * user mode are served, and a system call reading or writing an evicted page fails with
 * EFAULT. Linux 6.8 or later (UFFDIO_MOVE). The region is not inherited by fork's child.
 * While faults come (until 10 ms pass with none), a region holds a CPU latency request of
 * 0 us through /dev/cpu_dma_latency where it may open it (root): every idle CPU of the
 * machine then polls instead of halting, so that a fault whose two threads the scheduler put
 * on different CPUs does not wait for a halted CPU to wake (on a VM, 50-80 us instead of
 * 8-10). It costs power (on a VM, host CPU time); ZTIER_REGION_NO_CPU_LATENCY_QOS turns it
 * off. A child forked (without exec) while the request is held shares it: if the parent is
 * killed then, the child keeps it until it exits or execs.
 * Every function may be called from any thread; destroy only once no thread uses the
 * region.
 */
#ifndef ZTIER_UFFD_H
#define ZTIER_UFFD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ztier_region ztier_region;

/* Buckets of fault_latency_us: bucket 0 under 1 us, bucket k from 2^(k-1) to 2^k us, the
 * last everything longer. */
#define ZTIER_REGION_LATENCY_BUCKETS 16

/* The region's figures (RegionStats in Rust). Set `size` to sizeof(ztier_region_stats)
 * before ztier_region_get_stats: the library fills that many bytes at most, fields from the
 * start, and sets `size` to the bytes it filled. A program built against this header keeps
 * working with a later library (whose struct only grows at the end), and one built against
 * a later header learns from `size` which fields an earlier library left unfilled. */
typedef struct ztier_region_stats {
    uint64_t size;             /* in: the caller's sizeof; out: the bytes filled */
    uint64_t pages;
    uint64_t budget_pages;
    uint64_t resident_pages;   /* present in the region */
    uint64_t stored_pages;     /* held compressed */
    uint64_t held_pages;       /* refused by the store, held whole until touched */
    uint64_t faults;           /* served from the store (the faulting page) */
    uint64_t zero_faults;      /* served with zeros */
    uint64_t evictions;        /* dropped with a copy in the store: dirty + clean */
    uint64_t zero_evictions;   /* found all zeros: dropped, nothing stored */
    uint64_t evict_failures;   /* refused by the store */
    uint64_t removed_pages;    /* dropped by the program (MADV_DONTNEED) */
    uint64_t unmapped_pages;   /* unmapped by the program */
    uint64_t compr_data_size;  /* bytes of compressed data held (mm_stat) */
    uint64_t mem_used_total;   /* bytes of memory the store holds (mm_stat) */
    uint64_t clean_pages;      /* resident, read in from the store, not written since */
    uint64_t evictions_clean;  /* of evictions: clean pages dropped, nothing written */
    uint64_t cpu_latency_qos_usable; /* 1: the region can make its CPU latency request */
    uint64_t cpu_latency_qos_held;   /* 1: it holds it now */
    uint64_t cpu_latency_qos_holds;  /* times it was taken, once a spell of faults */
    uint64_t reclaim_target_pages;   /* where an eviction pass stops, under the budget */
    uint64_t held_faults;      /* served from a held copy */
    uint64_t spurious_faults;  /* on a page already present: nothing brought in */
    uint64_t first_write_faults; /* first writes to clean pages: their copies discarded */
    uint64_t evictions_dirty;  /* of evictions: compressed and written to the store */
    uint64_t remapped_pages;   /* moved out of the region by the program's mremap */
    uint64_t poisoned_pages;   /* whose copy could not be read: a touch raises SIGBUS */
    uint64_t deferred_faults;  /* served late (address space changing, over budget) */
    uint64_t fault_around_pages; /* installed beside a faulting page */
    uint64_t refaults;         /* pages brought back in after the region evicted them */
    uint64_t written_back_pages; /* copies on the device's backing store (bd_count) */
    uint64_t fault_latency_us[ZTIER_REGION_LATENCY_BUCKETS]; /* every fault served */
    uint64_t orig_data_size;   /* bytes of pages held (mm_stat) */
    uint64_t mem_used_max;     /* mem_used_total's peak (mm_stat) */
    uint64_t same_pages;       /* held as one repeated word, no memory (mm_stat) */
    uint64_t huge_pages;       /* held uncompressed (mm_stat) */
    uint64_t mem_limit;        /* the store's memory limit in bytes, 0: none (mm_stat) */
    uint64_t pages_compacted;  /* pages compaction gave back (mm_stat) */
    uint64_t huge_pages_since; /* pages stored uncompressed since the device was made */
    uint64_t idle_priority_usable;    /* 1: the fault thread may run at idle priority */
    uint64_t idle_priority;           /* 1: it does now */
    uint64_t idle_priority_demotions; /* times idle priority was ended for waiting faults */
    uint64_t fault_thread_moves;      /* times the fault thread moved to a faulting CPU */
    /* The device's backing store (bd_stat), 0 without one: */
    uint64_t bd_reads;         /* reads from the store (a packed segment is one) */
    uint64_t bd_writes;        /* 4 KiB blocks written to it */
    uint64_t bd_bytes_written;
    uint64_t bd_bytes_stored;  /* bytes of live copies on it */
    uint64_t bd_bytes_held;    /* bytes of blocks or segments held on it */
    uint64_t bd_failed_writebacks; /* writebacks the store refused: pages kept in memory */
    uint64_t parked_reads;     /* the fault thread's waits parked in a blocking read */
    uint64_t fault_thread_rung; /* times another thread rang it out of such a wait */
    uint64_t reclaim_looks;    /* times the reclaim thread looked at the region */
    uint64_t reclaim_blocked;  /* 1: over budget, nothing evictable (locked or read-only
                                * pages: ztier_region_last_error says which); reclaim backs off */
    uint64_t reclaim_blocked_passes; /* reclaim batches that could evict nothing so */
    uint64_t stall_us;         /* time some thread waited on a fault (the region's PSI "some") */
    uint64_t stall_share_ppm;  /* its share of the last whole second, parts per million */
    /* The self-sizing budget (ztier_region_set_autosize), all 0 while it is off: */
    uint64_t autosize_state;   /* ZTIER_REGION_AUTOSIZE_HOLDING, _SHRINKING, _GROWING */
    uint64_t autosize_target_ppm; /* the stall share it steers to */
    uint64_t autosize_floor_pages;
    uint64_t autosize_cap_pages;  /* the budget is never above it */
    uint64_t autosize_steps;   /* the controller's steps, and of them: */
    uint64_t autosize_shrinks; /* those that lowered the budget */
    uint64_t autosize_grows;   /* those that raised it */
    uint64_t store_reads;      /* device reads by faults: one decompression of a whole
                                  compression unit each, serving every stored page of it
                                  the fault brings in */
    uint64_t autosize_fault_overhead_ns; /* what the stall clock adds a fault served while
                                            the budget sizes itself (measured on this
                                            machine: the bare round trip's median) */
    uint64_t lost_pages;       /* resident pages an eviction's UFFDIO_MOVE found gone
                                  (ENOENT) and not in the pad: they read back as zeros;
                                  0 unless the kernel dropped a page behind the region */
    uint64_t unreported_moves; /* pages UFFDIO_MOVE moved into the pad and said it had
                                  not (Linux 6.18, after a retried step), found there
                                  and stored */
    uint64_t vanished_pages;   /* faults on pages the region held resident with nothing
                                  mapped there: mapped with zeros (a page the program
                                  dropped while another of its threads touched it) */
    uint64_t copies_freed;     /* copies of pages read in that a full store freed
                                  (ZTIER_REGION_FREE_COPIES_WHEN_FULL) */
    uint64_t fault_hold_pages; /* resident pages past which faults wait for reclaim:
                                  the budget plus its margin; while the budget sizes
                                  itself, the cap plus its margin */
    uint64_t budget_held_faults; /* of deferred_faults: held past fault_hold_pages */
} ztier_region_stats;

/* autosize_state and ztier_region_autosize_step's state: what the last step decided. */
#define ZTIER_REGION_AUTOSIZE_HOLDING 1u   /* the stall within the band: budget unchanged */
#define ZTIER_REGION_AUTOSIZE_SHRINKING 2u /* under it: budget lowered, evicting down to it */
#define ZTIER_REGION_AUTOSIZE_GROWING 3u   /* over it: budget raised */

/* A budget that sizes itself from the region's stall share (AutosizeConfig in Rust). Each
 * interval: a stall share under target_stall * (1 - band) lowers the budget by shrink_step of
 * what is in use; over target_stall * (1 + band) raises it by grow_step of it for each target
 * over (at most 8, at least 16 pages); within, it holds. The budget stays within
 * [floor, cap] (bytes; at least one page). */
typedef struct ztier_region_autosize {
    double target_stall;  /* a share of wall time: 0.001 is 0.1 % */
    double band;          /* 0 to 1 */
    uint64_t cap;
    uint64_t floor;
    double shrink_step;   /* 0 to 1 */
    double grow_step;     /* over 0, at most 8 */
    uint64_t interval_ms; /* 10 ms to an hour */
} ztier_region_autosize;

/* One step of the controller. */
typedef struct ztier_region_autosize_step {
    uint64_t at_ms;          /* since the region was made */
    uint64_t stall_ppm;      /* the stall share over the interval that ended here */
    uint64_t resident_pages;
    uint64_t budget_pages;   /* the budget the step set */
    uint64_t state;          /* ZTIER_REGION_AUTOSIZE_* */
} ztier_region_autosize_step;

/* ztier_region_create_flags: make no CPU latency request while faults come. */
#define ZTIER_REGION_NO_CPU_LATENCY_QOS 1u
/* ztier_region_create_flags: once the store is full (copies of more than half the pages the
 * budget leaves out), pages read in come in without keeping their copies, and the clock
 * frees the copies of the clean pages it gives a second chance; page-sized units only
 * (RegionConfig::free_copies_when_full; copies_freed). */
#define ZTIER_REGION_FREE_COPIES_WHEN_FULL 2u

/* A region of `length` bytes (a whole number of pages) of which at most `budget` bytes
 * (at least one page) are resident. NULL on failure, with errno: EINVAL (length or budget),
 * EPERM (userfaultfd not allowed), ENOSYS (the kernel lacks UFFDIO_MOVE), ENOMEM. */
ztier_region *ztier_region_create(size_t length, size_t budget);

/* As ztier_region_create, with flags (ZTIER_REGION_*, or'ed); EINVAL for a flag
 * it does not know. */
ztier_region *ztier_region_create_flags(size_t length, size_t budget, uint32_t flags);

/* As ztier_region_create_flags, its pages stored in compression units of `unit_size` bytes:
 * 4096 (what the others make), 16384 or 65536, each unit compressed as one object (denser)
 * and decompressed once for the pages a fault brings in with it. EINVAL for another size. */
ztier_region *ztier_region_create_unit(size_t length, size_t budget, uint32_t flags,
                                       size_t unit_size);

/* The region's first byte; the memory lives until ztier_region_destroy. */
void *ztier_region_ptr(const ztier_region *region);

size_t ztier_region_len(const ztier_region *region);

/* Fills *out up to out->size bytes (set it first); 0, or -1 with errno EINVAL for a NULL
 * argument or a size under 8. */
int ztier_region_get_stats(const ztier_region *region, ztier_region_stats *out);

/* The last error the region's threads met (a store that refused a page, pages that cannot
 * be evicted and why), as text: copied into buf (at most len - 1 bytes and a NUL, if len >
 * 0), its whole length returned as snprintf does; 0 if none. */
size_t ztier_region_last_error(const ztier_region *region, char *buf, size_t len);

/* The defaults under a cap of `cap` bytes: a 0.1 % stall target, a band of half of it,
 * steps of 2 % down and 10 % up, each second, no floor but a page. */
void ztier_region_autosize_defaults(ztier_region_autosize *out, uint64_t cap);

/* Lets the budget size itself as `config` says, from where it is now (brought within the
 * floor and cap), or stops that (NULL: the budget stays where it was left). 0, or -1 with
 * errno EINVAL for a NULL region or a config outside its rule. */
int ztier_region_set_autosize(ztier_region *region, const ztier_region_autosize *config);

/* The controller's last steps (at most 256 are kept), oldest first: the newest `max` of them
 * copied to out; returns how many are kept (0 while the budget does not size itself), as
 * snprintf does. */
size_t ztier_region_autosize_history(const ztier_region *region,
                                     ztier_region_autosize_step *out, size_t max);

/* Stops the region's threads and unmaps it. NULL is ignored. */
void ztier_region_destroy(ztier_region *region);

#ifdef __cplusplus
}
#endif

#endif
