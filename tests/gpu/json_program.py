"""The GPU tests' programs print one JSON line last; the benchmark's runners
(bench/gpu/harness.py, on the path through conftest) run them and read it."""

import harness as bench


def run_json_program(command, env=None, timeout=300):
    """That last line, parsed, and the program's stderr; a failed run fails the test."""
    stderr = []
    return bench.run_json(command, env=env, timeout=timeout, stderr_into=stderr), stderr[0]


def run_side_by_side(command, env, count=2, timeout=300):
    """count copies of command started at once: their pids and parsed last lines."""
    processes = [bench.start_json(command, env=env) for _ in range(count)]
    return [process.pid for process in processes], [
        bench.finish_json(process, timeout) for process in processes
    ]
