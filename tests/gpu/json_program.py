"""The GPU tests' programs print one JSON line last; these run them and read it."""
import json
import subprocess


def run_json_program(command, env=None, timeout=300):
    """That last line, parsed, and the program's stderr; a failed run fails the test."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def run_side_by_side(command, env, count=2, timeout=300):
    """count copies of command started at once: their pids and parsed last lines."""
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(count)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return [process.pid for process in processes], results
