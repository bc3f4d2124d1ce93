/*
 * swapload: the guest's workload for scripts/vm-swap.sh. Fills an anonymous mapping larger
 * than the guest's RAM with real memory pages read from a corpus disk, touches it with a
 * working set (hot and cold pages), then reads every page back; every page is checked
 * against its checksum whenever it is touched.
 *
 *   swapload CORPUS_DEV MIB [TOUCHES] [HOT_PERCENT]
 *
 * CORPUS_DEV holds consecutive 4096-byte pages (read with O_DIRECT, so the corpus takes no
 * page cache). Page i of the mapping is corpus page i mod N; from the second copy of the
 * corpus on, a page that is not same-filled has its first 8 bytes XORed with the copy's
 * number, so no two pages of the mapping are alike unless the corpus made them so.
 *
 * The touch phase makes TOUCHES touches (default or 0: as many as the mapping has pages): 90 %
 * land on the hot set (HOT_PERCENT of the pages, default 25, spread over the mapping), 10 %
 * on the rest; one touch in four writes the page. A touch of a page mincore() says is not in
 * memory is a swap-in: its time (the first load) is recorded. The verify pass reads every
 * page in order.
 *
 * Prints one line, "VMSWAP key=value ...", and /proc/vmstat's pswpin/pswpout deltas; exits
 * 1 if any page came back different.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define CHUNK 256UL /* pages read from the corpus at once */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* A 64-bit hash of a page: cheap enough under emulation, sensitive to every word and its
 * place. */
static uint64_t page_hash(const uint64_t *p)
{
	uint64_t h = 0x243F6A8885A308D3ULL;
	for (size_t i = 0; i < PAGE / 8; i++)
		h = (h ^ p[i]) * 0x100000001B3ULL + i;
	return h ^ (h >> 29);
}

