/*
 * Stand-in for libnvidia-ml.so.1 (NVIDIA NVML) for ethand's tests on machines without a GPU:
 * exports the NVML calls ethand's collector makes through nvml-wrapper
 * (userspace-probes/src/devices/nvml.rs), with the prototypes, enums and struct layouts of
 * NVIDIA's nvml.h as nvml-wrapper-sys mirrors them, and answers with fixed values that
 * userspace-probes/tests/nvml_standin.rs checks.
 *
 * Two GPUs with different values, so that swapped indices show:
 *
 *                           gpu0 ("NVIDIA H200")         gpu1 ("Tesla V100-SXM2-16GB")
 *   UUID                    GPU-00000000-0000-...-0000   GPU-11111111-1111-...-1111
 *   PCI bus id / minor      00000000:18:00.0 / 0         00000000:86:00.0 / 1
 *   utilization gpu / mem   87 % / 41 %                  33 % / 12 %
 *   memory total            141 GiB                      16 GiB
 *          reserved         512 MiB                      256 MiB
 *          used / free      3 GiB / the rest             1 GiB / the rest
 *   power usage             512345 mW                    NVML_ERROR_NO_PERMISSION
 *   enforced power limit    700000 mW                    300000 mW
 *   total energy            123456789 mJ                 987654321 mJ
 *   temperature (GPU)       45 C                         61 C
 *   clocks SM / memory      1980 / 3201 MHz              1530 / 877 MHz
 *   PCIe throughput tx / rx 1000 / 2000 KB/s             300 / 400 KB/s
 *   PCIe link gen cur / max 4 / 5                        3 / 3
 *   PCIe link width cur/max 8 / 16                       16 / 16
 *   volatile ECC cor / unc  12 / 0                       5 / 2
 *   throttle reasons        0x4 (SW power cap)           0x1 (GPU idle)
 *   encoder / decoder       7 % / 9 %                    NVML_ERROR_NOT_SUPPORTED
 *   NVLinks                 0 and 1 active, 2-17 not,    NVML_ERROR_NOT_SUPPORTED
 *                           18+ INVALID_ARGUMENT
 *     data tx / rx (KiB)    link0 1000 / 2000,           -
 *                           link1 3000 / 4000 (constant)
 *     error counters        replay 1+link, recovery 10+link, crc flit 20+link,
 *                           crc data 30+link
 *   field values (scope 0)
 *     MEMORY_TEMP (82)      52 (SIGNED_LONG_LONG)        NVML_ERROR_NOT_SUPPORTED
 *     PCIE_REPLAY (94)      3 (UNSIGNED_LONG_LONG)       7 (UNSIGNED_INT)
 *     REMAPPED_COR/UNC      2 / 1 (UNSIGNED_INT)         NVML_ERROR_NOT_SUPPORTED
 *     REMAPPED_PENDING/FAIL 1 / 0 (UNSIGNED_INT)         NVML_ERROR_NOT_SUPPORTED
 *     RETIRED_SBE/DBE       4 / 1 (UNSIGNED_LONG_LONG)   6 / 2 (SIGNED_INT)
 *     RETIRED_PENDING       1 (UNSIGNED_INT)             0 (UNSIGNED_INT)
 *   compute processes (v3)  4242: 1 GiB, 4343: 2 GiB     none
 *   process utilization     4242: SM 55 % at t=1000 us   NVML_ERROR_NOT_FOUND (none)
 *                           (NOT_FOUND for lastSeen >= 1000)
 *   GPM                     supported; every interval:   NVML_ERROR_NOT_SUPPORTED
 *                           SM util 50, occupancy 25,
 *                           any tensor 12.5, DRAM bw 75,
 *                           graphics 62.5, FP64 6.25,
 *                           FP32 37.5, FP16 18.75 (percent),
 *                           PCIe tx 1024, rx 256 (MiB/s);
 *                           other metrics NOT_SUPPORTED
 *   XID events              supported                    not supported (no event types)
 *   driver version          "570.86.15"
 *
 * XID: the first nvmlEventSetWait_v2 after gpu0 was registered delivers an XID 79 event on
 * gpu0, the next an XID 13 event on gpu0, every later one NVML_ERROR_TIMEOUT.
 *
 * ETHAND_NVML_STANDIN_LOST=1 in the environment at nvmlInit_v2: every call about gpu1 (other
 * than nvmlDeviceGetHandleByIndex_v2) answers NVML_ERROR_GPU_IS_LOST.
 *
 * ETHAND_NVML_STANDIN_PIDS="P1[,P2]" at nvmlInit_v2: gpu0's compute processes are these pids
 * (P1 with 1 GiB and the process-utilization sample, P2 with 2 GiB) instead of 4242 and 4343,
 * so that an end-to-end test can put a real process on the GPU.
 *
 * Every call other than nvmlInit_v2 answers NVML_ERROR_UNINITIALIZED before nvmlInit_v2.
 *
 * Build: cc -shared -fPIC -o libnvidia-ml.so.1 nvml.c
 */
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

