//! Self-tests of the stand-in CUPTI (tests/standins/cupti.c) and of what the stand-in libcuda
//! tells it (cuda.c): no GPU, no BPF, no root. A small C client, compiled here, uses CUPTI's
//! Activity API the way an injection library does and prints what it received as JSON; the
//! tests compare it with what the client asked libcuda to do.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
    time::Duration,
};

use ethand_tests::{
    run_with_timeout,
    standins::{self, Lib, Standins},
    text,
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The client: `cupti_client CUPTI_LIB CUDA_LIB MODE`, one JSON line on stdout.
///   activity  kernels alpha x10 and beta x5 (grid 2,1,1 block 64,1,1), an HtoD copy from
///             pinned memory, an async DtoH copy to pageable memory on a stream, a memset, a
///             stream sync; 1 KiB buffers so that the worker completes most of them
///   threads   4 threads x 250 launches of "t"
///   decline   bufferRequested declines; 7 launches
///   busy      one cuptiSubscribe
///   finalize  the DRIVER_API domain on; the callback calls cuptiFinalize at the first API
///             exit; 3 launches; then a new subscribe
const CLIENT_C: &str = r#"
#define _GNU_SOURCE
#include "standins.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUptiResult;
typedef struct CUpti_Subscriber_st *Sub;
typedef void (*CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*RequestFunc)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*CompleteFunc)(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);
typedef struct { int kind; } __attribute__((packed, aligned(8))) Activity;
typedef struct {
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
} CallbackData;

static CUptiResult (*cupti_get_version)(uint32_t *);
static CUptiResult (*cupti_subscribe)(Sub *, CallbackFunc, void *);
static CUptiResult (*cupti_enable_domain)(uint32_t, Sub, int);
static CUptiResult (*cupti_finalize)(void);
static CUptiResult (*cupti_register)(RequestFunc, CompleteFunc);
static CUptiResult (*cupti_enable)(int);
static CUptiResult (*cupti_flush)(uint32_t);
static CUptiResult (*cupti_next)(uint8_t *, size_t, Activity **);
static CUptiResult (*cupti_dropped)(CUcontext, uint32_t, size_t *);
static void (*cupti_counts)(char *, size_t);
static void *cuda;

static void *need(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "no %s\n", name);
        exit(1);
    }
    return p;
}
#define CU(name) ((__typeof__(name) *)need(cuda, #name))

static uint32_t rd32(const uint8_t *r, int off) { uint32_t v; memcpy(&v, r + off, 4); return v; }
static uint64_t rd64(const uint8_t *r, int off) { uint64_t v; memcpy(&v, r + off, 8); return v; }
static uint16_t rd16(const uint8_t *r, int off) { uint16_t v; memcpy(&v, r + off, 2); return v; }

