"""A registered candidate is a real MLflow model: logged from the run that trained it (its
"Source Run"), with an MLmodel and a signature, loadable with `mlflow.pyfunc.load_model`,
and `download_version` still gives the checkpoint folder as it was saved."""

from __future__ import annotations

from components.lineage import weights_sha256
from components.promote import registry
from components.promote.client import mlflow_client
from components.promote.registry import Lineage


def test_candidate_is_an_mlflow_model_logged_from_its_training_run(cfg, policy_dir):
    import mlflow
    import pandas as pd
    from mlflow.models import Model

    client = mlflow_client(cfg)
    exp = client.create_experiment(f"train-{cfg.model_name}")
    train = client.create_run(exp, run_name="grpo", start_time=1_700_000_000_000)
    client.set_terminated(train.info.run_id, "FINISHED", end_time=1_700_000_060_000)
    lineage = Lineage(data_version="data-v1", config_hash="cfg1",
                      training_run_id=train.info.run_id, pipeline_run_id="parent1")  # fmt: skip
    version = registry.register_candidate(policy_dir, lineage, cfg)

    mv = client.get_model_version(cfg.model_name, version)
    assert mv.run_id == train.info.run_id
    assert mv.tags["pipeline_run_id"] == "parent1" and mv.tags["data_version"] == "data-v1"
    after = client.get_run(train.info.run_id)
    assert after.info.end_time == 1_700_000_060_000  # logging the model left the run as it was
    assert len(after.outputs.model_outputs) == 1  # the run lists the model it produced

    uri = client.get_model_version_download_uri(cfg.model_name, version)
    local = mlflow.artifacts.download_artifacts(uri, tracking_uri=cfg.resolved_tracking_uri())
    meta = Model.load(f"{local}/MLmodel")
    assert meta.signature.inputs.input_names() == ["task"] and meta.run_id == train.info.run_id
    model = mlflow.pyfunc.load_model(local)
    out = model.predict(pd.DataFrame({"task": ["fix the failing test"]}),
                        params={"max_new_tokens": 4})  # fmt: skip
    assert len(out) == 1 and isinstance(out[0], str) and out[0]

    folder = registry.download_version(version, cfg)
    assert weights_sha256(folder) == weights_sha256(policy_dir)
    assert (folder / "tokenizer.json").is_file()


def test_a_lora_candidate_is_registered_merged_into_its_base(cfg, policy_dir, tmp_path):
    """A LoRA-trained candidate (an adapter folder, as configs/cpu-pretrained.yaml trains)
    registers as a version that loads on its own: the adapters folded into the base, whose
    sha256 and the adapters' stay in the tags."""
    import mlflow
    import torch

    from components.policy.config import LoRAConfig
    from components.policy.lora import add_adapters, merge_adapters, save_adapters
    from components.policy.model import load_policy

    model, tokenizer = load_policy(policy_dir)
    adapted = add_adapters(model, LoRAConfig(r=2, alpha=4))
    with torch.no_grad():  # B = 0 at init: move it so merging changes the weights
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    adapter_dir = save_adapters(adapted, tokenizer, tmp_path / "adapters")
    lineage = Lineage(data_version="data-v1", config_hash="cfg1")
    version = registry.register_candidate(adapter_dir, lineage, cfg)

    mv = mlflow_client(cfg).get_model_version(cfg.model_name, version)
    # The base's digest as `agentrl policy fetch` checks it and the fingerprints record it
    # (components/lineage.py), so the tag matches the checkpoint a user fetched.
    assert mv.tags["adapter"] == "lora" and mv.tags["base_sha256"] == weights_sha256(policy_dir)
    assert mv.tags["base_path"] == str(policy_dir)
    assert mv.tags["adapters_sha256"] == weights_sha256(adapter_dir)
    folder = registry.download_version(version, cfg)
    assert (folder / "config.json").is_file() and not (folder / "adapter_config.json").exists()
    merged, _ = load_policy(folder)
    ids = torch.tensor([tokenizer.encode("def f(x): return x")])
    expected = merge_adapters(load_policy(adapter_dir)[0])(ids).logits
    assert torch.allclose(merged(ids).logits, expected, atol=1e-5)
    uri = mlflow_client(cfg).get_model_version_download_uri(cfg.model_name, version)
    local = mlflow.artifacts.download_artifacts(uri, tracking_uri=cfg.resolved_tracking_uri())
    assert mlflow.pyfunc.load_model(local) is not None
