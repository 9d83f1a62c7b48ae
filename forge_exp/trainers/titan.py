"""The TorchTitan trainer engine: a Qwen3 / Llama 3 model sharded over the torch.distributed world, trained with the
same step as the transformers trainer (trainers/update.py `train_step`).

Pure: no monarch, mlflow or hydra. It runs inside an initialised torch.distributed world (gloo on CPU, nccl on GPU;
runtime/torch_world.py sets one up inside a Monarch proc mesh), one process per GPU, every rank calling the same
methods in the same order (they are collective).

    trainer = TitanTrainer.from_pretrained(path, degrees=degrees("fsdp", 2), loss=GRPOLoss(), lr=1e-6)
    metrics = trainer.train_step(batch, grad_accum=1, max_grad_norm=1.0, temperature=1.0)  # every rank, same batch
    for name, tensor in trainer.named_full_weights(torch.bfloat16): ...  # HF names, full tensors, one at a time
    trainer.save_hf(dir); trainer.save(dcp_dir); trainer.load(dcp_dir)    # trainers/titan_checkpoint.py
    reference = TitanTrainer.from_pretrained(path, frozen=True, degrees=..., loss=None, lr=0.0)
    ref_logprobs = reference.score(batch, temperature=1.0)               # [B, R] on the host, every rank

The model is built on the meta device from the checkpoint's config.json (trainers/titan_models.py), parallelised by
TorchTitan's own `parallelize_qwen3` / `parallelize_llama` (TP plan, activation checkpointing, per-block compile,
FSDP2 with float32 master weights kept sharded and `param_dtype` compute), then materialised and loaded shard by
shard. Every rank receives the whole TrainBatch; its data-parallel coordinate picks its micro-batches, and the ranks
of one TP group run the same ones.

Layout (models/packing.py): each row's real tokens are packed to the left ([prompt | response | pads]) so that
plain causal attention is exact without a padding mask, with positions 0..n-1 equal to the generator's
(models/generate.py); with `share_prompts` the rows sharing a prompt are one sequence, [prompt | responses | pads],
under a mask that keeps each response to the prompt and itself, and a batch's rows are first ordered by prompt so
that its micro-batches (and data-parallel shares) hold whole groups. The LM head is not run by the model
(`_skip_lm_head`): the response positions' hidden states go through the chunked head of models/logprobs.py,
vocabulary-parallel under TP, so [B, R, V] logits never exist.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from forge_exp.choices import ACTIVATION_CHECKPOINTING
from forge_exp.models.logprobs import CHUNK_ROWS, response_logprobs
from forge_exp.models.packing import dense_mask, pack_groups, pack_left, prompt_sharing_mask
from forge_exp.rl.types import TrainBatch
from forge_exp.trainers.update import by_prompt, micro_batches, to_device, train_step
from forge_exp.trainers import titan_checkpoint
from forge_exp.trainers.parallel import Degrees, check_model, parallel_dims
from forge_exp.trainers.titan_compat import titan
from forge_exp.trainers.titan_models import (
    NameMap,
    arch_from_hf,
    clean_fqn,
    parallelize_fn,
    read_hf_config,
    titan_config,
)

AC_MODES = ACTIVATION_CHECKPOINTING


class TitanTrainer:
    def __init__(
        self,
        hf_config: dict | str | Path,
        *,
        degrees: Degrees,
        loss: torch.nn.Module,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.99),
        device: torch.device | str | None = None,
        param_dtype: torch.dtype | None = None,
        activation_checkpointing: str = "none",
        compile: bool | None = None,
        attention: str | None = None,
        chunk_rows: int = CHUNK_ROWS,
        share_prompts: bool | None = None,
        seed: int = 0,
        frozen: bool = False,
    ):
        """A randomly initialised model of `hf_config` (a config.json dict or its path); `load_hf` loads weights.
        `param_dtype`: compute dtype of the forward/backward (FSDP2 mixed precision; default bf16 on GPU, float32 on
        CPU); weights, gradients' reduction and AdamW state stay float32. `compile`: TorchTitan's per-block
        torch.compile; None: on CUDA, off on CPU (Inductor's C++ build costs more there than it saves).
        `share_prompts`: the rows that share a prompt run it once (models/packing.pack_groups); a batch's rows are
        ordered by prompt first, so that a micro-batch holds whole groups. None: on CUDA (`attention` None: then
        flex), off on CPU (`shared_layout`).
        `frozen`: a model that only scores (`score`: a reference model), with no gradients and no optimizer, its weights
        stored in `param_dtype` (no float32 master copy: nothing updates them)."""
        if activation_checkpointing not in AC_MODES:
            raise ValueError(f"activation_checkpointing must be one of {AC_MODES}, got {activation_checkpointing!r}")
        titan()
        from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig

        self.hf_config = read_hf_config(hf_config)
        self.arch = arch = arch_from_hf(self.hf_config)
        check_model(degrees, arch.n_heads, arch.n_kv_heads, arch.vocab_size)
        self.degrees, self.loss, self.chunk_rows = degrees, loss, chunk_rows
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.param_dtype = param_dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.share_prompts, self.attention = shared_layout(self.device.type, share_prompts, attention)

        parallelism = ParallelismConfig(
            data_parallel_replicate_degree=degrees.dp_replicate,
            data_parallel_shard_degree=degrees.dp_shard,
            tensor_parallel_degree=degrees.tp,
            spmd_backend="partial_dtensor",  # FSDP2 + DTensor TP; the spmd_types backends need torch >= 2.12
        )
        self.model_config = config = titan_config(arch, self.attention, masked=self.share_prompts)
        config.update_from_config(config=SimpleNamespace(parallelism=parallelism))  # TP sharding plans
        self.parallel_dims = pd = parallel_dims(degrees, self.device.type)
        with torch.device("meta"):
            model = config.build()
        if frozen:  # its weights in the compute dtype, which FSDP2 would cast them to for every forward anyway
            for param in model.parameters():  # (parameters only: the RoPE cache stays as built; ties stay tied)
                param.data = param.data.to(self.param_dtype)
        model = parallelize_fn(arch)(
            model,
            parallel_dims=pd,
            training=TrainingConfig(
                mixed_precision_param="bfloat16" if self.param_dtype == torch.bfloat16 else "float32",
                mixed_precision_reduce="float32",
            ),
            parallelism=parallelism,
            compile_config=CompileConfig(enable=self.device.type == "cuda" if compile is None else compile,
                                         components=["model"]),
            ac_config=_ac_config(activation_checkpointing),
            dump_folder=tempfile.gettempdir(),
        )
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():  # gradients are summed over data-parallel ranks: the step weights each part
            if isinstance(m, FSDPModule):  # (SUM, not PREMUL_SUM: gloo has no premultiplied sum)
                m.set_gradient_divide_factor(1.0)
                if hasattr(m, "set_force_sum_reduction_for_comms"):
                    m.set_force_sum_reduction_for_comms(True)
        model.to_empty(device=self.device)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(seed)
            model.init_weights(buffer_device=None)  # random weights (load_hf replaces them) and the RoPE caches
        model._skip_lm_head = True  # the chunked head runs outside the model (see the module docstring)
        model.train(not frozen).requires_grad_(not frozen)
        self.model = model
        self.params = {clean_fqn(n): p for n, p in model.named_parameters()}
        self._qkv = {
            clean_fqn(n) + ".wqkv.weight": m for n, m in model.named_modules() if type(m).__name__ == "FusedQKVLinear"
        }
        self.names = NameMap.build(arch, config, self.hf_config, list(self.params))
        self.optimizer = None if frozen else torch.optim.AdamW(
            model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay,
            **({"fused": True} if self.device.type == "cuda" else {"foreach": True}),
        )
        self.step = 0

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> "TitanTrainer":
        """Build from `path`/config.json and load `path`'s safetensors."""
        trainer = cls(read_hf_config(path), **kwargs)
        trainer.load_hf(path)
        return trainer

    # ------------------------------------------------------------------------------------------------ training
    @property
    def dp_rank(self) -> int:
        return self._dp_mesh.get_local_rank() if self._dp_mesh is not None else 0

    @functools.cached_property
    def _dp_mesh(self):
        return self.parallel_dims.get_mesh("batch") if self.degrees.dp > 1 else None

    @functools.cached_property
    def _tp_group(self) -> dist.ProcessGroup | None:
        return self.parallel_dims.get_mesh("tp").get_group() if self.degrees.tp > 1 else None

    def train_step(
        self, batch: TrainBatch, *, grad_accum: int, max_grad_norm: float, temperature: float,
        mask_truncated: bool = False, version: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step on `batch` (the whole batch, on every rank); metrics are the whole batch's."""
        from torchtitan.distributed.utils import clip_grad_norm_

        self.model.train()
        metrics = train_step(
            by_prompt(batch)[0] if self.share_prompts else batch,
            logprobs_fn=functools.partial(self.logprobs, temperature=temperature),
            loss=self.loss,
            optimizer=self.optimizer,
            clip=lambda: clip_grad_norm_(list(self.model.parameters()), max_grad_norm, foreach=True),
            device=self.device,
            grad_accum=grad_accum,
            mask_truncated=mask_truncated,
            shard=self.dp_rank,
            shards=self.degrees.dp,
            reduce=self._sum_over_dp if self._dp_mesh is not None else None,
            gather_rows=self._rows_over_dp if self._dp_mesh is not None else None,
            version=version,
        )
        self.step += 1
        return metrics

    def logprobs(self, mb: TrainBatch, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """`(logprobs [b, R], entropy [b, R])` float32 of a micro-batch on this rank's device, 0 off the response
        mask; differentiable."""
        if self.share_prompts:
            packed = pack_groups(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
            hidden = self._hidden(packed.ids, packed.positions, self._sharing_mask(packed.segments))
            h = packed.per_row(hidden)  # [b, R, D]
        else:
            ids, index = pack_left(mb.prompt_ids, mb.prompt_mask, mb.response_ids)  # [b, L], [b, R]
            hidden = self._hidden(ids, None, self._causal_mask(ids.shape[1]) if self.attention == "flex" else None)
            h = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # [b, R, D]
        weight = self.model.lm_head.weight  # unsharded by FSDP for the forward; a vocab shard under TP
        start = 0
        if isinstance(weight, DTensor):
            weight = weight.to_local()
            start = dist.get_rank(self._tp_group) * weight.shape[0]
        return response_logprobs(h, weight, mb.response_ids, mb.response_mask, temperature, self.chunk_rows,
                                 self._tp_group, start)

    @torch.no_grad()
    def score(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        """[B, R] float32 logprobs of the whole batch's responses, on the host, without a gradient (a frozen
        reference model's pass): each data-parallel rank scores its share of the rows in one forward, and every
        rank returns the whole batch (collective)."""
        batch, order = by_prompt(batch) if self.share_prompts else (batch, None)
        out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=self.device)
        for mb, _, rows in micro_batches(batch, 1, self.dp_rank, self.degrees.dp):
            out[rows] = self.logprobs(to_device(mb, self.device), temperature)[0]
        out = (self._rows_over_dp(out) if self._dp_mesh is not None else out).cpu()
        return out if order is None else out[order.argsort()]  # back in the caller's row order

    def _rows_over_dp(self, rows: torch.Tensor) -> torch.Tensor:
        """The [B, R] tensor whose rows each data-parallel rank filled for its share (zeros elsewhere), whole."""
        dist.all_reduce(rows, group=self._dp_mesh.get_group())
        return rows

    def _sum_over_dp(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self._dp_mesh.get_group())
        return dict(zip(keys, t.tolist()))

    @functools.lru_cache(maxsize=8)
    def _causal_mask(self, length: int):
        return _block_mask()(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=length, KV_LEN=length,
                             device=self.device)

    def _hidden(self, ids: torch.Tensor, positions: torch.Tensor | None, masks) -> torch.Tensor:
        """The model's hidden states [n, L, D] after the final norm (the LM head is not run), on this rank."""
        hidden = self.model(ids, positions, masks)
        return hidden.to_local() if isinstance(hidden, DTensor) else hidden  # TP: replicated over the tp mesh

    def _sharing_mask(self, segments: torch.Tensor):
        """The attention mask of `pack_groups`'s sequences: a flex BlockMask, or SDPA's bool [G, 1, L, L]."""
        if self.attention != "flex":
            return dense_mask(segments)
        G, L = segments.shape
        return _block_mask()(prompt_sharing_mask(segments), B=G, H=None, Q_LEN=L, KV_LEN=L, device=self.device)

    # ------------------------------------------------------------------------------------------ weights and I/O
    def named_full_weights(self, dtype: torch.dtype | None = None, grads: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) in the HF model's parameter order, one tensor gathered at a time (collective: every
        rank iterates to the end). `dtype` casts each shard before the gather (bf16 halves the bytes moved);
        `grads=True` yields the gradients instead (after a step: the clipped ones)."""
        with torch.no_grad():
            for fqn, _ in self.names.plan:
                t = self.params[fqn].grad if grads else self.params[fqn].detach()
                if dtype is not None:
                    t = t.to(dtype)
                full = t.full_tensor() if isinstance(t, DTensor) else t
                yield from self.names.to_hf(fqn, full, self._qkv.get(fqn))
                del full

    def whole_weight_views(self) -> list[tuple[str, torch.Tensor]] | None:
        """(HF name, a view of the parameter's own storage holding that HF tensor's values) in the order of
        `named_full_weights`, when every parameter is whole on this process (no sharding) and needs no reordering:
        a publisher then copies straight from the parameters, once per version, with nothing gathered or allocated.
        A fused wqkv gives three strided views (per kv group: heads_per_kv query heads, one key, one value head),
        shaped [kv groups, heads, head_dim, dim]: the HF tensor viewed that way takes them with one copy each.
        None when some parameter is sharded or permuted (Llama's q/k): `named_full_weights` gathers then."""
        out = []
        for fqn, hf_names in self.names.plan:
            t = self.params[fqn].detach()
            if isinstance(t, DTensor):
                if t.device_mesh.size() > 1:
                    return None
                t = t.to_local()
            if any(self.names.permuted(h) for h in hf_names):
                return None
            qkv = self._qkv.get(fqn)
            if qkv is None:
                if len(hf_names) > 1:  # a fused bias
                    return None
                out.append((hf_names[0], t))
                continue
            hd, per_kv = qkv.head_dim, qkv.heads_per_kv
            w = t.view(-1, per_kv + 2, hd, *t.shape[1:])  # [kv groups, per_kv q heads + k + v, head_dim, dim]
            out += list(zip(hf_names, (w[:, :per_kv], w[:, per_kv], w[:, per_kv + 1])))
        return out

    def weight_layout(self, dtype: torch.dtype | None = None) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """(HF name, shape, dtype) of what `named_full_weights(dtype)` yields, without gathering anything."""
        return [(n, s, dtype or torch.float32) for n, s in self.names.hf_shapes.items()]

    def load_hf(self, path: str | Path) -> None:
        titan_checkpoint.load_hf(self, path)

    def save_hf(self, directory: str | Path, tokenizer=None, dtype: torch.dtype = torch.float32) -> Path:
        return titan_checkpoint.save_hf(self, directory, tokenizer, dtype)

    def save(self, directory: str | Path) -> None:
        titan_checkpoint.save_dcp(self, directory)

    def load(self, directory: str | Path) -> None:
        titan_checkpoint.load_dcp(self, directory)


def shared_layout(device_type: str, share_prompts: bool | None, attention: str | None) -> tuple[bool, str]:
    """(share_prompts, attention) as run: None shares the prompts on CUDA, where flex attention skips the mask's
    empty blocks, and not on CPU, where flex has no backward and SDPA would compute every block of the dense mask."""
    share = device_type == "cuda" if share_prompts is None else share_prompts
    return share, attention or ("flex" if share and device_type == "cuda" else "sdpa")


@functools.cache
def _block_mask():
    """torch.compile(create_block_mask), as TorchTitan builds its masks: compiled, it works block by block and never
    holds the [B, L, L] grid that the eager function evaluates (~10 bytes a pair: 11 GB for one 33k-token sequence)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def _ac_config(mode: str):
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {"none": None, "full": FullAC.Config(), "selective": SelectiveAC.Config()}[mode]
