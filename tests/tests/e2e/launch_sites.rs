//! Kernels joined to the call that launched them, against a C program of known ground truth:
//! two threads launch from two known lines, `launch_a` kernel `gemm_site_a` and `launch_b`
//! kernel `add_site_b`, through the stand-in libcuda with libethand_cupti.so injected and the
//! stand-in CUPTI recording. Built `-g -O1 -fno-omit-frame-pointer`. A mutex keeps the two
//! threads' launch calls apart in time, so that no kernel can be ambiguous: every kernel the
//! window recorded must sit on the site of its own launch line, with exactly its GPU time
//! (the stand-in GPU runs each kernel 10 us).
use std::{fs, process::Command, thread};

use ethand_snapshot::kernels::ActivityState;
use ethand_tests::{
    Daemon, SETTLE,
    cprog::{self, Prog},
    serial, standins,
};

const KERNEL_NS: u64 = 10_000;

const SOURCE: &str = r#"#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUfunction;
CUresult cuInit(unsigned flags);
CUresult cuModuleGetFunction(CUfunction *f, void *module, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream,
                        void **params, void **extra);

static pthread_mutex_t one = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stop;
static CUfunction fa, fb;

__attribute__((noinline)) void launch_a(void) {
    pthread_mutex_lock(&one);
    cuLaunchKernel(fa, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0); /* SITE_A */
    pthread_mutex_unlock(&one);
}

__attribute__((noinline)) void launch_b(void) {
    pthread_mutex_lock(&one);
    cuLaunchKernel(fb, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0); /* SITE_B */
    pthread_mutex_unlock(&one);
}

static void *thread_a(void *arg) {
    while (!atomic_load(&stop)) { launch_a(); usleep(300); }
    return arg;
}

static void *thread_b(void *arg) {
    while (!atomic_load(&stop)) { launch_b(); usleep(700); }
    return arg;
}

int main(void) {
    char line[64];
    pthread_t a, b;
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuInit(0);
    cuModuleGetFunction(&fa, 0, "gemm_site_a");
    cuModuleGetFunction(&fb, 0, "add_site_b");
    printf("ready\n");
    if (!fgets(line, sizeof line, stdin)) return 1;
    pthread_create(&a, NULL, thread_a, NULL);
    pthread_create(&b, NULL, thread_b, NULL);
    if (!fgets(line, sizeof line, stdin)) return 1;
    atomic_store(&stop, 1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("done\n");
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
"#;

fn line_of(marker: &str) -> u32 {
    cprog::line_of(SOURCE, marker)
}

#[test]
fn kernels_sit_on_the_line_that_launched_them() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-launchsites-{}", std::process::id()));
    let (src, bin) = cprog::compile(&dir, "launchsites", SOURCE, &["-pthread"]);
    let d = Daemon::start(
        "launch-sites",
        "[gpu]\nrescan_interval_ms = 300\n[diagnosis]\ngpu_activity_ms = 2000\nlaunch_sites = true\n",
    );
    let lib = ethand_tests::temp_path("launch-sites", "cupti").join("libethand_cupti.so");
    assert!(lib.exists(), "the daemon did not install {}", lib.display());
    let mut p = Prog::start(
        Command::new(&bin)
            .env("CUDA_INJECTION64_PATH", &lib)
            .env("ETHAND_CUPTI_LIB", &standins::shared().cupti13),
    );
    let pid = p.pid();
    thread::sleep(SETTLE);
    p.say(b"go\n");
    let t = d.snapshot(pid);
    p.say(b"stop\n");
    p.expect("done");
    let a = t.gpu_activity.expect("gpu_activity in the snapshot");
    eprintln!("observed: {}", serde_json::to_string(&a).expect("json"));
    let rec = a
        .processes
        .iter()
        .find(|r| r.pid == pid)
        .expect("the process");
    assert_eq!(rec.state, ActivityState::Recorded, "{rec:?}");
    assert_eq!(rec.records_lost_by_ethand, 0);
    assert_eq!(rec.launch_sites_unavailable, None);
    let ls = rec.launch_sites.as_ref().expect("launch sites");
    let count = |name: &str| {
        rec.kernels
            .iter()
            .find(|k| k.name.as_deref() == Some(name))
            .map_or(0, |k| k.count)
    };
    let (truth_a, truth_b) = (count("gemm_site_a"), count("add_site_b"));
    assert!(truth_a > 1000 && truth_b > 500, "{truth_a} {truth_b}");
    assert_eq!(ls.kernels, truth_a + truth_b);
    assert_eq!(ls.kernels_ambiguous, 0, "{ls:?}");
    assert_eq!(ls.kernels_without_queued_time, 0, "{ls:?}");
    assert_eq!(ls.launches_over_budget, 0);
    // A launch already inside its call when the window opened has no event: at most one per
    // thread.
    assert!(ls.kernels_without_launch <= 2, "{ls:?}");
    assert_eq!(ls.kernels_joined + ls.kernels_without_launch, ls.kernels);
    assert!(ls.launches >= ls.kernels_joined, "{ls:?}");
    assert_eq!(ls.sites.len(), 2, "{ls:#?}");
    let src_path = src.display().to_string();
    for (func, thread_fn, kernel, truth, marker) in [
        ("launch_a", "thread_a", "gemm_site_a", truth_a, "SITE_A"),
        ("launch_b", "thread_b", "add_site_b", truth_b, "SITE_B"),
    ] {
        let site = ls
            .sites
            .iter()
            .find(|s| s.frames.first().and_then(|f| f.function.as_deref()) == Some(func))
            .unwrap_or_else(|| panic!("no site in {func}: {ls:#?}"));
        let f = &site.frames[0];
        assert_eq!(f.file.as_deref(), Some(src_path.as_str()), "{f:?}");
        assert_eq!(f.line, Some(line_of(marker)), "{f:?}");
        assert!(
            site.source.as_deref().is_some_and(|s| s.contains(marker)),
            "{site:?}"
        );
        assert_eq!(
            site.frames.get(1).and_then(|f| f.function.as_deref()),
            Some(thread_fn)
        );
        // Only its own kernel, each with its exact GPU time.
        assert_eq!(site.top.len(), 1, "{site:?}");
        assert_eq!(site.top[0].name.as_deref(), Some(kernel));
        assert_eq!(site.top[0].count, site.kernels);
        assert_eq!(site.gpu_ns, site.kernels * KERNEL_NS, "{site:?}");
        assert!(
            site.kernels + ls.kernels_without_launch >= truth,
            "{site:?}"
        );
        if ls.kernels_without_launch == 0 {
            assert_eq!(site.kernels, truth, "{site:?}");
        }
    }
    let _ = fs::remove_dir_all(&dir);
}