/* What the buffers held, in completion order. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t buffer_bytes = 1024;
static unsigned long long buffers, valid_bytes, records, bad_ends, dropped_seen;
static int serial = 1, corr_increasing = 1, ids_ok = 1;
static uint64_t gpu_end;
static uint32_t last_corr;
struct kernel { const char *ptr; char name[64]; unsigned long long n; int shared;
                uint32_t grid[3], block[3], stream; uint64_t dur_min, dur_max; };
static struct kernel kernels[16];
static int nkernels;
static char others[8192];
static size_t others_len;

static void other(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void other(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    others_len += (size_t)vsnprintf(others + others_len, sizeof others - others_len, fmt, ap);
    va_end(ap);
}

static void on_record(const uint8_t *r) {
    uint32_t kind = rd32(r, 0), corr = 0;
    uint64_t start = 0, end = 0;
    records++;
    if (kind == 10 || kind == 3) {
        start = rd64(r, 16), end = rd64(r, 24), corr = rd32(r, 92);
        const char *name;
        memcpy(&name, r + 104, sizeof name);
        int k = 0;
        while (k < nkernels && strcmp(kernels[k].name, name) != 0)
            k++;
        if (k == nkernels && nkernels < 16) {
            struct kernel *n = &kernels[nkernels++];
            n->ptr = name;
            snprintf(n->name, sizeof n->name, "%s", name);
            n->shared = 1;
            n->dur_min = ~0ULL;
            for (int i = 0; i < 3; i++)
                n->grid[i] = rd32(r, 52 + 4 * i), n->block[i] = rd32(r, 64 + 4 * i);
            n->stream = rd32(r, 48);
        }
        struct kernel *K = &kernels[k];
        K->n++;
        K->shared &= K->ptr == name;
        if (end - start < K->dur_min) K->dur_min = end - start;
        if (end - start > K->dur_max) K->dur_max = end - start;
        ids_ok &= rd32(r, 40) == 0 && rd32(r, 44) == 1;
    } else if (kind == 1) {
        start = rd64(r, 16), end = rd64(r, 24), corr = rd32(r, 44);
        other("%s{\"kind\":\"memcpy\",\"copy_kind\":%u,\"src_kind\":%u,\"dst_kind\":%u,\"flags\":%u,"
              "\"bytes\":%llu,\"stream\":%u,\"dur_ns\":%llu}", others_len ? "," : "",
              r[4], r[5], r[6], r[7], (unsigned long long)rd64(r, 8), rd32(r, 40),
              (unsigned long long)(end - start));
        ids_ok &= rd32(r, 32) == 0 && rd32(r, 36) == 1;
    } else if (kind == 2) {
        start = rd64(r, 16), end = rd64(r, 24), corr = rd32(r, 44);
        other("%s{\"kind\":\"memset\",\"value\":%u,\"bytes\":%llu,\"flags\":%u,\"memory_kind\":%u,"
              "\"stream\":%u,\"dur_ns\":%llu}", others_len ? "," : "", rd32(r, 4),
              (unsigned long long)rd64(r, 8), rd16(r, 48), rd16(r, 50), rd32(r, 40),
              (unsigned long long)(end - start));
        ids_ok &= rd32(r, 32) == 0 && rd32(r, 36) == 1;
    } else if (kind == 38) {
        uint64_t s = rd64(r, 8), e = rd64(r, 16);
        corr = rd32(r, 24);
        other("%s{\"kind\":\"sync\",\"type\":%u,\"stream\":%u,\"event\":%u,\"context\":%u,"
              "\"dur_ns\":%llu}", others_len ? "," : "", rd32(r, 4), rd32(r, 32), rd32(r, 36),
              rd32(r, 28), (unsigned long long)(e - s));
    } else {
        other("%s{\"kind\":%u}", others_len ? "," : "", kind);
    }
    if (start) {
        serial &= start >= gpu_end && end > start;
        gpu_end = end;
    }
    corr_increasing &= corr > last_corr;
    last_corr = corr;
}

static void requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, buffer_bytes);
    *size = buffer_bytes;
    *max_records = 0;
}

static void declined(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = NULL;
    *size = 0;
    *max_records = 0;
}

static void completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    pthread_mutex_lock(&mu);
    buffers++;
    valid_bytes += valid;
    Activity *r = NULL;
    int rc;
    while ((rc = cupti_next(buffer, valid, &r)) == 0)
        on_record((const uint8_t *)r);
    bad_ends += rc != 12;
    /* CUPTI calls are allowed here: this must not deadlock. */
    size_t d = 0;
    cupti_dropped(NULL, 0, &d);
    dropped_seen += d;
    pthread_mutex_unlock(&mu);
    free(buffer);
}

static int exit_callbacks, exit_site = -1;
static char exit_function[64];
static void finalize_at_exit(void *userdata, int domain, uint32_t cbid, const void *cbdata) {
    const CallbackData *d = cbdata;
    exit_callbacks++;
    exit_site = d->callbackSite;
    snprintf(exit_function, sizeof exit_function, "%s", d->functionName);
    cupti_finalize();
}

