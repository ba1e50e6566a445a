/*
 * Stand-in for libdcmi.so (Huawei Ascend DCMI) for ethand's tests on machines without an NPU:
 * exports the DCMI calls ethand's collector makes (userspace-probes/src/devices/dcmi.rs), with
 * the prototypes and struct layouts of Huawei's public DCMI API reference and
 * dcmi_interface_api.h, and answers with fixed values that
 * userspace-probes/tests/dcmi_standin.rs checks.
 *
 * Two cards (ids 3 and 7, not 0 and 1, to catch code that assumes card ids are indexes), one
 * NPU chip each:
 *
 *                          card 3 / chip 0          card 7 / chip 0
 *   logic id               1                        0
 *   AI core utilization    37 %                     81 %
 *   HBM total / used       65536 / 12288 MB         32768 / 30000 MB
 *   HBM freq / temp / bw   1600 MHz / 41 C / 23 %   1600 MHz / 52 C / 90 %
 *   power                  1234 (123.4 W)           2005 (200.5 W)
 *   temperature            47 C                     63 C
 *   health                 0 (normal)               2 (major alarm)
 *   chip                   "Ascend" "910B3"         "Ascend" "910B3"
 *   PCI (v2)               0000:c1:00.0             0001:41:00.0
 *   VDIE                   {0x3001,2,3,4,5}         {0x7001,2,3,4,5}
 *   processes              4242: 1 GiB, 4343: 512 MiB    none
 *   driver version         "24.1.rc2.stand-in"
 *
 * Every call other than dcmi_init fails with DCMI_ERR_CODE_NOT_REDAY until dcmi_init was called.
 * Utilization types other than 2 (AI core) answer 11 % (DDR) or DCMI_ERR_CODE_NOT_SUPPORT, so
 * a collector asking for the wrong type sees a wrong value.
 *
 * Built with -DSTANDIN_MINIMAL it is an older, smaller library: only dcmi_init,
 * dcmi_get_card_list (the newer name of dcmi_get_card_num_list), dcmi_get_device_num_in_card,
 * dcmi_get_device_utilization_rate, dcmi_get_device_hbm_info and dcmi_get_device_temperature;
 * and the temperature of card 7 answers DCMI_ERR_CODE_NOT_SUPPORT.
 *
 * Build: cc -shared -fPIC -o libdcmi.so dcmi.c
 */
#include <stdio.h>
#include <string.h>

#define DCMI_OK 0
#define DCMI_ERR_CODE_INVALID_PARAMETER (-8001)
#define DCMI_ERR_CODE_INVALID_DEVICE_ID (-8007)
#define DCMI_ERR_CODE_NOT_REDAY (-8012)
#define DCMI_ERR_CODE_NOT_SUPPORT (-8255)

#define DCMI_UTILIZATION_RATE_DDR 1
#define DCMI_UTILIZATION_RATE_AICORE 2

#define EXPORT __attribute__((visibility("default")))

struct dcmi_hbm_info {
    unsigned long long memory_size; /* MB */
    unsigned int freq;              /* MHz */
    unsigned long long memory_usage; /* MB */
    int temp;
    unsigned int bandwith_util_rate;
};

struct dcmi_chip_info {
    unsigned char chip_type[32];
    unsigned char chip_name[32];
    unsigned char chip_ver[32];
    unsigned int aicore_cnt;
};

struct dcmi_pcie_info_all {
    unsigned int venderid;
    unsigned int subvenderid;
    unsigned int deviceid;
    unsigned int subdeviceid;
    int domain;
    unsigned int bdf_busid;
    unsigned int bdf_deviceid;
    unsigned int bdf_funcid;
    unsigned char reserve[32];
};

struct dcmi_die_id {
    unsigned int soc_die[5];
};

enum dcmi_die_type { NDIE, VDIE };

struct dcmi_proc_mem_info {
    int proc_id;
    unsigned long proc_mem_usage; /* bytes */
};

static int initialized;

/* Index of the card in the table below, or -1 for an unknown card or chip. */
static int chip(int card_id, int device_id) {
    if (device_id != 0)
        return -1;
    if (card_id == 3)
        return 0;
    if (card_id == 7)
        return 1;
    return -1;
}

#define CHECK(card_id, device_id)                                                              \
    int i = chip(card_id, device_id);                                                          \
    if (!initialized)                                                                          \
        return DCMI_ERR_CODE_NOT_REDAY;                                                        \
    if (i < 0)                                                                                 \
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;

static const int cards[2] = {3, 7};

EXPORT int dcmi_init(void) {
    initialized = 1;
    return DCMI_OK;
}

static int card_list(int *card_num, int *card_list, int list_len) {
    if (!initialized)
        return DCMI_ERR_CODE_NOT_REDAY;
    if (!card_num || !card_list || list_len < 2)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    card_list[0] = cards[0];
    card_list[1] = cards[1];
    *card_num = 2;
    return DCMI_OK;
}

