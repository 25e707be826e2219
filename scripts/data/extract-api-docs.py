#!/usr/bin/env python3
"""Write a library's API documentation as JSONL for MEMCoder's memory
([memory] api_docs): one {name, signature, description, source} object per
public function, class and method of an installed package.

  .venv/bin/python scripts/data/extract-api-docs.py numpy --out numpy-api.jsonl [--max-depth 2]

Only imports the package (its own import code runs; use a package you
trust). Private names (leading underscore) and re-exports from other
packages are skipped; the description is the docstring's first paragraph.
"""
import argparse
import importlib
import inspect
import json
import os
import pkgutil
import sys


def first_paragraph(doc):
    doc = inspect.cleandoc(doc or "")
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def signature(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def source_of(obj):
    try:
        return "%s:%d" % (inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1])
    except (TypeError, OSError):
        return None


def walk(root, max_depth):
    seen = set()
    mods = [importlib.import_module(root)]
    pkg = mods[0]
    if hasattr(pkg, "__path__") and max_depth > 1:
        for info in pkgutil.walk_packages(pkg.__path__, root + "."):
            name = info.name
            if any(part.startswith("_") for part in name.split(".")) or name.count(".") >= max_depth:
                continue
            try:
                mods.append(importlib.import_module(name))
            except Exception as e:  # a submodule that needs optional deps
                print("skip %s: %s" % (name, e), file=sys.stderr)
    for mod in mods:
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)
                                            or type(obj).__name__ in ("ufunc", "_ArrayFunctionDispatcher")):
                continue
            owner = getattr(obj, "__module__", "") or ""
            if owner and not owner.startswith(root):
                continue
            qual = "%s.%s" % (mod.__name__, attr)
            if id(obj) in seen and not qual.count(".") == 1:
                continue
            seen.add(id(obj))
            yield {"name": qual, "signature": signature(obj), "description": first_paragraph(obj.__doc__),
                   "source": source_of(obj)}
            if inspect.isclass(obj):
                for m, f in sorted(vars(obj).items()):
                    if m.startswith("_") or not callable(f):
                        continue
                    yield {"name": "%s.%s" % (qual, m), "signature": signature(f),
                           "description": first_paragraph(getattr(f, "__doc__", "")), "source": source_of(f)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-depth", type=int, default=2, help="module nesting to descend (1 = the package only)")
    a = ap.parse_args()
    names = set()
    tmp = a.out + ".tmp"
    n = 0
    with open(tmp, "w") as f:
        for entry in walk(a.package, a.max_depth):
            if entry["name"] in names:
                continue
            names.add(entry["name"])
            f.write(json.dumps(entry) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.out)
    print("wrote %d API entries to %s" % (n, a.out))


if __name__ == "__main__":
    main()
