"""Build small Nsight Systems-like SQLite exports for tests.

The tables and columns follow the Nsight Systems SQLite schema reference (2024.6 exports,
schema 3.16: StringIds, ThreadNames, TARGET_INFO_*, META_DATA_EXPORT, CUPTI_ACTIVITY_KIND_*,
NVTX_EVENTS, OSRT_API, CUDA_GPU_MEMORY_USAGE_EVENTS, CUDA_UM_{CPU,GPU}_PAGE_FAULT_EVENTS,
ENUM_* with real symbol names and labels).
Only tables that received rows are written, as nsys itself creates tables lazily; `omit`
drops any table, `enum_columns` writes ENUM tables with only 'name' or only 'label' (older and
newer exports differ), and `with_enums=False` leaves them out like pre-2021.3 exports.

    x = NsysExport()
    x.step(0, 0, 10_000_000)
    x.kernel(1_000_000, 3_000_000, "ampere_sgemm_128x64_tn")      # + its cudaLaunchKernel
    x.memcpy(4_000_000, 5_000_000, 1 << 20, "HtoD", src="pageable")
    path = x.write(tmp_path / "trace.sqlite")
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

# ENUM rows as nsys writes them: id, symbol name, human label.
ENUMS: dict[str, list[tuple[int, str, str]]] = {
    "ENUM_CUDA_MEMCPY_OPER": [
        (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
        (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
        (4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"), (5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
        (6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"), (7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
        (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"), (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
        (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"),
        (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
        (12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host"),
        (13, "CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device")],
    "ENUM_CUDA_MEM_KIND": [
        (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"), (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
        (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"), (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
        (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
        (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
        (6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static"),
        (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown")],
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": [
        (0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
        (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation")],
    "ENUM_CUPTI_SYNC_TYPE": [
        (0, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", "Unknown"),
        (1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event sync"),
        (2, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "Stream wait sync"),
        (3, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "Stream sync"),
        (4, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", "Context sync")],
    # As the nsys 2025.3.2 export of fixtures/gpu writes them ('prefecth' is nsys's spelling).
    "ENUM_CUDA_UNIF_MEM_MIGRATION": [
        (0, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_UNKNOWN", "Unknown"),
        (1, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_USER", "User prefetch"),
        (2, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE", "Page fault"),
        (3, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH", "Speculative prefecth"),
        (4, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_EVICTION", "Eviction"),
        (5, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_ACCESS_COUNTERS", "Access counters")],
    "ENUM_CUDA_UNIF_MEM_ACCESS_TYPE": [
        (0, "CUDA_UNIFIED_MEMORY_ACCESS_TYPE_UNKNOWN", "Unknown"),
        (1, "CUDA_UNIFIED_MEMORY_ACCESS_TYPE_READ", "Read"),
        (2, "CUDA_UNIFIED_MEMORY_ACCESS_TYPE_WRITE", "Write"),
        (3, "CUDA_UNIFIED_MEMORY_ACCESS_TYPE_ATOMIC", "Atomic"),
        (4, "CUDA_UNIFIED_MEMORY_ACCESS_TYPE_PREFETCH", "Prefetch")],
    "ENUM_NSYS_EVENT_TYPE": [
        (33, "NvtxCategory", "NvtxCategory"), (34, "NvtxMark", "NvtxMark"),
        (39, "NvtxThread", "NvtxThread"), (59, "NvtxPushPopRange", "NvtxPushPopRange"),
        (60, "NvtxStartEndRange", "NvtxStartEndRange"), (75, "NvtxDomainCreate", "NvtxDomainCreate"),
        (76, "NvtxDomainDestroy", "NvtxDomainDestroy")],
    "ENUM_NSYS_EVENT_CLASS": [
        (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
        (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
        (27, "TRACE_PROCESS_EVENT_OS_RUNTIME", "OS runtime"),
        (67, "TRACE_PROCESS_EVENT_CUDABACKTRACE", "CUDA backtrace")],
}

MEMCPY_KIND = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
UVM_KIND = {"HtoD": 11, "DtoH": 12, "DtoD": 13}
UM_CAUSE = {"user": 1, "coherence": 2, "prefetch": 3, "eviction": 4, "access_counters": 5}
UM_ACCESS = {"read": 1, "write": 2, "atomic": 3, "prefetch": 4}
MEM_KIND = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4}
SYNC_TYPE = {"event": 1, "stream_wait": 2, "stream": 3, "context": 4}
SYNC_API = {"event": "cudaEventSynchronize_v3020", "stream_wait": "cudaStreamWaitEvent_v3020",
            "stream": "cudaStreamSynchronize_v3020", "context": "cudaDeviceSynchronize_v3020"}
NVTX_PUSH_POP, NVTX_START_END, NVTX_MARK, NVTX_DOMAIN_CREATE = 59, 60, 34, 75
CLASS_RUNTIME, CLASS_DRIVER, CLASS_BACKTRACE = 0, 1, 67

SCHEMA: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ANALYSIS_DETAILS": "globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
                        "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
        "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
        "smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, "
        "ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, "
        "maxIPC INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, "
        "maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, "
        "threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
        "maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, "
        "maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, "
        "computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER"),
    "TARGET_INFO_CUDA_DEVICE": "gpuId INTEGER, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL, "
                               "uuid TEXT, numMultiprocessors INTEGER",
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
        "shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, "
        "registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
        "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, "
        "blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, "
        "dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL, "
        "localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, "
        "graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
        "deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, "
        "srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER, "
        "graphNodeId INTEGER, virtualAddress INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, "
        "graphNodeId INTEGER, memKind INTEGER"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
        "returnValue INTEGER NOT NULL, callchainId INTEGER"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": (
        "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, "
        "bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, "
        "name TEXT, correlationId INTEGER, streamId INTEGER"),
    # Unified memory (--cuda-um-cpu-page-faults / --cuda-um-gpu-page-faults), as the schema
    # reference of nsys 2024.x-2025.x declares them.
    "CUDA_UM_CPU_PAGE_FAULT_EVENTS": (
        "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, address INTEGER NOT NULL, "
        "originalFaultPc INTEGER, CpuInstruction INTEGER NOT NULL, module INTEGER NOT NULL, "
        "unresolvedFaultPc INTEGER, sourceFile INTEGER, sourceLine INTEGER"),
    "CUDA_UM_GPU_PAGE_FAULT_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, globalPid INTEGER NOT NULL, "
        "deviceId INTEGER NOT NULL, address INTEGER NOT NULL, numberOfPageFaults INTEGER NOT NULL, "
        "faultAccessType INTEGER NOT NULL"),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
        "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, "
        "jsonTextId INTEGER, jsonText TEXT, binaryData TEXT"),
    "OSRT_API": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, "
        "nestingLevel INTEGER, callchainId INTEGER NOT NULL"),
}

H100 = dict(name="NVIDIA H100 80GB HBM3", totalMemory=85520809984, smCount=132, computeMajor=9,
            computeMinor=0, maxWarpsPerSm=64, threadsPerWarp=32, busLocation="0000:19:00.0",
            chipName="GH100", l2CacheSize=52428800)


def global_tid(pid: int, tid: int) -> int:
    """nsys's serialised thread id (the top bits hold the hardware/VM id)."""
    return (1 << 48) | (pid << 24) | tid


