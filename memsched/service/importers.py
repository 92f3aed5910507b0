"""Importers: traces from other tools' profiles. The first one reads PipeDream's profiler `graph.txt`.

PipeDream records per node: forward/backward time (ms), output size (bytes), parameter size (bytes), and the
DAG's edges. It does not record what autograd saves, so saved bytes follow a documented rule (see
`_saves`), with the attribution rule (docs/architecture.md, 'Trace'): each tensor is counted once, by the
first layer that saves it. It does not name the device either: copy speeds and capacity come from flags.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from memsched.errors import TraceFormatError
from memsched.io import describe_validation_error
from memsched.schema import Baseline, DeviceInfo, Layer, StaticBytes, Trace

MAX_COPY_LATENCY_S = 1.0
"""The longest per-copy latency an import accepts: no host link takes a second to start a copy."""
MAX_OPTIMIZER_STATE_FACTOR = 64.0
"""The most optimizer-state bytes per parameter byte an import accepts (Adam keeps 2; 64 is no optimizer)."""

_NODE_RE = re.compile(
    r"^(?P<id>node\d+) -- (?P<desc>.*) -- forward_compute_time=(?P<f>[^,]+), backward_compute_time=(?P<b>[^,]+), "
    r"activation_size=(?P<act>\[[^\]]*\]|[^,]+), parameter_size=(?P<p>\S+)\s*$"
)
_EDGE_RE = re.compile(r"^\s+(?P<a>node\d+) -- (?P<b>node\d+)\s*$")

# Ops that save nothing for their backward (add / concat / indexing / views).
_SAVES_NOTHING = ("Add", "Concat", "__getitem__", "View", "Flatten", "Size", "Transpose", "Cat")
# Ops that save their own output (the backward of these activations needs the result, not the input).
_SAVES_OUTPUT = ("ReLU", "ReLU6", "Sigmoid", "Tanh", "Softmax", "LogSoftmax")
# Pseudo-nodes that stand for the step's inputs: their outputs are resident (counted as static 'other').
_INPUT_NODES = ("Input", "hidden")


@dataclass
class _Node:
    id: str
    kind: str
    desc: str
    forward_s: float
    backward_s: float
    output_bytes: int
    param_bytes: int
    line: int
    preds: list[str] = field(default_factory=list)


def _number(text: str, path: str, line: int, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(f"{path}:{line}: {what} {text!r} is not a number; fix the profile line") from None
    if value < 0 or not math.isfinite(value):
        raise TraceFormatError(f"{path}:{line}: {what} {text!r} must be a finite number >= 0")
    return value


def _kind(desc: str) -> str:
    return re.split(r"[(\s]", desc.strip(), maxsplit=1)[0] or "op"


def _is_input(node: _Node) -> bool:
    return node.kind.rstrip("0123456789") in _INPUT_NODES and node.param_bytes == 0


def parse_pipedream(text: str, path: str = "graph.txt") -> tuple[dict[str, _Node], list[tuple[str, str]]]:
    nodes: dict[str, _Node] = {}
    edges: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if m := _EDGE_RE.match(raw):
            edges.append((m["a"], m["b"]))
            continue
        m = _NODE_RE.match(raw)
        if not m:
            raise TraceFormatError(
                f"{path}:{lineno}: not a PipeDream node or edge line; expected 'nodeN -- <module> -- "
                "forward_compute_time=<ms>, backward_compute_time=<ms>, activation_size=<bytes>, "
                "parameter_size=<bytes>' or a tab-indented 'nodeA -- nodeB'"
            )
        act = m["act"].strip()
        parts = act[1:-1].split(";") if act.startswith("[") else [act]
        out_bytes = sum(_number(p.strip(), path, lineno, "activation_size") for p in parts if p.strip())
        if m["id"] in nodes:
            raise TraceFormatError(f"{path}:{lineno}: node {m['id']} is defined twice; keep one definition")
        nodes[m["id"]] = _Node(
            id=m["id"],
            kind=_kind(m["desc"]),
            desc=m["desc"].strip(),
            forward_s=_number(m["f"], path, lineno, "forward_compute_time") / 1e3,
            backward_s=_number(m["b"], path, lineno, "backward_compute_time") / 1e3,
            output_bytes=round(out_bytes),
            param_bytes=round(_number(m["p"], path, lineno, "parameter_size")),
            line=lineno,
        )
    if not nodes:
        raise TraceFormatError(f"{path}: no node lines found; is this a PipeDream graph.txt?")
    for a, b in edges:
        for x in (a, b):
            if x not in nodes:
                raise TraceFormatError(f"{path}: edge {a} -- {b} names {x}, which has no node line")
        nodes[b].preds.append(a)
    return nodes, edges


def _topological(nodes: dict[str, _Node], path: str) -> list[_Node]:
    """Kahn's algorithm, ties broken by node number, so the order is deterministic."""
    indeg = {k: len(v.preds) for k, v in nodes.items()}
    succ: dict[str, list[str]] = {k: [] for k in nodes}
    for k, v in nodes.items():
        for p in v.preds:
            succ[p].append(k)
    import heapq

    def key(k: str) -> tuple[int, str]:
        return (int(k[4:]), k)

    ready = [key(k) for k, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order: list[_Node] = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(nodes[k])
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, key(s))
    if len(order) != len(nodes):
        raise TraceFormatError(f"{path}: the edges contain a cycle; a training graph must be a DAG")
    return order


