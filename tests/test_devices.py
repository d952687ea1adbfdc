"""Device slots: discovery, clear errors for devices that are not there, remote slots over TVM RPC."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import tests.fault_kernels as kernels
from measure.slots import DeviceNotFound, RpcAddress, cpu_slots, cuda_slots, discover, parse_device, rpc_slot


def _has_gpu() -> bool:
    try:
        cuda_slots()
        return True
    except DeviceNotFound:
        return False


HAS_GPU = _has_gpu()


def test_cpu_slots_are_disjoint_core_sets():
    cores = sorted(os.sched_getaffinity(0))
    slots = cpu_slots(1)
    assert [s.cores for s in slots] == [(c,) for c in cores]
    assert cpu_slots(len(cores))[0].cores == tuple(cores)
    with pytest.raises(DeviceNotFound, match="needs 1\\.\\."):
        cpu_slots(len(cores) + 1)


def test_device_words_are_checked():
    assert parse_device("cuda:1") == ("cuda", 1)
    assert parse_device("rpc:10.0.0.2:9190:pi4") == ("rpc", RpcAddress("10.0.0.2", 9190, "pi4"))
    with pytest.raises(DeviceNotFound, match="expected cpu, cuda:N or rpc:HOST:PORT:KEY"):
        parse_device("tpu:0")
    with pytest.raises(DeviceNotFound, match="needs --target cuda"):
        discover(["cuda:0"], "llvm", 1)


@pytest.mark.skipif(HAS_GPU, reason="checks the error on a machine without an NVIDIA GPU")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(DeviceNotFound, match="no NVIDIA GPU"):
        cuda_slots()


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_slots_record_name_memory_and_clocks():
    slots = cuda_slots()
    assert slots and all(s.info["name"] and s.info["memory_total_mib"] > 0 for s in slots)
    with pytest.raises(DeviceNotFound, match="does not exist"):
        cuda_slots([len(slots)])


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_candidates_are_timed_on_device(tmp_path):
    from autotune.target import resolve_target
    from measure.calibration import sample_candidates
    from measure.kernels import kernel
    from measure.parallel import ParallelEngine
    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    target = resolve_target("cuda").tvm_target()
    engine = ParallelEngine(cuda_slots([0]), build_workers=4)
    try:
        results = engine.measure(target, "cuda", sample_candidates(kernel("matmul512"), target, 8, 0))
    finally:
        engine.close()
    assert sum(m.ok for m in results) >= 4
    assert all(m.slot == "cuda:0" for m in results if m.ok)


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_energy_comes_from_nvml_and_is_billed_as_measured():
    from cost_models.energy import EnergyLedger, gpu_meter

    meter = gpu_meter([0])
    assert meter is not None, "NVML offers no total-energy counter on this GPU"
    ledger = EnergyLedger(gpu=meter)
    time.sleep(1.0)  # even idle, a data-centre GPU draws tens of watts
    bill = ledger.bill({"measure": {"cpu_s": 0.5, "device_s": 1.0}}, wall_s=1.0, devices=1,
                       wasted={"measurements": 0, "of": 1, "cpu_s": 0.0, "device_s": 0.0})
    assert bill["method"]["gpu"] == "NVML GPU energy (measured)"
    assert 5 < bill["gpu_energy_j"] < 2000
    assert bill["energy_j"] == pytest.approx(bill["gpu_energy_j"] + bill["cpu_energy_j"], abs=0.2)
    assert bill["phases"]["measure"]["energy_j"] == pytest.approx(bill["energy_j"], abs=0.2)


def test_the_cuda_target_carries_what_the_search_space_needs(tmp_path):
    """Candidates for an H200 (sm_90) are drawn as a job's first round draws them, and built here: only their
    timing needs the GPU. Most random draws break the GPU's limits: the round is full all the same (a round that
    came back short of one or two draws used to end its task)."""
    import tvm

    from autotune.search import TaskSearch
    from autotune.target import cuda_target_config
    from measure.build import build_candidate
    from measure.kernels import kernel
    from tests.conftest import pre_tuned_context, schedule_hash

    target = tvm.target.Target(cuda_target_config("9.0", 1024, 49152, 32, 2))
    ctx, spaces = pre_tuned_context(kernel("matmul512"), target, 9, 8)
    search = TaskSearch(ctx, spaces, seed=0)
    proposal = search.propose(8, [], set(), None, guided=False)
    assert proposal.kind == "sampled" and len(proposal.candidates) == 8
    seen = {schedule_hash(c) for c in proposal.candidates}
    assert len(search.propose(1, [], seen, None, guided=False).candidates) == 1
    ctx.post_tuning()
    assert os.path.getsize(build_candidate(proposal.candidates[0].sch.mod, target, str(tmp_path))) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """The launchers run the real service in a child: stop the whole group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture
def rpc_device():
    port = _free_port()
    tracker = _launch("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1))
    server = _launch("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", "autotune-test",
                     "--host", "127.0.0.1")
    address = RpcAddress("127.0.0.1", port, "autotune-test")
    deadline = time.monotonic() + 90
    while True:
        try:
            rpc_slot(address)
            break
        except DeviceNotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    yield address, server
    _stop(server)
    _stop(tracker)


def test_a_missing_tracker_or_key_is_an_error_before_tuning():
    with pytest.raises(DeviceNotFound, match="no RPC tracker"):
        rpc_slot(RpcAddress("127.0.0.1", _free_port(), "k"))


def test_remote_slot_times_candidates_and_survives_its_server_leaving(rpc_device):
    from autotune.target import resolve_target
    from measure.parallel import EngineLimits, ParallelEngine
    from measure.tvm_import import import_meta_schedule

    address, server = rpc_device
    with pytest.raises(DeviceNotFound, match="no server with key 'other'"):
        rpc_slot(RpcAddress(address.host, address.port, "other"))
    import_meta_schedule()
    target = resolve_target("cpu", 1).tvm_target()
    engine = ParallelEngine([rpc_slot(address)], build_workers=1, limits=EngineLimits(run_timeout_s=6))
    try:
        first = engine.measure(target, "cpu", [kernels.good(128), kernels.good(256)])
        assert all(m.ok for m in first), [m.error for m in first]
        assert first[0].slot == str(address)
        _stop(server)
        after = engine.measure(target, "cpu", [kernels.good(128)])
    finally:
        engine.close()
    assert not after[0].ok and after[0].error.startswith("run:")
