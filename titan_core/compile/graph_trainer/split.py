"""Graph splitter: the captured step as two programs, forward and backward (+ optimizer).

The forward program computes the loss and returns every forward value the rest of the
step reads (the saved activations, as the memory policy left them). Between the two
programs those values move to host memory and come back right before the backward
program runs, so device memory holds no activations while the host owns them; on a CPU
device host and device are one memory and the move is skipped. Each program is compiled
on its own.

The split follows the region tags written at capture, so no partitioner guesses which
node is forward: a node is forward exactly when it was traced before `autograd.grad`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, GraphModule, Node


@dataclass
class SplitProgram:
    forward: GraphModule
    """Inputs: flat step inputs at `fwd_inputs`; outputs: the saved values."""
    backward: GraphModule
    """Inputs: the saved values, then flat step inputs at `bwd_inputs`; outputs: the step's outputs."""
    fwd_inputs: list[int]
    bwd_inputs: list[int]
    is_activation: list[bool] = field(default_factory=list)
    """Per saved value: read by the backward program (False: only a step output, e.g. the loss)."""
    saved_bytes: int = 0
    """Activation bytes handed from the forward to the backward program on the last call (weights' views excluded)."""
    compile_time_s: float = 0.0
    _programs: list = field(default_factory=list)

    def compile(self, compile_fn: Callable) -> None:
        """Compile both programs, each on the fake values of its own inputs."""
        t0 = time.perf_counter()
        self._programs = [compile_fn(gm, _fake_inputs(gm)) for gm in (self.forward, self.backward)]
        self.compile_time_s = time.perf_counter() - t0

    def __call__(self, flat: list[torch.Tensor]):
        fwd, bwd = self._programs or (self.forward, self.backward)
        fwd_in = [flat[i] for i in self.fwd_inputs]
        saved = fwd(*fwd_in)
        self.saved_bytes = _activation_bytes([t for t, a in zip(saved, self.is_activation) if a], fwd_in)
        parked = [_to_host(t) for t in saved]
        del saved  # the device copies die here; only the host copies live until the backward
        back = [t.to(flat[0].device, non_blocking=True) for t in parked]
        return bwd(*back, *[flat[i] for i in self.bwd_inputs])


def _fake_inputs(gm: GraphModule) -> list:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def _activation_bytes(saved, inputs) -> int:
    """Bytes of distinct storages among `saved`, leaving out views of the inputs (weights)."""
    inputs_ptr = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    seen: dict[int, int] = {}
    for t in saved:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in inputs_ptr:
            seen[ptr] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return t
    host = torch.empty_like(t, device="cpu", pin_memory=torch.cuda.is_available())
    return host.copy_(t, non_blocking=True)


def split_forward_backward(gm: GraphModule) -> SplitProgram:
    """Cut the tagged step graph after the forward region; see the module docstring."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")
    body = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    fwd = [n for n in body if n.meta.get("gt_region") == "forward"]
    fwd_set = set(fwd)
    for n in fwd:
        for a in n.all_input_nodes:
            if a.op == "call_function" and a not in fwd_set:
                raise ValueError(
                    f"forward node {n.name} reads {a.name} from the {a.meta.get('gt_region')} region; cannot split"
                )
    rest = [n for n in body if n not in fwd_set]
    saved = [n for n in fwd if any(u not in fwd_set for u in n.users)]

    f_graph, f_inputs = _subgraph(gm, fwd, placeholders, [], lambda env: tuple(env[n] for n in saved))
    b_graph, b_inputs = _subgraph(gm, rest, placeholders, saved, lambda env: _map_output(output, env))
    is_activation = [any(u in set(rest) for u in n.users) for n in saved]
    return SplitProgram(GraphModule(gm, f_graph), GraphModule(gm, b_graph), f_inputs, b_inputs, is_activation)


def _map_output(output: Node, env: dict) -> object:
    return torch.fx.node.map_arg(output.args[0], lambda n: env[n])


def _subgraph(gm: GraphModule, members: list[Node], placeholders: list[Node], carried: list[Node], make_output):
    """A graph of `members`: carried values first as inputs, then the step inputs it reads."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for n in carried:
        env[n] = graph.placeholder(f"saved_{n.name}")
        env[n].meta = dict(n.meta)
    member_set = set(members)
    needed = {a for n in members for a in n.all_input_nodes} | set(_output_inputs(make_output, carried, members))
    used = [i for i, p in enumerate(placeholders) if p in needed]
    for i in used:
        p = placeholders[i]
        env[p] = graph.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for n in gm.graph.nodes:
        if n.op == "get_attr" and n in needed:
            env[n] = graph.node_copy(n, lambda a: env[a])
    for n in members:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(make_output(env))
    graph.eliminate_dead_code()
    assert all(n in env for n in needed if n not in member_set)
    return graph, used


def _output_inputs(make_output, carried, members):
    """Nodes the output expression reads (placeholders among them count as inputs)."""
    seen: list[Node] = []

    class _Env(dict):
        def __missing__(self, key):
            seen.append(key)
            return key

    make_output(_Env())
    return seen
