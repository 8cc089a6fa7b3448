// fakecuda.c is a fake CUDA driver (libcuda.so.1) for the tests of package cuda: the driver API
// calls the probe makes, over host memory (malloc, memset, memcpy). The tests build it with gcc
// into a temporary directory:
//
//	gcc -shared -fPIC -pthread -o libfakecuda.so fakecuda.c        (every symbol)
//	gcc -shared -fPIC -pthread -DNO_EVENTS -o ... fakecuda.c       (no cuEventElapsedTime)
//
// Every call reads its behaviour from the environment, at the time of the call:
//
//	FAKE_CUDA_DEVICES=4              how many devices (default 1; 0: cuInit says NO_DEVICE)
//	FAKE_CUDA_GBPS=30,30,25,30       per device: the rate at which copies "run", counted as the
//	                                 probe counts it (2 × bytes / time); cuEventElapsedTime
//	                                 returns the time the copies between two events took at it
//	                                 (default 100)
//	FAKE_CUDA_UUIDS=GPU-…,GPU-…      per device, in NVML's form (default GPU-f00dcafe-0000-0000-0000-00000000000N)
//	FAKE_CUDA_NAMES=NVIDIA H200,…    per device (default "NVIDIA Fake GPU")
//	FAKE_CUDA_CC=9.0,8.0             per device compute capability (default 9.0)
//	FAKE_CUDA_MEM=85899345920        per device total memory in bytes (default 80 GiB)
//	FAKE_CUDA_FREE=8388608           per device free memory in bytes (default: total - allocated)
//	FAKE_CUDA_VERSION=12040          cuDriverGetVersion (default 12040)
//	FAKE_CUDA_FAIL=cuInit=100,cuMemAlloc_v2@2=2
//	                                 a call that fails with that CUresult: on every device, or on
//	                                 device @N only
//	FAKE_CUDA_BARRIER=4              the first cuEventSynchronize of each of 4 threads waits until
//	                                 all 4 are in it at once (10 s at most; then CUDA_ERROR_UNKNOWN):
//	                                 it passes only if the devices are probed in parallel
//	FAKE_CUDA_PAUSE=W,R              the second cuEventSynchronize in each context (the end of the
//	                                 first timed batch, after the warm-up's) writes a byte to file
//	                                 descriptor W, then waits for a byte on R (10 s at most; then
//	                                 CUDA_ERROR_UNKNOWN): a test can look at the GPUs while the
//	                                 timed copies are under way, without any timing
//	FAKE_CUDA_STATS=/path            after every create and destroy, the live objects are written
//	                                 there: "contexts 0 max_contexts 4 allocations 0 streams 0 events 0"
//
// A list with one item applies to every device. Contexts are current per thread, as CUDA's are:
// a call that needs a context made on another thread fails with CUDA_ERROR_INVALID_CONTEXT.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct { char bytes[16]; } CUuuid;

typedef struct fctx { int dev; int syncs; } *CUcontext;
typedef struct fstream { struct fctx *ctx; double vtime_ms; } *CUstream;
typedef struct fevent { struct fctx *ctx; double t; int recorded; int synced; } *CUevent;

enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	NOT_INITIALIZED = 3,
	NO_DEVICE = 100,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
	INVALID_HANDLE = 400,
	UNKNOWN = 999,
};

static __thread struct fctx *current;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t barrier_cv = PTHREAD_COND_INITIALIZER;
static int initialized, barrier_arrived, barrier_done;
static long live_ctx, max_ctx, live_streams, live_events;

struct alloc { char *p; size_t n; struct fctx *ctx; };
static struct alloc *allocs;
static size_t nallocs, capallocs;