static int same_filled(const uint64_t *p)
{
	for (size_t i = 1; i < PAGE / 8; i++)
		if (p[i] != p[0])
			return 0;
	return 1;
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void vmstat(unsigned long long *in, unsigned long long *out)
{
	char name[64];
	unsigned long long v;
	FILE *f = fopen("/proc/vmstat", "r");
	*in = *out = 0;
	if (!f)
		return;
	while (fscanf(f, "%63s %llu", name, &v) == 2) {
		if (!strcmp(name, "pswpin"))
			*in = v;
		else if (!strcmp(name, "pswpout"))
			*out = v;
	}
	fclose(f);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: swapload CORPUS_DEV MIB [TOUCHES] [HOT_PERCENT]\n");
		return 2;
	}
	size_t npages = strtoull(argv[2], NULL, 0) * (1048576 / PAGE);
	size_t touches = argc > 3 ? strtoull(argv[3], NULL, 0) : 0;
	size_t hot_pct = argc > 4 ? strtoull(argv[4], NULL, 0) : 25;
	int fd = open(argv[1], O_RDONLY | O_DIRECT);
	if (fd < 0) {
		perror(argv[1]);
		return 2;
	}
	off_t bytes = lseek(fd, 0, SEEK_END);
	size_t ncorp = bytes / PAGE;
	if (touches == 0)
		touches = npages;
	if (ncorp == 0 || npages == 0 || hot_pct == 0 || hot_pct > 100) {
		fprintf(stderr, "swapload: empty corpus, mapping or hot set\n");
		return 2;
	}
	unsigned char *mem = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint64_t *sums = calloc(npages, sizeof *sums);
	uint32_t *lat = calloc(touches + 1, sizeof *lat); /* swap-in times, 0.1 us units */
	if (mem == MAP_FAILED || !sums || !lat) {
		perror("swapload: memory");
		return 2;
	}
	madvise(mem, npages * PAGE, MADV_NOHUGEPAGE);
	unsigned long long in0, out0, in1, out1;
	vmstat(&in0, &out0);
	size_t bad = 0;

	/* Fill. */
	double t0 = now();
	for (size_t i = 0; i < npages;) {
		size_t at = i % ncorp, n = CHUNK;
		if (n > ncorp - at)
			n = ncorp - at;
		if (n > npages - i)
			n = npages - i;
		ssize_t got = pread(fd, mem + i * PAGE, n * PAGE, (off_t)(at * PAGE));
		if (got != (ssize_t)(n * PAGE)) {
			perror("swapload: corpus read");
			return 2;
		}
		uint64_t copy = i / ncorp;
		for (size_t k = i; k < i + n; k++) {
			uint64_t *p = (uint64_t *)(mem + k * PAGE);
			if (copy && !same_filled(p))
				p[0] ^= copy * 0x9E3779B97F4A7C15ULL;
			sums[k] = page_hash(p);
		}
		i += n;
	}
	double t1 = now();

	/* Touch: a working set. Hot pages are those whose index mod 100 is under hot_pct. */
	size_t nhot = 0, ncold = 0, faults = 0, writes = 0;
	for (size_t i = 0; i < npages; i++)
		(i % 100 < hot_pct) ? nhot++ : ncold++;
	for (size_t t = 0; t < touches; t++) {
		uint64_t r = next();
		size_t i;
		if (ncold == 0 || (nhot && r % 10 != 0)) {
			size_t k = (r >> 8) % nhot; /* the k-th hot page */
			i = (k / hot_pct) * 100 + k % hot_pct;
		} else {
			size_t k = (r >> 8) % ncold; /* the k-th cold page */
			i = (k / (100 - hot_pct)) * 100 + hot_pct + k % (100 - hot_pct);
		}
		uint64_t *p = (uint64_t *)(mem + i * PAGE);
		unsigned char inmem = 1;
		mincore(p, PAGE, &inmem);
		uint64_t a = now_ns();
		*(volatile uint64_t *)p;
		uint64_t b = now_ns();
		if (!(inmem & 1)) {
			uint64_t d = (b - a) / 100;
			lat[faults++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
		}
		if (page_hash(p) != sums[i]) {
			if (bad < 10)
				fprintf(stderr, "swapload: page %zu differs (touch)\n", i);
			bad++;
		}
		if ((r >> 4) % 4 == 0) {
			p[1 + (r >> 20) % 500] += 1 + (r >> 32);
			sums[i] = page_hash(p);
			writes++;
		}
	}
	double t2 = now();

	/* Verify every page. */
	for (size_t i = 0; i < npages; i++) {
		if (page_hash((uint64_t *)(mem + i * PAGE)) != sums[i]) {
			if (bad < 10)
				fprintf(stderr, "swapload: page %zu differs (verify)\n", i);
			bad++;
		}
	}
	double t3 = now();
	vmstat(&in1, &out1);

	qsort(lat, faults, sizeof *lat, cmp_u32);
	double p50 = faults ? lat[faults / 2] / 10.0 : 0;
	double p99 = faults ? lat[(size_t)(faults * 0.99)] / 10.0 : 0;
	double mean = 0;
	for (size_t k = 0; k < faults; k++)
		mean += lat[k] / 10.0;
	mean = faults ? mean / faults : 0;
	printf("VMSWAP pages=%zu corpus_pages=%zu touches=%zu writes=%zu hot_pages=%zu "
	       "fill_s=%.2f touch_s=%.2f verify_s=%.2f total_s=%.2f swapins_timed=%zu "
	       "swapin_p50_us=%.1f swapin_p99_us=%.1f swapin_mean_us=%.1f pswpin=%llu pswpout=%llu "
	       "mismatches=%zu\n",
	       npages, ncorp, touches, writes, nhot, t1 - t0, t2 - t1, t3 - t2, t3 - t0, faults, p50,
	       p99, mean, in1 - in0, out1 - out0, bad);
	fflush(stdout);
	return bad ? 1 : 0;
}
