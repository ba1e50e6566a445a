"""Dumps the line tables of every code object of the given source files, with the lines
CPython itself gives each bytecode position (co_lines() from 3.10 on, dis.findlinestarts
before): the ground truth of reader/src/pyline/tests.rs. Fixtures: run with each CPython
version, e.g. `python3.9 dump_lines.py $(python3.9 -c 'import textwrap; print(textwrap.__file__)')`."""
import dis
import json
import sys
import types


def walk(c):
    yield c
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            yield from walk(k)


out = {"version": list(sys.version_info[:3]), "codes": []}
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        top = compile(f.read(), path, "exec")
    for c in walk(top):
        if sys.version_info >= (3, 10):
            table = c.co_linetable
            lines = [[s, e, l] for (s, e, l) in c.co_lines()]
        else:
            table = c.co_lnotab
            lines = [[o, l] for (o, l) in dis.findlinestarts(c)]
        out["codes"].append(
            {
                "name": c.co_name,
                "first": c.co_firstlineno,
                "table": table.hex(),
                "code_bytes": len(c.co_code),
                "lines": lines,
            }
        )
json.dump(out, sys.stdout)