// item copies the i-th comma-separated item of the environment variable name into buf (the last
// one when the list is shorter) and returns buf, or NULL when the variable is unset or empty.
static const char *item(const char *name, int i, char *buf, size_t n) {
	const char *v = getenv(name);
	if (v == NULL || *v == 0) return NULL;
	const char *start = v;
	for (int k = 0; k < i; k++) {
		const char *comma = strchr(start, ',');
		if (comma == NULL) break;
		start = comma + 1;
	}
	size_t len = strcspn(start, ",");
	if (len >= n) len = n - 1;
	memcpy(buf, start, len);
	buf[len] = 0;
	return buf;
}

static double num(const char *name, int i, double def) {
	char buf[64];
	return item(name, i, buf, sizeof buf) ? strtod(buf, NULL) : def;
}

static int ndev(void) { return (int)num("FAKE_CUDA_DEVICES", 0, 1); }

// fail returns the CUresult FAKE_CUDA_FAIL gives sym on device dev (-1: not a device call), or 0.
static CUresult fail(const char *sym, int dev) {
	const char *v = getenv("FAKE_CUDA_FAIL");
	if (v == NULL) return SUCCESS;
	size_t symlen = strlen(sym);
	for (const char *p = v; *p;) {
		size_t len = strcspn(p, ",");
		if (strncmp(p, sym, symlen) == 0 && (p[symlen] == '=' || p[symlen] == '@')) {
			const char *q = p + symlen;
			int on = -1;
			if (*q == '@') on = (int)strtol(q + 1, (char **)&q, 10);
			if (*q == '=' && (on < 0 || on == dev)) return (CUresult)strtol(q + 1, NULL, 10);
		}
		p += len;
		if (*p == ',') p++;
	}
	return SUCCESS;
}

// stats writes the live objects to FAKE_CUDA_STATS; mu is held.
static void stats(void) {
	const char *path = getenv("FAKE_CUDA_STATS");
	if (path == NULL) return;
	FILE *f = fopen(path, "w");
	if (f == NULL) return;
	fprintf(f, "contexts %ld max_contexts %ld allocations %zu streams %ld events %ld\n",
		live_ctx, max_ctx, nallocs, live_streams, live_events);
	fclose(f);
}

// find returns the allocation holding [p, p+n) made in ctx, or NULL; mu is held.
static struct alloc *find(CUdeviceptr p, size_t n, struct fctx *ctx) {
	for (size_t i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];
		uintptr_t base = (uintptr_t)a->p;
		if (a->ctx == ctx && p >= base && p - base <= a->n && n <= a->n - (p - base)) return a;
	}
	return NULL;
}

#define NEED_INIT if (!initialized) return NOT_INITIALIZED
#define NEED_CTX  NEED_INIT; if (current == NULL) return INVALID_CONTEXT
#define FAIL(sym, dev) do { CUresult r_ = fail(sym, dev); if (r_) return r_; } while (0)

CUresult cuInit(unsigned int flags) {
	(void)flags;
	FAIL("cuInit", -1);
	if (ndev() <= 0) return NO_DEVICE;
	initialized = 1;
	return SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	if (v == NULL) return INVALID_VALUE;
	*v = (int)num("FAKE_CUDA_VERSION", 0, 12040);
	return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	NEED_INIT;
	FAIL("cuDeviceGetCount", -1);
	*n = ndev();
	return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT;
	FAIL("cuDeviceGet", ordinal);
	if (ordinal < 0 || ordinal >= ndev()) return INVALID_DEVICE;
	*d = ordinal;
	return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT;
	FAIL("cuDeviceGetName", d);
	char buf[256];
	if (len <= 0) return INVALID_VALUE;
	snprintf(name, (size_t)len, "%s", item("FAKE_CUDA_NAMES", d, buf, sizeof buf) ? buf : "NVIDIA Fake GPU");
	return SUCCESS;
}

