/*
 * What the four stand-in libraries share: every exported function has a distinct body (it
 * bumps its own volatile counter, HIT()), so that neither inlining nor identical code folding
 * can make two symbols one address; fake device addresses; the sleep of synchronizations.
 */
#ifndef ETHAND_STANDIN_LIB_H
#define ETHAND_STANDIN_LIB_H

#include "standins.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default"), noinline, used))

/* One counter per exported function: __COUNTER__ gives each HIT() its own slot. Each library
 * ends with STANDIN_HITS_CHECK(). */
#define STANDIN_MAX_HITS 256
static volatile unsigned long standin_hits[STANDIN_MAX_HITS];
#define HIT() ((void)(standin_hits[__COUNTER__]++))
#define STANDIN_HITS_CHECK() _Static_assert(__COUNTER__ < STANDIN_MAX_HITS, "too many HIT()s")

/* Fake device memory: addresses inside a PROT_NONE reservation of this library instance
 * (256 MiB, 256-byte steps, so 1 Mi allocations before an address repeats). Unique in the
 * process even across two copies of a library, never dereferenceable (a stray access faults). */
#define STANDIN_WINDOW_BYTES (256ULL << 20)
#define STANDIN_FAKE_STEP 256ULL
static unsigned long long standin_window_base;
static unsigned long long standin_window_next;
static unsigned int standin_sync_us = STANDIN_SYNC_US_DEFAULT;
/* Host time of each collective (ETHAND_STANDIN_COLL_US, default 0: return at once). */
#define STANDIN_COLL_ENV "ETHAND_STANDIN_COLL_US"
static unsigned int standin_coll_us;

/* glibc passes (argc, argv, envp) to a shared object's constructors. */
__attribute__((constructor)) static void standin_init(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    void *p = mmap(NULL, STANDIN_WINDOW_BYTES, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        abort();
    standin_window_base = (unsigned long long)(uintptr_t)p;
    const size_t n = strlen(STANDIN_SYNC_ENV "=");
    const size_t m = strlen(STANDIN_COLL_ENV "=");
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, STANDIN_SYNC_ENV "=", n) == 0)
            standin_sync_us = (unsigned int)strtoul(*e + n, NULL, 10);
        if (strncmp(*e, STANDIN_COLL_ENV "=", m) == 0)
            standin_coll_us = (unsigned int)strtoul(*e + m, NULL, 10);
    }
}

__attribute__((unused)) static unsigned long long standin_fake_addr(void) {
    unsigned long long i = __atomic_fetch_add(&standin_window_next, 1, __ATOMIC_RELAXED);
    return standin_window_base + (i % (STANDIN_WINDOW_BYTES / STANDIN_FAKE_STEP)) * STANDIN_FAKE_STEP;
}

__attribute__((unused)) static int standin_is_fake(const void *p) {
    unsigned long long a = (unsigned long long)(uintptr_t)p;
    return a >= standin_window_base && a < standin_window_base + STANDIN_WINDOW_BYTES;
}

/* Host memory: real malloc() up to STANDIN_HOST_MALLOC_MAX, else a fake address. */
__attribute__((unused)) static void *standin_host_alloc(size_t size) {
    if (size <= STANDIN_HOST_MALLOC_MAX) {
        void *p = malloc(size);
        if (p)
            return p;
    }
    return (void *)(uintptr_t)standin_fake_addr();
}

__attribute__((unused)) static void standin_host_free(void *p) {
    if (p && !standin_is_fake(p))
        free(p);
}

/* A synchronization: the host waits STANDIN_SYNC_ENV microseconds for the "device". */
__attribute__((unused)) static void standin_sync_sleep(void) {
    struct timespec ts = {standin_sync_us / 1000000u, (long)(standin_sync_us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* A collective's host time (0 by default). */
__attribute__((unused)) static void standin_coll_sleep(void) {
    struct timespec ts = {standin_coll_us / 1000000u, (long)(standin_coll_us % 1000000u) * 1000L};
    while (standin_coll_us && nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

#endif
