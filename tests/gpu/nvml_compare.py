#!/usr/bin/env python3
"""ethand's GPU series (native and dcgm-exporter alias) next to nvidia-smi's reading of the
same moment: reads what scripts/gpu-nvml-compare.sh left in DIR and prints a markdown report.

Usage: nvml_compare.py DIR

Per field: nvidia-smi's value in each of the three rounds, ethand's native series converted to
nvidia-smi's unit, the alias in dcgm-exporter's unit, and whether they agree within the stated
tolerance (gauges that move under load: utilization, power, clocks, temperatures). A field
nvidia-smi shows as "[N/A]" or "[Not Supported]" must be absent from ethand ("absent" agrees);
a series ethand has where nvidia-smi has none, or the reverse, disagrees.
"""
import csv
import json
import os
import re
import sys

MIB = 1 << 20
LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Clock event reason bits (nvml.h nvmlClocksEventReason*) and ethand's names for them.
REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def parse_metrics(path):
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            pass
    return out


def pick(series, name, want):
    """The value of the first series `name` whose labels include `want`, else None."""
    for n, labels, v in series:
        if n == name and all(labels.get(k) == val for k, val in want.items()):
            return v
    return None


def labels_of(series, name, want):
    for n, labels, _ in series:
        if n == name and all(labels.get(k) == val for k, val in want.items()):
            return labels
    return None


def smi_rows(path):
    try:
        rows = list(csv.reader(open(path)))
    except OSError:
        return []
    if len(rows) < 2:
        return []
    head = [h.strip().split(" [")[0] for h in rows[0]]
    return [dict(zip(head, (c.strip() for c in r))) for r in rows[1:]]


def smi_number(v):
    """nvidia-smi's value as a number: "123 MiB" -> 123, "Yes"/"No" -> 1/0, hex masks -> int;
    None for "[N/A]", "[Not Supported]" and the like."""
    if v is None:
        return None
    v = v.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    if v in ("Yes", "No"):
        return 1.0 if v == "Yes" else 0.0
    if v.startswith("0x"):
        return float(int(v, 16))
    try:
        return float(v.split()[0])
    except ValueError:
        return None


