"""Timing shared by the GPU peers (bench/gpu_transformers.py, bench/gpu_generation.py)."""
import time


def timed(work, gpu):
    """Seconds `work()` takes, the device drained before and after (on a GPU), and its result."""
    import torch

    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = work()
    if gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out
