"""The remedies `navdoctor verify` can apply without an edit of the user's script, and how.

Parent side (no torch import): the registry, REMEDIES and CODE_CHANGES, and `parse_arms`.
Child side: `Patches`, installed by navdoctor.verify.runner before it runs the script:

- DataLoader remedies wrap `DataLoader.__init__` and rewrite its arguments
  (num_workers, pin_memory, persistent_workers, prefetch_factor).
- Model remedies wrap `torch.nn.Module.__call__`. "The model" is every module that has
  parameters and is called while no other module call is in progress (a top-level call);
  its submodules, parameter-free modules such as losses, and calls inside compiled code go
  straight through. Each model gets, at its first call, what the remedy asks:
  autocast around its calls, channels_last weights and inputs, or its calls sent to
  `torch.compile(module)`.
- cudnn_benchmark sets `torch.backends.cudnn.benchmark = True` before the script, and again
  at any step boundary where the script has turned it off.
- Optimizer remedies wrap `torch.optim.Optimizer.__init__` (every built-in optimizer and the
  script's subclasses call it with their defaults) and `Optimizer.zero_grad` /
  `Module.zero_grad`: foreach_optimizer turns a `foreach` of None or False into True (unless
  the optimizer is fused or differentiable), zero_grad_set_to_none turns a call's
  `set_to_none=False` into True. The default of both has been True/auto since torch 2.0, so
  these change what the script asked for explicitly (or what an older torch defaults to).

Both arms of a comparison run under the same wrappers (the baseline applies nothing), so the
wrappers' small per-call cost is in both.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from ..errors import NavdoctorError


@dataclass(frozen=True)
class RemedyInfo:
    id: str
    title: str
    target: str          # loader | model | global | code
    patch: str           # what navdoctor does in the child process
    code: str            # the same change written in the user's code
    cuda_only: bool = False   # only a CUDA device can profit


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def target_workers() -> int:
    return max(1, min(8, usable_cpus()))


REMEDIES: dict[str, RemedyInfo] = {r.id: r for r in [
    RemedyInfo("num_workers", "DataLoader worker processes", "loader",
               "DataLoader(num_workers=0) becomes num_workers=min(8, CPUs)",
               "DataLoader(dataset, ..., num_workers=8)"),
    RemedyInfo("pin_memory", "Pinned host memory for batches", "loader",
               "DataLoader(pin_memory=True)",
               "DataLoader(dataset, ..., pin_memory=True)\nx = x.to('cuda', non_blocking=True)",
               cuda_only=True),
    RemedyInfo("persistent_workers", "Keep loader workers alive between epochs", "loader",
               "DataLoader(persistent_workers=True) where num_workers > 0",
               "DataLoader(dataset, ..., num_workers=8, persistent_workers=True)"),
    RemedyInfo("prefetch_factor", "Load more batches ahead per worker", "loader",
               "DataLoader(prefetch_factor=4) where num_workers > 0",
               "DataLoader(dataset, ..., num_workers=8, prefetch_factor=4)"),
    RemedyInfo("amp_bf16", "bf16 autocast", "model",
               "each model's calls run under torch.autocast(device, dtype=torch.bfloat16)",
               "with torch.autocast('cuda', dtype=torch.bfloat16):\n    out = model(x)"),
    RemedyInfo("amp_fp16", "fp16 autocast", "model",
               "each model's calls run under torch.autocast(device, dtype=torch.float16)",
               "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
               "    loss = loss_fn(model(x), y)\nscaler.scale(loss).backward()"),
    RemedyInfo("channels_last", "channels_last memory format", "model",
               "each model and its 4-D inputs converted to torch.channels_last",
               "model = model.to(memory_format=torch.channels_last)\n"
               "x = x.to(memory_format=torch.channels_last)"),
    RemedyInfo("compile", "torch.compile", "model",
               "each model's calls go to torch.compile(model)",
               "model = torch.compile(model)"),
    RemedyInfo("cuda_graphs", "CUDA graphs via torch.compile(mode='reduce-overhead')", "model",
               "each model's calls go to torch.compile(model, mode='reduce-overhead'); "
               "torch.compiler.cudagraph_mark_step_begin() at each step",
               "model = torch.compile(model, mode='reduce-overhead')", cuda_only=True),
    RemedyInfo("cudnn_benchmark", "cuDNN autotuning", "global",
               "torch.backends.cudnn.benchmark = True before the script",
               "torch.backends.cudnn.benchmark = True", cuda_only=True),
    RemedyInfo("zero_grad_set_to_none", "zero_grad drops gradients (set_to_none=True)", "optimizer",
               "optimizer.zero_grad(set_to_none=False) and module.zero_grad(set_to_none=False) "
               "run with set_to_none=True",
               "optimizer.zero_grad(set_to_none=True)   # the default since torch 2.0"),
    RemedyInfo("foreach_optimizer", "foreach (multi-tensor) optimizers", "optimizer",
               "optimizers made with foreach=None or foreach=False (not fused, not differentiable) "
               "are made with foreach=True",
               "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)"),
]}

# Known to `verify:` ids but not applicable from outside the script.
CODE_CHANGES: dict[str, RemedyInfo] = {r.id: r for r in [
    RemedyInfo("batch_size", "Larger batches", "code",
               "none: the batch size is the script's own choice (and changes what a step is)",
               "DataLoader(dataset, batch_size=2 * batch_size, ...)  # scale the learning rate too"),
]}

LOADER_IDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
MODEL_IDS = ("amp_bf16", "amp_fp16", "channels_last", "compile", "cuda_graphs")
OPTIMIZER_IDS = ("zero_grad_set_to_none", "foreach_optimizer")


def known_ids() -> list[str]:
    return list(REMEDIES) + list(CODE_CHANGES)


def parse_arms(values: list[str] | tuple[str, ...]) -> list[tuple[str, ...]]:
    """--remedy values -> arms. A comma separates arms, '+' joins remedies into one arm:
    'num_workers,pin_memory' is two arms, 'num_workers+persistent_workers' one."""
    arms: list[tuple[str, ...]] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            ids = tuple(p.strip() for p in part.split("+"))
            for rid in ids:
                if rid not in REMEDIES and rid not in CODE_CHANGES:
                    raise NavdoctorError(f"unknown remedy {rid!r} (known: {', '.join(known_ids())})")
            if len(ids) != len(set(ids)):
                raise NavdoctorError(f"remedy {part!r} names the same remedy twice")
            if len(ids) > 1 and any(rid in CODE_CHANGES for rid in ids):
                raise NavdoctorError(f"{part!r}: a code-change remedy cannot be combined")
            if "compile" in ids and "cuda_graphs" in ids:
                raise NavdoctorError(f"{part!r}: cuda_graphs already compiles the model")
            if "amp_bf16" in ids and "amp_fp16" in ids:
                raise NavdoctorError(f"{part!r}: choose one of amp_bf16 and amp_fp16")
            if ids not in arms:
                arms.append(ids)
    return arms


def arm_name(ids: tuple[str, ...]) -> str:
    return "+".join(ids) if ids else "baseline"


# ---- child side ------------------------------------------------------------------------------

MAX_RECORDS = 20    # loaders and models described in the status; the rest are only counted


def bf16_without_tensor_cores(capability: tuple[int, int] | None) -> str | None:
    """The note for amp_bf16 on a GPU whose tensor cores have no bf16 (before Ampere, compute
    capability 8.0: V100, T4): bf16 math there runs without them, and fp16 is the remedy."""
    if capability is None or tuple(capability) >= (8, 0):
        return None
    major, minor = capability
    return (f"this GPU (compute capability {major}.{minor}) has no bf16 tensor cores: bf16 "
            "autocast runs without them here; measure amp_fp16 instead")


class Patches:
    """Installs the wrappers in the child and records what each remedy changed."""

    def __init__(self, remedy_ids: tuple[str, ...] | list[str]):
        self.ids = tuple(remedy_ids)
        self.changes: dict[str, list[str]] = {rid: [] for rid in self.ids}
        self.notes: dict[str, list[str]] = {rid: [] for rid in self.ids}
        self.loaders: list[dict] = []
        self.loader_count = 0
        self.models: list[dict] = []
        self.optimizers: list[dict] = []
        self.optimizer_count = 0
        self.observed: dict = {}
        self._steps_seen = 0
        self._cudnn_reset_noted = False
        self._cudagraph_skip_reasons: list[str] = []

    # -- helpers
    def _change(self, rid: str, text: str) -> None:
        if rid in self.changes and text not in self.changes[rid] and len(self.changes[rid]) < MAX_RECORDS:
            self.changes[rid].append(text)

    def _note(self, rid: str, text: str) -> None:
        if rid in self.notes and text not in self.notes[rid]:
            self.notes[rid].append(text)

    def install(self) -> None:
        import torch
        self.torch = torch
        self.cuda = torch.cuda.is_available()
        for rid in self.ids:
            info = REMEDIES[rid]
            if info.cuda_only and not self.cuda:
                self._note(rid, "no CUDA device: this remedy only matters on a GPU")
        self._patch_dataloader()
        self._patch_module_call()
        self._patch_optimizer()
        if "cuda_graphs" in self.ids:
            self._listen_for_cudagraph_skips()
        if "cudnn_benchmark" in self.ids:
            torch.backends.cudnn.benchmark = True
            self._change("cudnn_benchmark", "torch.backends.cudnn.benchmark = True before the script")

    def on_step(self) -> None:
        """Called at every step boundary the runner accepts."""
        torch = self.torch
        self._steps_seen += 1
        if self._steps_seen == 1:
            self.observed["cudnn_benchmark_at_first_step"] = bool(torch.backends.cudnn.benchmark)
            self.observed["cuda_initialized"] = bool(self.cuda and torch.cuda.is_initialized())
        if "cudnn_benchmark" in self.ids and not torch.backends.cudnn.benchmark:
            torch.backends.cudnn.benchmark = True
            if not self._cudnn_reset_noted:
                self._cudnn_reset_noted = True
                self._note("cudnn_benchmark", "the script sets cudnn.benchmark = False; "
                                              "navdoctor set it back to True at the step boundary")
        if "cuda_graphs" in self.ids and self.cuda and torch.cuda.is_initialized():
            torch.compiler.cudagraph_mark_step_begin()

    def after_run(self) -> None:
        """What the compiler did with a compiled model, from torch._dynamo's counters: a remedy
        that compiles can be applied and still not do what it promises (graph breaks split the
        model; inductor skips CUDA graphs for reasons it logs only on request)."""
        if not any(rid in self.ids for rid in ("compile", "cuda_graphs")):
            return
        try:
            from torch._dynamo.utils import counters
        except ImportError:
            return
        breaks = sum(counters.get("graph_break", {}).values())
        graphs = counters.get("stats", {}).get("unique_graphs", 0)
        skips = counters.get("inductor", {}).get("cudagraph_skips", 0)
        self.observed["compiler"] = {"unique_graphs": graphs, "graph_breaks": breaks,
                                     "cudagraph_skips": skips}
        if breaks:
            for rid in ("compile", "cuda_graphs"):
                self._note(rid, f"{breaks} graph break(s), {graphs} compiled graph(s): the model "
                                "runs in pieces with eager code between them (see why: "
                                "TORCH_LOGS=graph_breaks)")
        if "cuda_graphs" in self.ids and skips and self.cuda:
            reasons = "; ".join(self._cudagraph_skip_reasons)
            why = f"why: {reasons}" if reasons else "see why: TORCH_LOGS=cudagraphs"
            self._note("cuda_graphs", f"inductor skipped CUDA graphs {skips} time(s): at least part "
                                      f"of the model ran compiled but without CUDA graphs ({why})")
            self.observed["compiler"]["cudagraph_skip_reasons"] = list(self._cudagraph_skip_reasons)

    def _listen_for_cudagraph_skips(self) -> None:
        """Keep inductor's reasons for skipping CUDA graphs. It logs each at WARNING on the
        'cudagraphs' artifact logger, which is silent unless TORCH_LOGS names it; a handler on
        that logger itself still sees the records. Nothing is kept if a torch release renames it."""
        import logging
        reasons = self._cudagraph_skip_reasons

        class KeepReasons(logging.Handler):
            def emit(self, record):
                text = " ".join(record.getMessage().split())[:300]
                if text not in reasons and len(reasons) < 5:
                    reasons.append(text)

        logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs").addHandler(KeepReasons())

    def summary(self) -> dict:
        return {"changes": self.changes, "notes": self.notes, "loaders": self.loaders,
                "loader_count": self.loader_count, "models": self.models,
                "optimizers": self.optimizers, "optimizer_count": self.optimizer_count,
                "observed": self.observed}

    # -- DataLoader
    def _patch_dataloader(self) -> None:
        import inspect
        from torch.utils.data import DataLoader, IterableDataset
        original = DataLoader.__init__
        signature = inspect.signature(original)
        patches = self
        workers = target_workers()
        keys = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")

        def init(loader, *args, **kwargs):
            try:
                bound = signature.bind(loader, *args, **kwargs)
            except TypeError:       # torch's own error message for bad arguments
                return original(loader, *args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            before = {k: a.get(k) for k in keys}
            patches._rewrite_loader(a, isinstance(a.get("dataset"), IterableDataset), workers)
            after = {k: a.get(k) for k in keys}
            patches.loader_count += 1
            if len(patches.loaders) < MAX_RECORDS:
                patches.loaders.append({"dataset": type(a.get("dataset")).__name__,
                                        "batch_size": a.get("batch_size") if isinstance(
                                            a.get("batch_size"), (int, type(None))) else None,
                                        "before": before, "after": after})
            return original(*bound.args, **bound.kwargs)

        init.__wrapped__ = original
        DataLoader.__init__ = init

    def _rewrite_loader(self, a: dict, iterable: bool, workers: int) -> None:
        ids = self.ids
        if "num_workers" in ids:
            if a["num_workers"] == 0:
                if iterable:
                    self._note("num_workers", "an IterableDataset loader was left alone: each worker "
                                              "would yield the whole stream unless the dataset shards "
                                              "itself with get_worker_info() (a code change)")
                else:
                    a["num_workers"] = workers
                    self._change("num_workers", f"num_workers 0 -> {workers}")
            else:
                self._note("num_workers", f"a loader already has num_workers={a['num_workers']}")
        if "pin_memory" in ids:
            if not a["pin_memory"]:
                a["pin_memory"] = True
                self._change("pin_memory", "pin_memory False -> True")
                self._note("pin_memory", "copies only overlap with compute when the script also "
                                         "calls .to(device, non_blocking=True)")
            else:
                self._note("pin_memory", "a loader already has pin_memory=True")
        if "persistent_workers" in ids:
            if a["num_workers"] == 0:
                self._note("persistent_workers", "a loader has num_workers=0, where persistent_workers "
                                                 "does not apply (try --remedy num_workers+persistent_workers)")
            elif not a["persistent_workers"]:
                a["persistent_workers"] = True
                self._change("persistent_workers", "persistent_workers False -> True")
            else:
                self._note("persistent_workers", "a loader already has persistent_workers=True")
        if "prefetch_factor" in ids:
            if a["num_workers"] == 0:
                self._note("prefetch_factor", "a loader has num_workers=0, where prefetch_factor does "
                                              "not apply (try --remedy num_workers+prefetch_factor)")
            elif (a["prefetch_factor"] or 2) < 4:
                old = a["prefetch_factor"] or 2
                a["prefetch_factor"] = 4
                self._change("prefetch_factor", f"prefetch_factor {old} -> 4")
            else:
                self._note("prefetch_factor", f"a loader already has prefetch_factor={a['prefetch_factor']}")

    # -- optimizers
    def _patch_optimizer(self) -> None:
        import inspect
        torch = self.torch
        opt_cls = torch.optim.Optimizer
        original_init = opt_cls.__init__
        patches = self

        def init(opt, params, defaults, *args, **kwargs):
            name = type(opt).__name__
            before = {k: defaults.get(k) for k in ("foreach", "fused")} if isinstance(defaults, dict) else {}
            if "foreach_optimizer" in patches.ids and isinstance(defaults, dict):
                defaults = patches._foreach_defaults(name, defaults)
            patches.optimizer_count += 1
            if len(patches.optimizers) < MAX_RECORDS:
                patches.optimizers.append({"class": name, "before": before,
                                           "after": {k: defaults.get(k) for k in before}})
            return original_init(opt, params, defaults, *args, **kwargs)

        init.__wrapped__ = original_init
        opt_cls.__init__ = init

        # zero_grad of optimizers and of modules: same argument, same change. A subclass that
        # overrides zero_grad (some third-party optimizers) goes around the wrapper.
        for cls in (opt_cls, torch.nn.Module):
            original = cls.zero_grad
            signature = inspect.signature(original)

            def zero_grad(self, *args, _original=original, _signature=signature, **kwargs):
                if "zero_grad_set_to_none" in patches.ids:
                    try:
                        bound = _signature.bind(self, *args, **kwargs)
                    except TypeError:      # torch's own error for bad arguments
                        return _original(self, *args, **kwargs)
                    bound.apply_defaults()
                    if bound.arguments.get("set_to_none") is False:
                        bound.arguments["set_to_none"] = True
                        patches._change("zero_grad_set_to_none",
                                        f"{type(self).__name__}.zero_grad(set_to_none=False) -> True")
                    return _original(*bound.args, **bound.kwargs)
                return _original(self, *args, **kwargs)

            zero_grad.__wrapped__ = original
            cls.zero_grad = zero_grad

    def _foreach_defaults(self, name: str, defaults: dict) -> dict:
        rid = "foreach_optimizer"
        if "foreach" not in defaults:
            self._note(rid, f"{name} has no foreach option")
        elif defaults.get("fused"):
            self._note(rid, f"{name} is fused already (one kernel, better than foreach)")
        elif defaults.get("differentiable"):
            self._note(rid, f"{name} is differentiable: left alone (torch runs it tensor by tensor)")
        elif defaults["foreach"] is True:
            self._note(rid, f"{name} has foreach=True already")
        else:
            old = defaults["foreach"]
            defaults = dict(defaults, foreach=True)
            self._change(rid, f"{name}: foreach {old} -> True")
            if old is None:
                self._note(rid, "with foreach=None torch already picks foreach when every parameter "
                                "is a CUDA tensor: the change matters where the script passed "
                                "foreach=False or parameters live off the GPU")
        return defaults

    # -- models
    def _patch_module_call(self) -> None:
        torch = self.torch
        module_cls = torch.nn.Module
        original = module_cls.__call__
        is_compiling = torch.compiler.is_compiling
        local = threading.local()
        plans: dict[int, tuple] = {}      # id(module) -> (module, plan or None)
        patches = self

        # The first parameter must be called `self`: torch.profiler's Python tracer
        # (with_stack=True) recognises module calls by the code of Module.__call__ and reads
        # the module from the frame's local named "self" (a crash without it).
        def call(self, *args, **kwargs):
            if is_compiling() or getattr(local, "depth", 0):
                return original(self, *args, **kwargs)
            entry = plans.get(id(self))
            if entry is None or entry[0] is not self:
                entry = (self, patches._plan_for(self, args, kwargs, original))
                plans[id(self)] = entry
            local.depth = 1
            try:
                plan = entry[1]
                if plan is None:
                    return original(self, *args, **kwargs)
                return plan(self, args, kwargs)
            finally:
                local.depth = 0

        call.__wrapped__ = original
        module_cls.__call__ = call

    def _plan_for(self, module, args, kwargs, original):
        """At a module's first top-level call: is it a model, and what do the remedies do to it?"""
        torch = self.torch
        first = next(iter(module.parameters()), None)
        if first is None:
            return None
        record = {"class": type(module).__name__,
                  "parameters": sum(p.numel() for p in module.parameters()),
                  "device": str(first.device), "calls": 0}
        if len(self.models) < MAX_RECORDS:
            self.models.append(record)
        device_type = first.device.type
        name = record["class"]
        ids = self.ids

        autocast_dtype = None
        for rid, dtype in (("amp_bf16", torch.bfloat16), ("amp_fp16", torch.float16)):
            if rid in ids:
                if torch.is_autocast_enabled(device_type):
                    self._note(rid, f"{name} already runs under the script's own autocast")
                else:
                    autocast_dtype = dtype
                    self._change(rid, f"{name}: calls under torch.autocast({device_type!r}, {dtype})")
                    if rid == "amp_bf16" and device_type == "cuda":
                        note = bf16_without_tensor_cores(torch.cuda.get_device_capability(first.device))
                        if note:
                            self._note(rid, note)
                    if rid == "amp_fp16" and module.training and device_type == "cuda":
                        self._note(rid, "fp16 training also needs torch.amp.GradScaler against "
                                        "gradient underflow; not applied (timing only)")

        channels_last = "channels_last" in ids
        if channels_last:
            cl = torch.channels_last
            tensors = list(module.parameters()) + list(module.buffers())
            four_d = [t for t in tensors if t.dim() == 4]
            # 1x1 and single-channel kernels are both layouts at once; the rest need converting.
            to_convert = sum(1 for t in four_d if not t.is_contiguous(memory_format=cl))
            if to_convert:
                module.to(memory_format=cl)
                self._change("channels_last", f"{name}: {len(four_d)} 4-D weights in channels_last "
                                              f"({to_convert} changed layout)")
            elif not four_d:
                self._note("channels_last", f"{name} has no 4-D weights (not a convolutional model)")
            else:
                self._note("channels_last", f"{name}'s weights are channels_last already")

        compiled = None     # the model as torch.compile wraps it; calls go there instead
        for rid, mode in (("compile", None), ("cuda_graphs", "reduce-overhead")):
            if rid in ids:
                compiled_cls = getattr(getattr(torch, "_dynamo", None), "OptimizedModule", None)
                if module._compiled_call_impl is not None or (
                        compiled_cls is not None and isinstance(module, compiled_cls)):
                    self._note(rid, f"{name} is compiled by the script already")
                else:
                    # torch.compile(module), not module.compile(): on an H200 with torch 2.11,
                    # module.compile() of a Sequential compiled each block on its own (48 CUDA
                    # graphs per step, 2.8 ms) where torch.compile(module) made one (0.53 ms).
                    # The wrapper shares the module's parameters; the user's object is unchanged.
                    compiled = torch.compile(module, mode=mode)
                    self._change(rid, f"{name}: torch.compile({name.lower()}"
                                      f"{'' if mode is None else ', mode=' + repr(mode)})")
                    if rid == "cuda_graphs" and device_type != "cuda":
                        self._note(rid, f"{name} runs on {device_type}: mode='reduce-overhead' compiles "
                                        "it but captures no CUDA graph")
                    self._note(rid, "compiling happens in the first steps; raise --warmup if "
                                    "recompiles reach the timed steps")

        def to_cl(value, depth=0):
            if isinstance(value, torch.Tensor):
                if value.dim() == 4 and not value.is_contiguous(memory_format=torch.channels_last):
                    converted[0] += 1
                    return value.contiguous(memory_format=torch.channels_last)
                return value
            if depth == 0 and isinstance(value, (list, tuple)):
                return type(value)(to_cl(v, 1) for v in value) if not hasattr(value, "_fields") else value
            return value

        converted = [0]
        input_noted = [False]

        def call_model(mod, a, kw):
            if compiled is not None:
                # The wrapper's own Module.__call__ goes through `call` as a nested call.
                return compiled(*a, **kw)
            return original(mod, *a, **kw)

        def plan(mod, a, kw):
            record["calls"] += 1
            if channels_last:
                a = tuple(to_cl(v) for v in a)
                kw = {k: to_cl(v) for k, v in kw.items()}
                if converted[0] and not input_noted[0]:
                    input_noted[0] = True
                    self._change("channels_last", f"{name}: 4-D inputs to channels_last")
            if autocast_dtype is not None and not torch.is_autocast_enabled(device_type):
                with torch.autocast(device_type, dtype=autocast_dtype):
                    return call_model(mod, a, kw)
            return call_model(mod, a, kw)

        return plan
