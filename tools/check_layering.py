#!/usr/bin/env python3
"""Checks the include layering of splitserve's folders.

Every `#include "a/b.h"` (or <a/b.h>) whose first path component is a folder of the repository is
a dependency of the including file's folder on that header. The table RULES says, per folder, which
headers it may include: the longest folder of the table that contains the file decides; an entry
ending in "/" or naming a folder allows everything under it, an entry ending in a file name allows
that header only. Includes of libraries outside the repository (absl/, grpcpp/, httplib.h, ...)
are not checked. A source file in a folder the table does not name is an error too, so a new
top-level folder gets its rule on purpose.

Prints one line per offending include, `file:line: includes "header": <folder>/ may include
only ...`, and exits 1; exits 0 when every include is allowed; 2 on usage errors.

  tools/check_layering.py [--root DIR]   (default: the repository holding this script)
"""

import argparse
import os
import re
import sys

# Which repository headers each folder may include. ANY: anything (test, benchmark and tool code).
ANY = None
RULES = {
    # The libraries every process shares: nothing from a process folder.
    "common": ["common"],
    "proto": ["proto", "common"],
    # The coordinator talks to the workers over proto/ only.
    "coordinator": ["coordinator", "common", "proto"],
    # The GPU worker calls the expert workers through their client-side transports.
    "gpu_worker": [
        "gpu_worker", "common", "proto",
        "cpu_expert_worker/transport/grpc_client.h",
        "cpu_expert_worker/transport/shm_client.h",
    ],
    # Kernels see raw pointers, sizes and streams: no backend, RPC or config types.
    "gpu_worker/kernels": ["gpu_worker/kernels", "common"],
    "cpu_expert_worker": ["cpu_expert_worker", "common", "proto"],
    "cpu_expert_worker/kernels": ["cpu_expert_worker/kernels", "common"],
    "tests": ANY,
    "bench": ANY,
    "tools": ANY,
}

SOURCE_EXTENSIONS = (".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
SKIPPED_TOP = ("build", "node_modules")  # build trees (build, build-*) and npm's folder


def rule_folder(path):
    """The longest folder of RULES that contains `path` (repository-relative), or None."""
    parts = path.split("/")[:-1]
    for n in range(len(parts), 0, -1):
        folder = "/".join(parts[:n])
        if folder in RULES:
            return folder
    return None


def allowed(entry, header):
    if entry.endswith((".h", ".hh", ".hpp", ".cuh", ".inc")):
        return header == entry
    return header.startswith(entry.rstrip("/") + "/")


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and not (rel_dir == "." and d.startswith(SKIPPED_TOP))
            and d != "node_modules")
        for f in sorted(filenames):
            if f.endswith(SOURCE_EXTENSIONS):
                yield os.path.normpath(os.path.join(rel_dir, f)).replace(os.sep, "/")


def check(root):
    top_dirs = {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))}
    errors = []
    for path in source_files(root):
        folder = rule_folder(path)
        if folder is None:
            if "/" in path:  # files at the root (none today) belong to no folder
                errors.append(f"{path}: no layering rule for its folder (tools/check_layering.py "
                              f"RULES)")
            continue
        rule = RULES[folder]
        if rule is ANY:
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for line_no, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                header = m.group(1) or m.group(2)
                # A header beside the file, included by its bare name, is the file's own folder's.
                local = os.path.join(os.path.dirname(path), header)
                if "/" not in header and os.path.isfile(os.path.join(root, local)):
                    header = local.replace(os.sep, "/")
                if header.split("/")[0] not in top_dirs:
                    continue  # a library outside the repository
                if not any(allowed(e, header) for e in rule):
                    may = ", ".join(e if e.endswith(".h") else e.rstrip("/") + "/" for e in rule)
                    errors.append(f'{path}:{line_no}: includes "{header}": {folder}/ may include '
                                  f"only {may}")
    return errors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.path.dirname(here), help="repository root")
    a = p.parse_args()
    if not os.path.isdir(a.root):
        print(f"check_layering: --root {a.root}: not a directory", file=sys.stderr)
        return 2
    errors = check(a.root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_layering: {len(errors)} error(s) (rules: tools/check_layering.py RULES)")
        return 1
    print("check_layering: every include is allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
