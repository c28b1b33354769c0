"""Do the folders stepwise writes load in transformers, and read the same way?

For each checkpoint folder given (a lab run's `policy/`, `prm_mc/`, `orm/`, `rl_*/`, or a
`stepwise train-prm` output), this checks what a transformers user would hit first:
  * `AutoTokenizer.from_pretrained` (and `PreTrainedTokenizerFast.from_pretrained`) give the same
    ids as the folder's `tokenizer.json` read by the `tokenizers` library (what stepwise reads),
    on texts from the folder's own vocabulary. transformers 5 builds every `model_type: qwen2`
    tokenizer anew from its vocabulary and merges with Qwen2's own pre-tokenizer, whatever
    `tokenizer_class` says; for a tokenizer.json of another kind (the lab's word-level one) use
    `PreTrainedTokenizerFast.from_pretrained` there, which this script checks too;
  * `AutoModelFor*.from_pretrained` (the class its `architectures` names) loads with no missing or
    unexpected weights, in the dtype its config.json names;
  * a sequence classifier scores a padded batch (it needs `pad_token_id`) and the padded row
    scores as it does alone.
Optional: `pip install torch transformers`; never needed by the tests or CI.

    python bench/interop_checkpoints.py out/policy out/prm_mc out/orm prm-from-bf16/
"""
import json
import sys
from pathlib import Path

import tokenizers
import torch
import transformers
from transformers import AutoConfig, AutoTokenizer

CLASSES = {
    "ForCausalLM": transformers.AutoModelForCausalLM,
    "ForTokenClassification": transformers.AutoModelForTokenClassification,
    "ForSequenceClassification": transformers.AutoModelForSequenceClassification,
}


def sample_texts(tok_file):
    """Texts made of the vocabulary's own words, so word-level tokenizers have no unknowns."""
    words = [w for w in tok_file.get_vocab() if w.isprintable() and not w.startswith("<")]
    words.sort()
    step = max(1, len(words) // 40)
    picked = words[::step][:40]
    return [" ".join(picked[i : i + 8]) for i in range(0, len(picked), 8)] + [
        "Ann has 12 boxes | 12 * 3 = 36",
        "What is 2 + 3? The answer is 5.",
    ]


def check(folder):
    folder = Path(folder)
    problems = []
    tok_file = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(folder)
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    texts = sample_texts(tok_file)
    notes = []
    for name, tok in [("AutoTokenizer", auto), ("PreTrainedTokenizerFast", fast)]:
        differ = [t for t in texts if tok(t)["input_ids"] != tok_file.encode(t, add_special_tokens=True).ids]
        if differ:
            t = differ[0]
            problems.append(
                f"{name} ({type(tok).__name__}): ids differ on {len(differ)} of {len(texts)} texts, e.g. {t!r}: "
                f"{tok(t)['input_ids'][:10]} vs tokenizers {tok_file.encode(t, add_special_tokens=True).ids[:10]}"
            )
        else:
            notes.append(f"{name} ids same")
    config = AutoConfig.from_pretrained(folder)
    arch = config.architectures[0]
    cls = next((c for suffix, c in CLASSES.items() if arch.endswith(suffix)), None)
    if cls is None:
        return f"{folder}: {', '.join(notes)}; {arch} has no Auto class to check", problems
    dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model, info = cls.from_pretrained(folder, output_loading_info=True, **{dtype_arg: "auto"})
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            problems.append(f"{kind}: {sorted(info[kind])[:6]}")
    want_dtype = json.loads((folder / "config.json").read_text()).get("torch_dtype", "float32")
    if str(model.dtype) != f"torch.{want_dtype}":
        problems.append(f"loaded as {model.dtype}, config.json says {want_dtype}")
    if arch.endswith("ForSequenceClassification"):
        short, long = auto(texts[-1])["input_ids"], auto(texts[0])["input_ids"]
        batch = auto.pad({"input_ids": [short, long]}, return_tensors="pt")
        with torch.no_grad():
            together = model(**batch).logits[0].float()
            alone = model(torch.tensor([short])).logits[0].float()
        if not torch.allclose(together, alone, atol=1e-2):
            problems.append(f"padded row scores {together.tolist()} alone {alone.tolist()}")
    return f"{folder}: {arch} ({model.dtype}) loads; {', '.join(notes)} on {len(texts)} texts", problems


def main():
    failed = 0
    for folder in sys.argv[1:]:
        try:
            what, problems = check(folder)
        except Exception as e:  # report every folder, not just the first failure
            what, problems = f"{folder}: could not load", [f"{type(e).__name__}: {e}"]
        print(("FAIL " if problems else "ok   ") + what)
        for p in problems:
            print("     " + p)
        failed += bool(problems)
    print(f"transformers {transformers.__version__}: {len(sys.argv) - 1 - failed} ok, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