/* nvmlValueType_t */
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_VALUE_TYPE_SIGNED_LONG_LONG 4
#define NVML_VALUE_TYPE_SIGNED_INT 5

/* field ids */
#define NVML_FI_DEV_RETIRED_SBE 29
#define NVML_FI_DEV_RETIRED_DBE 30
#define NVML_FI_DEV_RETIRED_PENDING 31
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_FI_DEV_REMAPPED_COR 142
#define NVML_FI_DEV_REMAPPED_UNC 143
#define NVML_FI_DEV_REMAPPED_PENDING 144
#define NVML_FI_DEV_REMAPPED_FAILURE 145

/* nvmlClockType_t, nvmlPcieUtilCounter_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t */
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_PCIE_UTIL_TX_BYTES 0
#define NVML_PCIE_UTIL_RX_BYTES 1
#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0
#define NVML_TEMPERATURE_GPU 0

#define nvmlEventTypeXidCriticalError 0x8ULL
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRIC_MAX 210
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* nvmlProcessInfo_v2_t, which nvmlDeviceGetComputeRunningProcesses_v3 fills. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

struct gpu;
typedef struct gpu *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct event_set {
    int gpu0_registered;
    int delivered;
};
typedef struct event_set *nvmlEventSet_t;

struct gpm_sample {
    int filled_by; /* GPU index, -1 until nvmlGpmSampleGet */
};
typedef struct gpm_sample *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

/* Layout checks against the sizes nvml-wrapper-sys's bindings have (x86_64 and aarch64). */
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t");
_Static_assert(sizeof(nvmlGpmMetricsGet_t) == 24 + 40 * NVML_GPM_METRIC_MAX, "nvmlGpmMetricsGet_t");

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

struct gpu {
    unsigned int index;
    const char *uuid;
    const char *name;
    const char *bus_id;
    unsigned int bus;
    unsigned int util_gpu, util_mem;
    unsigned long long mem_total, mem_reserved, mem_used;
    nvmlReturn_t power_rc;
    unsigned int power_mw, power_limit_mw;
    unsigned long long energy_mj;
    unsigned int temp, sm_mhz, mem_mhz, pcie_tx_kb, pcie_rx_kb;
    unsigned int link_gen, link_gen_max, link_width, link_width_max;
    unsigned long long ecc_cor, ecc_unc, throttle;
    nvmlReturn_t video_rc;
    unsigned int enc, dec;
    int nvlink; /* has NVLinks 0 and 1 */
    int gpm;
    int xid;
};

static struct gpu gpus[2] = {
    {
        .index = 0,
        .uuid = "GPU-00000000-0000-0000-0000-000000000000",
        .name = "NVIDIA H200",
        .bus_id = "00000000:18:00.0",
        .bus = 0x18,
        .util_gpu = 87, .util_mem = 41,
        .mem_total = 141 * GIB, .mem_reserved = 512 * MIB, .mem_used = 3 * GIB,
        .power_rc = NVML_SUCCESS, .power_mw = 512345, .power_limit_mw = 700000,
        .energy_mj = 123456789ULL,
        .temp = 45, .sm_mhz = 1980, .mem_mhz = 3201, .pcie_tx_kb = 1000, .pcie_rx_kb = 2000,
        .link_gen = 4, .link_gen_max = 5, .link_width = 8, .link_width_max = 16,
        .ecc_cor = 12, .ecc_unc = 0, .throttle = 0x4,
        .video_rc = NVML_SUCCESS, .enc = 7, .dec = 9,
        .nvlink = 1, .gpm = 1, .xid = 1,
    },
    {
        .index = 1,
        .uuid = "GPU-11111111-1111-1111-1111-111111111111",
        .name = "Tesla V100-SXM2-16GB",
        .bus_id = "00000000:86:00.0",
        .bus = 0x86,
        .util_gpu = 33, .util_mem = 12,
        .mem_total = 16 * GIB, .mem_reserved = 256 * MIB, .mem_used = 1 * GIB,
        .power_rc = NVML_ERROR_NO_PERMISSION, .power_mw = 0, .power_limit_mw = 300000,
        .energy_mj = 987654321ULL,
        .temp = 61, .sm_mhz = 1530, .mem_mhz = 877, .pcie_tx_kb = 300, .pcie_rx_kb = 400,
        .link_gen = 3, .link_gen_max = 3, .link_width = 16, .link_width_max = 16,
        .ecc_cor = 5, .ecc_unc = 2, .throttle = 0x1,
        .video_rc = NVML_ERROR_NOT_SUPPORTED,
        .nvlink = 0, .gpm = 0, .xid = 0,
    },
};

