"""Every panel query of deploy/grafana/*.json evaluated through a Prometheus that scrapes a live
ethand on a GPU machine (the CI test, tests/tests/e2e/dashboards.rs, does the same with stand-in
libraries; this one meets NVML and real PyTorch/NCCL). Variables are resolved as Grafana would:
label_values() through the API, "All" as its allValue.

python3 dashboards_check.py PROMETHEUS_URL DASHBOARD_DIR
Prints one line per query: series count, NaN count, title; then the totals. Exit 1 if a query
failed or returned nothing.
"""
import glob
import json
import os
import sys
import urllib.parse
import urllib.request

RATE_INTERVAL = "15s"


def api(base, path, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def substitute(expr, vars):
    out = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__interval", "1s").replace("$__range", "1m")
    for n in sorted(vars, key=len, reverse=True):
        out = out.replace("${" + n + "}", vars[n]).replace("$" + n, vars[n])
    return out


def panels(d):
    out = []
    for p in d.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return [p for p in out if p.get("targets")]


def main():
    base, ddir = sys.argv[1], sys.argv[2]
    failures, checked, empty = [], 0, []
    for f in sorted(glob.glob(os.path.join(ddir, "*.json"))):
        d = json.load(open(f))
        name = os.path.basename(f)
        vars = {}
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") == "datasource":
                vars[v["name"]] = "prometheus"
                continue
            definition = substitute(v.get("definition", ""), vars)
            args = definition[len("label_values("):-1]
            selector, label = [s.strip() for s in args.rsplit(",", 1)]
            values = api(base, f"/api/v1/label/{label}/values", **{"match[]": selector}).get("data", [])
            if v["name"] != "instance" and v.get("includeAll") and v.get("multi"):
                value = v.get("allValue") or ".*"
            else:
                value = values[0] if values else ".*"
            vars[v["name"]] = value
            print(f"{name}: variable {v['name']} = {value!r} (values {values[:6]})")
        for p in panels(d):
            for t in p["targets"]:
                if "expr" not in t:
                    continue
                expr = substitute(t["expr"], vars)
                r = api(base, "/api/v1/query", query=expr)
                res = r.get("data", {}).get("result", [])
                nan = sum(1 for x in res if x.get("value", [0, ""])[1] == "NaN")
                checked += 1
                print(f"  {name} / {p['title']}: {len(res)} series ({nan} NaN)")
                if r.get("status") != "success":
                    failures.append(f"{name} / {p['title']}: {r}")
                elif not res:
                    empty.append(f"{name} / {p['title']}: {expr}")
    print(f"checked {checked} queries: {len(failures)} failed, {len(empty)} empty")
    for e in empty:
        print("  EMPTY", e)
    for f in failures:
        print("  FAILED", f)
    sys.exit(1 if failures or empty else 0)


if __name__ == "__main__":
    main()