static int hexval(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
	NEED_INIT;
	FAIL("cuDeviceGetUuid", d);
	char buf[128];
	if (item("FAKE_CUDA_UUIDS", d, buf, sizeof buf) == NULL)
		snprintf(buf, sizeof buf, "GPU-f00dcafe-0000-0000-0000-%012x", d);
	const char *p = strncmp(buf, "GPU-", 4) == 0 ? buf + 4 : buf;
	int k = 0;
	for (; *p && k < 32; p++) {
		if (*p == '-') continue;
		int h = hexval(*p);
		if (h < 0) return INVALID_VALUE;
		if (k % 2 == 0) u->bytes[k / 2] = (char)(h << 4);
		else u->bytes[k / 2] |= (char)h;
		k++;
	}
	return k == 32 ? SUCCESS : INVALID_VALUE;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	NEED_INIT;
	FAIL("cuDeviceGetAttribute", d);
	char buf[32];
	const char *cc = item("FAKE_CUDA_CC", d, buf, sizeof buf) ? buf : "9.0";
	const char *dot = strchr(cc, '.');
	switch (attr) {
	case 75: *v = atoi(cc); return SUCCESS;                 // COMPUTE_CAPABILITY_MAJOR
	case 76: *v = dot ? atoi(dot + 1) : 0; return SUCCESS;  // COMPUTE_CAPABILITY_MINOR
	}
	return INVALID_VALUE;
}

static size_t total_mem(int d) { return (size_t)num("FAKE_CUDA_MEM", d, 80.0 * (1 << 30)); }

CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
	NEED_INIT;
	FAIL("cuDeviceTotalMem_v2", d);
	*n = total_mem(d);
	return SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d) {
	(void)flags;
	NEED_INIT;
	FAIL("cuCtxCreate_v2", d);
	if (d < 0 || d >= ndev()) return INVALID_DEVICE;
	struct fctx *ctx = calloc(1, sizeof *ctx);
	ctx->dev = d;
	*c = ctx;
	current = ctx;
	pthread_mutex_lock(&mu);
	if (++live_ctx > max_ctx) max_ctx = live_ctx;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext c) {
	NEED_INIT;
	if (c == NULL) return INVALID_CONTEXT;
	FAIL("cuCtxDestroy_v2", c->dev);
	if (current == c) current = NULL;
	free(c);
	pthread_mutex_lock(&mu);
	live_ctx--;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
	NEED_CTX;
	FAIL("cuMemGetInfo_v2", current->dev);
	*total = total_mem(current->dev);
	size_t used = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].ctx->dev == current->dev) used += allocs[i].n;
	pthread_mutex_unlock(&mu);
	*freeb = (size_t)num("FAKE_CUDA_FREE", current->dev, (double)(*total - used));
	return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX;
	FAIL("cuMemAlloc_v2", current->dev);
	if (n == 0) return INVALID_VALUE;
	char *m = malloc(n);
	if (m == NULL) return OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	if (nallocs == capallocs) {
		capallocs = capallocs ? 2 * capallocs : 16;
		allocs = realloc(allocs, capallocs * sizeof *allocs);
	}
	allocs[nallocs++] = (struct alloc){m, n, current};
	stats();
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)m;
	return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX;
	FAIL("cuMemFree_v2", current->dev);
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nallocs; i++) {
		if ((uintptr_t)allocs[i].p == p && allocs[i].ctx == current) {
			free(allocs[i].p);
			allocs[i] = allocs[--nallocs];
			stats();
			pthread_mutex_unlock(&mu);
			return SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
	NEED_CTX;
	FAIL("cuMemsetD8_v2", current->dev);
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, n, current);
	pthread_mutex_unlock(&mu);
	if (a == NULL) return INVALID_VALUE;
	memset((void *)(uintptr_t)p, v, n);
	return SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	(void)flags;
	NEED_CTX;
	FAIL("cuStreamCreate", current->dev);
	struct fstream *st = calloc(1, sizeof *st);
	st->ctx = current;
	*s = st;
	pthread_mutex_lock(&mu);
	live_streams++;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	NEED_CTX;
	if (s == NULL || s->ctx != current) return INVALID_HANDLE;
	free(s);
	pthread_mutex_lock(&mu);
	live_streams--;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	NEED_CTX;
	FAIL("cuMemcpyDtoDAsync_v2", current->dev);
	if (s == NULL || s->ctx != current) return INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	struct alloc *d = find(dst, n, current), *a = find(src, n, current);
	pthread_mutex_unlock(&mu);
	if (d == NULL || a == NULL || d == a) return INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	double gbps = num("FAKE_CUDA_GBPS", current->dev, 100);
	s->vtime_ms += 2.0 * (double)n / (gbps * 1e9) * 1e3;
	return SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
	(void)flags;
	NEED_CTX;
	FAIL("cuEventCreate", current->dev);
	struct fevent *ev = calloc(1, sizeof *ev);
	ev->ctx = current;
	*e = ev;
	pthread_mutex_lock(&mu);
	live_events++;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
	NEED_CTX;
	if (e == NULL || e->ctx != current) return INVALID_HANDLE;
	free(e);
	pthread_mutex_lock(&mu);
	live_events--;
	stats();
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	NEED_CTX;
	FAIL("cuEventRecord", current->dev);
	if (e == NULL || s == NULL || e->ctx != current || s->ctx != current) return INVALID_HANDLE;
	e->t = s->vtime_ms;
	e->recorded = 1;
	e->synced = 0;
	return SUCCESS;
}