static void print_common(void) {
    char counts[8192];
    cupti_counts(counts, sizeof counts);
    uint32_t version = 0;
    cupti_get_version(&version);
    printf("\"version\":%u,\"buffers\":%llu,\"valid_bytes\":%llu,\"records\":%llu,\"bad_ends\":%llu,"
           "\"dropped_seen\":%llu,\"serial\":%d,\"corr_increasing\":%d,\"ids_ok\":%d,\"kernels\":{",
           version, buffers, valid_bytes, records, bad_ends, dropped_seen, serial, corr_increasing,
           ids_ok);
    for (int k = 0; k < nkernels; k++) {
        struct kernel *K = &kernels[k];
        printf("%s\"%s\":{\"records\":%llu,\"name_shared\":%d,\"grid\":[%u,%u,%u],"
               "\"block\":[%u,%u,%u],\"stream\":%u,\"dur_min_ns\":%llu,\"dur_max_ns\":%llu}",
               k ? "," : "", K->name, K->n, K->shared, K->grid[0], K->grid[1], K->grid[2],
               K->block[0], K->block[1], K->block[2], K->stream,
               (unsigned long long)K->dur_min, (unsigned long long)K->dur_max);
    }
    int distinct = 1;
    for (int a = 0; a < nkernels; a++)
        for (int b = a + 1; b < nkernels; b++)
            distinct &= kernels[a].ptr != kernels[b].ptr;
    printf("},\"name_ptrs_distinct\":%d,\"others\":[%s],\"counts\":%s", distinct, others, counts);
}

static CUfunction function(const char *name) {
    CUfunction f = NULL;
    if (CU(cuModuleGetFunction)(&f, NULL, name) != 0 || !f)
        exit(1);
    return f;
}

static void launch(CUfunction f, unsigned n, CUstream s) {
    for (unsigned i = 0; i < n; i++)
        if (CU(cuLaunchKernel)(f, 2, 1, 1, 64, 1, 1, 0, s, NULL, NULL) != 0)
            exit(1);
}

static void *launcher(void *arg) {
    launch(function("t"), 250, (CUstream)arg);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    const char *mode = argv[3];
    /* libcuda first, as when CUPTI is loaded by an injection library. */
    cuda = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    void *cupti = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!cuda || !cupti) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    cupti_get_version = need(cupti, "cuptiGetVersion");
    cupti_subscribe = need(cupti, "cuptiSubscribe");
    cupti_enable_domain = need(cupti, "cuptiEnableDomain");
    cupti_finalize = need(cupti, "cuptiFinalize");
    cupti_register = need(cupti, "cuptiActivityRegisterCallbacks");
    cupti_enable = need(cupti, "cuptiActivityEnable");
    cupti_flush = need(cupti, "cuptiActivityFlushAll");
    cupti_next = need(cupti, "cuptiActivityGetNextRecord");
    cupti_dropped = need(cupti, "cuptiActivityGetNumDroppedRecords");
    cupti_counts = need(cupti, "ethand_standin_cupti_counts");
    Sub sub = NULL, sub2 = NULL;
    printf("{\"mode\":\"%s\",", mode);
    if (strcmp(mode, "busy") == 0) {
        printf("\"subscribe\":%d,", cupti_subscribe(&sub, NULL, NULL));
    } else if (strcmp(mode, "activity") == 0) {
        int first = cupti_subscribe(&sub, NULL, NULL);
        int second = cupti_subscribe(&sub2, NULL, NULL);
        int rc = cupti_register(requested, completed);
        rc |= cupti_enable(10) | cupti_enable(1) | cupti_enable(2) | cupti_enable(38);
        rc |= CU(cuInit)(0);
        launch(function("alpha"), 10, NULL);
        launch(function("beta"), 5, NULL);
        void *pinned = NULL;
        rc |= CU(cuMemAllocHost_v2)(&pinned, 1 << 20);
        static char pageable[4096];
        CUstream stream = (CUstream)(uintptr_t)0x5000;
        rc |= CU(cuMemcpyHtoD_v2)(0xd0000000ULL, (char *)pinned + 100, 1 << 20);
        rc |= CU(cuMemcpyDtoHAsync_v2)(pageable, 0xd0000000ULL, 4096, stream);
        rc |= CU(cuMemsetD32_v2)(0xd0000000ULL, 7, 256);
        rc |= CU(cuStreamSynchronize)(stream);
        rc |= cupti_flush(1);
        printf("\"subscribe\":%d,\"second_subscribe\":%d,\"rc\":%d,", first, second, rc);
    } else if (strcmp(mode, "threads") == 0) {
        int rc = cupti_subscribe(&sub, NULL, NULL) | cupti_register(requested, completed) | cupti_enable(10);
        pthread_t t[4];
        for (uintptr_t i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, launcher, (void *)(0x7000 + i));
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        rc |= cupti_flush(0);
        printf("\"rc\":%d,", rc);
    } else if (strcmp(mode, "decline") == 0) {
        int rc = cupti_subscribe(&sub, NULL, NULL) | cupti_register(declined, completed) | cupti_enable(10);
        launch(function("gamma"), 7, NULL);
        rc |= cupti_flush(1);
        size_t first = 0, second = 0;
        rc |= cupti_dropped(NULL, 0, &first) | cupti_dropped(NULL, 0, &second);
        printf("\"rc\":%d,\"dropped\":%zu,\"dropped_again\":%zu,", rc, first, second);
    } else if (strcmp(mode, "finalize") == 0) {
        int rc = cupti_subscribe(&sub, finalize_at_exit, NULL) | cupti_register(requested, completed);
        rc |= cupti_enable(10) | cupti_enable_domain(1, sub, 1);
        launch(function("delta"), 3, NULL);
        int again = cupti_subscribe(&sub2, NULL, NULL);
        printf("\"rc\":%d,\"exit_callbacks\":%d,\"exit_site\":%d,\"exit_function\":\"%s\","
               "\"subscribe_after_finalize\":%d,", rc, exit_callbacks, exit_site, exit_function, again);
    } else {
        return 2;
    }
    pthread_mutex_lock(&mu);
    print_common();
    pthread_mutex_unlock(&mu);
    printf("}\n");
    return 0;
}
"#;

