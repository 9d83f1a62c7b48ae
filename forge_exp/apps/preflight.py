"""What can be checked before any process starts, beyond the schemas: the components import and take their
arguments, the weights are on this machine, the data opens and its first rows fit the field mapping and the
tokenizer, the layout fits the GPUs. Each failure is a ValueError whose one line names the key, file or row."""

from __future__ import annotations

from pathlib import Path

from forge_exp.config.dataset import DatasetBase
from forge_exp.config.logger import extra_loggers
from forge_exp.config.run import ForgeConfig
from forge_exp.generators.options import VllmOptions
from forge_exp.runtime.build import build, build_reward, locate

PREVIEW_ROWS = 5  # rows of a local file read to check the field mapping and the prompt


def resolve_model(config: ForgeConfig) -> list[str]:
    """What the model node leaves to the run, decided once here for every process: a .gguf file's HF folder
    (dequantized once and cached: models/gguf.py) and `dtype: auto` (models/precision.py). Returns what was decided,
    one line each, for the log (and what the run will not do that a setting might suggest)."""
    from forge_exp.config.enums import plain
    from forge_exp.models.gguf import check_gguf, ensure_converted, is_gguf
    from forge_exp.models.precision import auto_dtype

    notes = []
    if is_gguf(config.model.path):
        check_gguf(config.model.path)
        folder = str(ensure_converted(config.model.path))
        notes.append(f"model.path={config.model.path}: loaded from its HF checkpoint {folder}")
        config.model.path = folder
    if plain(config.model.dtype) == "auto":
        services = config.services
        on_gpu = any(spec.gpus for spec in (services.trainer, services.generator, services.ref_model))
        dtype, why = auto_dtype(on_gpu)
        config.model.dtype = type(config.model.dtype)[dtype]
        notes.append(f"model.dtype=auto: {dtype} ({why})")
    sleeps = isinstance(config.generator, VllmOptions) and config.generator.enable_sleep_mode
    if sleeps and config.algorithm.app == "grpo":
        # docs/generators.md: Sleep mode
        overlap = config.algorithm.max_policy_age > 0 and not config.algorithm.rollout_waves  # driver/overlap.py
        why = ("as it samples the next batch meanwhile (rollouts overlap training)" if overlap else
               "though here rollouts and training take turns (max_policy_age=0 or rollout_waves): "
               "sleeping between them is not wired")
        notes.append(f"generator.enable_sleep_mode=true: the GRPO loop does not put the engine to sleep while the "
                     f"trainer steps, {why}; its memory is what generator.gpu_memory_utilization / kv_cache_gib allow")
    return notes


def check(config: ForgeConfig) -> None:
    import torch

    from forge_exp.apps.rollout import rollout_kind
    from forge_exp.rl.losses import check_loss_inputs
    from forge_exp.runtime.layout import check_gpus, plan_for

    loss = build(config.algorithm.loss, "algorithm.loss")
    inputs = config.algorithm.loss_inputs
    sft = config.algorithm.app == "sft"
    if sft:
        check_loss_inputs(loss, inputs, key="algorithm.loss (algorithm=sft)")
    else:
        check_loss_inputs(loss, inputs)
        probe_loss(loss, inputs)
    if not config.reward.functions:
        raise ValueError("reward.functions is empty: give at least one reward function")
    build_reward(config.reward)
    # an engine or a logger that needs an extra says so now, not from its process or the tracker's thread
    components = {"trainer": config.trainer, "generator": config.generator}
    components.update({f"logger.{name}": node for name, node in extra_loggers(config.logger).items()})
    for key, node in components.items():
        try:
            getattr(locate(node._target_, key), "check_installed", lambda: None)()
        except ImportError as e:
            raise ValueError(str(e)) from None
    if (config.checkpoint.every or config.resume) and config.checkpoint.dir:  # (the CLI sets the default one)
        from forge_exp.apps.rundir import writable_dir

        writable_dir(config.checkpoint.dir, "checkpoint.dir")
    model = build(config.model, "model")
    model.check_available()
    check_lora(model)
    check_dataset(config.dataset, model, sft=sft)
    rollout_kind(config.env).check(config.env, model)
    check_context(config.dataset, config.env, model, config.algorithm.max_seq_len if sft else None)
    meshes = plan_for(config)
    check_gpus(meshes, torch.cuda.device_count() if torch.cuda.is_available() else 0)


def check_lora(model) -> None:
    """model.lora: peft is installed, and the target modules and layers exist in the model."""
    from forge_exp.models.lora import require_peft

    lora = model.lora_spec
    if lora is None:
        return
    try:
        require_peft()
    except ImportError as e:
        raise ValueError(str(e)) from None
    lora.check(model.base().skeleton())