def q_replays(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    m = re.search(r"Replays Since Reset\s*:\s*(\d+)", text)
    return float(m.group(1)) if m else None


def dmon_gpm(path):
    """Mean of each GPM column of `nvidia-smi dmon --gpm-metrics` over its samples of gpu 0."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return {}
    head, sums = None, {}
    for line in lines:
        if line.startswith("#") and head is None:
            head = line.lstrip("#").split()
            continue
        if line.startswith("#") or not line.strip():
            continue
        cells = line.split()
        if not head or len(cells) != len(head) or cells[0] != "0":
            continue
        # A column's "-" (GPM's first interval) is no sample of it.
        for h, c in zip(head[1:], cells[1:]):
            try:
                v = float(c)
            except ValueError:
                continue
            t, k = sums.get(h, (0.0, 0))
            sums[h] = (t + v, k + 1)
    return {h: t / k for h, (t, k) in sums.items()}


def fmt(v):
    if v is None:
        return "absent"
    if abs(v - round(v)) < 1e-9:
        return str(int(round(v)))
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"


def agree(a, b, tol):
    """tol: ("abs", x) or ("rel", x)."""
    if a is None or b is None:
        return a is None and b is None
    kind, x = tol
    if kind == "abs":
        return abs(a - b) <= x
    return abs(a - b) <= x * max(abs(a), abs(b), 1e-9)


EXACT = ("abs", 0)

# (what, nvidia-smi field or callable, native (name, labels, factor to smi's unit),
#  alias (name, labels, factor from alias unit to smi's unit) or None, tolerance)
FIELDS = [
    ("GPU utilization (%)", "utilization.gpu", ("ethand_gpu_utilization_ratio", {}, 100), ("DCGM_FI_DEV_GPU_UTIL", {}, 1), ("abs", 15)),
    ("Memory utilization (%)", "utilization.memory", ("ethand_gpu_memory_utilization_ratio", {}, 100), ("DCGM_FI_DEV_MEM_COPY_UTIL", {}, 1), ("abs", 15)),
    ("Encoder utilization (%)", "utilization.encoder", ("ethand_gpu_encoder_utilization_ratio", {}, 100), ("DCGM_FI_DEV_ENC_UTIL", {}, 1), EXACT),
    ("Decoder utilization (%)", "utilization.decoder", ("ethand_gpu_decoder_utilization_ratio", {}, 100), ("DCGM_FI_DEV_DEC_UTIL", {}, 1), EXACT),
    ("Memory total (MiB)", "memory.total", ("ethand_gpu_memory_total_bytes", {}, 1 / MIB), None, ("abs", 1)),
    ("Memory reserved (MiB)", "memory.reserved", ("ethand_gpu_memory_reserved_bytes", {}, 1 / MIB), ("DCGM_FI_DEV_FB_RESERVED", {}, 1), ("abs", 1)),
    ("Memory used (MiB)", "memory.used", ("ethand_gpu_memory_used_bytes", {}, 1 / MIB), ("DCGM_FI_DEV_FB_USED", {}, 1), ("abs", 64)),
    ("Memory free (MiB)", "memory.free", ("ethand_gpu_memory_free_bytes", {}, 1 / MIB), ("DCGM_FI_DEV_FB_FREE", {}, 1), ("abs", 64)),
    ("GPU temperature (C)", "temperature.gpu", ("ethand_gpu_temperature_celsius", {}, 1), ("DCGM_FI_DEV_GPU_TEMP", {}, 1), ("abs", 3)),
    ("Memory temperature (C)", "temperature.memory", ("ethand_gpu_memory_temperature_celsius", {}, 1), ("DCGM_FI_DEV_MEMORY_TEMP", {}, 1), ("abs", 3)),
    ("Power draw (W)", "power.draw", ("ethand_gpu_power_watts", {}, 1), ("DCGM_FI_DEV_POWER_USAGE", {}, 1), ("rel", 0.25)),
    ("Enforced power limit (W)", "enforced.power.limit", ("ethand_gpu_power_limit_watts", {}, 1), None, ("abs", 0.5)),
    ("SM clock (MHz)", ("clocks.current.sm", "clocks.sm"), ("ethand_gpu_sm_clock_hertz", {}, 1e-6), ("DCGM_FI_DEV_SM_CLOCK", {}, 1), ("rel", 0.1)),
    ("Memory clock (MHz)", ("clocks.current.memory", "clocks.mem"), ("ethand_gpu_memory_clock_hertz", {}, 1e-6), ("DCGM_FI_DEV_MEM_CLOCK", {}, 1), ("rel", 0.02)),
    ("PCIe generation now", ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"), ("ethand_gpu_pcie_link_generation", {}, 1), None, EXACT),
    ("PCIe generation max", ("pcie.link.gen.max",), ("ethand_gpu_pcie_link_generation_max", {}, 1), None, EXACT),
    ("PCIe width now", "pcie.link.width.current", ("ethand_gpu_pcie_link_width", {}, 1), None, EXACT),
    ("PCIe width max", "pcie.link.width.max", ("ethand_gpu_pcie_link_width_max", {}, 1), None, EXACT),
    ("PCIe replays", "__replays", ("ethand_gpu_pcie_replays_total", {}, 1), ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", {}, 1), EXACT),
    ("Remapped rows, correctable", "remapped_rows.correctable", ("ethand_gpu_memory_remapped_rows_total", {"cause": "correctable"}, 1), ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", {}, 1), EXACT),
    ("Remapped rows, uncorrectable", "remapped_rows.uncorrectable", ("ethand_gpu_memory_remapped_rows_total", {"cause": "uncorrectable"}, 1), ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", {}, 1), EXACT),
    ("Row remap pending", "remapped_rows.pending", ("ethand_gpu_memory_row_remap_pending", {}, 1), None, EXACT),
    ("Row remap failure", "remapped_rows.failure", ("ethand_gpu_memory_row_remap_failed", {}, 1), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", {}, 1), EXACT),
    ("Retired pages, single-bit", "retired_pages.single_bit_ecc.count", ("ethand_gpu_memory_retired_pages_total", {"cause": "single_bit"}, 1), None, EXACT),
    ("Retired pages, double-bit", "retired_pages.double_bit.count", ("ethand_gpu_memory_retired_pages_total", {"cause": "double_bit"}, 1), None, EXACT),
    ("Retired pages pending", "retired_pages.pending", ("ethand_gpu_memory_retired_pages_pending", {}, 1), None, EXACT),
    ("ECC corrected, volatile", "ecc.errors.corrected.volatile.total", ("ethand_gpu_ecc_errors_total", {"type": "corrected"}, 1), ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", {}, 1), EXACT),
    ("ECC uncorrected, volatile", "ecc.errors.uncorrected.volatile.total", ("ethand_gpu_ecc_errors_total", {"type": "uncorrected"}, 1), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", {}, 1), EXACT),
]

# GPM: nvidia-smi dmon's mean over the rounds against ethand's value in each round (both are
# averages over their own 1 s intervals of a steady load). dmon column, native, alias, factor
# from ratio to dmon's unit.
GPM = [
    ("Graphics activity (%)", ("gract", "gr"), "ethand_gpu_graphics_activity_ratio", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("SM activity (%)", ("smutil", "sm"), "ethand_gpu_sm_activity_ratio", "DCGM_FI_PROF_SM_ACTIVE"),
    ("SM occupancy (%)", ("smocc",), "ethand_gpu_sm_occupancy_ratio", "DCGM_FI_PROF_SM_OCCUPANCY"),
    ("Tensor activity (%)", ("mmaact", "anyten", "tensor"), "ethand_gpu_tensor_activity_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("DRAM activity (%)", ("dramu", "dram"), "ethand_gpu_dram_bandwidth_ratio", "DCGM_FI_PROF_DRAM_ACTIVE"),
]


def main(d):
    rounds = [parse_metrics(os.path.join(d, f"metrics-{r}.txt")) for r in (1, 2, 3)]
    smis = [smi_rows(os.path.join(d, f"smi-{r}.csv")) for r in (1, 2, 3)]
    replays = q_replays(os.path.join(d, "smi-q.txt"))
    gpm = dmon_gpm(os.path.join(d, "smi-gpm-dmon.txt"))
    print("# ethand /metrics against nvidia-smi, same moments (scripts/gpu-nvml-compare.sh)\n")
    try:
        print("```\n" + open(os.path.join(d, "env.txt")).read().strip() + "\n```\n")
    except OSError:
        pass
    ngpu = max((len(s) for s in smis), default=0)
    bad = 0
    for gi in range(ngpu):
        native = {"gpu": f"gpu{gi}"}
        alias = {"gpu": str(gi)}
        print(f"## gpu{gi}\n")
        print("Per round (1 / 2 / 3); native converted to nvidia-smi's unit, alias in "
              "dcgm-exporter's.\n")
        print("| field | nvidia-smi | ethand native | DCGM alias | agree |")
        print("| --- | --- | --- | --- | --- |")
        for what, field, (nn, nl, nf), al, tol in FIELDS:
            cells = {"smi": [], "nat": [], "ali": []}
            ok = True
            for r in range(3):
                row = smis[r][gi] if gi < len(smis[r]) else {}
                if field == "__replays":
                    s = replays if gi == 0 else None
                elif isinstance(field, tuple):
                    s = next((smi_number(row.get(f)) for f in field
                              if smi_number(row.get(f)) is not None), None)
                else:
                    s = smi_number(row.get(field))
                n = pick(rounds[r], nn, {**native, **nl})
                n = None if n is None else n * nf
                a = None
                if al:
                    a = pick(rounds[r], al[0], {**alias, **al[1]})
                    a = None if a is None else a * al[2]
                ok &= agree(s, n, tol)
                if al:
                    ok &= agree(s, a, tol)
                cells["smi"].append(s)
                cells["nat"].append(n)
                cells["ali"].append(a)
            bad += not ok
            j = lambda xs: " / ".join(fmt(x) for x in xs)
            print(f"| {what} | {j(cells['smi'])} | {j(cells['nat'])} | "
                  f"{j(cells['ali']) if al else 'no alias'} | {'yes' if ok else '**NO**'} |")
        # Clock event reasons: names of the set bits against ethand's 0/1 series.
        row = smis[1][gi] if gi < len(smis[1]) else {}
        mask = smi_number(row.get("clocks_event_reasons.active") or row.get("clocks_throttle_reasons.active"))
        smi_names = sorted(n for b, n in REASONS.items() if mask is not None and int(mask) & b)
        ours = sorted(l["reason"] for nm, l, v in rounds[1]
                      if nm == "ethand_gpu_throttle_reason" and l.get("gpu") == f"gpu{gi}" and v == 1)
        ok = mask is not None and smi_names == ours
        bad += not ok
        print(f"| Clock event reasons (round 2) | {', '.join(smi_names) or 'none'} | "
              f"{', '.join(ours) or 'none'} | no alias | {'yes' if ok else '**NO**'} |")
        drv = row.get("driver_version")
        info = labels_of(rounds[1], "ethand_gpu_info", native) or {}
        al = labels_of(rounds[1], "DCGM_FI_DEV_GPU_TEMP", alias) or {}
        ok = drv is not None and info.get("driver") == drv and al.get("DCGM_FI_DRIVER_VERSION") == drv
        bad += not ok
        print(f"| Driver version | {drv} | {info.get('driver')} (ethand_gpu_info) | "
              f"{al.get('DCGM_FI_DRIVER_VERSION')} (label) | {'yes' if ok else '**NO**'} |")
        # Energy: no nvidia-smi field; the alias (mJ) against the native counter (J).
        e = [pick(rs, "ethand_gpu_energy_joules_total", native) for rs in rounds]
        ea = [pick(rs, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", alias) for rs in rounds]
        ok = all(x is not None and y is not None and abs(x * 1000 - y) <= 1 for x, y in zip(e, ea))
        bad += not ok
        print(f"| Energy (J; alias mJ) | no field | {' / '.join(fmt(x) for x in e)} | "
              f"{' / '.join(fmt(x) for x in ea)} | {'yes' if ok else '**NO**'} (alias = native x 1000) |")
        nv = [pick(rs, "ethand_gpu_nvlink_bytes_per_second", native) for rs in rounds]
        nva = [pick(rs, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", alias) for rs in rounds]
        print(f"| NVLink traffic (B/s; alias ~MiB/s) | see `nvidia-smi nvlink -gt d` | "
              f"{' / '.join(fmt(x) for x in nv)} | {' / '.join(fmt(x) for x in nva)} | - |")
        print()
        if gi == 0 and gpm:
            print("GPM: `nvidia-smi dmon --gpm-metrics` mean over the 12 s of the rounds (%; its "
                  "first interval has no GPM value), against ethand's 1 s value in each round.\n")
            print("| field | nvidia-smi dmon | ethand native (%) | DCGM alias (ratio) | agree (±10 points) |")
            print("| --- | --- | --- | --- | --- |")
            for what, cols, nn, an in GPM:
                s = next((gpm[c] for c in cols if c in gpm), None)
                n = [pick(rs, nn, native) for rs in rounds]
                a = [pick(rs, an, alias) for rs in rounds]
                ok = all(x is not None and s is not None and abs(x * 100 - s) <= 10 for x in n)
                ok &= all(x == y for x, y in zip(n, a))
                bad += not ok
                print(f"| {what} | {fmt(s)} | {' / '.join(fmt(None if x is None else x * 100) for x in n)} | "
                      f"{' / '.join(fmt(x) for x in a)} | {'yes' if ok else '**NO**'} |")
            # dmon's PCIe columns are MiB/s ("GPM:MiB/s"); ethand's bytes/s.
            for what, cols, nn, an in (
                ("PCIe TX (MiB/s; alias B/s)", ("pcitx", "ptx"), "ethand_gpu_pcie_tx_average_bytes_per_second", "DCGM_FI_PROF_PCIE_TX_BYTES"),
                ("PCIe RX (MiB/s; alias B/s)", ("pcirx", "prx"), "ethand_gpu_pcie_rx_average_bytes_per_second", "DCGM_FI_PROF_PCIE_RX_BYTES"),
            ):
                s = next((gpm[c] for c in cols if c in gpm), None)
                n = [pick(rs, nn, native) for rs in rounds]
                a = [pick(rs, an, alias) for rs in rounds]
                n = [None if x is None else x / MIB for x in n]
                ok = s is not None and all(x is not None and abs(x - s) <= 0.1 * s + 1 for x in n)
                bad += not ok
                print(f"| {what} | {fmt(s)} | {' / '.join(fmt(x) for x in n)} | "
                      f"{' / '.join(fmt(x) for x in a)} | {'yes' if ok else '**NO**'} (±10 %) |")
            # Clocks from dmon too (where --query-gpu lacked them): its mean against each round.
            for what, col, nn, an in (
                ("SM clock (MHz)", "pclk", "ethand_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK"),
                ("Memory clock (MHz)", "mclk", "ethand_gpu_memory_clock_hertz", "DCGM_FI_DEV_MEM_CLOCK"),
            ):
                s = gpm.get(col)
                n = [pick(rs, nn, native) for rs in rounds]
                n = [None if x is None else x / 1e6 for x in n]
                a = [pick(rs, an, alias) for rs in rounds]
                ok = s is not None and all(x is not None and abs(x - s) <= 0.05 * s for x in n)
                ok &= all(x is not None and y is not None and abs(x - y) < 1 for x, y in zip(n, a))
                bad += not ok
                print(f"| {what} (dmon) | {fmt(s)} | {' / '.join(fmt(x) for x in n)} | "
                      f"{' / '.join(fmt(x) for x in a)} | {'yes' if ok else '**NO**'} (±5 %) |")
            print()
    # The job's workload labels on its per-process and device series.
    print("## Workload labels (devices.workload_labels = true)\n")
    for nm in ("ethand_gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL", "ethand_process_gpu_utilization_ratio"):
        l = next((l for n, l, _ in rounds[1] if n == nm), None)
        print(f"- `{nm}`: {json.dumps(l) if l is not None else 'absent'}")
    print()
    for f in ("status.txt",):
        try:
            text = open(os.path.join(d, f)).read()
        except OSError:
            continue
        nv = [l for l in text.splitlines() if "nvml" in l.lower()]
        print("## `ethand status` (nvml lines)\n\n```\n" + "\n".join(nv)[:3000] + "\n```\n")
    try:
        t = json.load(open(os.path.join(d, "snapshot-job.json")))
        print("## The job's snapshot: findings\n")
        for x in t.get("findings") or []:
            print(f"- {x.get('id')} ({x.get('severity')}, impact {x.get('impact')})")
        print()
    except (OSError, ValueError) as e:
        print(f"no job snapshot: {e}\n")
    print(f"**{bad} field(s) disagree.**")


if __name__ == "__main__":
    main(sys.argv[1])
