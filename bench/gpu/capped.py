"""A PyTorch process under its share group's memory cap (shares.py's cap phase).

Prints one JSON line: what torch.cuda.mem_get_info() says (the cap as the total, the
room under it as free), what an allocation past the cap raised, and whether the process
went on (a smaller allocation and a matmul after it).  Its stderr carries the shim's
warning."""

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap-gib", type=float, default=4.0)
    args = parser.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, and the shim's first talk with the agent
    time.sleep(1.0)  # MEMORY_CAP comes right after the agent's answer to HELLO
    free_bytes, total_bytes = torch.cuda.mem_get_info()
    result = {"total_bytes": total_bytes, "free_bytes": free_bytes}
    cap = int(args.cap_gib * (1 << 30))
    held = torch.empty(cap // 2, dtype=torch.uint8, device="cuda")  # half the cap: fits
    try:
        past = torch.empty(cap, dtype=torch.uint8, device="cuda")  # with held: past the cap
        result["past_cap"] = "allocated"
        del past
    except torch.OutOfMemoryError:
        result["past_cap"] = "OutOfMemoryError"
    a = torch.randn(2048, 2048, device="cuda")
    result["went_on"] = bool(torch.isfinite((a @ a).sum()).item()) and held.numel() == cap // 2
    result["free_after_bytes"] = torch.cuda.mem_get_info()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