/// An injection library: InitializeInjection appends a line to $ETHAND_TEST_MARKER and, when
/// ETHAND_CUPTI_LIB is set, subscribes and enables CONCURRENT_KERNEL there.
const INJECTION_C: &str = r#"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 1 << 16;
    *buffer = aligned_alloc(8, *size);
    *max_records = 0;
}
static void completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    free(buffer);
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
    FILE *f = fopen(getenv("ETHAND_TEST_MARKER"), "a");
    if (f) {
        fputs("InitializeInjection\n", f);
        fclose(f);
    }
    const char *lib = getenv("ETHAND_CUPTI_LIB");
    void *h = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h)
        return 1;
    int (*subscribe)(void **, void *, void *) = dlsym(h, "cuptiSubscribe");
    int (*reg)(void *, void *) = dlsym(h, "cuptiActivityRegisterCallbacks");
    int (*enable)(int) = dlsym(h, "cuptiActivityEnable");
    void *sub;
    if (subscribe(&sub, NULL, NULL) == 0 && reg(requested, completed) == 0)
        enable(10);
    return 1;
}
"#;

struct Built {
    standins: &'static Standins,
    client: PathBuf,
    injection: PathBuf,
}

fn gcc(out: &Path, source: &str, args: &[&str]) {
    let src = out.with_extension("c");
    fs::write(&src, source).expect("write C source");
    let o = Command::new("gcc")
        .args(["-O1", "-Wall", "-pthread", "-I", standins::SOURCES])
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc {}: {}{}",
        src.display(),
        text(&o.stdout),
        text(&o.stderr)
    );
}

fn built() -> &'static Built {
    static ONCE: OnceLock<Built> = OnceLock::new();
    ONCE.get_or_init(|| {
        let standins = standins::shared();
        let client = standins.root.join("bin/cupti_client");
        let injection = standins.root.join("lib/libtest_injection.so");
        fs::create_dir_all(injection.parent().expect("parent")).expect("mkdir");
        gcc(&client, CLIENT_C, &[]);
        gcc(&injection, INJECTION_C, &["-shared", "-fPIC"]);
        Built {
            standins,
            client,
            injection,
        }
    })
}

fn json(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let line = text(&out.stdout);
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{what}: bad JSON ({e}): {line:?}"))
}

/// Runs the client on the stand-in CUPTI of `major` (12 or 13).
fn client(major: u32, mode: &str, env: &[(&str, &str)]) -> Value {
    let b = built();
    let cupti = match major {
        13 => &b.standins.cupti13,
        12 => &b.standins.cupti12,
        _ => panic!("no CUPTI {major}"),
    };
    let mut cmd = Command::new(&b.client);
    cmd.arg(cupti).arg(&b.standins.cuda).arg(mode);
    cmd.env_remove("ETHAND_STANDIN_CUPTI_BUSY")
        .env_remove("CUDA_INJECTION64_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    json(
        &run_with_timeout(&mut cmd, TIMEOUT),
        &format!("cupti_client {major} {mode}"),
    )
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {path} in {v}"))
}