def global_pid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


class NsysExport:
    def __init__(self, pid: int = 4242, tid: int | None = None, version: str = "2024.6.2.225"):
        self.pid, self.tid = pid, tid if tid is not None else pid
        self.version = version
        self.rows: dict[str, list[dict]] = {name: [] for name in SCHEMA}
        self.strings: dict[str, int] = {}
        self._corr = 0
        self._domains: dict[str, int] = {}
        self.rows["META_DATA_EXPORT"] += [{"name": "EXPORT_PRODUCT_VERSION", "value": version},
                                          {"name": "EXPORT_SCHEMA_VERSION", "value": "3.16.1"}]

    # -- helpers ------------------------------------------------------------------------
    def string(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
            self.rows["StringIds"].append({"id": self.strings[s], "value": s})
        return self.strings[s]

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def gtid(self, tid: int | None = None, pid: int | None = None) -> int:
        return global_tid(self.pid if pid is None else pid, self.tid if tid is None else tid)

    def add(self, table: str, **row) -> dict:
        self.rows[table].append(row)
        return row

    # -- CUDA ---------------------------------------------------------------------------
    def runtime(self, start: int, end: int, name: str, corr: int | None = None,
                tid: int | None = None, event_class: int = CLASS_RUNTIME, pid: int | None = None) -> int:
        corr = self.next_corr() if corr is None else corr
        self.add("CUPTI_ACTIVITY_KIND_RUNTIME", start=start, end=end, eventClass=event_class,
                 globalTid=self.gtid(tid, pid), correlationId=corr, nameId=self.string(name),
                 returnValue=0, callchainId=None)
        return corr

    def kernel(self, start: int, end: int, name: str, *, short: str | None = None, device: int = 0,
               stream: int = 7, grid=(1, 1, 1), block=(128, 1, 1), regs: int = 32,
               static_smem: int = 0, dynamic_smem: int = 0, launch: str | None = "cudaLaunchKernel_v7000",
               launch_at: tuple[int, int] | None = None, corr: int | None = None) -> int:
        """A kernel, and (unless launch=None) the API call that launched it, just before it."""
        if launch:
            ls, le = launch_at or (max(0, start - 5000), max(0, start - 1000))
            corr = self.runtime(ls, le, launch, corr=corr)
        elif corr is None:
            corr = self.next_corr()
        self.add("CUPTI_ACTIVITY_KIND_KERNEL", start=start, end=end, deviceId=device, contextId=1,
                 greenContextId=None, streamId=stream, correlationId=corr,
                 globalPid=global_pid(self.pid), demangledName=self.string(name),
                 shortName=self.string(short or name.split("<")[0].split("(")[0].split()[-1]),
                 mangledName=None, launchType=0, cacheConfig=0, registersPerThread=regs,
                 gridX=grid[0], gridY=grid[1], gridZ=grid[2], blockX=block[0], blockY=block[1],
                 blockZ=block[2], staticSharedMemory=static_smem, dynamicSharedMemory=dynamic_smem,
                 localMemoryPerThread=0, localMemoryTotal=0, gridId=corr, sharedMemoryExecuted=0,
                 graphNodeId=None, sharedMemoryLimitConfig=0)
        return corr

    def memcpy(self, start: int, end: int, nbytes: int, kind: str = "HtoD", *, src: str = "pageable",
               dst: str = "device", device: int = 0, stream: int = 7,
               api: str | None = "cudaMemcpyAsync_v3020") -> int:
        corr = self.runtime(max(0, start - 5000), max(0, start - 1000), api) if api else self.next_corr()
        self.add("CUPTI_ACTIVITY_KIND_MEMCPY", start=start, end=end, deviceId=device, contextId=1,
                 greenContextId=None, streamId=stream, correlationId=corr,
                 globalPid=global_pid(self.pid), bytes=nbytes, copyKind=MEMCPY_KIND[kind],
                 deprecatedSrcId=None, srcKind=MEM_KIND[src], dstKind=MEM_KIND[dst],
                 srcDeviceId=device, srcContextId=1, dstDeviceId=device, dstContextId=1,
                 migrationCause=None, graphNodeId=None, virtualAddress=None)
        return corr

    def memset(self, start: int, end: int, nbytes: int, *, device: int = 0, stream: int = 7,
               api: str | None = "cudaMemsetAsync_v3020") -> int:
        corr = self.runtime(max(0, start - 5000), max(0, start - 1000), api) if api else self.next_corr()
        self.add("CUPTI_ACTIVITY_KIND_MEMSET", start=start, end=end, deviceId=device, contextId=1,
                 greenContextId=None, streamId=stream, correlationId=corr,
                 globalPid=global_pid(self.pid), value=0, bytes=nbytes, graphNodeId=None,
                 memKind=MEM_KIND["device"])
        return corr

    def sync(self, start: int, end: int, kind: str = "stream", *, api: str | None = None,
             record: bool = True, tid: int | None = None) -> int:
        """A host wait: the API call and (record=True) its CUPTI synchronisation record."""
        corr = self.runtime(start, end, api or SYNC_API[kind], tid=tid)
        if record:
            self.add("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", start=start, end=end, deviceId=0,
                     contextId=1, greenContextId=None, streamId=7, correlationId=corr,
                     globalPid=global_pid(self.pid), syncType=SYNC_TYPE[kind], eventId=0)
        return corr

    def memory(self, ts: int, nbytes: int, alloc: bool = True, *, kind: str = "device",
               device: int = 0) -> None:
        self.add("CUDA_GPU_MEMORY_USAGE_EVENTS", start=ts, globalPid=global_pid(self.pid),
                 deviceId=device, contextId=1, address=0x7F0000000000 + ts, pc=0, bytes=nbytes,
                 memKind=MEM_KIND[kind], memoryOperationType=0 if alloc else 1, name=None,
                 correlationId=None, streamId=None)

    # -- unified memory ---------------------------------------------------------------
    def um_gpu_fault(self, start: int, end: int, address: int, faults: int = 1, *,
                     access: str = "read", device: int = 0) -> None:
        """A GPU fault group: `faults` faults on the page at `address`, handled in [start, end)."""
        self.add("CUDA_UM_GPU_PAGE_FAULT_EVENTS", start=start, end=end, globalPid=global_pid(self.pid),
                 deviceId=device, address=address, numberOfPageFaults=faults,
                 faultAccessType=UM_ACCESS[access])

    def um_cpu_fault(self, start: int, address: int) -> None:
        self.add("CUDA_UM_CPU_PAGE_FAULT_EVENTS", start=start, globalPid=global_pid(self.pid),
                 address=address, originalFaultPc=0x401000, CpuInstruction=self.string("main"),
                 module=self.string("python3"), unresolvedFaultPc=0, sourceFile=None, sourceLine=None)

    def um_migration(self, start: int, end: int, nbytes: int, direction: str = "HtoD", *,
                     cause: str = "coherence", address: int = 0x7F5000000000, device: int = 0) -> None:
        """A unified-memory migration: a CUPTI_ACTIVITY_KIND_MEMCPY row of a UVM copy kind,
        launched by no API call (the driver moves the pages)."""
        self.add("CUPTI_ACTIVITY_KIND_MEMCPY", start=start, end=end, deviceId=device, contextId=1,
                 greenContextId=None, streamId=0, correlationId=0, globalPid=global_pid(self.pid),
                 bytes=nbytes, copyKind=UVM_KIND[direction], deprecatedSrcId=None,
                 srcKind=MEM_KIND["managed"], dstKind=MEM_KIND["managed"], srcDeviceId=device,
                 srcContextId=1, dstDeviceId=device, dstContextId=1,
                 migrationCause=UM_CAUSE[cause], graphNodeId=None, virtualAddress=address)

    # -- NVTX, OS runtime, threads, GPU ---------------------------------------------------
    def domain(self, name: str, tid: int | None = None) -> int:
        if name not in self._domains:
            self._domains[name] = len(self._domains) + 1
            self.add("NVTX_EVENTS", start=0, end=None, eventType=NVTX_DOMAIN_CREATE, text=name,
                     globalTid=self.gtid(tid), domainId=self._domains[name])
        return self._domains[name]

    def nvtx(self, start: int, end: int | None, text: str, *, tid: int | None = None,
             domain: str | None = None, registered: bool = False, start_end: bool = False) -> None:
        event_type = NVTX_MARK if end is None else (NVTX_START_END if start_end else NVTX_PUSH_POP)
        self.add("NVTX_EVENTS", start=start, end=end, eventType=event_type,
                 text=None if registered else text, textId=self.string(text) if registered else None,
                 globalTid=self.gtid(tid), endGlobalTid=None,
                 domainId=self.domain(domain, tid) if domain else 0)

    def step(self, n: int, start: int, end: int, name: str = "navdoctor.step") -> None:
        self.nvtx(start, end, f"{name}#{n}")

    def dataloader_wait(self, start: int, end: int) -> None:
        self.nvtx(start, end, "navdoctor.dataloader_next")

    def osrt(self, start: int, end: int, name: str, *, tid: int | None = None,
             pid: int | None = None) -> None:
        self.add("OSRT_API", start=start, end=end, eventClass=27, globalTid=self.gtid(tid, pid),
                 nameId=self.string(name), returnValue=0, nestingLevel=0, callchainId=0)

    def thread_name(self, tid: int, name: str, pid: int | None = None) -> None:
        self.add("ThreadNames", nameId=self.string(name), priority=0, globalTid=self.gtid(tid, pid))

    def gpu(self, gpu_id: int = 0, cuda_id: int | None = 0, **props) -> None:
        row = dict(H100, vmId=0, id=gpu_id, cuDevice=cuda_id if cuda_id is not None else gpu_id)
        row.update(props)
        self.add("TARGET_INFO_GPU", **row)
        if cuda_id is not None:
            self.add("TARGET_INFO_CUDA_DEVICE", gpuId=gpu_id, cudaId=cuda_id, pid=self.pid,
                     uuid=None, numMultiprocessors=row.get("smCount"))

    # -- output -----------------------------------------------------------------------
    def write(self, path, *, omit=(), with_enums: bool = True, enum_columns=("name", "label"),
              keep_empty=(), lazy: bool = True) -> Path:
        """Write the export. Tables without rows are left out (nsys creates them lazily)
        unless named in keep_empty or lazy=False; tables named in omit are never written."""
        path = Path(path)
        if path.exists():
            path.unlink()
        con = sqlite3.connect(path)
        try:
            if not self.rows["ANALYSIS_DETAILS"]:
                self.add("ANALYSIS_DETAILS", globalVid=0, duration=1_000_000_000, startTime=0,
                         stopTime=1_000_000_000)
            for table, columns in SCHEMA.items():
                rows = self.rows[table]
                if table in omit or (lazy and not rows and table not in keep_empty):
                    continue
                con.execute(f"CREATE TABLE {table} ({columns})")
                names = [c.split()[0] for c in _split_columns(columns)]
                con.executemany(
                    f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                    [[r.get(n) for n in names] for r in rows])
            if with_enums:
                for table, rows in ENUMS.items():
                    if table in omit:
                        continue
                    cols = ["id"] + list(enum_columns)
                    decl = ", ".join(["id INTEGER NOT NULL PRIMARY KEY"] + [f"{c} TEXT" for c in enum_columns])
                    con.execute(f"CREATE TABLE {table} ({decl})")
                    con.executemany(
                        f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})",
                        [(i,) + tuple(name if c == "name" else label for c in enum_columns)
                         for i, name, label in rows])
            con.commit()
        finally:
            con.close()
        return path


def _split_columns(columns: str) -> list[str]:
    return [c.strip() for c in columns.split(",") if c.strip()]
