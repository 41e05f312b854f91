#!/usr/bin/env python3
"""Reads every #include of the project's sources and fails on an arrow
against the documented order (docs/ARCHITECTURE.md, "Dependency arrows"):

  1. top-level folders: core <- simulator <- backends <- models <- engine <- experiments
     (a folder includes only from itself and the folders before it);
  2. inside engine/, the levels below, each including only its own level and
     lower ones;
  3. concrete backends (backends/cpu/, backends/cuda/) are known only to the
     backend registry (ENTRY_POINTS: engine/cli/backend_registry.cc); the
     rest of the code goes through backends/backend.h.

  4. engine/ never branches on the model's kind (ModelSpec::vision(), vqa(),
     moe()): it asks the model what it reads and reports (models/model_io.h).

usage: include_order.py REPO_ROOT"""
import os
import re
import sys

TOP_ORDER = ["core", "simulator", "backends", "models", "engine", "experiments"]

# engine/ levels, lowest first: a folder includes only from its own level and
# lower ones (docs/ARCHITECTURE.md draws them). Folders on one level do not
# include each other today except plan/ and memory/ (a segment plan is
# checked against the memory model).
ENGINE_LEVELS = [
    {"schedule", "tracing", "data"},
    {"plan", "memory"},
    {"parallel", "checkpoint"},
    {"step", "export", "generate"},
    {"simulation", "training"},
    {"planner"},
    {"pictures"},
    {"cli", "calibrate"},
]

# The one file outside backends/ that knows the concrete backends: the
# registry the commands ask for a backend by name.
ENTRY_POINTS = {"engine/cli/backend_registry.cc"}
CONCRETE = ("backends/cpu/", "backends/cuda/")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
KIND_BRANCH = re.compile(r'\.(vision|vqa|moe)\(\)')


def engine_part(path):
    """The folder of engine/ a path is in; "engine" for a file directly in
    engine/, which has no level: every source lives in a folder."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else "engine"


def level_of(part):
    for i, level in enumerate(ENGINE_LEVELS):
        if part in level:
            return i
    return None


def check_file(path, text, problems):
    top = path.split("/")[0]
    for n, line in enumerate(text.splitlines(), 1):
        if top == "engine" and KIND_BRANCH.search(line.split("//")[0]):
            problems.append(f"{path}:{n}: branches on the model's kind; ask models/model_io.h instead")
        m = INCLUDE.match(line)
        if not m:
            continue
        target = m.group(1)
        ttop = target.split("/")[0]
        where = f"{path}:{n}: includes {target}"
        if top in TOP_ORDER and ttop in TOP_ORDER and TOP_ORDER.index(ttop) > TOP_ORDER.index(top):
            problems.append(f"{where}: {top}/ may not depend on {ttop}/ ({' <- '.join(TOP_ORDER)})")
        if top == "engine" and ttop == "engine":
            src, dst = engine_part(path), engine_part(target)
            ls, ld = level_of(src), level_of(dst)
            if "engine" in (src, dst):
                loose = path if src == "engine" else target
                problems.append(f"{where}: {loose} lies directly in engine/; put it in a folder of ENGINE_LEVELS")
            elif ls is None or ld is None:
                problems.append(f"{where}: engine/{src if ls is None else dst}/ has no level in ENGINE_LEVELS")
            elif ld > ls:
                problems.append(f"{where}: engine/{src}/ is below engine/{dst}/")
        if target.startswith(CONCRETE) and top != "backends" and top not in ("tests", "experiments") \
                and path not in ENTRY_POINTS:
            problems.append(f"{where}: only the entry points that choose a backend know concrete backends")


def self_test():
    """Each rule catches its own kind of arrow, and a clean include passes."""
    cases = {
        ("core/x.cc", '#include "engine/plan/plan.h"'): "core/ may not depend on engine/",
        ("models/x.cc", '#include "backends/backend.h"'): None,
        ("engine/schedule/x.cc", '#include "engine/planner/planner.h"'): "engine/schedule/ is below engine/planner/",
        ("engine/planner/x.cc", '#include "engine/cli/commands.h"'): "engine/planner/ is below engine/cli/",
        ("engine/training/trainer.cc", '#include "backends/cpu/cpu_backend.h"'): "only the entry points",
        ("engine/cli/backend_registry.cc", '#include "backends/cpu/cpu_backend.h"'): None,
        ("engine/cli/train_command.cc", '#include "backends/cpu/cpu_backend.h"'): "only the entry points",
        ("engine/plan/plan.cc", '#include "engine/step/step_engine.h"'): "engine/plan/ is below engine/step/",
        ("engine/loose.cc", '#include "engine/plan/plan.h"'): "engine/loose.cc lies directly in engine/",
        ("engine/training/trainer.cc", '#include "engine/data/data_loader.h"'): None,
        ("engine/newfolder/x.cc", '#include "engine/plan/plan.h"'): "has no level",
        ("engine/training/trainer.cc", "  if (m.vision()) return;"): "branches on the model's kind",
        ("models/model_io.cc", "  io.routes_to_experts = m.moe();"): None,
    }
    failed = 0
    for (path, line), expect in cases.items():
        problems = []
        check_file(path, line + "\n", problems)
        ok = (not problems) if expect is None else (len(problems) == 1 and expect in problems[0])
        if not ok:
            print(f"self-test: {path} with {line}: expected {expect or 'no problem'}, got {problems}")
            failed += 1
    print(f"include_order self-test: {len(cases) - failed} of {len(cases)} cases right")
    return 1 if failed else 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems, files = [], 0
    for top in TOP_ORDER:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                with open(full, encoding="utf-8", errors="replace") as f:
                    check_file(rel, f.read(), problems)
                files += 1
    if files < 100:
        print(f"include_order: only {files} source files under {root}; wrong root?")
        return 1
    for p in problems:
        print(p)
    print(f"include_order: {files} files, {len(problems)} arrows against the order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
