"""Attention for the HF server's cached engine: grouped-query decode and shared-prefix attention.

Two functions are registered with transformers' ``AttentionInterface`` under one name and
selected per model by :func:`server_attention_for`:

* **Grouped-query decode.** transformers' CPU path expands keys/values (B, Hkv, L, D) to all query
  heads before SDPA, which copies the whole cache every step. For one query position the query
  heads of a group can instead be laid out as that group's "query length":
  (B, H, 1, D) -> (B, Hkv, H/Hkv, D), all of them under the same mask row. A few positions under
  a 4-D boolean mask (the speculative decoder's verification) are laid out the same way, each
  position's mask row repeated for its group's heads.
* **Shared-prefix attention.** The rows of a batch are mostly the same prompt: the n episodes of
  a task (a GRPO group) share the tool schemas and the task, thousands of tokens. Reading that
  prefix's key/values once per row makes a decode step cost B times the prefix; instead the
  caller passes :class:`PrefixGroup` s (rows that share a prefix, and that prefix's key/values once),
  the cache holds only each row's own remainder, and attention is computed in two parts merged by
  their log-sum-exp (as in cascade / flash-decoding attention):

      out = (o_p * exp(lse_p) + o_s * exp(lse_s)) / (exp(lse_p) + exp(lse_s))

  where ``o_p, lse_p`` attend every query of a group to the shared prefix (one kernel call for
  all its rows: the queries are stacked along the query axis, no mask, since every new position
  comes after the prefix) and ``o_s, lse_s`` attend each row to its own remainder under the model's
  mask. This is exact up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SERVER_ATTENTION = "seal_server_sdpa"
PREFIX_KWARG = "seal_prefix_groups"  # the model-call keyword that carries the groups to the layers
MIN_CHUNK = 512  # shortest piece of a shared prefix worth a thread of its own
# Most query positions per row that grouped-query attention takes (a speculative decoder's
# verification step); longer ones (prefill) go to transformers' SDPA.
MAX_GROUPED_QUERIES = 16

# The CPU flash kernel, which also returns the log-sum-exp of each query's scores.
_flash_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class PrefixGroup:
    """Rows of a batch whose contexts start with the same ``length`` tokens, and those tokens'
    key/values, per layer (Hkv, length, D), held once for the group."""

    rows: torch.Tensor  # (n,) long: indices into the batch
    keys: Sequence[torch.Tensor]
    values: Sequence[torch.Tensor]


def server_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The registered attention: shared-prefix attention when the call carries prefix groups,
    else grouped-query decode for one position, else transformers' stock SDPA."""
    groups = kwargs.pop(PREFIX_KWARG, None)
    if groups:
        return prefix_attention(query, key, value, attention_mask, groups, module.layer_idx, scaling), None
    b, h, q, d = query.shape
    hkv = key.shape[1]
    few = (attention_mask is not None and attention_mask.dim() == 4 and attention_mask.dtype == torch.bool
           and q <= MAX_GROUPED_QUERIES)
    if (q != 1 and not few) or h == hkv or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    g = h // hkv
    # Query head j of kv head k is head k * g + j: (B, H, Q, D) -> (B, Hkv, g * Q, D), each query
    # position's mask row repeated for the g heads of its group.
    grouped = query.reshape(b, hkv, g * q, d)
    mask = attention_mask
    if q != 1:
        mask = mask[..., :key.shape[2]].expand(b, 1, q, key.shape[2]).repeat(1, 1, g, 1)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     groups: Sequence[PrefixGroup], layer: int, scaling: float | None) -> torch.Tensor:
    """Attention of ``query`` (B, H, Q, D) to [group prefix; own keys (B, Hkv, K, D)].

    ``mask`` (B, 1, Q, K) (bool, True = attend) applies to the own keys; ``None`` means all of
    them for one position, causal for several (then the own keys are exactly the new positions).
    Every query must be allowed at least one own key (a new position always sees itself). Rows in no
    group attend to their own keys only. Returns (B, Q, H, D), the layout transformers expects.
    """
    b, h, q, d = query.shape
    hkv = key.shape[1]
    g = h // hkv
    causal = mask is None and q > 1  # transformers passes no mask for plain causal attention
    if causal and key.shape[2] != q:
        raise ValueError("prefix attention over several new positions needs a mask unless they are all the keys")
    # Under autocast the rotated query may be fp32 while the cache holds bf16 (stock SDPA would
    # cast both to bf16 by autocast's rules; this kernel needs one dtype).
    query = query.to(key.dtype)
    # Query head j of kv head k is head k * g + j: (B, H, Q, D) -> (B, Hkv, g * Q, D).
    grouped = query.reshape(b, hkv, g * q, d)
    bias = None
    if mask is not None:
        allowed = mask.expand(b, 1, q, key.shape[2]).repeat(1, 1, g, 1)
        bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill_(~allowed, float("-inf"))
    if causal:  # the kernel takes no grouped layout for this: repeat the few kv heads instead
        own, own_lse = _flash_with_lse(query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1),
                                       is_causal=True, scale=scaling)
        own, own_lse = own.reshape(b, hkv, g * q, d), own_lse.reshape(b, hkv, g * q)
    else:
        own, own_lse = _flash_with_lse(grouped, key, value, attn_mask=bias, scale=scaling)
    out, lse = own.float(), own_lse
    for group in groups:
        rows = group.rows
        n = int(rows.shape[0])
        stacked = grouped.index_select(0, rows).transpose(0, 1).reshape(1, hkv, n * g * q, d)
        shared, shared_lse = _shared_attention(stacked, group.keys[layer], group.values[layer], scaling)
        shared = shared.reshape(hkv, n, g * q, d).transpose(0, 1)
        shared_lse = shared_lse.reshape(hkv, n, g * q).transpose(0, 1)
        row_lse = lse.index_select(0, rows)
        total = torch.logaddexp(row_lse, shared_lse)
        merged = (out.index_select(0, rows) * torch.exp(row_lse - total)[..., None]
                  + shared * torch.exp(shared_lse - total)[..., None])
        out = out.index_copy(0, rows, merged)
        lse = lse.index_copy(0, rows, total)
    return out.to(query.dtype).reshape(b, h, q, d).transpose(1, 2).contiguous()


