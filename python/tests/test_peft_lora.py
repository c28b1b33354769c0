"""LoRA adapters stepwise trains (``lora_rank=`` on ``stepwise.dpo``, ``stepwise.rl``,
``stepwise.train_prm``; ``--lora-rank`` on the commands) load into PEFT as pip installs it:
``PeftModel.from_pretrained`` on the base gives, merged, the weights of the model stepwise
wrote beside the adapters, for a causal LM (DPO) and for a PRM with a new head (PEFT's
``modules_to_save``).

Skipped where PEFT is not installed (it brings PyTorch); ``STEPWISE_REQUIRE_PEFT=1`` (CI, where
verl's install brings it) turns the skip into a failure."""

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("peft") is None:
    if os.environ.get("STEPWISE_REQUIRE_PEFT"):
        raise RuntimeError("STEPWISE_REQUIRE_PEFT is set but peft is not installed")
    pytest.skip("peft is not installed", allow_module_level=True)

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification  # noqa: E402

import stepwise  # noqa: E402


def assert_peft_merges_to(model_cls, base_dir, out):
    """PEFT's adapter on `base_dir`, merged, against the weights stepwise saved in `out`:
    the adapted projections within the bf16 rounding stepwise's engine computes them in (the
    base rounded, then the sum: a bf16 step of the largest weight at most), every other tensor
    equal; the adapters must have moved some projection by more than ten such steps, so that a
    wrong layout, scale or name could not pass."""
    theirs = PeftModel.from_pretrained(model_cls.from_pretrained(base_dir, dtype=torch.float32), out)
    theirs = theirs.merge_and_unload().state_dict()
    ours = load_file(str(out / "model.safetensors"))
    base = load_file(str(base_dir / "model.safetensors"))
    moved, step = 0.0, 0.0
    for name, want in ours.items():
        got = theirs[name].float()
        if name.endswith("_proj.weight"):
            tolerance = 2.0**-7 * want.abs().max().item()
            assert (got - want).abs().max().item() <= tolerance, name
            moved, step = max(moved, (want - base[name].float()).abs().max().item()), max(step, tolerance)
        else:
            assert torch.equal(got, want), name
    assert moved > 10 * step, f"the adapters moved the projections by {moved} (a bf16 step: {step})"
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4


def test_dpo_adapters_load_into_peft(repo, fixtures, tmp_path):
    policy = fixtures / "qwen2-policy"
    pairs = stepwise.step_pairs(repo / "data" / "prm800k" / "samples_openr.jsonl")
    out = tmp_path / "dpo"
    log = stepwise.dpo(policy, pairs, out, epochs=3, batch_size=4, lr=2e-2, beta=0.5, warmup_ratio=0.0,
                       lora_rank=4, lora_alpha=32, trainer="packed")
    assert log[-1]["train"]["loss"] < log[0]["train"]["loss"]
    assert_peft_merges_to(AutoModelForCausalLM, policy, out)


def test_prm_adapters_and_new_head_load_into_peft(fixtures, processbench, tmp_path):
    records = stepwise.read(processbench)[:16]
    out = tmp_path / "prm"
    stepwise.train_prm(records, out, base=fixtures / "qwen2-policy", steps=8, batch_size=4, lr=3e-2,
                       trainer="packed", lora_rank=4, lora_alpha=32, lora_targets="q,v,down", max_len=256)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["score"] and config["target_modules"] == ["q_proj", "v_proj", "down_proj"]
    assert_peft_merges_to(AutoModelForTokenClassification, out / "lora-base", out)
    # The folder is a PRM as any other.
    prm = stepwise.PRM(out)
    assert len(prm.score("What is 2 + 3?", ["2 + 3 = 5.", "The answer is 5."])) == 2