/// The record sizes of each version: kernel, memcpy, memset, synchronization.
fn record_bytes(major: u32) -> [u64; 4] {
    match major {
        13 => [248, 112, 104, 56],
        _ => [208, 96, 88, 56],
    }
}

fn activity_matches_the_calls(major: u32) {
    let v = client(
        major,
        "activity",
        &[("ETHAND_STANDIN_CUPTI_KERNEL_NS", "5000")],
    );
    assert_eq!(u(&v, "/version"), if major == 13 { 130500 } else { 28 });
    assert_eq!(u(&v, "/subscribe"), 0, "{v}");
    assert_eq!(u(&v, "/second_subscribe"), 39, "{v}");
    assert_eq!(u(&v, "/rc"), 0, "{v}");
    // 15 kernels, 2 copies, 1 memset, 1 sync, each once.
    assert_eq!(u(&v, "/records"), 19, "{v}");
    let [k, m, s, y] = record_bytes(major);
    assert_eq!(u(&v, "/valid_bytes"), 15 * k + 2 * m + s + y, "{v}");
    // 1 KiB buffers: four kernel records each, so the worker completed most of them.
    assert!(u(&v, "/buffers") >= 4, "{v}");
    assert_eq!(u(&v, "/bad_ends"), 0, "{v}");
    assert_eq!(u(&v, "/dropped_seen"), 0, "{v}");
    assert_eq!(v["serial"], 1, "kernels, copies and memsets overlap: {v}");
    assert_eq!(v["corr_increasing"], 1, "{v}");
    assert_eq!(v["ids_ok"], 1, "device 0, context 1: {v}");
    for (name, n) in [("alpha", 10), ("beta", 5)] {
        let kern = &v["kernels"][name];
        assert_eq!(kern["records"], n, "{name}: {v}");
        assert_eq!(kern["name_shared"], 1, "{name}: one name pointer: {v}");
        assert_eq!(kern["grid"], serde_json::json!([2, 1, 1]), "{v}");
        assert_eq!(kern["block"], serde_json::json!([64, 1, 1]), "{v}");
        assert_eq!(kern["stream"], 0, "{v}");
        assert_eq!(
            (kern["dur_min_ns"].clone(), kern["dur_max_ns"].clone()),
            (5000.into(), 5000.into())
        );
    }
    assert_eq!(v["name_ptrs_distinct"], 1, "{v}");
    let others = v["others"].as_array().expect("others");
    let by_kind = |k: &str| -> Vec<&Value> { others.iter().filter(|o| o["kind"] == k).collect() };
    let copies = by_kind("memcpy");
    assert_eq!(copies.len(), 2, "{v}");
    // HtoD from inside cuMemAllocHost memory: PINNED -> DEVICE, 1 MiB at 100 ns/KiB.
    assert_eq!(
        (
            &copies[0]["copy_kind"],
            &copies[0]["src_kind"],
            &copies[0]["dst_kind"]
        ),
        (&1.into(), &2.into(), &3.into()),
        "{v}"
    );
    assert_eq!(copies[0]["bytes"], 1 << 20);
    assert_eq!(copies[0]["flags"], 0);
    assert_eq!(copies[0]["dur_ns"], 102_400);
    // Async DtoH to a static array: DEVICE -> PAGEABLE, the minimum 1000 ns, stream 1.
    assert_eq!(
        (
            &copies[1]["copy_kind"],
            &copies[1]["src_kind"],
            &copies[1]["dst_kind"]
        ),
        (&2.into(), &3.into(), &1.into()),
        "{v}"
    );
    assert_eq!(
        (&copies[1]["flags"], &copies[1]["stream"]),
        (&1.into(), &1.into())
    );
    assert_eq!(copies[1]["dur_ns"], 1000);
    let memsets = by_kind("memset");
    assert_eq!(memsets.len(), 1, "{v}");
    assert_eq!(
        (
            &memsets[0]["value"],
            &memsets[0]["bytes"],
            &memsets[0]["memory_kind"]
        ),
        (&7.into(), &1024.into(), &3.into())
    );
    assert_eq!(memsets[0]["dur_ns"], 2000);
    let syncs = by_kind("sync");
    assert_eq!(syncs.len(), 1, "{v}");
    // STREAM_SYNC on the stream of the copy; it lasts at least the stand-in's 1 ms sleep.
    assert_eq!(
        (&syncs[0]["type"], &syncs[0]["stream"]),
        (&3.into(), &1.into())
    );
    assert_eq!(syncs[0]["event"], u64::from(u32::MAX));
    assert!(u(syncs[0], "/dur_ns") >= 1_000_000, "{v}");
    // The counters agree.
    let c = &v["counts"];
    assert_eq!(
        (u(c, "/subscribe"), u(c, "/subscribe_refused")),
        (2, 1),
        "{c}"
    );
    for kind in ["concurrent_kernel", "memcpy", "memset", "synchronization"] {
        assert_eq!(c["enable"][kind], 1, "{kind}: {c}");
    }
    assert_eq!(c["records"]["concurrent_kernel"], 15, "{c}");
    assert_eq!(c["records"]["memcpy"], 2, "{c}");
    assert_eq!(u(c, "/records_made"), 19, "{c}");
    assert_eq!(u(c, "/activities"), 19, "{c}");
    assert_eq!(u(c, "/records_dropped"), 0, "{c}");
    assert_eq!(u(c, "/flush"), 1, "{c}");
    assert_eq!(u(c, "/buffers_completed"), u(&v, "/buffers"), "{c}");
    assert_eq!(u(c, "/attached"), 1, "{c}");
}

