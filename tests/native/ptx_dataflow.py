"""A small interpreter of one PTX thread block, for comparing the float arithmetic of two compiled kernels on
the CPU (tests/native/test_attention_fold_ptx.py). Integer work runs concretely; every float32 value is carried
twice: a concrete number (for the branches) and a node of a hash-consed graph of the float operations
(Dag). Two outputs with the same node id were computed by the same operations, in the same order, from the
same inputs -- with the operands of fma's product and of mul / add / max taken as unordered, as the
hardware's are -- so they are bitwise equal on any GPU, whatever scheduling ptxas chooses (PTX .rn ops
are not re-associated or contracted by ptxas).

Covers the PTX that nvcc -O3 --use_fast_math emits for the attention combine code: integer and predicate
arithmetic, ld / st on param, global and shared space (scalars and vectors), bar.sync (threads run in
turn up to each barrier), atom.dec and acquire loads (one block at a time: Block.settle sets a counter's
value after an atomic), and the no-ops griddepcontrol / nanosleep. Warp-collective instructions (vote,
shfl) are not supported: a kernel path that needs them raises NotImplementedError.
"""
from __future__ import annotations

import re
import struct

import numpy as np

F32 = np.float32
FLOAT_OPS = ("fma", "mul", "sub", "add", "ex2", "max", "min", "div", "neg", "mov")


class Dag:
    """Hash-consed float operations: node(op, *args) -> id; equal ids <=> equal expressions."""

    def __init__(self):
        self.ids: dict = {}
        self.nodes: list = []

    def node(self, op, *args):
        if op in ("mul", "add", "max", "min"):
            args = tuple(sorted(args))
        elif op == "fma":
            args = tuple(sorted(args[:2])) + (args[2],)
        key = (op, *args)
        if key not in self.ids:
            self.ids[key] = len(self.nodes)
            self.nodes.append(key)
        return self.ids[key]


def _f32(bits: int):
    return np.frombuffer(struct.pack("<I", bits & 0xFFFFFFFF), F32)[0]


def _signed(v: int, w: int) -> int:
    v %= 1 << w
    return v - (1 << w) if v >> (w - 1) else v


class Kernel:
    """One .entry of a PTX file: its parameters, instructions and labels."""

    def __init__(self, ptx: str, name_part: str):
        for m in re.finditer(r"\.entry (\S+)\((.*?)\)[^{]*\{(.*?)\n\}", ptx, re.S):
            if name_part in m.group(1):
                break
        else:
            raise KeyError(f"no kernel matching {name_part!r}")
        self.name = m.group(1)
        self.params = re.findall(r"\.param\s+(?:\.align \d+ )?\.(\w+)\s+([\w$]+)", m.group(2))
        self.shared = re.findall(r"\.shared \.align (\d+) \.b8 (\S+)\[(\d*)\];", ptx)
        self.insts: list = []
        self.labels: dict = {}
        for raw in m.group(3).split("\n"):
            line = raw.split("//")[0].strip()
            if not line or line.startswith((".reg", ".shared", ".local", ".pragma")):
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.insts)
                continue
            for stmt in line.split(";"):
                stmt = stmt.strip()
                if stmt and stmt not in ("{", "}") and not stmt.startswith(".pragma"):
                    self.insts.append(self._parse(stmt))

    @staticmethod
    def _parse(stmt: str):
        pred = None
        if stmt.startswith("@"):
            p, stmt = stmt.split(None, 1)
            pred = (p.startswith("@!"), p.lstrip("@!"))
        op, _, rest = stmt.partition(" ")
        ops, depth, cur = [], 0, ""
        for ch in rest:
            depth += ch in "[{"
            depth -= ch in "]}"
            if ch == "," and depth == 0:
                ops.append(cur.strip())
                cur = ""
            else:
                cur += ch
        if cur.strip():
            ops.append(cur.strip())
        return pred, op, ops