def peft_adapter(model, target_modules, out, task_type=None):
    """`model` with PEFT's LoRA (rank 4, alpha 8, both halves drawn at random so that the
    adapter moves the weights), saved as PEFT saves it: adapter files only."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, init_lora_weights=False,
                        task_type=task_type)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(out)
    assert not (out / "config.json").exists() and (out / "adapter_model.safetensors").is_file()
    return peft_model.merge_and_unload().state_dict()


def merged_folder(cache):
    """The one model stepwise merged into its cache."""
    found = [p for p in (cache / "merged").iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def assert_same_weights(theirs, folder, base_dir):
    """stepwise's merged weights are PEFT's merge within 1e-6, and the adapter moved some of them
    (by more than 1e-2), so that an adapter left out could not pass."""
    ours = load_file(str(folder / "model.safetensors"))
    base = load_file(str(base_dir / "model.safetensors"))
    moved = 0.0
    for name, want in ours.items():
        assert torch.allclose(theirs[name].float(), want.float(), atol=1e-6), name
        if name in base:
            moved = max(moved, (want.float() - base[name].float()).abs().max().item())
    assert moved > 1e-2, moved


def test_a_peft_adapter_reads_as_a_policy(fixtures, tmp_path, monkeypatch):
    """An adapter PEFT wrote on the policy (every linear projection) is a policy to stepwise:
    merged once into STEPWISE_CACHE, its weights PEFT's own merge, and it samples."""
    monkeypatch.setenv("STEPWISE_CACHE", str(tmp_path / "cache"))
    policy = fixtures / "qwen2-policy"
    adapter = tmp_path / "policy-adapter"
    theirs = peft_adapter(AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32), "all-linear", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(policy)
    sampler = stepwise.Policy(adapter, max_tokens=8)
    assert len(sampler.generate("What is 2 + 3?", n=2)) == 2
    merged = merged_folder(tmp_path / "cache")
    assert_same_weights(theirs, merged, policy)
    options = ["5.", "6."]
    assert sampler.loglikelihood("What is 2 + 3?", options) == stepwise.Policy(merged).loglikelihood(
        "What is 2 + 3?", options)


def test_a_peft_token_classifier_adapter_reads_as_a_prm(fixtures, tmp_path, monkeypatch):
    """PEFT's TOKEN_CLS adapter on a causal LM (its new `score` head in `modules_to_save`) is a
    PRM to stepwise, scoring as the model PEFT merges does: the same weights, the same scores as
    the merged folder itself."""
    monkeypatch.setenv("STEPWISE_CACHE", str(tmp_path / "cache"))
    policy = fixtures / "qwen2-policy"
    adapter = tmp_path / "prm-adapter"
    base = AutoModelForTokenClassification.from_pretrained(policy, num_labels=2, dtype=torch.float32)
    theirs = peft_adapter(base, ["q_proj", "v_proj"], adapter, task_type="TOKEN_CLS")
    steps = ["2 + 3 = 5.", "The answer is 5."]
    scores = stepwise.PRM(adapter).score("What is 2 + 3?", steps)
    merged = merged_folder(tmp_path / "cache")
    assert json.loads((merged / "config.json").read_text())["architectures"] == ["Qwen2ForTokenClassification"]
    assert_same_weights(theirs, merged, policy)
    assert scores == stepwise.PRM(merged).score("What is 2 + 3?", steps)


def test_merge_adapter_writes_a_model_transformers_loads(fixtures, tmp_path):
    """`stepwise.merge_adapter`: an adapter whose base was a folder that is gone (trained on
    another machine) is refused naming the field, merged onto `base=` into a folder that
    transformers loads as PEFT's own merge (the same weights, the same logits); an existing
    folder is not written over."""
    import shutil

    policy = fixtures / "qwen2-policy"
    elsewhere = tmp_path / "models" / "qwen2-policy"
    shutil.copytree(policy, elsewhere)
    adapter = tmp_path / "policy-adapter"
    model = AutoModelForCausalLM.from_pretrained(elsewhere, dtype=torch.float32)
    theirs = peft_adapter(model, ["q_proj", "up_proj"], adapter)
    shutil.rmtree(elsewhere)
    out = tmp_path / "merged"
    with pytest.raises(stepwise.StepwiseError, match="base_model_name_or_path"):
        stepwise.merge_adapter(adapter, out)
    assert stepwise.merge_adapter(adapter, out, base=policy) == str(out)
    assert_same_weights(theirs, out, policy)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-4)
    with pytest.raises(stepwise.StepwiseError, match="already exists"):
        stepwise.merge_adapter(adapter, out, base=policy)


