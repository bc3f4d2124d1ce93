/* The C ABI's test: a 16 MiB region under a 2 MiB budget, every page written and read
 * back, the figures read, its budget left to size itself and its steps read, the region
 * destroyed; then one made with a flag, and one of 64 KiB compression units written and
 * read back under its budget. Exit 0: passed; 77: userfaultfd is not
 * allowed here (skipped); else failed, with the reason on stderr. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ztier_uffd.h"

#define PAGE 4096

/* The layout this test was written against: 86 fields of 8 bytes, the histogram at field 31
 * (the library's side asserts the same size). */
_Static_assert(sizeof(ztier_region_stats) == 86 * 8, "ztier_region_stats's size");
_Static_assert(offsetof(ztier_region_stats, fault_latency_us) == 31 * 8, "the histogram");
_Static_assert(offsetof(ztier_region_stats, fault_thread_rung) == 65 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, reclaim_looks) == 66 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, reclaim_blocked_passes) == 68 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, stall_us) == 69 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, autosize_fault_overhead_ns) == 79 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, copies_freed) == 83 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, fault_hold_pages) == 84 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, budget_held_faults) == 85 * 8, "the last field");
_Static_assert(sizeof(ztier_region_autosize) == 7 * 8, "ztier_region_autosize's size");
_Static_assert(sizeof(ztier_region_autosize_step) == 5 * 8, "a step's size");

/* The budget left to size itself under a cap of 4 MiB with a floor of 1 MiB, steps every
 * 10 ms: a bad config refused, then steps kept, each within the limits, faults held only
 * past the cap (and its margin of a sixteenth), then stopped, faults held past the budget
 * again. 0: passed. */
static int autosize(ztier_region *r) {
    ztier_region_autosize c;
    ztier_region_autosize_defaults(&c, 4u << 20);
    c.floor = 1u << 20;
    c.interval_ms = 10;
    ztier_region_autosize bad = c;
    bad.target_stall = 0;
    if (ztier_region_set_autosize(r, &bad) != -1 || errno != EINVAL) {
        fprintf(stderr, "a zero stall target was not refused with EINVAL\n");
        return 1;
    }
    if (ztier_region_set_autosize(r, &c) != 0) {
        fprintf(stderr, "ztier_region_set_autosize: %s\n", strerror(errno));
        return 1;
    }
    ztier_region_autosize_step steps[8];
    size_t kept = 0;
    for (int i = 0; i < 1000 && kept < 3; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        kept = ztier_region_autosize_history(r, steps, 8);
    }
    if (kept < 3) {
        fprintf(stderr, "the controller kept %zu steps in 10 s\n", kept);
        return 1;
    }
    size_t n = kept < 8 ? kept : 8;
    for (size_t i = 0; i < n; i++) {
        if (steps[i].budget_pages < 256 || steps[i].budget_pages > 1024 ||
            steps[i].state < ZTIER_REGION_AUTOSIZE_HOLDING ||
            steps[i].state > ZTIER_REGION_AUTOSIZE_GROWING ||
            (i > 0 && steps[i].at_ms < steps[i - 1].at_ms)) {
            fprintf(stderr, "step %zu: budget %llu pages, state %llu\n", i,
                    (unsigned long long)steps[i].budget_pages,
                    (unsigned long long)steps[i].state);
            return 1;
        }
    }
    ztier_region_stats s = {.size = sizeof s};
    if (ztier_region_get_stats(r, &s) != 0 || s.autosize_cap_pages != 1024 ||
        s.autosize_floor_pages != 256 || s.autosize_steps < kept || s.budget_pages > 1024 ||
        s.budget_pages < 256 || s.autosize_state == 0 || s.autosize_fault_overhead_ns == 0 ||
        s.autosize_fault_overhead_ns > 10 * 1000 * 1000 || s.fault_hold_pages != 1024 + 64) {
        fprintf(stderr,
                "autosize figures: cap %llu floor %llu steps %llu budget %llu overhead %llu ns, "
                "faults held past %llu\n",
                (unsigned long long)s.autosize_cap_pages,
                (unsigned long long)s.autosize_floor_pages,
                (unsigned long long)s.autosize_steps, (unsigned long long)s.budget_pages,
                (unsigned long long)s.autosize_fault_overhead_ns,
                (unsigned long long)s.fault_hold_pages);
        return 1;
    }
    s.size = sizeof s;
    if (ztier_region_set_autosize(r, NULL) != 0 || ztier_region_get_stats(r, &s) != 0 ||
        s.autosize_state != 0 || ztier_region_autosize_history(r, steps, 8) != 0 ||
        s.fault_hold_pages != s.budget_pages + s.budget_pages / 16) {
        fprintf(stderr, "the controller did not stop (faults held past %llu, budget %llu)\n",
                (unsigned long long)s.fault_hold_pages, (unsigned long long)s.budget_pages);
        return 1;
    }
    return 0;
}
#define LEN (16u << 20)
#define BUDGET (2u << 20)