class Block:
    """One block of `kernel` with n_threads threads. params: one bytes object per .param; gmem: address ->
    cell (an int, or a float as (np.float32, dag id)). Stores of floats to global memory are recorded in
    self.stores (address -> list of dag ids). settle: after an atomic, set its cell to this value (a block
    run alone stands for one of several arrivals)."""

    def __init__(self, kernel: Kernel, dag: Dag, params: list, gmem: dict, n_threads: int, ctaid=(0, 0, 0),
                 settle=None):
        self.k, self.dag, self.gmem, self.n, self.ctaid, self.settle = kernel, dag, gmem, n_threads, ctaid, settle
        self.symbols, self.pmem, self.smem, self.stores = {}, {}, {}, {}
        base = 0x7000_0000
        for (_, name), blob in zip(kernel.params, params):
            self.symbols[name] = base
            self.pmem.update({base + i: b for i, b in enumerate(blob)})
            base += 0x1000
        sbase = 0x20_0000
        for align, name, size in kernel.shared:
            if size == "":
                self.symbols[name] = 0x10_0000           # dynamic shared memory
            else:
                sbase = -(-sbase // int(align)) * int(align)
                self.symbols[name] = sbase
                sbase += int(size)

    def run(self, max_steps=50_000_000):
        threads = [{"pc": 0, "regs": {}, "tid": t, "done": False, "bar": False} for t in range(self.n)]
        steps = 0
        while True:
            for th in threads:
                while not (th["done"] or th["bar"]):
                    steps += 1
                    if steps > max_steps:
                        raise RuntimeError("runaway block")
                    if th["pc"] >= len(self.k.insts):
                        th["done"] = True
                        break
                    pred, op, ops = self.k.insts[th["pc"]]
                    th["pc"] += 1
                    if pred is not None and th["regs"][pred[1]] == pred[0]:
                        continue
                    r = self._step(th, op, ops)
                    th["done"] |= r == "ret"
                    th["bar"] |= r == "bar"
            live = [t for t in threads if not t["done"]]
            if not live:
                return self
            for t in live:
                t["bar"] = False

    # ---- operands ----
    def _read(self, regs, tok, tid):
        if tok.startswith("%"):
            special = {"%tid.x": tid, "%tid.y": 0, "%tid.z": 0, "%ctaid.x": self.ctaid[0], "%ctaid.y": self.ctaid[1],
                       "%ctaid.z": self.ctaid[2], "%ntid.x": self.n}
            return special[tok] if tok in special else regs[tok]
        if tok.startswith("0f"):
            bits = int(tok[2:], 16)
            return (_f32(bits), self.dag.node("const", bits))
        if tok in self.symbols:
            return self.symbols[tok]
        return int(tok, 0)

    def _addr(self, regs, tok, tid):
        m = re.match(r"\[\s*(.+?)\s*(?:\+\s*(-?\d+))?\s*\]$", tok)
        return self._read(regs, m.group(1), tid) + int(m.group(2) or 0)

    @staticmethod
    def _width(reg):
        return 64 if reg.startswith("%rd") else 16 if reg.startswith("%rs") else 32

    # ---- one instruction ----
    def _step(self, th, op, ops):
        regs, tid = th["regs"], th["tid"]
        base = op.split(".")[0]
        rd = lambda t: self._read(regs, t, tid)  # noqa: E731
        if base == "bra":
            th["pc"] = self.k.labels[ops[0]]
        elif base in ("ret", "exit"):
            return "ret"
        elif base == "bar":
            return "bar"
        elif base in ("griddepcontrol", "nanosleep", "membar", "fence"):
            pass
        elif op.endswith(".f32") and base in FLOAT_OPS:
            regs[ops[0]] = self._float(base, op, [rd(t) for t in ops[1:]])
        elif base == "setp":
            regs[ops[0]] = self._setp(op, rd(ops[1]), rd(ops[2]))
        elif base == "selp":
            regs[ops[0]] = rd(ops[1]) if rd(ops[3]) else rd(ops[2])
        elif op.endswith(".pred"):
            a = rd(ops[1])
            regs[ops[0]] = {"mov": lambda: a, "not": lambda: not a, "or": lambda: a or rd(ops[2]),
                            "and": lambda: a and rd(ops[2]), "xor": lambda: a != rd(ops[2])}[base]()
        elif base in ("ld", "st", "atom"):
            self._mem(th, op, ops)
        elif base == "cvta":
            regs[ops[0]] = rd(ops[1])
        else:
            regs[ops[0]] = self._int(op, ops, rd) % (1 << self._width(ops[0]))
        return None

    def _float(self, base, op, vals):
        if base == "mov":
            return vals[0]
        c, s = [v[0] for v in vals], [v[1] for v in vals]
        with np.errstate(all="ignore"):
            cv = {"fma": lambda: F32(np.float64(c[0]) * np.float64(c[1]) + np.float64(c[2])),
                  "mul": lambda: F32(c[0] * c[1]), "add": lambda: F32(c[0] + c[1]), "sub": lambda: F32(c[0] - c[1]),
                  "ex2": lambda: F32(np.exp2(c[0])), "max": lambda: F32(np.fmax(c[0], c[1])),
                  "min": lambda: F32(np.fmin(c[0], c[1])), "div": lambda: F32(c[0] / c[1]),
                  "neg": lambda: F32(-c[0])}[base]()
        return cv, self.dag.node(base if base != "div" else op, *s)   # div: keep its rounding flavour

    @staticmethod
    def _setp(op, a, b):
        parts = op.split(".")
        cmp, ty = parts[1], parts[-1]
        if ty == "f32":
            a, b = a[0], b[0]
            un = bool(np.isnan(a) or np.isnan(b))
            return bool({"eq": a == b, "ne": a != b and not un, "lt": a < b, "le": a <= b, "gt": a > b,
                         "ge": a >= b, "neu": a != b or un, "equ": a == b or un, "ltu": a < b or un,
                         "leu": a <= b or un, "gtu": a > b or un, "geu": a >= b or un}[cmp])
        w = int(re.sub(r"\D", "", ty))
        a, b = (_signed(a, w), _signed(b, w)) if ty[0] == "s" else (a % (1 << w), b % (1 << w))
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "lo": a < b,
                "ls": a <= b, "hi": a > b, "hs": a >= b}[cmp]

    @staticmethod
    def _int(op, ops, rd):
        parts = op.split(".")
        base, ty = parts[0], parts[-1]
        w = int(re.sub(r"\D", "", ty) or 32)
        val = (lambda t: _signed(rd(t), w)) if ty[0] == "s" else (lambda t: rd(t) % (1 << w))
        if base == "mov":
            return rd(ops[1])
        if base == "cvt":
            sw = int(re.sub(r"\D", "", ty))
            return _signed(rd(ops[1]), sw) if ty[0] == "s" else rd(ops[1]) % (1 << sw)
        if base in ("div", "rem"):
            a, b = val(ops[1]), val(ops[2])
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return q if base == "div" else a - q * b
        if base == "mul" and parts[1] == "hi":
            return (val(ops[1]) * val(ops[2])) >> w
        if base == "mad":
            wide = parts[1] == "wide"
            addend = (_signed(rd(ops[3]), 2 * w) if ty[0] == "s" else rd(ops[3])) if wide else val(ops[3])
            return val(ops[1]) * val(ops[2]) + addend
        table = {"add": lambda: val(ops[1]) + val(ops[2]), "sub": lambda: val(ops[1]) - val(ops[2]),
                 "mul": lambda: val(ops[1]) * val(ops[2]), "shl": lambda: rd(ops[1]) << rd(ops[2]),
                 "shr": lambda: val(ops[1]) >> rd(ops[2]), "and": lambda: rd(ops[1]) & rd(ops[2]),
                 "or": lambda: rd(ops[1]) | rd(ops[2]), "xor": lambda: rd(ops[1]) ^ rd(ops[2]),
                 "not": lambda: ~rd(ops[1]), "neg": lambda: -val(ops[1]),
                 "min": lambda: min(val(ops[1]), val(ops[2])), "max": lambda: max(val(ops[1]), val(ops[2])),
                 "popc": lambda: bin(rd(ops[1]) % (1 << 32)).count("1")}
        if base not in table:
            raise NotImplementedError(op)
        return table[base]()

    def _mem(self, th, op, ops):
        regs, tid = th["regs"], th["tid"]
        parts = op.split(".")
        space = next(p for p in parts if p in ("global", "shared", "param"))
        mem = {"global": self.gmem, "shared": self.smem, "param": self.pmem}[space]
        ty = parts[-1]
        size = int(re.sub(r"\D", "", ty)) // 8
        if parts[0] == "atom":
            if "dec" not in parts:
                raise NotImplementedError(op)
            a = self._addr(regs, ops[1], tid)
            old, bound = mem[a], self._read(regs, ops[2], tid) % (1 << 32)
            mem[a] = bound if old == 0 or old > bound else old - 1
            if self.settle is not None:
                mem[a] = self.settle
            regs[ops[0]] = old
            return
        if parts[0] == "ld":
            a = self._addr(regs, ops[1], tid)
            for i, d in enumerate(x.strip() for x in ops[0].strip("{}").split(",")):
                at = a + i * size
                if space == "param":
                    v = int.from_bytes(bytes(self.pmem.get(at + j, 0) for j in range(size)), "little")
                    regs[d] = (_signed(v, 8 * size) if ty[0] == "s" else v) % (1 << self._width(d))
                elif at not in mem:
                    raise KeyError(f"{op}: {space} address {at:#x} never written")
                else:
                    regs[d] = mem[at] & 0xFF if ty == "u8" else mem[at]
            return
        a = self._addr(regs, ops[0], tid)
        for i, s in enumerate(x.strip() for x in ops[1].strip("{}").split(",")):
            v = self._read(regs, s, tid)
            if space == "global" and isinstance(v, tuple):
                self.stores.setdefault(a + i * size, []).append(v[1])
            mem[a + i * size] = v
