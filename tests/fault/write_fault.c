// write_fault.c — a fault-injection shim for the reliability tests, loaded with LD_PRELOAD into piper's
// ranks. It stands between piper (and HDF5) and the C library's write calls on the files whose path contains
// PIPER_FAULT_FILE, in the process of world rank PIPER_FAULT_RANK (every rank when unset):
//   PIPER_FAULT_AFTER=N      the writes after the first N bytes to such files fail
//   PIPER_FAULT_ERRNO=E      ... with errno E (default 28, ENOSPC; 5 is EIO)
//   PIPER_FAULT_SYNC=1       fsync and fdatasync of such files fail with EIO (a write error the disk reports late)
//   PIPER_FAULT_DELAY_MS=T   fsync and fdatasync of such files first sleep T ms (a slow disk: a save that lasts)
// Everything else passes through untouched.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long long g_written;  // bytes let through to matching files, in this process

static int matches(int fd) {
  const char* pattern = getenv("PIPER_FAULT_FILE");
  if (!pattern || !*pattern) return 0;
  const char* rank = getenv("PIPER_FAULT_RANK");
  if (rank && *rank) {
    const char* me = getenv("OMPI_COMM_WORLD_RANK");
    if (!me || strcmp(me, rank) != 0) return 0;
  }
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strstr(path, pattern) != NULL;
}

static int fault_errno(void) {
  const char* e = getenv("PIPER_FAULT_ERRNO");
  return e && *e ? atoi(e) : ENOSPC;
}

// 0: go ahead; -1 with errno set: fail this write of `bytes`.
static int gate_write(int fd, size_t bytes) {
  const char* after = getenv("PIPER_FAULT_AFTER");
  if (!after || !*after || !matches(fd)) return 0;
  const long long limit = atoll(after);
  if (__atomic_add_fetch(&g_written, (long long)bytes, __ATOMIC_SEQ_CST) > limit) {
    errno = fault_errno();
    return -1;
  }
  return 0;
}

static int gate_sync(int fd) {
  if (!matches(fd)) return 0;
  const char* delay = getenv("PIPER_FAULT_DELAY_MS");
  if (delay && *delay) {
    const long ms = atol(delay);
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
  }
  const char* fail = getenv("PIPER_FAULT_SYNC");
  if (fail && *fail == '1') {
    errno = EIO;
    return -1;
  }
  return 0;
}

static size_t iov_bytes(const struct iovec* iov, int n) {
  size_t b = 0;
  for (int i = 0; i < n; ++i) b += iov[i].iov_len;
  return b;
}

typedef ssize_t (*write_fn)(int, const void*, size_t);
typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec*, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec*, int, off_t);
typedef int (*sync_fn)(int);

// The C library's own function `name`, looked up once.
#define REAL(name, type) \
  static type real_##name; \
  if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void* buf, size_t n) {
  REAL(write, write_fn);
  if (gate_write(fd, n)) return -1;
  return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite, pwrite_fn);
  if (gate_write(fd, n)) return -1;
  return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite64, pwrite_fn);
  if (gate_write(fd, n)) return -1;
  return real_pwrite64(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  REAL(writev, writev_fn);
  if (gate_write(fd, iov_bytes(iov, cnt))) return -1;
  return real_writev(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  REAL(pwritev, pwritev_fn);
  if (gate_write(fd, iov_bytes(iov, cnt))) return -1;
  return real_pwritev(fd, iov, cnt, off);
}

int fsync(int fd) {
  REAL(fsync, sync_fn);
  if (gate_sync(fd)) return -1;
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync, sync_fn);
  if (gate_sync(fd)) return -1;
  return real_fdatasync(fd);
}