static uint64_t word(size_t page, size_t w) {
    uint64_t x = page * 0x9E3779B97F4A7C15ull + w;
    return (w & 1) ? page : x ^ (x >> 29);
}

int main(void) {
    if (ztier_region_create(LEN, 100) != NULL || errno != EINVAL) {
        fprintf(stderr, "a budget under a page was not refused with EINVAL\n");
        return 1;
    }
    ztier_region *r = ztier_region_create(LEN, BUDGET);
    if (r == NULL) {
        if (errno == EPERM || errno == ENOSYS) {
            fprintf(stderr, "skipped: %s\n", strerror(errno));
            return 77;
        }
        fprintf(stderr, "ztier_region_create: %s\n", strerror(errno));
        return 1;
    }
    if (ztier_region_len(r) != LEN) {
        fprintf(stderr, "length %zu\n", ztier_region_len(r));
        return 1;
    }
    uint64_t *m = ztier_region_ptr(r);
    size_t words = PAGE / sizeof(uint64_t);
    for (size_t p = 0; p < LEN / PAGE; p++)
        for (size_t w = 0; w < words; w++)
            m[p * words + w] = word(p, w);
    for (size_t p = 0; p < LEN / PAGE; p++)
        for (size_t w = 0; w < words; w++)
            if (m[p * words + w] != word(p, w)) {
                fprintf(stderr, "page %zu word %zu differs\n", p, w);
                return 1;
            }
    ztier_region_stats s = {.size = sizeof s};
    if (ztier_region_get_stats(r, &s) != 0 || ztier_region_get_stats(r, NULL) != -1) {
        fprintf(stderr, "ztier_region_get_stats\n");
        return 1;
    }
    if (s.size != sizeof s) {
        fprintf(stderr, "the library filled %llu bytes of a %zu-byte ztier_region_stats\n",
                (unsigned long long)s.size, sizeof s);
        return 1;
    }
    /* The fields are where the header says: figures that must agree across the struct. */
    uint64_t timed = 0;
    for (int b = 0; b < ZTIER_REGION_LATENCY_BUCKETS; b++)
        timed += s.fault_latency_us[b];
    if (timed < s.faults + s.zero_faults + s.held_faults ||
        s.evictions != s.evictions_dirty + s.evictions_clean ||
        s.refaults < s.faults + s.fault_around_pages || s.refaults == 0 ||
        s.orig_data_size < s.stored_pages * PAGE / 2 || s.mem_used_max < s.mem_used_total ||
        s.reclaim_target_pages > s.budget_pages || s.written_back_pages != 0) {
        fprintf(stderr, "the figures disagree: timed %llu faults %llu+%llu+%llu evictions %llu "
                "(%llu dirty, %llu clean) refaults %llu around %llu\n",
                (unsigned long long)timed, (unsigned long long)s.faults,
                (unsigned long long)s.zero_faults, (unsigned long long)s.held_faults,
                (unsigned long long)s.evictions, (unsigned long long)s.evictions_dirty,
                (unsigned long long)s.evictions_clean, (unsigned long long)s.refaults,
                (unsigned long long)s.fault_around_pages);
        return 1;
    }
    /* A program built against an earlier, shorter struct gets its fields and nothing past
     * them; one built against a longer struct learns what was filled. */
    union {
        ztier_region_stats s;
        unsigned char bytes[sizeof(ztier_region_stats) + 64];
    } big;
    unsigned char *buf = big.bytes;
    ztier_region_stats *prefix = &big.s;
    memset(buf, 0xAA, sizeof big);
    uint64_t asked = 4 * sizeof(uint64_t);
    memcpy(buf, &asked, sizeof asked);
    if (ztier_region_get_stats(r, prefix) != 0 || prefix->size != asked ||
        prefix->pages != LEN / PAGE || buf[asked] != 0xAA) {
        fprintf(stderr, "a 32-byte ztier_region_stats was not filled as asked\n");
        return 1;
    }
    asked = sizeof big;
    memcpy(buf, &asked, sizeof asked);
    if (ztier_region_get_stats(r, prefix) != 0 || prefix->size != sizeof s ||
        buf[sizeof s] != 0xAA) {
        fprintf(stderr, "a longer ztier_region_stats was filled past the library's fields\n");
        return 1;
    }
    asked = 4;
    memcpy(buf, &asked, sizeof asked);
    if (ztier_region_get_stats(r, prefix) != -1 || errno != EINVAL) {
        fprintf(stderr, "a size under 8 bytes was not refused with EINVAL\n");
        return 1;
    }
    printf("pages %llu resident %llu stored %llu faults %llu evictions %llu mem_used %llu\n",
           (unsigned long long)s.pages, (unsigned long long)s.resident_pages,
           (unsigned long long)s.stored_pages, (unsigned long long)s.faults,
           (unsigned long long)s.evictions, (unsigned long long)s.mem_used_total);
    if (s.pages != LEN / PAGE || s.evictions == 0 || s.faults == 0 || s.stored_pages == 0) {
        fprintf(stderr, "the region never went over its budget\n");
        return 1;
    }
    if (s.resident_pages > s.budget_pages + 128) {
        fprintf(stderr, "resident %llu pages, budget %llu\n",
                (unsigned long long)s.resident_pages, (unsigned long long)s.budget_pages);
        return 1;
    }
    /* Faults came: the CPU latency request was taken, where the region may make one. */
    if (s.cpu_latency_qos_usable && s.cpu_latency_qos_holds == 0) {
        fprintf(stderr, "faults came and the CPU latency request was never taken\n");
        return 1;
    }
    if (autosize(r) != 0)
        return 1;
    ztier_region_destroy(r);
    ztier_region_destroy(NULL);

    /* Told not to, a region makes none; a flag it does not know is refused. Told to, a
     * region whose store is full (copies of more than half the pages the budget leaves out:
     * here all of them are out) keeps no copy of a page read back. */
    if (ztier_region_create_flags(LEN, BUDGET, 4) != NULL || errno != EINVAL) {
        fprintf(stderr, "an unknown flag was not refused with EINVAL\n");
        return 1;
    }
    r = ztier_region_create_flags(LEN, BUDGET,
                                  ZTIER_REGION_NO_CPU_LATENCY_QOS |
                                      ZTIER_REGION_FREE_COPIES_WHEN_FULL);
    if (r == NULL) {
        fprintf(stderr, "ztier_region_create_flags: %s\n", strerror(errno));
        return 1;
    }
    m = ztier_region_ptr(r);
    for (int pass = 0; pass < 2; pass++)
        for (size_t p = 0; p < LEN / PAGE; p++)
            for (size_t w = 0; w < words; w++) {
                if (pass == 0)
                    m[p * words + w] = word(p, w);
                else if (m[p * words + w] != word(p, w)) {
                    fprintf(stderr, "page %zu word %zu differs, copies freed\n", p, w);
                    return 1;
                }
            }
    s.size = sizeof s;
    if (ztier_region_get_stats(r, &s) != 0 || s.cpu_latency_qos_usable || s.cpu_latency_qos_holds) {
        fprintf(stderr, "a region told to make no CPU latency request made one\n");
        return 1;
    }
    if (s.copies_freed == 0 || s.faults == 0) {
        fprintf(stderr, "a full store freed no copy: %llu faults, %llu copies freed\n",
                (unsigned long long)s.faults, (unsigned long long)s.copies_freed);
        return 1;
    }
    ztier_region_destroy(r);

    /* A unit the device cannot have is refused; 64 KiB units read back what was written. */
    if (ztier_region_create_unit(LEN, BUDGET, 0, 12288) != NULL || errno != EINVAL) {
        fprintf(stderr, "a 12 KiB unit was not refused with EINVAL\n");
        return 1;
    }
    r = ztier_region_create_unit(LEN, BUDGET, 0, 65536);
    if (r == NULL) {
        fprintf(stderr, "ztier_region_create_unit: %s\n", strerror(errno));
        return 1;
    }
    m = ztier_region_ptr(r);
    for (size_t p = 0; p < LEN / PAGE; p++)
        for (size_t w = 0; w < words; w++)
            m[p * words + w] = word(p, w);
    for (size_t p = 0; p < LEN / PAGE; p++)
        for (size_t w = 0; w < words; w++)
            if (m[p * words + w] != word(p, w)) {
                fprintf(stderr, "64 KiB units: page %zu word %zu differs\n", p, w);
                return 1;
            }
    s.size = sizeof s;
    if (ztier_region_get_stats(r, &s) != 0 || s.evictions == 0 || s.faults == 0) {
        fprintf(stderr, "64 KiB units: nothing was evicted and read back\n");
        return 1;
    }
    /* A fault reads its whole unit once: at most one device read a unit's 16 pages brought
       back, and fewer than one a page. */
    uint64_t brought = s.faults + s.fault_around_pages;
    if (s.store_reads == 0 || s.store_reads >= brought) {
        fprintf(stderr, "64 KiB units: %llu device reads for %llu pages brought in\n",
                (unsigned long long)s.store_reads, (unsigned long long)brought);
        return 1;
    }
    ztier_region_destroy(r);
    return 0;
}