def probe_loss(loss, available: set[str]) -> None:
    """Call the loss once on a made-up batch of 2 sequences x 3 tokens, the way the trainer will: it must return a
    finite scalar that depends on the policy's logprobs (a per-token vector, a NaN, a constant fail here)."""
    import torch

    from forge_exp.rl.losses import describe_loss, call_loss

    g = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(2, 3, generator=g) - 0.1).requires_grad_()  # [B, T]
    inputs = {
        "logprobs": logprobs,
        "behavior_logprobs": logprobs.detach() - 0.05,  # [B, T]
        "advantages": torch.tensor([[1.0], [-1.0]]),  # [B, 1]
        "padding_mask": torch.tensor([[True, True, False], [True, True, True]]),  # [B, T]
        "entropy": torch.rand(2, 3, generator=g).requires_grad_(),  # [B, T]
        "ref_logprobs": logprobs.detach() - 0.1 if "ref_logprobs" in available else None,  # [B, T]
    }
    name = f"algorithm.loss ({describe_loss(loss)})"
    try:
        value, _ = call_loss(loss, **inputs)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 — the loss's own error, on a well-formed batch
        raise ValueError(f"{name} raised on a test batch of 2 x 3 tokens: {type(e).__name__}: {e}") from None
    if not torch.isfinite(value.detach()):
        raise ValueError(f"{name} returned {value.item()} on a test batch of 2 x 3 tokens; it must be finite")
    if not value.requires_grad:
        raise ValueError(f"{name} returned a value with no gradient with respect to logprobs: training could not "
                         f"move the policy")


def check_context(dataset: DatasetBase, env, model, max_seq_len: int | None = None) -> None:
    """The longest sequence the run feeds the model fits in its positions: the longest prompt plus the response
    budget; a whole episode (multi-turn: env.max_total_tokens, and a turn may run env.turn_tokens past the least
    budget left, envs/driver.py); SFT's max_seq_len."""
    positions = getattr(model, "max_position_embeddings", None)
    if positions is None:
        try:
            from transformers import AutoConfig

            positions = getattr(AutoConfig.from_pretrained(model.source(), local_files_only=True),
                                "max_position_embeddings", None)
        except (OSError, ValueError):  # unreadable here: the model's own loading says why, later
            return
    if positions is None:
        return
    if max_seq_len is not None:
        if max_seq_len > positions:
            raise ValueError(f"algorithm.max_seq_len={max_seq_len} is longer than the model's "
                             f"max_position_embeddings={positions}: lower it or use a model with a longer context")
        return
    if env.sequence_budget(dataset) > positions:
        raise ValueError(f"model.max_position_embeddings={positions} is shorter than "
                         f"{env.sequence_budget_keys(dataset)}: lower them or use a model with a longer context")


def check_dataset(dataset: DatasetBase, model, sft: bool = False) -> None:
    """The problem source builds; for local files, each is a readable file and its first rows have the configured
    fields and prompts the model's tokenizer can read (chat template present if asked for, characters it knows).
    SFT rows may be conversations instead (data/sft.py). With dataset.bad_rows=skip a bad row among them is left to
    the dataset service to skip, unless every one is bad (a wrong field mapping, not a few bad rows)."""
    from forge_exp.data.files import data_files, first_rows
    from forge_exp.data.hf import FileProblems

    source = build(dataset, "dataset")
    if hasattr(source, "check"):  # a task generator that checks its own settings (reasoning-gym)
        source.check()
        tokenizer = model.tokenizer()
        train, _ = source.problems(tokenizer)  # formats a prompt: a chat template asked for must be there
        _check_known_characters(next(iter(train())).prompt, tokenizer, f"dataset={dataset.name}")
        return
    if not isinstance(source, FileProblems):
        return  # the synthetic task is always there; a Hub dataset is opened by the dataset service
    tokenizer = model.tokenizer()
    for split, key in (("train", "train_path"), ("eval", "eval_path")):
        if split == "eval" and not source.has_eval():
            continue
        builder = source.builder(split)
        file = data_files(source.location(split), key)[0]
        rows = first_rows(file, builder, PREVIEW_ROWS)
        if not rows:
            raise ValueError(f"dataset.{key}: {file} has no rows")
        bad = [e for row_number, row in rows if (e := _bad_row(row_number, row, file, source, tokenizer, sft))]
        if bad and source.bad_rows != "skip":
            raise bad[0]
        if bad and len(bad) == len(rows):
            raise ValueError(f"{bad[0]} (and every other of the first {len(rows)} rows: dataset.bad_rows=skip skips "
                             f"a few bad rows, not a wrong field mapping)")


def _bad_row(row_number: int, row: dict, file: str, source, tokenizer, sft: bool) -> ValueError | None:
    """What is wrong with one row (file and row named), or None. A prompt that cannot be formatted at all (a chat
    template the tokenizer lacks) is the config's mistake: raised, whatever dataset.bad_rows says."""
    from forge_exp.data.hf import check_row
    from forge_exp.data.sft import MESSAGES_KEY, check_messages

    where = f"{file} row {row_number}"
    try:
        if sft and row.get(MESSAGES_KEY) is not None:
            check_messages(row[MESSAGES_KEY], where)
            return None
        question, _ = check_row(row, file, row_number, source)
    except ValueError as e:
        return e
    try:
        prompt = source.format(question, tokenizer)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    try:
        _check_known_characters(prompt, tokenizer, where)
    except ValueError as e:
        return e
    return None


def _check_known_characters(prompt: str, tokenizer, where: str) -> None:
    from forge_exp.data.hf import check_prompt

    try:
        check_prompt(prompt, tokenizer(prompt)["input_ids"], tokenizer)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
