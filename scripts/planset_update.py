#!/usr/bin/env python3
"""Refresh the measured values of a planner validation set from a new scripts/gpu_plan_set.sh run.

Each configuration of the set names its source file (a `strata bench --json` output); the new
run's file of the same name is read and the record of the same test, batch and context (decode:
ms_per_step at that KV length; prefill: ms at batch x tokens) replaces `measured` and `source`.
Configurations whose file or record is missing are listed and left as they were.

  scripts/planset_update.py tests/planner/data/h100_planset.json bench/results/<dir>/planset
"""
import json
import os
import sys


def find(records, c):
    for r in records:
        if r.get("batch") != c["batch"]:
            continue
        if c["kind"] == "decode_step_ms" and r.get("test") == "decode" and r.get("ctx") == c["prompt"]:
            return r["ms_per_step"]
        if c["kind"] == "prefill_ms" and r.get("test") == "prefill" and r.get("tokens") == c["prompt"]:
            return r["ms"]
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, new_dir = sys.argv[1], sys.argv[2].rstrip("/")
    with open(path) as f:
        data = json.load(f)
    missing = []
    for c in data["configurations"]:
        src = os.path.join(new_dir, os.path.basename(c["source"]))
        try:
            with open(src) as f:
                records = json.load(f)
        except (OSError, ValueError):
            missing.append(c["id"])
            continue
        ms = find(records, c)
        if ms is None:
            missing.append(c["id"])
            continue
        old = c["measured"]
        c["measured"] = round(ms, 4)
        c["source"] = src
        print(f"{c['id']:<48} {old:>10.4f} -> {c['measured']:>10.4f}  {100 * (ms / old - 1):+6.1f}%")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    for m in missing:
        print(f"not in the new run (kept): {m}", file=sys.stderr)


if __name__ == "__main__":
    main()