#[test]
fn cupti13_records_match_the_calls() {
    activity_matches_the_calls(13);
}

#[test]
fn cupti12_records_match_the_calls() {
    activity_matches_the_calls(12);
}

#[test]
fn launches_from_many_threads_are_all_recorded_in_order() {
    let v = client(13, "threads", &[]);
    assert_eq!(u(&v, "/rc"), 0, "{v}");
    assert_eq!(u(&v, "/kernels/t/records"), 1000, "{v}");
    assert_eq!(v["kernels"]["t"]["name_shared"], 1, "{v}");
    assert_eq!(v["serial"], 1, "{v}");
    assert_eq!(v["corr_increasing"], 1, "{v}");
    assert_eq!(u(&v, "/valid_bytes"), 1000 * 248, "{v}");
    assert_eq!(u(&v, "/counts/records_dropped"), 0, "{v}");
}

#[test]
fn a_busy_cupti_refuses_the_subscriber() {
    for major in [12, 13] {
        let v = client(major, "busy", &[("ETHAND_STANDIN_CUPTI_BUSY", "1")]);
        assert_eq!(u(&v, "/subscribe"), 39, "{v}");
        assert_eq!(u(&v, "/counts/subscribe_refused"), 1, "{v}");
        let v = client(major, "busy", &[]);
        assert_eq!(u(&v, "/subscribe"), 0, "{v}");
    }
}

#[test]
fn declined_buffers_drop_and_count_records() {
    let v = client(13, "decline", &[]);
    assert_eq!(u(&v, "/rc"), 0, "{v}");
    assert_eq!(u(&v, "/dropped"), 7, "{v}");
    assert_eq!(u(&v, "/dropped_again"), 0, "read resets: {v}");
    assert_eq!(u(&v, "/records"), 0, "{v}");
    assert_eq!(u(&v, "/counts/records_dropped"), 7, "{v}");
    assert_eq!(u(&v, "/counts/buffers_declined"), 7, "{v}");
}

#[test]
fn finalize_at_the_next_api_exit_detaches() {
    let v = client(13, "finalize", &[]);
    assert_eq!(u(&v, "/rc"), 0, "{v}");
    // One callback (then CUPTI is detached), at the exit of the launch.
    assert_eq!(u(&v, "/exit_callbacks"), 1, "{v}");
    assert_eq!(u(&v, "/exit_site"), 1, "{v}");
    assert_eq!(v["exit_function"], "cuLaunchKernel", "{v}");
    // The record of that launch was handed back by cuptiFinalize; the later ones never made.
    assert_eq!(u(&v, "/kernels/delta/records"), 1, "{v}");
    assert_eq!(u(&v, "/counts/finalize"), 1, "{v}");
    assert_eq!(u(&v, "/counts/activities"), 1, "{v}");
    // Attach and detach any number of times.
    assert_eq!(u(&v, "/subscribe_after_finalize"), 0, "{v}");
    assert_eq!(u(&v, "/counts/attached"), 1, "{v}");
}

