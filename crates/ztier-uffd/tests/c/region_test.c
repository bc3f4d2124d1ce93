/* The C ABI's test: a 16 MiB region under a 2 MiB budget, every page written and read
 * back, the figures read, the region destroyed; then one made with a flag. Exit 0: passed; 77: userfaultfd is not
 * allowed here (skipped); else failed, with the reason on stderr. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ztier_uffd.h"

#define PAGE 4096

/* The layout this test was written against: 69 fields of 8 bytes, the histogram at field 31
 * (the library's side asserts the same size). */
_Static_assert(sizeof(ztier_region_stats) == 69 * 8, "ztier_region_stats's size");
_Static_assert(offsetof(ztier_region_stats, fault_latency_us) == 31 * 8, "the histogram");
_Static_assert(offsetof(ztier_region_stats, fault_thread_rung) == 65 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, reclaim_looks) == 66 * 8, "a field");
_Static_assert(offsetof(ztier_region_stats, reclaim_blocked_passes) == 68 * 8, "the last field");
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
    ztier_region_destroy(r);
    ztier_region_destroy(NULL);

    /* Told not to, a region makes none; a flag it does not know is refused. */
    if (ztier_region_create_flags(LEN, BUDGET, 2) != NULL || errno != EINVAL) {
        fprintf(stderr, "an unknown flag was not refused with EINVAL\n");
        return 1;
    }
    r = ztier_region_create_flags(LEN, BUDGET, ZTIER_REGION_NO_CPU_LATENCY_QOS);
    if (r == NULL) {
        fprintf(stderr, "ztier_region_create_flags: %s\n", strerror(errno));
        return 1;
    }
    m = ztier_region_ptr(r);
    m[0] = 1;
    s.size = sizeof s;
    if (ztier_region_get_stats(r, &s) != 0 || s.cpu_latency_qos_usable || s.cpu_latency_qos_holds) {
        fprintf(stderr, "a region told to make no CPU latency request made one\n");
        return 1;
    }
    ztier_region_destroy(r);
    return 0;
}