// barrier makes the first call of each thread wait until FAKE_CUDA_BARRIER threads are in it.
static CUresult barrier(void) {
	static __thread int passed;
	int need = (int)num("FAKE_CUDA_BARRIER", 0, 0);
	if (need <= 0 || passed) return SUCCESS;
	passed = 1;
	pthread_mutex_lock(&mu);
	if (++barrier_arrived >= need) {
		barrier_done = 1;
		pthread_cond_broadcast(&barrier_cv);
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	while (!barrier_done) {
		if (pthread_cond_timedwait(&barrier_cv, &mu, &until) == ETIMEDOUT) {
			pthread_mutex_unlock(&mu);
			return UNKNOWN;
		}
	}
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

// pause hands over to the test at the second call in each context, as FAKE_CUDA_PAUSE says.
// Counted per context, not per thread: Go reuses the threads of earlier probes.
static CUresult pause_here(void) {
	char buf[32];
	if (++current->syncs != 2 || item("FAKE_CUDA_PAUSE", 0, buf, sizeof buf) == NULL) return SUCCESS;
	int w = atoi(buf), r = (int)num("FAKE_CUDA_PAUSE", 1, -1);
	char b = 'p';
	if (write(w, &b, 1) != 1) return UNKNOWN;
	struct pollfd p = {.fd = r, .events = POLLIN};
	if (poll(&p, 1, 10000) != 1 || read(r, &b, 1) != 1) return UNKNOWN;
	return SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) {
	NEED_CTX;
	FAIL("cuEventSynchronize", current->dev);
	if (e == NULL || e->ctx != current) return INVALID_HANDLE;
	CUresult r = barrier();
	if (r) return r;
	if ((r = pause_here())) return r;
	e->synced = 1;
	return SUCCESS;
}

#ifndef NO_EVENTS
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
	NEED_CTX;
	FAIL("cuEventElapsedTime", current->dev);
	if (start == NULL || end == NULL || !start->recorded || !end->recorded) return INVALID_HANDLE;
	if (!end->synced) return 600; // CUDA_ERROR_NOT_READY
	*ms = (float)(end->t - start->t);
	return SUCCESS;
}
#endif

static const struct { CUresult r; const char *name, *text; } errs[] = {
	{SUCCESS, "CUDA_SUCCESS", "no error"},
	{INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
	{600, "CUDA_ERROR_NOT_READY", "device not ready"},
	{UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].r == r) { *s = errs[i].name; return SUCCESS; }
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
		if (errs[i].r == r) { *s = errs[i].text; return SUCCESS; }
	*s = NULL;
	return INVALID_VALUE;
}
