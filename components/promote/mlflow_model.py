"""A candidate checkpoint as an MLflow model: a pyfunc that wraps the policy.

The checkpoint folder (what `save_policy` wrote: weights, config, tokenizer with its chat
template, or LoRA adapters with their base's fingerprint) travels unchanged as the model's
`checkpoint` artifact, so `download_version` still hands consumers (`load_policy`, vLLM,
`agentrl serve`) the folder as it was saved. The pyfunc around it gives the registry what
MLflow users expect: an MLmodel file, a signature, `mlflow.pyfunc.load_model(...)
.predict(...)`. A pyfunc rather than the transformers flavour: a policy's prompt is the
agent's chat format (components/policy/chat.py), which a text-generation pipeline does not
know, and an adapter folder is not a pipeline checkpoint.

predict: a DataFrame of task instructions (column `task`) -> the policy's first assistant turn
for each, greedy, as the environment would prompt it (`max_new_tokens` is a parameter).
Loading needs this package importable (the model's class lives here), as in the image.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import mlflow.pyfunc

ARTIFACT = "checkpoint"


class PolicyModel(mlflow.pyfunc.PythonModel):
    """The policy in a checkpoint folder, behind MLflow's pyfunc interface."""

    def load_context(self, context) -> None:
        from components.policy.model import load_policy

        self.model, self.tokenizer = load_policy(context.artifacts[ARTIFACT])

    def predict(self, context, model_input, params: dict | None = None) -> list[str]:
        from components.policy.chat import prompt_ids
        from components.rollout.engine import generate_transformers

        tasks = list(model_input["task"])  # the signature makes any input a DataFrame
        cap = int((params or {}).get("max_new_tokens", 64))
        prompts = [prompt_ids(self.tokenizer, [{"role": "user", "content": str(t)}]) for t in tasks]
        completions = generate_transformers(self.model, self.tokenizer, prompts,
                                            [cap] * len(prompts), temperature=0.0, top_p=1.0,
                                            seed=0)  # fmt: skip
        return [self.tokenizer.decode(c.token_ids, skip_special_tokens=False) for c in completions]


def signature():
    """task (string) -> completion (string); `max_new_tokens` (long, default 64)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "task")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", 64)]),
    )


def requirements() -> list[str]:
    """What loading the model needs, pinned as installed here (given, not inferred: MLflow's
    inference would load the model in a subprocess at registration)."""
    return [f"{p}=={version(p)}" for p in ("mlflow", "torch", "transformers", "safetensors")]


def save(checkpoint_dir: str | Path, path: str | Path, mlflow_model=None) -> None:
    """Write the pyfunc model for `checkpoint_dir` to the folder `path`."""
    mlflow.pyfunc.save_model(
        path=str(path),
        python_model=PolicyModel(),
        artifacts={ARTIFACT: str(checkpoint_dir)},
        signature=signature(),
        pip_requirements=requirements(),
        mlflow_model=mlflow_model,
    )


def checkpoint_in(model_dir: str | Path) -> Path:
    """The checkpoint folder inside a downloaded model (where its MLmodel says it is)."""
    from mlflow.models import Model

    flavor = Model.load(str(Path(model_dir) / "MLmodel")).flavors["python_function"]
    return Path(model_dir) / flavor["artifacts"][ARTIFACT]["path"]