#[test]
fn cuinit_loads_the_injection_library_once() {
    let b = built();
    let s = b.standins;
    let marker = s
        .root
        .join(format!("injection-marker-{}", std::process::id()));
    let _ = fs::remove_file(&marker);
    let mut cmd = s.command(
        &[Lib::Cuda],
        &[
            "cuinit",
            "cuinit",
            "kernel foo x 5",
            "kernel bar",
            "launches 2",
        ],
    );
    cmd.env("CUDA_INJECTION64_PATH", &b.injection)
        .env("ETHAND_TEST_MARKER", &marker)
        .env("ETHAND_CUPTI_LIB", &s.cupti13)
        .env_remove("ETHAND_STANDIN_CUPTI_BUSY");
    let out = run_with_timeout(&mut cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let truth = standins::GroundTruth::parse(text(&out.stdout).trim()).expect("ground truth");
    assert_eq!(
        fs::read_to_string(&marker).expect("marker"),
        "InitializeInjection\n"
    );
    // `kernel` launches are cuLaunchKernel calls in the existing ground truth.
    assert_eq!(truth.symbol(&s.cuda, "cuLaunchKernel").calls, 5 + 1 + 2);
    assert_eq!(
        truth.kernels,
        BTreeMap::from([("bar".to_string(), 1), ("foo".to_string(), 5)])
    );
    let cupti = truth.cupti.expect("the injected CUPTI's counts");
    assert_eq!(cupti["version"], 130500);
    assert_eq!(cupti["subscribe"], 1);
    assert_eq!(cupti["records"]["concurrent_kernel"], 8, "{cupti}");
    let _ = fs::remove_file(&marker);

    // Without the variable: no injection, no CUPTI.
    let mut cmd = s.command(&[Lib::Cuda], &["cuinit", "kernel foo"]);
    cmd.env_remove("CUDA_INJECTION64_PATH");
    let out = run_with_timeout(&mut cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let truth = standins::GroundTruth::parse(text(&out.stdout).trim()).expect("ground truth");
    assert!(truth.cupti.is_none(), "{:?}", truth.cupti);
    assert_eq!(truth.kernels, BTreeMap::from([("foo".to_string(), 1)]));
}

#[test]
fn the_cupti_libraries_are_laid_out_like_the_wheels() {
    let s = built().standins;
    for (p, suffix, soname) in [
        (
            &s.cupti13,
            "venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13",
            "libcupti.so.13",
        ),
        (
            &s.cupti12,
            "venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12",
            "libcupti.so.12",
        ),
    ] {
        assert_eq!(*p, s.root.join(suffix));
        let o = Command::new("readelf")
            .arg("-d")
            .arg(p)
            .output()
            .expect("readelf");
        assert!(
            text(&o.stdout).contains(&format!("[{soname}]")),
            "{}: {}",
            p.display(),
            text(&o.stdout)
        );
        let syms = standins::dynamic_symbols(p).expect("nm");
        for name in [
            "cuptiGetVersion",
            "cuptiGetResultString",
            "cuptiSubscribe",
            "cuptiUnsubscribe",
            "cuptiEnableDomain",
            "cuptiEnableCallback",
            "cuptiFinalize",
            "cuptiGetTimestamp",
            "cuptiActivityRegisterCallbacks",
            "cuptiActivityEnable",
            "cuptiActivityDisable",
            "cuptiActivityEnableAndDump",
            "cuptiActivityFlushAll",
            "cuptiActivityGetNextRecord",
            "cuptiActivityGetNumDroppedRecords",
            "cuptiActivityEnableDriverApi",
            "cuptiActivitySetAttribute",
            "ethand_standin_cupti_counts",
        ] {
            assert!(
                syms.iter().any(|d| d.name == name && d.kind == 'T'),
                "{} does not export {name}",
                p.display()
            );
        }
    }
}