#ifndef STANDIN_MINIMAL
EXPORT int dcmi_get_card_num_list(int *card_num, int *card_list_out, int list_len) {
    return card_list(card_num, card_list_out, list_len);
}
#else
EXPORT int dcmi_get_card_list(int *card_num, int *card_list_out, int list_len) {
    return card_list(card_num, card_list_out, list_len);
}
#endif

EXPORT int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    CHECK(card_id, 0);
    if (!device_num)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    *device_num = 1;
    return DCMI_OK;
}

EXPORT int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type,
                                            unsigned int *utilization_rate) {
    static const unsigned int aicore[2] = {37, 81};
    CHECK(card_id, device_id);
    if (!utilization_rate)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    switch (input_type) {
    case DCMI_UTILIZATION_RATE_AICORE:
        *utilization_rate = aicore[i];
        return DCMI_OK;
    case DCMI_UTILIZATION_RATE_DDR:
        *utilization_rate = 11;
        return DCMI_OK;
    default:
        return DCMI_ERR_CODE_NOT_SUPPORT;
    }
}

EXPORT int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info) {
    static const struct dcmi_hbm_info hbm[2] = {
        {.memory_size = 65536, .freq = 1600, .memory_usage = 12288, .temp = 41, .bandwith_util_rate = 23},
        {.memory_size = 32768, .freq = 1600, .memory_usage = 30000, .temp = 52, .bandwith_util_rate = 90},
    };
    CHECK(card_id, device_id);
    if (!hbm_info)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    *hbm_info = hbm[i];
    return DCMI_OK;
}

EXPORT int dcmi_get_device_temperature(int card_id, int device_id, int *temperature) {
    static const int celsius[2] = {47, 63};
    CHECK(card_id, device_id);
    if (!temperature)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
#ifdef STANDIN_MINIMAL
    if (i == 1)
        return DCMI_ERR_CODE_NOT_SUPPORT;
#endif
    *temperature = celsius[i];
    return DCMI_OK;
}

#ifndef STANDIN_MINIMAL
EXPORT int dcmi_get_device_power_info(int card_id, int device_id, int *power) {
    static const int decawatts[2] = {1234, 2005}; /* unit 0.1 W */
    CHECK(card_id, device_id);
    if (!power)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    *power = decawatts[i];
    return DCMI_OK;
}

EXPORT int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    static const unsigned int state[2] = {0, 2};
    CHECK(card_id, device_id);
    if (!health)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    *health = state[i];
    return DCMI_OK;
}

EXPORT int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    static const int logic[2] = {1, 0};
    CHECK(card_id, device_id);
    if (!device_logic_id)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    *device_logic_id = logic[i];
    return DCMI_OK;
}

EXPORT int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    CHECK(card_id, device_id);
    if (!chip_info)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    memset(chip_info, 0, sizeof *chip_info);
    strcpy((char *)chip_info->chip_type, "Ascend");
    strcpy((char *)chip_info->chip_name, "910B3");
    strcpy((char *)chip_info->chip_ver, "V1");
    chip_info->aicore_cnt = 20;
    return DCMI_OK;
}

EXPORT int dcmi_get_device_pcie_info_v2(int card_id, int device_id,
                                        struct dcmi_pcie_info_all *pcie_info) {
    static const unsigned int bus[2] = {0xc1, 0x41};
    CHECK(card_id, device_id);
    if (!pcie_info)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    memset(pcie_info, 0, sizeof *pcie_info);
    pcie_info->venderid = 0x19e5;
    pcie_info->deviceid = 0xd802;
    pcie_info->domain = i;
    pcie_info->bdf_busid = bus[i];
    pcie_info->bdf_deviceid = 0;
    pcie_info->bdf_funcid = 0;
    return DCMI_OK;
}

EXPORT int dcmi_get_device_die_v2(int card_id, int device_id, enum dcmi_die_type input_type,
                                  struct dcmi_die_id *die_id) {
    CHECK(card_id, device_id);
    if (!die_id || input_type != VDIE)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    die_id->soc_die[0] = (unsigned int)card_id * 0x1000 + 1;
    for (int w = 1; w < 5; w++)
        die_id->soc_die[w] = (unsigned int)w + 1;
    return DCMI_OK;
}

/* Writes at most 32 entries, as the real call documents. */
EXPORT int dcmi_get_device_resource_info(int card_id, int device_id,
                                         struct dcmi_proc_mem_info *proc_info, int *proc_num) {
    CHECK(card_id, device_id);
    if (!proc_info || !proc_num)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    if (i == 0) {
        proc_info[0].proc_id = 4242;
        proc_info[0].proc_mem_usage = 1UL << 30;
        proc_info[1].proc_id = 4343;
        proc_info[1].proc_mem_usage = 512UL << 20;
        *proc_num = 2;
    } else {
        *proc_num = 0;
    }
    return DCMI_OK;
}

EXPORT int dcmi_get_driver_version(char *driver_ver, unsigned int len) {
    if (!initialized)
        return DCMI_ERR_CODE_NOT_REDAY;
    if (!driver_ver || len == 0)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    snprintf(driver_ver, len, "%s", "24.1.rc2.stand-in");
    return DCMI_OK;
}
#endif /* STANDIN_MINIMAL */
