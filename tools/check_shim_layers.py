#!/usr/bin/env python3
"""Checks that the shim's files only call and include downwards.

The layers are listed in shim/layers.txt, bottom first.  A file may include and
call files of its own layer and of the layers below it; this fails on

  - an `#include "x.h"` of a header in a layer above the including file;
  - a call (or any other reference) from one object to a symbol that an object
    of a layer above defines, read from the built objects (`nm` on
    shim/build/*.o: each undefined symbol resolved to the object defining it),
    so the check sees the real call graph, inline functions from headers too;
  - files of one layer that call each other in a circle;
  - a shim file missing from the table, or a name in the table with no file.

Prints one line per violation and exits 1 when there is any; prints nothing and
exits 0 otherwise.  Run by `make lint` (after building the shim).  Python 3.11,
standard library only.

    tools/check_shim_layers.py [--shim DIR] [--objects DIR] [--layers FILE]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# `nm -P`: name, type, [value, size].  Lower-case types are local symbols.
DEFINED_TYPES = set("ABCDGRSTVW")
UNDEFINED_TYPES = {"U", "w", "v"}


def read_layers(path: Path) -> tuple[list[str], dict[str, int], list[str]]:
    """The layer names bottom first, each table entry's layer index, and problems."""
    names: list[str] = []
    layer_of: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        layer, entries = words[0], words[1:]
        if layer in names:
            problems.append(f"{path}:{number}: layer {layer} is listed twice")
            continue
        names.append(layer)
        for entry in entries:
            if entry in layer_of:
                problems.append(f"{path}:{number}: {entry} is in two layers")
            layer_of[entry] = len(names) - 1
    return names, layer_of, problems


def file_layers(shim: Path, layer_of: dict[str, int], table: Path) -> tuple[dict[str, int], list]:
    """Each shim source or header (by file name) and its layer."""
    layers: dict[str, int] = {}
    problems: list[str] = []
    files = sorted(p.name for p in shim.iterdir() if p.suffix in (".c", ".h"))
    for name in files:
        stem = name.rsplit(".", 1)[0]
        if name in layer_of:
            layers[name] = layer_of[name]
        elif stem in layer_of:
            layers[name] = layer_of[stem]
        else:
            problems.append(f"shim/{name}: not in the layer table ({table.name})")
    for entry in layer_of:
        if not any(name == entry or name.rsplit(".", 1)[0] == entry for name in files):
            problems.append(f"{table.name}: {entry} names no file in shim/")
    return layers, problems


def include_violations(shim: Path, layers: dict[str, int], names: list[str]) -> list[str]:
    problems = []
    for name, layer in sorted(layers.items()):
        for number, line in enumerate((shim / name).read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            included = match.group(1)
            if included not in layers:
                if (shim / included).exists():
                    continue  # reported as missing from the table already
                problems.append(f"shim/{name}:{number}: includes {included}, not a shim file")
            elif layers[included] > layer:
                problems.append(
                    f"shim/{name}:{number}: includes {included} "
                    f"(layer {names[layers[included]]}) from layer {names[layer]}"
                )
    return problems


def read_symbols(obj: Path) -> tuple[dict[str, str], set[str]]:
    """The global symbols obj defines (name -> nm type) and those it refers to."""
    listing = subprocess.run(
        ["nm", "-P", str(obj)], capture_output=True, text=True, check=True
    ).stdout
    defined: dict[str, str] = {}
    undefined: set[str] = set()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        symbol, kind = fields[0], fields[1]
        if kind in UNDEFINED_TYPES:
            undefined.add(symbol)
        elif kind in DEFINED_TYPES:
            defined[symbol] = kind
    return defined, undefined


def call_graph(shim: Path, objects: Path) -> tuple[dict[str, dict[str, set[str]]], dict, list]:
    """source -> {source it refers to -> symbols}, symbol -> nm type, problems."""
    problems = []
    sources = sorted(p.name for p in shim.glob("*.c"))
    defined_in: dict[str, str] = {}
    kinds: dict[str, str] = {}
    refers: dict[str, set[str]] = {}
    for source in sources:
        obj = objects / (source[:-2] + ".o")
        if not obj.exists():
            problems.append(f"shim/{source}: no object {obj}; build the shim first (make shim)")
            continue
        defined, undefined = read_symbols(obj)
        for symbol, kind in defined.items():
            defined_in[symbol] = source
            kinds[symbol] = kind
        refers[source] = undefined
    graph: dict[str, dict[str, set[str]]] = {}
    for source, undefined in refers.items():
        edges: dict[str, set[str]] = {}
        for symbol in undefined:
            target = defined_in.get(symbol)
            if target is not None and target != source:
                edges.setdefault(target, set()).add(symbol)
        graph[source] = edges
    return graph, kinds, problems


def call_violations(graph, kinds, layers: dict[str, int], names: list[str]) -> list[str]:
    problems = []
    for source, edges in sorted(graph.items()):
        if source not in layers:
            continue
        for target, symbols in sorted(edges.items()):
            if target not in layers or layers[target] <= layers[source]:
                continue
            for symbol in sorted(symbols):
                verb = "calls" if kinds.get(symbol) in ("T", "W") else "refers to"
                problems.append(
                    f"shim/{source}: {verb} {symbol} in shim/{target} "
                    f"(layer {names[layers[target]]}) from layer {names[layers[source]]}"
                )
    return problems


def cycles(graph, layers: dict[str, int], names: list[str]) -> list[str]:
    """Files of one layer that call each other in a circle (strongly connected sets of
    the calls within a layer; a circle through an upward call is reported as that call)."""
    graph = {
        source: [t for t in edges if source in layers and layers.get(t) == layers[source]]
        for source, edges in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [
        f"shim/{component[0]}: calls in a circle with "
        + ", ".join(f"shim/{m}" for m in component[1:])
        + f" (layer {names[layers[component[0]]]})"
        for component in found
    ]


def check(shim: Path, objects: Path, table: Path) -> list[str]:
    names, layer_of, problems = read_layers(table)
    layers, missing = file_layers(shim, layer_of, table)
    problems += missing
    problems += include_violations(shim, layers, names)
    graph, kinds, object_problems = call_graph(shim, objects)
    problems += object_problems
    problems += call_violations(graph, kinds, layers, names)
    problems += cycles(graph, layers, names)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--shim", type=Path, default=REPO / "shim", help="the shim's sources")
    parser.add_argument("--objects", type=Path, help="its built objects (default: SHIM/build)")
    parser.add_argument("--layers", type=Path, help="the layer table (default: SHIM/layers.txt)")
    options = parser.parse_args(argv)
    objects = options.objects or options.shim / "build"
    table = options.layers or options.shim / "layers.txt"
    problems = check(options.shim, objects, table)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
