#!/usr/bin/env python3
"""Fails on a Catch2 TEST_CASE whose name ctest cannot run.

catch_discover_tests registers each test case by name in a CMake list, and
CMake lists split at ';': a name with a semicolon registers truncated, its
command then selects no test case, and ctest reports Passed for a test that
never ran.

usage: test_names.py REPO_ROOT"""
import os
import re
import sys

NAME = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"')


def problems(root):
    out = []
    for folder, _, files in os.walk(os.path.join(root, "tests")):
        for f in sorted(files):
            if not f.endswith((".cc", ".cu", ".h")):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as src:
                text = src.read()
            for m in NAME.finditer(text):
                name = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                if ";" in name:
                    out.append(f"{os.path.relpath(path, root)}:{line}: test case name has a ';' (CMake splits the "
                               f"name there): {name!r}")
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = problems(sys.argv[1])
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} test case name(s) ctest would not run: use ',' instead")
        sys.exit(1)
    print("every test case name is one ctest can run")


if __name__ == "__main__":
    main()
