"""The tables of docs/benchmarks.md ("The GPU") and the README from a `bench/gpu_check.sh` summary,
so a device run's figures reach the docs without being copied by hand:

    python3 bench/gpu_table.py bench/results/gpu_check_<card>_<date>.json

Prints, as Markdown: scoring (each shape and dataset: the peer's fastest batch budget and every
budget it was timed at, stepwise, the ratio, peak memory, agreement), generation (the peer's best
batch size), training against PyTorch, and RL's seconds an update. A run of the old script (the
peer warmed up on one record, one budget) is labelled so. Standard library only.
"""
import json
import sys


def num(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def mib(x):
    return "—" if x is None else f"{x / 1024:.1f}"


def peer_settings(hf):
    """The peer's budget and how it was warmed up, in words."""
    if "sweep" not in hf:
        return "16,384 (warmed up on one record, timed on its first pass)"
    timed = [f"{e['max_batch_tokens'] // 1024}k: {num(e.get('tokens_per_s'))}" if "seconds" in e
             else f"{e['max_batch_tokens'] // 1024}k: {e.get('error', 'failed')[:20]}" for e in hf["sweep"]]
    return f"{hf['max_batch_tokens']:,} ({'; '.join(timed)})"


def scoring(summary):
    print("| shape, data | transformers bf16 tok/s | its batch budget (every budget timed) | stepwise CUDA tok/s | ratio "
          "| peak GiB (transformers / stepwise) | max \\|diff\\| | same first error |")
    print("|---|---|---|---|---|---|---|---|")
    for tag, run in summary.get("runs", {}).items():
        hf, sw, agree = run.get("transformers", {}), run.get("stepwise", {}), run.get("agreement") or {}
        shape, _, data = tag.partition("-")
        ratio = run.get("ratio")
        ratio = "—" if ratio is None else f"**{ratio:.2f}×**"
        settings = peer_settings(hf) if "tokens_per_s" in hf else hf.get("error", "—")
        print(f"| {shape.upper()}, {data.upper()} | {num(hf.get('tokens_per_s'))} | {settings} "
              f"| {num(sw.get('tokens_per_s'))} | {ratio} "
              f"| {mib(hf.get('peak_gpu_mib_nvidia_smi'))} / {mib(sw.get('peak_gpu_mib_nvidia_smi'))} "
              f"| {num(agree.get('max_abs_diff'), 4)} "
              f"| {pct(agree.get('same_first_error'))} |")


def generation(summary):
    g = summary.get("generation_64x256")
    if not g:
        return
    hf, sw = g.get("hf", {}), g.get("sw", {})
    if "tokens_per_s" not in hf and "tokens_per_s" not in sw:
        print("\nGeneration: no result (see the run's logs.tgz).")
        return
    size = hf.get("batch_size", "all the requests at once")
    sweep = "; ".join(f"{e['batch_size']}: {num(e.get('tokens_per_s'))}" for e in hf.get("sweep", []) if "seconds" in e)
    print(f"\nGeneration (64 requests × 256 sampled tokens, 0.5B-shaped policy): transformers' `generate` "
          f"{num(hf.get('tokens_per_s'))} tokens/s at batches of {size}{f' ({sweep})' if sweep else ''}; "
          f"`stepwise serve` {num(sw.get('tokens_per_s'))} tokens/s, {sw.get('failed', '?')} requests failed; "
          f"ratio {num(g.get('ratio'), 2)}×.")


def training(summary):
    rows = [(k, summary[k]) for k in ("training_0.5b", "training_log_ratio_0.5b") if summary.get(k)]
    if not rows:
        return
    print("\n| training, 0.5B shape | PyTorch bf16 autocast tok/s | stepwise tok/s | ratio | peak GiB (PyTorch / stepwise) "
          "| loss at the end (PyTorch: mean of its last 10 steps / stepwise: last step) "
          "| validation loss at the last step both validated (PyTorch / stepwise) | gap |")
    print("|---|---|---|---|---|---|---|---|")
    for key, t in rows:
        hf, sw = t.get("transformers", {}), t.get("stepwise", {})
        print(f"| {'classifier head' if key == 'training_0.5b' else 'log-ratio head'} | {num(hf.get('tokens_per_s'))} "
              f"| {num(sw.get('tokens_per_s'))}{' (cut off)' if sw.get('partial') else ''} | {num(t.get('ratio'), 2)} "
              f"| {mib(hf.get('peak_gpu_mib_nvidia_smi'))} / {mib(sw.get('peak_gpu_mib_nvidia_smi'))} "
              f"| {num(hf.get('loss_last_10'), 4)} / {num(sw.get('last_loss'), 4)} "
              f"| {valid_at(t)} "
              f"| {pct(t.get('valid_loss_gap'))} |")


def valid_at(t):
    """Both engines' validation loss at the last step both validated, or what there is."""
    v = t.get("valid_loss_at_step")
    if v:
        return f"step {v['step']}: {num(v['transformers'], 4)} / {num(v['stepwise'], 4)}"
    hf = t.get("transformers", {})
    return f"PyTorch {num(hf.get('valid_loss_start'), 4)} → {num(hf.get('valid_loss'), 4)}; stepwise —"


def rl(summary):
    updates = summary.get("rl_0.5b", {}).get("updates", [])
    if updates:
        secs = ", ".join(f"{u['seconds']:.1f}" for u in updates)
        print(f"\n`stepwise rl --device cuda` (0.5B shape): seconds an update {secs}.")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    summary = json.load(open(sys.argv[1]))
    print(f"GPU: {summary.get('gpu')}; stepwise at {summary.get('commit')}.")
    if summary.get("skipped"):
        print("Skipped: " + "; ".join(summary["skipped"]))
    print()
    scoring(summary)
    generation(summary)
    training(summary)
    rl(summary)


if __name__ == "__main__":
    main()