def test_adapters_loaded_into_a_running_policy(fixtures, tmp_path, monkeypatch):
    """Adapters PEFT wrote, loaded into a policy already in memory (`load_adapter`, what
    `stepwise serve --allow-runtime-lora-updating` does for a server): a view of it
    (`with_adapter`) weighs and samples as the adapter merged into a model of its own, the base
    stays the base, a replaced adapter's view moves to the new weights, and an unloaded one is
    kept by the views made before and refused by name after."""
    monkeypatch.setenv("STEPWISE_CACHE", str(tmp_path / "cache"))
    policy = fixtures / "qwen2-policy"
    first, second = tmp_path / "first", tmp_path / "second"
    peft_adapter(AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32), "all-linear", first)
    torch.manual_seed(1)
    peft_adapter(AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32), ["q_proj", "down_proj"], second)
    question, options = "What is 2 + 3?", ["5.", "6.", "The answer is 5."]

    def weighed(p):
        return p.loglikelihood(question, options, prefix=["2 + 3 = 5."])

    base = stepwise.Policy(policy, max_tokens=8, temperature=0.0)
    before = weighed(base)
    assert base.adapters == {} and base.adapter is None
    base.load_adapter("tuned", first)
    assert base.adapters == {"tuned": first}
    tuned = base.with_adapter("tuned")
    assert tuned.adapter == "tuned" and 'adapter="tuned"' in repr(tuned)
    merged_first = weighed(stepwise.Policy(first, temperature=0.0))
    assert weighed(tuned) == pytest.approx(merged_first, abs=1e-3)
    assert weighed(base) == before, "the base is untouched"
    assert max(abs(a - b) for a, b in zip(merged_first, before)) > 0.1, "the adapter moves the model"
    assert tuned.generate(question, n=1) == stepwise.Policy(first, max_tokens=8, temperature=0.0).generate(question)
    # A stage takes the view as any policy.
    assert len(tuned.continue_all([{"question": question, "n": 2}])[0]) == 2
    with pytest.raises(ValueError, match="already served: .*replace=True"):
        base.load_adapter("tuned", second)
    with pytest.raises(stepwise.StepwiseError, match="no adapter found at"):
        base.load_adapter("missing", tmp_path / "nowhere")
    base.load_adapter("tuned", str(second), replace=True)
    assert weighed(tuned) == pytest.approx(weighed(stepwise.Policy(second)), abs=1e-3)
    base.unload_adapter("tuned")
    assert base.adapters == {}
    assert weighed(tuned) == pytest.approx(weighed(stepwise.Policy(second)), abs=1e-3), "a view keeps its adapter"
    with pytest.raises(ValueError, match='no adapter named "tuned" is served'):
        base.with_adapter("tuned")
    assert base.with_adapter(None).adapter is None


def test_a_servers_adapters_are_not_loaded_from_python():
    """A policy behind servers names a served adapter as its model; loading one from here is
    refused with the way to do it, before any request."""
    remote = stepwise.Policy("http://127.0.0.1:9", served_model="base")
    with pytest.raises(ValueError, match="served_model=NAME"):
        remote.load_adapter("x", "/nonexistent")
    with pytest.raises(ValueError, match="served_model=NAME"):
        remote.with_adapter("x")
    assert remote.adapters == {}