def _shared_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``query`` (1, Hkv, M, D) to a prefix (Hkv, S, D): output (float32) and lse.

    The kernel spreads (batch x heads x query blocks) over the threads, which a few key/value
    heads and one query block leave idle or unbalanced (3 heads on 2 threads). The prefix is
    therefore cut into one chunk per thread, laid out as a batch (views, no copy), and the chunks'
    results merged by their log-sum-exp like the two parts of :func:`prefix_attention`.
    """
    hkv, s, d = keys.shape
    chunks = max(1, min(torch.get_num_threads(), s // MIN_CHUNK))
    if chunks == 1:
        out, lse = _flash_with_lse(query, keys[None], values[None], scale=scaling)
        return out[0].float(), lse[0]
    size = s // chunks
    main = size * chunks

    def split(t: torch.Tensor) -> torch.Tensor:
        return t[:, :main].reshape(hkv, chunks, size, d).transpose(0, 1)

    out, lse = _flash_with_lse(query.expand(chunks, -1, -1, -1), split(keys), split(values), scale=scaling)
    if main < s:  # the few positions left over
        rest, rest_lse = _flash_with_lse(query, keys[None, :, main:], values[None, :, main:], scale=scaling)
        out, lse = torch.cat([out, rest]), torch.cat([lse, rest_lse])
    total = torch.logsumexp(lse, dim=0)
    return (out.float() * torch.exp(lse - total)[..., None]).sum(0), total


# Registered by name (like a verl agent loop); selecting it is per model, see ``server_attention_for``.
AttentionInterface.register(SERVER_ATTENTION, server_attention)
AttentionMaskInterface.register(SERVER_ATTENTION, sdpa_mask)


def uses_server_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs :func:`server_attention` now (inside :func:`server_attention_for`)."""
    return getattr(model.config, "_attn_implementation", None) == SERVER_ATTENTION


def prefix_groups_supported(model: torch.nn.Module) -> bool:
    """Whether a call of ``model`` may carry prefix groups: it runs :func:`server_attention` on
    CPU (the kernel that returns the log-sum-exp is the CPU flash kernel; on a GPU the rows keep
    their own copies of the prefix, and vLLM is the engine there anyway)."""
    param = next(model.parameters(), None)
    return uses_server_attention(model) and param is not None and param.device.type == "cpu"


@contextlib.contextmanager
def server_attention_for(model: torch.nn.Module) -> Iterator[bool]:
    """Use :func:`server_attention` inside the block when the model runs stock ``sdpa``.

    Yields whether it is in use: only then may a model call carry prefix groups.
    """
    config = model.config
    previous = getattr(config, "_attn_implementation", None)
    if previous != "sdpa":
        yield False
        return
    config._attn_implementation = SERVER_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = previous
