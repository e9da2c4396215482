"""The shim and the agent together on a real GPU with PyTorch and static cudart."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from json_program import bench, run_json_program, run_side_by_side

HERE = pathlib.Path(__file__).parent


def run_training(env=None, *args, timeout=300):
    return run_json_program([sys.executable, str(HERE / "torch_train.py"), *args], env, timeout)


def test_training_under_shim_is_managed_and_matches_plain_run(start_agent, shim_env):
    plain, _ = run_training(None, "--steps", "20")
    agent = start_agent()
    shared, stderr = run_training(shim_env(agent), "--steps", "20")
    assert not plain["managed"]
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    assert agent.events("grant"), agent.log()


@pytest.mark.parametrize("preload", ["portable", "two-copies"])
def test_training_under_the_portable_shim_or_two_copies_matches_plain_run(
    start_agent, shim_env, preload
):
    # The containers' build (glibc 2.17 and later), and that build on top of the host's as
    # LD_PRELOAD on a node whose /etc/ld.so.preload names the host's: the first one hooks.
    library = {
        "portable": str(bench.PORTABLE_SHIM),
        "two-copies": f"{bench.SHIM} {bench.PORTABLE_SHIM}",
    }[preload]
    plain, _ = run_training(None, "--steps", "20")
    agent = start_agent()
    shared, stderr = run_training(
        shim_env(agent, LD_PRELOAD=library, NVSHARE_DEBUG=1), "--steps", "20"
    )
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    assert len(agent.events("connect")) == 1 and agent.events("grant"), agent.log()
    stepped_aside = stderr.count("another copy of libnvshare.so came first")
    assert stepped_aside == (1 if preload == "two-copies" else 0), stderr[-2000:]


def test_compiled_training_under_shim_matches_plain_run(start_agent, shim_env, tmp_path):
    def fresh_caches(run):  # so each run compiles its kernels itself, the shim's run included
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / run / "inductor"),
            "TRITON_CACHE_DIR": str(tmp_path / run / "triton"),
        }

    plain, _ = run_training(dict(os.environ, **fresh_caches("plain")), "--compile", "--steps", "20")
    agent = start_agent()
    shared, stderr = run_training(
        shim_env(agent, **fresh_caches("shim")), "--compile", "--steps", "20"
    )
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    assert agent.events("grant"), agent.log()
    assert any((tmp_path / "shim" / "triton").rglob("*.cubin")), (
        "Triton compiled nothing under the shim"
    )


def test_static_cudart_program_is_gated_and_managed(start_agent, shim_env, cuda_program):
    binary = cuda_program("vector_add", "-cudart=static")
    agent = start_agent()
    program = subprocess.Popen(
        [str(binary)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=shim_env(agent),
    )
    out, err = program.communicate(timeout=120)
    assert program.returncode == 0, out + err
    assert "wrong=0 managed=1" in out, out + err
    assert str(program.pid) in {event["pid"] for event in agent.events("grant")}, agent.log()


def test_each_burst_over_an_evicted_working_set_takes_one_grant(
    start_agent, shim_env, cuda_program
):
    # 6 GiB pushed back to host after each burst: each grant's prefetch (~125 ms at 48 GB/s)
    # outlasts the 100 ms idle release, which must count from the gate's opening; from the
    # grant, the lock went back as the gate opened and the burst asked again.
    agent = start_agent(idle_release_ms=100)
    done = subprocess.run(
        [str(cuda_program("bursts")), "6", "5", "500"],
        capture_output=True,
        text=True,
        env=shim_env(agent, NVSHARE_DEBUG=1),
        timeout=120,
    )
    assert done.returncode == 0 and "result=ok" in done.stdout, done.stdout + done.stderr[-4000:]
    prefetches = re.findall(r"prefetch gpu=0 allocations=1 bytes=(\d+) ms=([\d.]+)", done.stderr)
    assert prefetches and float(prefetches[-1][1]) > 100, done.stderr[-4000:]  # the premise
    assert len(re.findall(r"grant gpu=0 lease=", done.stderr)) == 5, done.stderr[-4000:]


def _alternations(pids_in_grant_order):
    return sum(1 for a, b in zip(pids_in_grant_order, pids_in_grant_order[1:]) if a != b)


def _run_two_trainers(env, seconds, *args):
    """Two trainers started at once: their pids and results."""
    return run_side_by_side(
        [sys.executable, str(HERE / "torch_train.py"), "--seconds", str(seconds), *args], env
    )


def test_two_trainers_alternate_under_anti_thrash(start_agent, shim_env):
    agent = start_agent(time_quantum_s=2, anti_thrash=True)
    pids, results = _run_two_trainers(shim_env(agent), seconds=12)
    grants = [event["pid"] for event in agent.events("grant")]
    assert set(grants) == {str(pid) for pid in pids}, agent.log()
    assert _alternations(grants) >= 3, agent.log()
    assert all(event.get("mode") == "exclusive" for event in agent.events("grant"))
    assert all(result["steps"] > 0 for result in results)


def test_two_trainers_run_together_with_anti_thrash_off(start_agent, shim_env):
    agent = start_agent(time_quantum_s=2, anti_thrash=False)
    _, results = _run_two_trainers(shim_env(agent), seconds=6)
    first, second = (sorted(r["step_times"]) for r in results)
    # Steps of both processes interleave in time: neither waited for the other.
    overlap_start, overlap_end = max(first[0], second[0]), min(first[-1], second[-1])
    assert overlap_end - overlap_start > 3.0
    assert all(event.get("mode") == "shared" for event in agent.events("grant")), agent.log()
    assert not agent.events("drop"), agent.log()


def test_cuda_graph_training_under_shim_matches_plain_run(start_agent, shim_env):
    plain, _ = run_training(None, "--graph", "--steps", "20")
    agent = start_agent()
    shared, stderr = run_training(shim_env(agent), "--graph", "--steps", "20")
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    assert agent.events("grant"), agent.log()


def test_graph_capture_beside_a_launching_thread_matches_plain_run(start_agent, shim_env):
    # PyTorch captures in global mode; the second thread's launches, and the queue bound's
    # event queries and waits on them, fall inside the capture (tests/gpu/test_gpu_capture.py
    # for the bare driver API).
    plain, _ = run_training(None, "--graph", "--side-thread", "--steps", "20")
    agent = start_agent()
    shared, stderr = run_training(shim_env(agent), "--graph", "--side-thread", "--steps", "20")
    assert shared["side_launches_during_capture"] >= 1000, shared["side_launches_during_capture"]
    assert shared["managed"], stderr[-2000:]
    assert (shared["losses"], shared["checksum"]) == (plain["losses"], plain["checksum"])


def test_two_graph_replaying_trainers_alternate_and_train_correctly(start_agent, shim_env):
    plain, _ = run_training(None, "--graph", "--steps", "20")
    agent = start_agent(time_quantum_s=1, anti_thrash=True)
    _, results = _run_two_trainers(shim_env(agent), 10, "--graph")
    grants = [event["pid"] for event in agent.events("grant")]
    assert _alternations(grants) >= 3, agent.log()
    for result in results:
        # 3 eager warm-up steps, then replays: the same losses as alone, without the shim.
        assert len(result["losses"]) >= len(plain["losses"])
        assert result["losses"][: len(plain["losses"])] == plain["losses"]


def test_training_fed_by_forked_loader_workers_matches_plain_run(start_agent, shim_env):
    # DataLoader workers are forked from a process that has a CUDA context and the shim's
    # client thread; they never touch CUDA, so they must neither hang nor connect.
    args = ("--steps", "20", "--loader-workers", "2")
    plain, _ = run_training(None, *args)
    agent = start_agent()
    shared, stderr = run_training(shim_env(agent), *args)
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    connected = {event["pid"] for event in agent.events("connect")}
    assert len(connected) == 1, agent.log()


def test_cuda_malloc_async_backend_is_managed_and_empty_cache_frees_parked_blocks(
    start_agent, shim_env
):
    # PyTorch's cudaMallocAsync backend allocates stream-ordered: converted, and its frees
    # parked for reuse; torch.cuda.empty_cache() trims the pool, which frees them.
    plain, _ = run_training(None, "--steps", "20")
    agent = start_agent()
    env = shim_env(agent, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync", NVSHARE_DEBUG=1)
    shared, stderr = run_training(env, "--steps", "20")
    assert shared["managed"], stderr[-2000:]
    assert shared["losses"] == plain["losses"]
    assert shared["checksum"] == plain["checksum"]
    trim = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import torch\n"
                "xs = [torch.ones(16 << 20, device='cuda') for _ in range(4)]\n"
                "del xs\n"
                "torch.cuda.synchronize(); torch.cuda.empty_cache()\n"
            ),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert trim.returncode == 0, trim.stderr[-2000:]
    freed = [
        int(n)
        for n in re.findall(r"pool trim gpu=\d+ keep=\d+ parked blocks freed=(\d+)", trim.stderr)
    ]
    assert freed and freed[0] >= 4 * (64 << 20), trim.stderr[-2000:]
