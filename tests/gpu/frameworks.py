"""Small JAX, CuPy and Triton workloads, run by the GPU tests with and without the shim.

Notebooks on a shared node use more than PyTorch: each of these allocates and
launches through its own path (XLA's preallocated pool, CuPy's memory pool and
cuBLAS, Triton's generated launcher).  The workload runs in three phases with
--idle-gap seconds of idleness between them, longer than the agent's idle
release, so each phase must ask for the GPU again:

  1. compute: --steps (or --seconds) steps, one value read back per step;
  2. launch only: one more step on data already on the GPU, waited for but not
     read back, so the only work it submits is the framework's launches;
  3. read back: the last value and a checksum.

With --jax-callback every JAX step also calls back into Python
(jax.debug.callback, as jax.debug.print does).

Prints one JSON line: the values, the checksum, whether the data lives in
managed memory, the wall-clock time of every step and the callbacks seen.
"""

import argparse
import json
import os
import time

from cuda_pointer import is_managed

callbacks_seen = []


def jax_workload(args):
    # Forced, not defaulted: XLA preallocates a share of what the driver reports (75 % by
    # default), and under the shim that is managed memory, which on a shared test GPU must
    # stay small.  No autotuning, so both runs pick the same kernels and give the same bits.
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = (
        "true" if args.jax_memory_fraction > 0 else "false"
    )
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(max(args.jax_memory_fraction, 0.01))
    os.environ["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    if args.jax_allocator != "default":
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = args.jax_allocator
    else:
        os.environ.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    params = [
        jax.random.normal(k, (args.width, args.width), jnp.float32) / args.width**0.5
        for k in keys[:4]
    ]
    inputs = jax.random.normal(keys[4], (args.batch, args.width), jnp.float32)
    targets = jax.random.normal(keys[5], (args.batch, args.width), jnp.float32)

    def loss_of(params, inputs, targets):
        hidden = inputs
        for weight in params:
            hidden = jax.nn.relu(hidden @ weight)
        return jnp.mean((hidden - targets) ** 2)

    @jax.jit
    def train_step(params, inputs, targets):
        loss, grads = jax.value_and_grad(loss_of)(params, inputs, targets)
        if args.jax_callback:
            jax.debug.callback(callbacks_seen.append, loss)
        return [p - 0.01 * g for p, g in zip(params, grads)], loss

    def step():
        nonlocal params
        params, loss = train_step(params, inputs, targets)
        return loss

    def wait(loss):
        loss.block_until_ready()

    def checksum():
        jax.effects_barrier()  # every callback has run
        return float(sum(jnp.sum(p) for p in params))

    return step, float, wait, checksum, lambda: is_managed(params[0].unsafe_buffer_pointer())


def cupy_workload(args):
    import cupy

    state = cupy.random.RandomState(0).standard_normal((args.batch, args.width), dtype=cupy.float32)
    mixer = cupy.random.RandomState(1).standard_normal((args.width, args.width), dtype=cupy.float32)
    mixer /= args.width**0.5

    def step():
        nonlocal state
        state = state + 0.01 * cupy.tanh(state @ mixer)  # cuBLAS, then elementwise kernels
        return state[0, 0]

    def wait(_):
        cupy.cuda.Device().synchronize()

    return (
        step,
        float,
        wait,
        lambda: float(cupy.sum(state, dtype=cupy.float64)),
        lambda: is_managed(state.data.ptr),
    )


def triton_workload(args):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def damped_update(state_ptr, source_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        state = tl.load(state_ptr + offsets, mask=inside)
        source = tl.load(source_ptr + offsets, mask=inside)
        tl.store(state_ptr + offsets, 0.5 * state + 0.25 * source * source, mask=inside)

    generator = torch.Generator().manual_seed(0)
    state = torch.randn(args.batch * args.width, generator=generator).cuda()
    source = torch.randn(args.batch * args.width, generator=generator).cuda()
    n = state.numel()
    grid = (triton.cdiv(n, 1024),)

    def step():
        # Only Triton's own launches: the update is in place, nothing is allocated.
        for _ in range(8):
            damped_update[grid](state, source, n, BLOCK=1024)
        return state[:1]

    def wait(_):
        torch.cuda.synchronize()

    return (
        step,
        lambda first: float(first.item()),
        wait,
        lambda: float(state.double().sum()),
        lambda: is_managed(state.data_ptr()),
    )


WORKLOADS = {"jax": jax_workload, "cupy": cupy_workload, "triton": triton_workload}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="compute for this long instead of --steps"
    )
    parser.add_argument(
        "--idle-gap", type=float, default=0.0, help="seconds of idleness between phases"
    )
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument(
        "--jax-memory-fraction",
        type=float,
        default=0.05,
        help="share of the GPU's memory XLA preallocates (0: none, it grows)",
    )
    parser.add_argument(
        "--jax-allocator",
        default="cuda_async",
        help="XLA_PYTHON_CLIENT_ALLOCATOR; 'default' leaves XLA's own (CUDA virtual memory, "
        "which the shim cannot make managed)",
    )
    parser.add_argument(
        "--jax-callback", action="store_true", help="each JAX step calls back into Python"
    )
    args = parser.parse_args()

    step, read, wait, checksum, managed = WORKLOADS[args.framework](args)
    values, step_times = [], []
    started = time.time()
    while (
        (len(values) < args.steps) if args.seconds <= 0 else (time.time() - started < args.seconds)
    ):
        values.append(read(step()))
        step_times.append(time.time())
    time.sleep(args.idle_gap)
    last = step()
    wait(last)
    time.sleep(args.idle_gap)
    values.append(read(last))
    print(
        json.dumps(
            {
                "values": values,
                "checksum": checksum(),
                "managed": managed(),
                "step_times": step_times,
                "steps": len(step_times),
                "callbacks": len(callbacks_seen),
            }
        )
    )


if __name__ == "__main__":
    main()
