"""Small Kineto traces written event by event, in the shapes torch releases produced.

`modern` follows torch 2.x (lowercase categories, float µs with ns decimals, string stream
tids, cuda_driver, ac2g flows); `legacy` follows torch 1.8 (capitalised categories, integer
µs, no 'device'/'stream' args: pid is the device and tid the stream).
"""
from __future__ import annotations

import gzip
import json

CATS = {
    "modern": {"op": "cpu_op", "kernel": "kernel", "memcpy": "gpu_memcpy", "runtime": "cuda_runtime",
               "annotation": "user_annotation"},
    "legacy": {"op": "Operator", "kernel": "Kernel", "memcpy": "Memcpy", "runtime": "Runtime",
               "annotation": "Operator"},
}


class KinetoTrace:
    def __init__(self, style: str = "modern", base_us: float = 1_700_000_000_000.0,
                 distributed: dict | None = None):
        self.distributed = distributed   # Kineto's distributedInfo (rank, world_size, backend)
        self.style = style
        self.cats = CATS[style]
        self.base = base_us
        self.events: list[dict] = []
        self.corr = 0

    def _ts(self, us: float):
        t = self.base + us
        return round(t, 3) if self.style == "modern" else int(t)

    def x(self, cat, name, ts_us, dur_us, pid=1, tid=1, **args):
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self._ts(ts_us),
             "dur": round(dur_us, 3) if self.style == "modern" else int(dur_us)}
        if args:
            e["args"] = args
        self.events.append(e)
        return e

    def step(self, n, ts_us, dur_us):
        return self.x(self.cats["annotation"], f"ProfilerStep#{n}", ts_us, dur_us)

    def dataloader(self, ts_us, dur_us):
        return self.x(self.cats["annotation"],
                      "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts_us, dur_us)

    def op(self, name, ts_us, dur_us, dims=None, types=None):
        """A CPU op; dims/types are its inputs' 'Input Dims' / 'Input type' (record_shapes)."""
        args = {}
        if dims is not None:
            args["Input Dims"] = dims
        if types is not None:
            args["Input type"] = types
        return self.x(self.cats["op"], name, ts_us, dur_us, **args)

    def launch_kernel(self, name, cpu_us, gpu_us, dur_us, launch_us=4.0, **kargs):
        """A cudaLaunchKernel on the host and its kernel on the GPU, linked by correlation."""
        self.corr += 1
        modern = self.style == "modern"
        r = self.x(self.cats["runtime"], "cudaLaunchKernel", cpu_us, launch_us,
                   **({"correlation": self.corr} if modern else {}))
        k_args = {"device": 0, "stream": 7, "correlation": self.corr, **kargs} if modern else {}
        k = self.x(self.cats["kernel"], name, gpu_us, dur_us, pid=0 if not modern else 0,
                   tid="stream 7" if modern else 7, **k_args)
        # Flow events link launch and kernel (the only link in old traces).
        self.events.append({"ph": "s", "cat": "ac2g", "id": self.corr, "pid": 1, "tid": 1,
                            "ts": r["ts"], "name": "ac2g"})
        self.events.append({"ph": "f", "cat": "ac2g", "id": self.corr, "pid": 0, "tid": k["tid"],
                            "ts": k["ts"], "name": "ac2g", "bp": "e"})
        return r, k

    def memcpy(self, kind, src, dst, cpu_us, gpu_us, dur_us, nbytes):
        self.corr += 1
        self.x(self.cats["runtime"], "cudaMemcpyAsync", cpu_us, 5, correlation=self.corr)
        self.x(self.cats["memcpy"], f"Memcpy {kind} ({src} -> {dst})", gpu_us, dur_us, pid=0,
               tid="stream 7", device=0, stream=7, correlation=self.corr, bytes=nbytes)

    def sync(self, cpu_us, dur_us, name="cudaStreamSynchronize"):
        self.x(self.cats["runtime"], name, cpu_us, dur_us)

    def cuda_sync(self, ts_us, dur_us, name="Stream Sync", correlation=None):
        """A CUPTI synchronisation record as newer Kineto writes it (enable_cuda_sync_events):
        on the GPU's row (pid 0, tid: the stream), linked to its runtime call by correlation."""
        args = {} if correlation is None else {"stream": 7, "device": 0, "correlation": correlation}
        return self.x("cuda_sync", name, ts_us, dur_us, pid=0, tid=7, **args)

    def memory(self, ts_us, total_reserved, device_type=1):
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                            "pid": 1, "tid": 1, "ts": self._ts(ts_us),
                            "args": {"Device Type": device_type, "Device Id": 0, "Bytes": 1024,
                                     "Total Allocated": total_reserved // 2,
                                     "Total Reserved": total_reserved}})

    def document(self, device_mem=80 * 10**9) -> dict:
        doc = {"schemaVersion": 1, "traceEvents": self.events,
               "deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": device_mem,
                                     "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
        if self.distributed is not None:
            doc["distributedInfo"] = self.distributed
        if self.style == "legacy":
            doc.pop("schemaVersion")
            doc.pop("deviceProperties")
        return doc

    def write(self, path, gz: bool = False, **kw) -> str:
        data = json.dumps(self.document(**kw)).encode()
        if gz:
            data = gzip.compress(data)
        with open(path, "wb") as f:
            f.write(data)
        return str(path)
