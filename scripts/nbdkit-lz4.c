/* An nbdkit plugin that keeps a RAM disk as lz4-compressed 4 KiB pages: the reference
 * scripts/nbd-bench.sh measures `ztier serve --compressor lz4` against for doing the same
 * job (each page compressed on write, decompressed on read) in nbdkit's server.
 *
 * It is nbdkit's memory plugin with allocator=sparse (one read-write lock over the whole
 * array, reads in parallel under it; pages that are all zeros are holes, reported as such
 * by extents) with one change: a page's bytes are kept as liblz4 compressed them
 * (LZ4_compress_default), or as they are when that would not save anything, and a read
 * decompresses them (LZ4_decompress_safe) straight into the reply's buffer.
 *
 * Build:  cc -O2 -shared -fPIC -o nbdkit-lz4.so scripts/nbdkit-lz4.c -llz4
 * Run:    nbdkit -U SOCKET ./nbdkit-lz4.so size=1G
 * Needs:  nbdkit-plugin-dev, liblz4-dev.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#define PAGE 4096u

/* A page: no bytes (len 0) reads as zeros; len PAGE is stored as it is; any other
 * length is an lz4 block that decompresses to PAGE bytes. */
struct page {
  uint8_t *bytes;
  uint32_t len;
};

static int64_t size = -1;
static struct page *pages;
static uint64_t npages;
static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static const uint8_t zeros[PAGE];

static int
lz4_config (const char *key, const char *value)
{
  if (strcmp (key, "size") == 0) {
    size = nbdkit_parse_size (value);
    return size == -1 ? -1 : 0;
  }
  nbdkit_error ("unknown parameter '%s'", key);
  return -1;
}

static int
lz4_config_complete (void)
{
  if (size <= 0 || size % PAGE != 0) {
    nbdkit_error ("size=N must be given, a multiple of %u", PAGE);
    return -1;
  }
  npages = (uint64_t) size / PAGE;
  pages = calloc (npages, sizeof *pages);
  if (pages == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  return 0;
}

static void
lz4_unload (void)
{
  for (uint64_t i = 0; pages != NULL && i < npages; i++)
    free (pages[i].bytes);
  free (pages);
}

static void *
lz4_open (int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
lz4_get_size (void *handle)
{
  return size;
}

static int lz4_can_multi_conn (void *handle) { return 1; }
static int lz4_can_extents (void *handle) { return 1; }
static int lz4_can_trim (void *handle) { return 1; }
static int lz4_can_zero (void *handle) { return 1; }
static int lz4_can_fua (void *handle) { return NBDKIT_FUA_NATIVE; }
static int lz4_flush (void *handle, uint32_t flags) { return 0; }

/* Page i's bytes into out (PAGE bytes). Under the lock. */
static int
read_page (uint64_t i, uint8_t *out)
{
  const struct page *p = &pages[i];
  if (p->len == 0)
    memset (out, 0, PAGE);
  else if (p->len == PAGE)
    memcpy (out, p->bytes, PAGE);
  else if (LZ4_decompress_safe ((const char *) p->bytes, (char *) out, p->len, PAGE)
           != PAGE) {
    nbdkit_error ("page %" PRIu64 " does not decompress", i);
    errno = EIO;
    return -1;
  }
  return 0;
}

/* Keeps in as page i's bytes: a hole if all zeros, else compressed if that saves
 * anything. Under the write lock. */
static int
store_page (uint64_t i, const uint8_t *in)
{
  struct page *p = &pages[i];
  if (memcmp (in, zeros, PAGE) == 0) {
    free (p->bytes);
    p->bytes = NULL;
    p->len = 0;
    return 0;
  }
  char packed[LZ4_COMPRESSBOUND (PAGE)];
  int n = LZ4_compress_default ((const char *) in, packed, PAGE, sizeof packed);
  const void *from = packed;
  if (n <= 0 || n >= (int) PAGE) {
    from = in;
    n = PAGE;
  }
  uint8_t *bytes = malloc (n);
  if (bytes == NULL) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  memcpy (bytes, from, n);
  free (p->bytes);
  p->bytes = bytes;
  p->len = n;
  return 0;
}

static int
lz4_pread (void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
  uint8_t *out = buf;
  uint8_t page[PAGE];
  int r = 0;
  pthread_rwlock_rdlock (&lock);
  while (count > 0 && r == 0) {
    uint64_t i = offset / PAGE;
    uint32_t in = offset % PAGE, n = PAGE - in < count ? PAGE - in : count;
    if (in == 0 && n == PAGE)
      r = read_page (i, out);
    else if ((r = read_page (i, page)) == 0)
      memcpy (out, page + in, n);
    out += n;
    offset += n;
    count -= n;
  }
  pthread_rwlock_unlock (&lock);
  return r;
}

/* Writes count bytes of buf (zeros if buf is NULL) at offset. */
static int
write_range (const uint8_t *buf, uint32_t count, uint64_t offset)
{
  uint8_t page[PAGE];
  int r = 0;
  pthread_rwlock_wrlock (&lock);
  while (count > 0 && r == 0) {
    uint64_t i = offset / PAGE;
    uint32_t in = offset % PAGE, n = PAGE - in < count ? PAGE - in : count;
    const uint8_t *from = buf ? buf : zeros;
    if (in == 0 && n == PAGE)
      r = store_page (i, from);
    else if ((r = read_page (i, page)) == 0) {
      memcpy (page + in, from, n);
      r = store_page (i, page);
    }
    if (buf)
      buf += n;
    offset += n;
    count -= n;
  }
  pthread_rwlock_unlock (&lock);
  return r;
}

static int
lz4_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  return write_range (buf, count, offset);
}

static int
lz4_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return write_range (NULL, count, offset);
}

static int
lz4_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return write_range (NULL, count, offset);
}

static int
lz4_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
             struct nbdkit_extents *extents)
{
  int r = 0;
  pthread_rwlock_rdlock (&lock);
  for (uint64_t i = offset / PAGE; r == 0 && i * PAGE < offset + count; i++) {
    uint32_t type = pages[i].len == 0 ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0;
    r = nbdkit_add_extent (extents, i * PAGE, PAGE, type);
  }
  pthread_rwlock_unlock (&lock);
  return r;
}

static struct nbdkit_plugin plugin = {
  .name = "lz4",
  .longname = "RAM disk of lz4-compressed pages (ztier's nbd-bench reference)",
  .config = lz4_config,
  .config_complete = lz4_config_complete,
  .config_help = "size=<SIZE>  (required) The disk's size, a multiple of 4096.",
  .unload = lz4_unload,
  .open = lz4_open,
  .get_size = lz4_get_size,
  .can_multi_conn = lz4_can_multi_conn,
  .can_extents = lz4_can_extents,
  .can_trim = lz4_can_trim,
  .can_zero = lz4_can_zero,
  .can_fua = lz4_can_fua,
  .pread = lz4_pread,
  .pwrite = lz4_pwrite,
  .zero = lz4_zero,
  .trim = lz4_trim,
  .flush = lz4_flush,
  .extents = lz4_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
