"""DatasetConfig: range checks name `dataset.<key>`; every conf/dataset YAML fits the schema; build_dataset
dispatches to the HF loader for local files."""

import itertools
import json

import pytest
from omegaconf import OmegaConf

from forge_exp.config.dataset import DatasetConfig, build_dataset
from tests.conftest import CONF

MINE = ["gsm8k", "math", "jsonl", "parquet"]


@pytest.mark.parametrize("name", MINE)
def test_dataset_yamls_fit_the_schema(name):
    cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(CONF / "dataset" / f"{name}.yaml"))
    )
    assert cfg.name == name and cfg.source in ("hf", "jsonl", "parquet")


def test_gsm8k_yaml_maps_the_hub_fields():
    cfg = OmegaConf.load(CONF / "dataset" / "gsm8k.yaml")
    assert (cfg.path, cfg.subset, cfg.target_format, cfg.answer_key) == ("openai/gsm8k", "main", "gsm8k", "answer")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "csv"}, r"^dataset\.source must be one of"),
        ({"source": "hf"}, r"^dataset\.path is required when dataset\.source=hf"),
        ({"source": "jsonl", "path": "train.jsonl"}, r"^dataset\.eval_split='test' needs a \{split\} placeholder"),
        ({"source": "jsonl", "path": "{split}.jsonl", "subset": "main"}, r"^dataset\.subset is for Hub datasets"),
        ({"target_format": "latex"}, r"^dataset\.target_format must be one of"),
        ({"max_prompt_tokens": 0}, r"^dataset\.max_prompt_tokens must be >= 1"),
        ({"max_new_tokens": 0}, r"^dataset\.max_new_tokens must be >= 1"),
        ({"eval_size": -1}, r"^dataset\.eval_size must be >= 0"),
        ({"digits": 0}, r"^dataset\.digits must be in \[1, 18\]"),
        ({"ops": "+%"}, r"^dataset\.ops must be a non-empty string"),
        ({"ops": ""}, r"^dataset\.ops"),
        ({"eval_size": None}, r"^dataset\.eval_size must be a number for source=arithmetic"),
        ({"source": "hf", "path": "openai/gsm8k", "question_key": ""}, r"^dataset\.question_key"),
    ],
)
def test_range_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        DatasetConfig(**overrides)


def test_errors_surface_through_omegaconf():
    with pytest.raises(Exception, match=r"dataset\.max_new_tokens"):
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DatasetConfig), {"max_new_tokens": 0}))


def test_build_dataset_local_jsonl(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean
    (tmp_path / "train.jsonl").write_text(json.dumps({"q": "What is 6*7?", "a": 42}) + "\n")
    cfg = DatasetConfig(name="mine", source="jsonl", path=str(tmp_path / "{split}.jsonl"), eval_split=None,
                        question_key="q", answer_key="a", target_format="raw", use_chat_template=False)
    factory, eval_problems = build_dataset(cfg, tokenizer=None)
    (problem,) = itertools.islice(factory(), 1)
    assert (problem.target, problem.question, eval_problems) == ("42", "What is 6*7?", [])
    assert problem.prompt.endswith("User: What is 6*7?\nAssistant:")