def import_pipedream(
    path: str | Path,
    batch_size: int,
    device_name: str = "unknown GPU (PipeDream profile)",
    device_memory_bytes: int = 16 * 2**30,
    h2d_bytes_per_s: float = 12e9,
    d2h_bytes_per_s: float = 12e9,
    copy_latency_s: float = 10e-6,
    optimizer_state_factor: float = 1.0,
) -> Trace:
    """Read a PipeDream graph.txt into a Trace (defaults: a 16 GiB V100 on PCIe 3, SGD with momentum). A profile
    whose numbers make no trace (sizes past any device, say: activation_size=1e300) is a TraceFormatError naming
    what the trace's rules refuse."""
    try:
        return _import_pipedream(
            Path(path),
            batch_size,
            device_name,
            device_memory_bytes,
            h2d_bytes_per_s,
            d2h_bytes_per_s,
            copy_latency_s,
            optimizer_state_factor,
        )
    except ValidationError as err:
        raise TraceFormatError(describe_validation_error(err, f"profile {Path(path).name}")) from None


def _import_pipedream(
    p: Path,
    batch_size: int,
    device_name: str,
    device_memory_bytes: int,
    h2d_bytes_per_s: float,
    d2h_bytes_per_s: float,
    copy_latency_s: float,
    optimizer_state_factor: float,
) -> Trace:
    if batch_size < 1:
        raise TraceFormatError(f"--batch-size must be >= 1, got {batch_size}")
    for flag, rate in (("--h2d-bandwidth", h2d_bytes_per_s), ("--d2h-bandwidth", d2h_bytes_per_s)):
        if not (math.isfinite(rate) and rate > 0):
            raise TraceFormatError(f"{flag} must be a finite rate above 0 bytes/s (such as 12e9), got {rate}")
    if not (math.isfinite(copy_latency_s) and 0 <= copy_latency_s <= MAX_COPY_LATENCY_S):
        raise TraceFormatError(
            f"--copy-latency must be seconds from 0 to {MAX_COPY_LATENCY_S:g} (such as 10e-6), got {copy_latency_s}"
        )
    if not (math.isfinite(optimizer_state_factor) and 0 <= optimizer_state_factor <= MAX_OPTIMIZER_STATE_FACTOR):
        raise TraceFormatError(
            f"--optimizer-state-factor must be optimizer bytes per parameter byte from 0 to "
            f"{MAX_OPTIMIZER_STATE_FACTOR:g} (1 = SGD momentum, 2 = Adam), got {optimizer_state_factor}"
        )
    if not p.is_file():
        raise TraceFormatError(f"profile file {str(p)!r} does not exist; check the path")
    nodes, _ = parse_pipedream(p.read_text(errors="replace"), str(p))
    order = _topological(nodes, str(p))
    inputs = [n for n in order if _is_input(n)]
    layers_nodes = [n for n in order if not _is_input(n)]
    if not layers_nodes:
        raise TraceFormatError(f"{p}: the profile has only input nodes; nothing to schedule")
    index = {n.id: i for i, n in enumerate(layers_nodes)}
    claimed: set[str] = {n.id for n in inputs}  # tensors already counted (inputs are resident anyway)
    layers: list[Layer] = []
    for node in layers_nodes:
        deps = sorted({index[q] for q in node.preds if q in index})
        in_bytes = sum(nodes[q].output_bytes for q in node.preds)
        saved: list[int] = []
        for tensor_owner, nbytes in _saves(node, nodes):
            if tensor_owner not in claimed and nbytes > 0:
                claimed.add(tensor_owner)
                saved.append(nbytes)
        layers.append(
            Layer(
                name=f"{node.id}.{node.kind}",
                kind=node.kind,
                forward_s=node.forward_s,
                backward_s=node.backward_s,
                saved_bytes=sum(saved),
                saved_tensor_bytes=saved,
                input_bytes=in_bytes,
                output_bytes=node.output_bytes,
                workspace_bytes=0,
                deps=deps,
            )
        )
    params = sum(n.param_bytes for n in layers_nodes)
    static = StaticBytes(
        params=params,
        grads=params,
        optimizer_state=round(params * optimizer_state_factor),
        other=sum(n.output_bytes for n in inputs),
    )
    step = sum(x.forward_s + x.backward_s for x in layers)
    trace = Trace(
        model=f"pipedream/{p.name.removesuffix('.graph.txt').removesuffix('.txt')}",
        batch_size=batch_size,
        dtype="float32",
        framework={"profiler": "pipedream"},
        source="import:pipedream",
        device=DeviceInfo(
            name=device_name,
            memory_bytes=device_memory_bytes,
            h2d_bytes_per_s=h2d_bytes_per_s,
            d2h_bytes_per_s=d2h_bytes_per_s,
            copy_latency_s=copy_latency_s,
        ),
        static=static,
        baseline=Baseline(step_s=step, peak_bytes=0),
        layers=layers,
    )
    # The profile has no measured peak: record the cost model's keep-all peak so the field is meaningful.
    from memsched.optimizer.budget import keepall_activation_peak

    trace.baseline.peak_bytes = static.total + keepall_activation_peak(trace)
    return trace


def _saves(node: _Node, nodes: dict[str, _Node]) -> list[tuple[str, int]]:
    """What a node saves for backward, as (tensor owner id, bytes): tensors are named by their producer."""
    if node.kind.startswith(_SAVES_NOTHING):
        return []
    if node.kind in _SAVES_OUTPUT:
        return [(node.id, node.output_bytes)]
    return [(q, nodes[q].output_bytes) for q in node.preds]
