#!/usr/bin/env python3
"""Fails when the published crates' dependency tree needs a newer Rust than the workspace's
`rust-version` says: a dependency update that raises the MSRV must raise it here too, on
purpose. Reads `cargo metadata` (the locked tree); no second toolchain is needed.

Usage: scripts/check-msrv.py   (from anywhere in the workspace)
"""
import json
import subprocess
import sys

PUBLISHED = {"lock-core", "lock-macros", "lock-tower"}


def version(text):
    return tuple(int(part) for part in (text or "0").split("."))


def main():
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    roots = [i for i in metadata["workspace_members"] if packages[i]["name"] in PUBLISHED]
    declared = {packages[i]["name"]: packages[i].get("rust_version") for i in roots}

    # What a user of the published crates compiles: normal and build dependencies, not
    # dev-dependencies.
    seen, stack = set(), list(roots)
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for dep in nodes[current]["deps"]:
            if any(kind["kind"] in (None, "build") for kind in dep["dep_kinds"]):
                stack.append(dep["pkg"])

    needed = max(
        (version(packages[i].get("rust_version")), packages[i]["name"], packages[i]["version"])
        for i in seen
        if packages[i]["name"] not in PUBLISHED
    )
    failed = False
    for name, rust_version in sorted(declared.items()):
        if rust_version is None:
            print(f"{name}: no rust-version declared", file=sys.stderr)
            failed = True
        elif version(rust_version) < needed[0]:
            print(
                f"{name}: rust-version {rust_version}, but {needed[1]} {needed[2]} needs "
                f"{'.'.join(map(str, needed[0]))}: raise the workspace's rust-version",
                file=sys.stderr,
            )
            failed = True
    if failed:
        sys.exit(1)
    print(
        f"MSRV check: rust-version {sorted(set(declared.values()))} covers the dependency tree "
        f"(highest need: {needed[1]} {needed[2]}, {'.'.join(map(str, needed[0]))})"
    )


if __name__ == "__main__":
    main()