static int initialised;
static int gpu1_lost;

/* Common checks of a device call: initialised, a known handle, gpu1 lost. */
#define DEVICE(dev)                                                        \
    do {                                                                   \
        if (!initialised)                                                  \
            return NVML_ERROR_UNINITIALIZED;                               \
        if ((dev) != &gpus[0] && (dev) != &gpus[1])                        \
            return NVML_ERROR_INVALID_ARGUMENT;                            \
        if ((dev)->index == 1 && gpu1_lost)                                \
            return NVML_ERROR_GPU_IS_LOST;                                 \
    } while (0)

#define OUT(p)                                                             \
    do {                                                                   \
        if (!(p))                                                          \
            return NVML_ERROR_INVALID_ARGUMENT;                            \
    } while (0)

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len) {
    OUT(buf);
    if (strlen(s) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

static nvmlReturn_t put_uint(unsigned int v, unsigned int *out) {
    OUT(out);
    *out = v;
    return NVML_SUCCESS;
}

static unsigned int gpu0_pids[2] = {4242, 4343};
static unsigned int gpu0_nprocs = 2;

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    const char *lost = getenv("ETHAND_NVML_STANDIN_LOST");
    gpu1_lost = lost && strcmp(lost, "1") == 0;
    const char *pids = getenv("ETHAND_NVML_STANDIN_PIDS");
    if (pids && *pids) {
        char *end;
        unsigned long p1 = strtoul(pids, &end, 10);
        gpu0_pids[0] = (unsigned int)p1;
        gpu0_nprocs = 1;
        if (*end == ',') {
            gpu0_pids[1] = (unsigned int)strtoul(end + 1, NULL, 10);
            gpu0_nprocs = 2;
        }
    }
    initialised++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string("570.86.15", version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    return put_uint(2, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    OUT(device);
    if (index >= 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    DEVICE(dev);
    return put_uint(dev->index, index);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    DEVICE(dev);
    return copy_string(dev->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    DEVICE(dev);
    return copy_string(dev->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    DEVICE(dev);
    OUT(pci);
    memset(pci, 0, sizeof *pci);
    strncpy(pci->busIdLegacy, dev->bus_id + 4, sizeof pci->busIdLegacy - 1);
    strcpy(pci->busId, dev->bus_id);
    pci->bus = dev->bus;
    pci->pciDeviceId = dev->index == 0 ? 0x233510de : 0x1db110de;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    DEVICE(dev);
    return put_uint(dev->index, minor);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    DEVICE(dev);
    OUT(u);
    u->gpu = dev->util_gpu;
    u->memory = dev->util_mem;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    DEVICE(dev);
    OUT(m);
    /* nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2). */
    if (m->version != (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = dev->mem_total;
    m->reserved = dev->mem_reserved;
    m->used = dev->mem_used;
    m->free = dev->mem_total - dev->mem_reserved - dev->mem_used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    DEVICE(dev);
    if (dev->power_rc != NVML_SUCCESS)
        return dev->power_rc;
    return put_uint(dev->power_mw, mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *mw) {
    DEVICE(dev);
    return put_uint(dev->power_limit_mw, mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev,
                                                        unsigned long long *mj) {
    DEVICE(dev);
    OUT(mj);
    *mj = dev->energy_mj;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *t) {
    DEVICE(dev);
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return put_uint(dev->temp, t);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    DEVICE(dev);
    switch (type) {
    case NVML_CLOCK_SM: return put_uint(dev->sm_mhz, mhz);
    case NVML_CLOCK_MEM: return put_uint(dev->mem_mhz, mhz);
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter,
                                                unsigned int *kb) {
    DEVICE(dev);
    switch (counter) {
    case NVML_PCIE_UTIL_TX_BYTES: return put_uint(dev->pcie_tx_kb, kb);
    case NVML_PCIE_UTIL_RX_BYTES: return put_uint(dev->pcie_rx_kb, kb);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *g) {
    DEVICE(dev);
    return put_uint(dev->link_gen, g);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *g) {
    DEVICE(dev);
    return put_uint(dev->link_gen_max, g);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *w) {
    DEVICE(dev);
    return put_uint(dev->link_width, w);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *w) {
    DEVICE(dev);
    return put_uint(dev->link_width_max, w);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int type, int counter,
                                                unsigned long long *count) {
    DEVICE(dev);
    OUT(count);
    if (counter != NVML_VOLATILE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_MEMORY_ERROR_TYPE_CORRECTED: *count = dev->ecc_cor; return NVML_SUCCESS;
    case NVML_MEMORY_ERROR_TYPE_UNCORRECTED: *count = dev->ecc_unc; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev,
                                                              unsigned long long *reasons) {
    DEVICE(dev);
    OUT(reasons);
    *reasons = dev->throttle;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int *util,
                                                    unsigned int *period_us) {
    DEVICE(dev);
    OUT(util && period_us);
    if (dev->video_rc != NVML_SUCCESS)
        return dev->video_rc;
    *util = dev->enc;
    *period_us = 167000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int *util,
                                                    unsigned int *period_us) {
    DEVICE(dev);
    OUT(util && period_us);
    if (dev->video_rc != NVML_SUCCESS)
        return dev->video_rc;
    *util = dev->dec;
    *period_us = 167000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active) {
    DEVICE(dev);
    OUT(active);
    if (!dev->nvlink)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < 2;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link,
                                                    int counter, unsigned long long *value) {
    DEVICE(dev);
    OUT(value);
    if (!dev->nvlink)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= 2 || counter < 0 || counter > 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    *value = (unsigned long long)counter * 10 + link + (counter == 0);
    return NVML_SUCCESS;
}

static void set_value(nvmlFieldValue_t *v, int type, long long value) {
    v->valueType = type;
    v->nvmlReturn = NVML_SUCCESS;
    switch (type) {
    case NVML_VALUE_TYPE_UNSIGNED_INT: v->value.uiVal = (unsigned int)value; break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: v->value.ullVal = (unsigned long long)value; break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG: v->value.sllVal = value; break;
    case NVML_VALUE_TYPE_SIGNED_INT: v->value.siVal = (int)value; break;
    }
}

static void field_value(const struct gpu *dev, nvmlFieldValue_t *v) {
    int h = dev->index == 0;
    v->timestamp = 1700000000000000LL;
    v->latencyUsec = 0;
    v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    switch (v->fieldId) {
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
        if (!dev->nvlink)
            return;
        if (v->scopeId >= 2) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
            return;
        }
        set_value(v, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                  1000 + 2000 * v->scopeId +
                      (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX ? 1000 : 0));
        return;
    }
    if (v->scopeId != 0) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
    switch (v->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        if (h)
            set_value(v, NVML_VALUE_TYPE_SIGNED_LONG_LONG, 52);
        break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        if (h)
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 3);
        else
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, 7);
        break;
    case NVML_FI_DEV_REMAPPED_COR:
        if (h)
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, 2);
        break;
    case NVML_FI_DEV_REMAPPED_UNC:
        if (h)
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, 1);
        break;
    case NVML_FI_DEV_REMAPPED_PENDING:
        if (h)
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, 1);
        break;
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (h)
            set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, 0);
        break;
    case NVML_FI_DEV_RETIRED_SBE:
        set_value(v, h ? NVML_VALUE_TYPE_UNSIGNED_LONG_LONG : NVML_VALUE_TYPE_SIGNED_INT,
                  h ? 4 : 6);
        break;
    case NVML_FI_DEV_RETIRED_DBE:
        set_value(v, h ? NVML_VALUE_TYPE_UNSIGNED_LONG_LONG : NVML_VALUE_TYPE_SIGNED_INT,
                  h ? 1 : 2);
        break;
    case NVML_FI_DEV_RETIRED_PENDING:
        set_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, h ? 1 : 0);
        break;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count,
                                             nvmlFieldValue_t *values) {
    DEVICE(dev);
    if (count < 0 || (count > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++)
        field_value(dev, &values[i]);
    return NVML_SUCCESS;
}

static const nvmlProcessInfo_t gpu0_processes[] = {
    {4242, 1 * GIB, NVML_VALUE_NOT_AVAILABLE_UINT, NVML_VALUE_NOT_AVAILABLE_UINT},
    {4343, 2 * GIB, NVML_VALUE_NOT_AVAILABLE_UINT, NVML_VALUE_NOT_AVAILABLE_UINT},
};

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev,
                                                            unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    DEVICE(dev);
    OUT(count);
    unsigned int n = dev->index == 0 ? gpu0_nprocs : 0;
    if (*count < n || (n > 0 && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    for (unsigned int i = 0; i < n; i++) {
        infos[i] = gpu0_processes[i];
        infos[i].pid = gpu0_pids[i];
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen) {
    DEVICE(dev);
    OUT(count);
    if (dev->index != 0 || last_seen >= 1000)
        return NVML_ERROR_NOT_FOUND;
    if (!samples || *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 1;
    memset(samples, 0, sizeof *samples);
    samples->pid = gpu0_pids[0];
    samples->timeStamp = 1000;
    samples->smUtil = 55;
    samples->memUtil = 20;
    return NVML_SUCCESS;
}

/* XID events */

static struct event_set the_set;
static int set_in_use;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    OUT(set);
    if (set_in_use)
        return NVML_ERROR_UNKNOWN;
    memset(&the_set, 0, sizeof the_set);
    set_in_use = 1;
    *set = &the_set;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (set != &the_set || !set_in_use)
        return NVML_ERROR_INVALID_ARGUMENT;
    set_in_use = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev,
                                                     unsigned long long *types) {
    DEVICE(dev);
    OUT(types);
    *types = dev->xid ? nvmlEventTypeXidCriticalError : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types,
                                             nvmlEventSet_t set) {
    DEVICE(dev);
    if (set != &the_set || !set_in_use)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!dev->xid || (types & ~nvmlEventTypeXidCriticalError))
        return NVML_ERROR_NOT_SUPPORTED;
    set->gpu0_registered = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeout_ms) {
    static const unsigned long long codes[] = {79, 13};
    (void)timeout_ms;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (set != &the_set || !set_in_use)
        return NVML_ERROR_INVALID_ARGUMENT;
    OUT(data);
    if (!set->gpu0_registered || set->delivered >= 2)
        return NVML_ERROR_TIMEOUT;
    memset(data, 0, sizeof *data);
    data->device = &gpus[0];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = codes[set->delivered++];
    data->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    data->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    return NVML_SUCCESS;
}

/* GPM */

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    DEVICE(dev);
    OUT(support);
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!dev->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    support->isSupportedDevice = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    OUT(sample);
    *sample = malloc(sizeof **sample);
    if (!*sample)
        return NVML_ERROR_UNKNOWN;
    (*sample)->filled_by = -1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    OUT(sample);
    free(sample);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    DEVICE(dev);
    OUT(sample);
    if (!dev->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    sample->filled_by = (int)dev->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    OUT(m);
    if (m->version != NVML_GPM_METRICS_GET_VERSION || m->numMetrics > NVML_GPM_METRIC_MAX ||
        !m->sample1 || !m->sample2 || m->sample1 == m->sample2 ||
        m->sample1->filled_by < 0 || m->sample1->filled_by != m->sample2->filled_by)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *g = &m->metrics[i];
        double v;
        const char *unit = "%";
        switch (g->metricId) {
        case 1: v = 62.5; break;  /* GRAPHICS_UTIL */
        case 2: v = 50.0; break;  /* SM_UTIL */
        case 3: v = 25.0; break;  /* SM_OCCUPANCY */
        case 5: v = 12.5; break;  /* ANY_TENSOR_UTIL */
        case 10: v = 75.0; break; /* DRAM_BW_UTIL */
        case 11: v = 6.25; break; /* FP64_UTIL */
        case 12: v = 37.5; break; /* FP32_UTIL */
        case 13: v = 18.75; break; /* FP16_UTIL */
        case 20: v = 1024.0; unit = "MiB/sec"; break; /* PCIE_TX_PER_SEC */
        case 21: v = 256.0; unit = "MiB/sec"; break;  /* PCIE_RX_PER_SEC */
        default:
            g->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        g->nvmlReturn = NVML_SUCCESS;
        g->value = v;
        g->metricInfo.shortName = (char *)"stand-in";
        g->metricInfo.longName = (char *)"stand-in metric";
        g->metricInfo.unit = (char *)unit;
    }
    return NVML_SUCCESS;
}
