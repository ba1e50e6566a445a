"""Checks, in this interpreter, the offsets ethand's eBPF CPython walk uses (issue 41;
docs/design/cpython-frames-in-ebpf.md): the gilstate key in _PyRuntime, glibc's
thread-specific slot of that key (fsbase + 0x318 + 16*key), the thread state's current
frame, each frame's caller, code object and instruction position, and the line that
position maps to. It reads its own memory with ctypes, from the main thread and from a
second thread, with the GIL held and released (a ctypes call into libc releases it).

Prints one JSON line: {"version": ..., "ok": bool, "checks": [...]} and exits 1 when a check
fails. x86_64 glibc only; CPython 3.9-3.13.
"""
import ctypes
import dis
import json
import struct
import sys
import threading

V = sys.version_info[:2]
# offsetof(_PyRuntimeState, [gilstate.]autoTSSkey); the key is at +4 (Py_tss_t).
AUTO_TSS = {(3, 9): 584, (3, 10): 584, (3, 11): 592, (3, 12): 1544, (3, 13): 2160}
# (tstate->frame path, frame->caller, frame->code, frame->position, position kind)
FRAMES = {
    (3, 9): ([24], 24, 32, 104, "lasti_bytes"),
    (3, 10): ([24], 24, 32, 96, "lasti_units"),
    (3, 11): ([56, 8], 48, 32, 56, "ptr"),
    (3, 12): ([56, 0], 8, 0, 56, "ptr"),
    (3, 13): ([72], 8, 0, 56, "ptr"),
}
# co_code_adaptive (== PyCode_Type.tp_basicsize) for the pointer kinds.
CODE_UNITS = {(3, 11): 184, (3, 12): 192, (3, 13): 200}

libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_ulong
libc.pthread_getspecific.restype = ctypes.c_void_p
libc.pthread_getspecific.argtypes = [ctypes.c_uint]
checks = []


def check(name, ok, **detail):
    checks.append({"check": name, "ok": bool(ok), **detail})


def u64(addr):
    return struct.unpack("<Q", ctypes.string_at(addr, 8))[0]


def i32(addr):
    return struct.unpack("<i", ctypes.string_at(addr, 4))[0]


def runtime_key():
    rt = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    off = AUTO_TSS[V]
    initialized, key = struct.unpack("<iI", ctypes.string_at(rt + off, 8))
    check("autoTSSkey initialized", initialized == 1, offset=off, key=key)
    return key


def slot(key):
    """The thread's TSD slot for `key`, read as the eBPF program would (key < 32)."""
    return u64(libc.pthread_self() + 0x318 + 16 * key)


def line_of(code, pos, kind):
    """The line of a position read from a frame, by CPython's own tables."""
    if kind == "lasti_bytes":
        offset = pos
    elif kind == "lasti_units":
        offset = 2 * pos
    else:
        offset = 2 * ((pos - (id(code) + CODE_UNITS[V])) // 2)
    if hasattr(code, "co_lines"):
        for start, end, line in code.co_lines():
            if start <= offset < end:
                return line
        return None
    line = None
    for start, ln in dis.findlinestarts(code):
        if start > offset:
            break
        line = ln
    return line


def walk(tstate, depth=64):
    """(code address, line) of each frame from the thread state's current one, skipping
    frames whose code is not a live code object (3.12/3.13 shim frames)."""
    path, back, code_off, pos_off, kind = FRAMES[V]
    frame = tstate
    for off in path:
        frame = u64(frame + off)
    codes = {id(c): c for c in gathered_codes}
    out = []
    while frame and len(out) < depth:
        code_addr = u64(frame + code_off)
        pos = i32(frame + pos_off) if kind.startswith("lasti") else u64(frame + pos_off)
        code = codes.get(code_addr)
        out.append((code_addr, line_of(code, pos, kind) if code else None))
        frame = u64(frame + back)
    return out


gathered_codes = []


def expected_stack():
    """(code address, line) of the callers of the function that calls this one."""
    f = sys._getframe(2)
    out = []
    while f is not None:
        gathered_codes.append(f.f_code)
        out.append((id(f.f_code), f.f_lineno))
        f = f.f_back
    return out


def one_thread(where):
    key = runtime_key()
    tstate = ctypes.pythonapi.PyThreadState_Get
    tstate.restype = ctypes.c_void_p
    ts = tstate()
    # The slot read with the GIL held (this read is a ctypes call: released) and through
    # libc's own pthread_getspecific.
    check(f"{where}: TSD slot is the thread state", slot(key) == ts, key=key, tstate=ts)
    check(f"{where}: pthread_getspecific agrees", libc.pthread_getspecific(key) == ts)
    callers = expected_stack()
    walked = walk(ts)
    # The callers' frames, each with its line, appear in order in the walked chain.
    i = 0
    for frame in walked:
        if i < len(callers) and frame == callers[i]:
            i += 1
    check(
        f"{where}: frames, code objects and lines of the callers",
        i == len(callers),
        matched=i,
        callers=len(callers),
        walked=[(hex(a), ln) for a, ln in walked[:8]],
        expected=[(hex(a), ln) for a, ln in callers[:8]],
    )


def outer(where):
    return middle(where)


def middle(where):
    return inner(where)


def inner(where):
    one_thread(where)


def main():
    if V not in AUTO_TSS:
        print(json.dumps({"version": sys.version, "ok": False, "why": "unsupported version"}))
        return 1
    outer("main thread")
    t = threading.Thread(target=outer, args=("second thread",))
    t.start()
    t.join()
    # Shared or static libpython: where _PyRuntime lives.
    maps = open("/proc/self/maps").read()
    libpython = sorted({l.split()[-1] for l in maps.splitlines() if "libpython" in l})
    ok = all(c["ok"] for c in checks)
    print(
        json.dumps(
            {
                "version": sys.version.split()[0],
                "executable": sys.executable,
                "libpython": libpython,
                "ok": ok,
                "checks": checks,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
