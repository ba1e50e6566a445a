// The `stacks` suite's workloads (xtask/src/bench/stacks.rs), in C so that every frame keeps
// its frame pointer: the kernel walks user stacks by frame pointers, and what a walk costs
// depends on how deep it goes.
//
//   stacked_calls calls LIB DEPTH ITERS
//       cuMemcpyHtoD_v2 of the stand-in LIB, called ITERS times (after ITERS/10 of warm-up)
//       from DEPTH nested frames of this program: what a call-site stack costs per call.
//   stacked_calls chunks LIB|- SECONDS OUT
//       SECONDS of fixed chunks of work (~1 ms each, calibrated before the handshake); each
//       chunk's end (CLOCK_REALTIME, ns) and length go to OUT. LIB "-": arithmetic only (a busy
//       loop); else each chunk is 100 x (cuLaunchKernel of LIB + ~10 us of arithmetic), a
//       launch-bound loop whose launches cost host time as a real driver's do.
//
// Protocol (xtask's handshake workloads): print "ready", wait for "go" on stdin, run, print
// "elapsed_ns=N events=N calls=N", then wait until stdin closes.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*memcpy_htod_fn)(unsigned long long, const void *, size_t);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

static memcpy_htod_fn memcpy_htod;
static launch_fn launch;
static volatile uint64_t sink;
static char host_buf[64];

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *open_symbol(const char *lib, const char *name) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        exit(2);
    }
    void *sym = dlsym(h, name);
    if (!sym) {
        fprintf(stderr, "%s has no %s\n", lib, name);
        exit(2);
    }
    return sym;
}

// Runs pinned to the last CPU allowed, as xtask's own workloads do.
static void pin_last_cpu(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) last = c;
    if (last < 0) return;
    CPU_ZERO(&set);
    CPU_SET(last, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void handshake_ready(void) {
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin) || strcmp(line, "go\n") != 0) {
        fprintf(stderr, "expected go on stdin\n");
        exit(2);
    }
}

static void handshake_result(uint64_t elapsed_ns, uint64_t events, uint64_t calls) {
    printf("elapsed_ns=%llu events=%llu calls=%llu\n", (unsigned long long)elapsed_ns,
           (unsigned long long)events, (unsigned long long)calls);
    fflush(stdout);
    char buf[64];
    while (fgets(buf, sizeof buf, stdin)) {
    }
}

__attribute__((noinline)) static int nested_copy(int depth) {
    if (depth <= 1) return memcpy_htod(0x1000, host_buf, sizeof host_buf);
    int rc = nested_copy(depth - 1);
    // Not a tail call: each level keeps its frame.
    __asm__ volatile("" ::: "memory");
    return rc;
}

static int calls(const char *lib, int depth, uint64_t iters) {
    memcpy_htod = (memcpy_htod_fn)open_symbol(lib, "cuMemcpyHtoD_v2");
    handshake_ready();
    uint64_t warmup = iters / 10;
    int bad = 0;
    for (uint64_t i = 0; i < warmup; i++) bad |= nested_copy(depth);
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    for (uint64_t i = 0; i < iters; i++) bad |= nested_copy(depth);
    uint64_t elapsed = now_ns(CLOCK_MONOTONIC) - t0;
    if (bad) {
        fprintf(stderr, "cuMemcpyHtoD_v2 of the stand-in failed\n");
        return 1;
    }
    handshake_result(elapsed, iters, warmup + iters);
    return 0;
}

__attribute__((noinline)) static void arithmetic(uint64_t n) {
    uint64_t x = sink;
    for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    sink = x;
}

static uint64_t spin_per_launch;

__attribute__((noinline)) static void launch_chunk(uint64_t launches) {
    for (uint64_t i = 0; i < launches; i++) {
        launch((void *)0x1000, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0);
        arithmetic(spin_per_launch);
    }
}

__attribute__((noinline)) static void chunk(uint64_t n) {
    if (launch)
        launch_chunk(n);
    else
        arithmetic(n);
}

// Iterations of arithmetic() that take about `ns`.
static uint64_t calibrate(uint64_t ns) {
    uint64_t n = 1024;
    for (;;) {
        uint64_t t0 = now_ns(CLOCK_MONOTONIC);
        arithmetic(n);
        uint64_t dt = now_ns(CLOCK_MONOTONIC) - t0;
        if (dt >= 20000000ull) return n * ns / dt;
        n *= 2;
    }
}

static int chunks(const char *lib, double seconds, const char *out) {
    uint64_t n;
    if (strcmp(lib, "-") != 0) {
        launch = (launch_fn)open_symbol(lib, "cuLaunchKernel");
        spin_per_launch = calibrate(10000);
        n = 100;
    } else {
        n = calibrate(1000000);
    }
    size_t cap = (size_t)(seconds * 20000) + 1024;
    uint64_t *ends = malloc(cap * sizeof *ends), *lens = malloc(cap * sizeof *lens);
    if (!ends || !lens) return 2;
    FILE *f = fopen(out, "w");
    if (!f) {
        perror(out);
        return 2;
    }
    handshake_ready();
    uint64_t t0 = now_ns(CLOCK_MONOTONIC), until = t0 + (uint64_t)(seconds * 1e9);
    size_t k = 0;
    uint64_t last = t0;
    while (last < until && k < cap) {
        chunk(n);
        uint64_t t = now_ns(CLOCK_MONOTONIC);
        ends[k] = now_ns(CLOCK_REALTIME);
        lens[k] = t - last;
        last = t;
        k++;
    }
    for (size_t i = 0; i < k; i++)
        fprintf(f, "%llu %llu\n", (unsigned long long)ends[i], (unsigned long long)lens[i]);
    fclose(f);
    handshake_result(last - t0, k, launch ? k * n : 0);
    return 0;
}

int main(int argc, char **argv) {
    pin_last_cpu();
    if (argc == 5 && strcmp(argv[1], "calls") == 0)
        return calls(argv[2], atoi(argv[3]), strtoull(argv[4], 0, 10));
    if (argc == 5 && strcmp(argv[1], "chunks") == 0)
        return chunks(argv[2], atof(argv[3]), argv[4]);
    fprintf(stderr,
            "usage: %s calls LIB DEPTH ITERS | chunks LIB|- SECONDS OUT\n", argv[0]);
    return 2;
}
