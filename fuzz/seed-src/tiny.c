// Source of corpus/elf/seed-tiny-versioned.so (5 KB): versioned, weak-alias and IFUNC symbols,
// the cases the resolver distinguishes. Built with:
//   gcc -Os -shared -fPIC -nostdlib -Wl,--version-script=tiny.map -Wl,-z,max-page-size=0x1000 \
//       -Wl,-z,noseparate-code -Wl,--build-id=none -s -o seed-tiny-versioned.so tiny.c
int cuInit(unsigned flags) { return (int)flags; }
int cuLaunchKernel(int a, int b) { return a + b; }
int pncclAllReduce(int a) { return a * 2; }
int ncclAllReduce(int a) __attribute__((weak, alias("pncclAllReduce")));
static int impl(int a) { return a; }
static void *resolve(void) { return (void *)impl; }
int fast_copy(int a) __attribute__((ifunc("resolve")));
