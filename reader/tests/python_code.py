"""A workload for reader/tests/python_code.rs: functions of known names and lines, then one
JSON line of what this interpreter says of itself (its version, its gilstate TSS key read
with ctypes, each code object's address, file, name and line of every position), and it
waits on standard input (its end ends the script).

Positions are in the unit of the kernel walk (reader/src/pyline.rs): bytes for 3.9, code
units for 3.10 and later.
"""
import ctypes
import dis
import gc
import json
import struct
import sys
import weakref

V = sys.version_info[:2]
# offsetof(_PyRuntimeState, [gilstate.]autoTSSkey) (docs/design/cpython-frames-in-ebpf.md §1.1).
AUTO_TSS = {(3, 9): 584, (3, 10): 584, (3, 11): 592, (3, 12): 1544, (3, 13): 2160}


class K:
    def method(self, x):
        y = x + 1
        if y > 2:
            return y * 2
        return y


def größe(a):
    b = a * 2
    for i in range(3):
        b += i
    return b


def δέλτα(a):
    return [a,
            a + 1]


def f𠀀(a):
    return a


def tss_key():
    """The key as CPython keeps it, and whether its slot holds this thread's state."""
    if V not in AUTO_TSS:
        return None, False
    rt = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    initialized, key = struct.unpack("<iI", ctypes.string_at(rt + AUTO_TSS[V], 8))
    libc = ctypes.CDLL(None)
    libc.pthread_getspecific.restype = ctypes.c_void_p
    libc.pthread_getspecific.argtypes = [ctypes.c_uint]
    get = ctypes.pythonapi.PyThreadState_Get
    get.restype = ctypes.c_void_p
    return key, initialized == 1 and get() == libc.pthread_getspecific(key)


def lines(code):
    """(position, line) of every position of `code` (None where it has no line)."""
    if hasattr(code, "co_lines"):
        return [[off // 2, line]
                for start, end, line in code.co_lines()
                for off in range(start, end, 2)]
    starts = list(dis.findlinestarts(code))
    out = []
    for off in range(0, len(code.co_code), 2):
        line = None
        for s, ln in starts:
            if s <= off:
                line = ln
        out.append([off, line])
    return out


def describe(code):
    return {
        "addr": id(code),
        "file": code.co_filename,
        "function": getattr(code, "co_qualname", code.co_name),
        "first_line": code.co_firstlineno,
        "lines": lines(code),
    }


def freed_code():
    """The address of a code object that is gone (a weak reference says so)."""
    ns = {}
    exec(compile("def gone(x):\n    return x + 1\n", "<gone>", "exec"), ns)
    code = ns["gone"].__code__
    ref = weakref.ref(code)
    addr = id(code)
    del code, ns
    gc.collect()
    return addr, ref() is None


long_ns = {}
exec("def " + "l" * 600 + "():\n    return 1\n", long_ns)
long_fn = next(v for k, v in long_ns.items() if k.startswith("l"))
codes = [K.method.__code__, größe.__code__, δέλτα.__code__, f𠀀.__code__, long_fn.__code__]
a_list = [1, 2, 3]
key, key_ok = tss_key()
freed, freed_ok = freed_code()
print(json.dumps({
    "minor": V[1],
    "version": ".".join(map(str, sys.version_info[:3])),
    "tss_key": key,
    "tss_key_ok": key_ok,
    "codes": [describe(c) for c in codes],
    "list": id(a_list),
    "freed": freed,
    "freed_ok": freed_ok,
}), flush=True)
sys.stdin.read()
