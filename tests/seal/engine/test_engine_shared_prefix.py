"""Shared-prefix attention, prefix groups and chained cache entries: each equals the plain path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seal.engine import attention, kv_engine
from seal.engine.attention import PrefixGroup, prefix_attention, server_attention_for
from seal.engine.hf_server import HFServerManager
from seal.engine.kv_cache import Entry, KVShape
from seal.engine.kv_engine import PrefillItem, decode, group_rows, prefill_padded, prefix_groups

from tiny_lm import _Tok, gather, prefill, tiny_model

HKV, G, D = 2, 3, 8  # grouped-query layout: 6 query heads share 2 key/value heads


def _reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Plain SDPA of (1, H, Q, D) queries over full (1, Hkv, K, D) keys, grouped heads repeated."""
    out = F.scaled_dot_product_attention(query, keys.repeat_interleave(G, 1), values.repeat_interleave(G, 1),
                                         attn_mask=allowed)
    return out.transpose(1, 2)


@pytest.mark.parametrize("q", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_attention_equals_attention_over_the_whole_context(q: int, dtype: torch.dtype) -> None:
    """Rows 0 and 2 share a 40-position prefix, row 1 is in no group; own keys are left-padded."""
    torch.manual_seed(0)
    b, own = 3, 7
    query = torch.randn(b, HKV * G, q, D, dtype=dtype)
    prefix_k, prefix_v = torch.randn(HKV, 40, D, dtype=dtype), torch.randn(HKV, 40, D, dtype=dtype)
    key, value = torch.randn(b, HKV, own, D, dtype=dtype), torch.randn(b, HKV, own, D, dtype=dtype)
    mask = torch.ones(b, 1, q, own, dtype=torch.bool)
    mask[1, :, :, :3] = False  # row 1 has 3 padding positions
    mask[:, 0, :, own - q:] = torch.ones(q, q, dtype=torch.bool).tril()  # causal among the new positions
    group = PrefixGroup(torch.tensor([0, 2]), [prefix_k], [prefix_v])
    out = prefix_attention(query, key, value, mask, [group], 0, None)
    assert out.shape == (b, q, HKV * G, D) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i in range(b):
        k, v, m = key[i:i + 1], value[i:i + 1], mask[i:i + 1]
        if i in (0, 2):
            k = torch.cat([prefix_k[None], k], 2)
            v = torch.cat([prefix_v[None], v], 2)
            m = torch.cat([torch.ones(1, 1, q, 40, dtype=torch.bool), m], 3)
        ref = _reference(query[i:i + 1].float(), k.float(), v.float(), m)
        assert torch.allclose(out[i:i + 1].float(), ref, atol=tol), (i, (out[i:i + 1].float() - ref).abs().max())


@pytest.mark.parametrize("threads", [2, 3])
def test_shared_prefix_split_per_thread(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix cut into one chunk per thread (41 positions: a remainder too) gives the same result."""
    torch.manual_seed(2)
    monkeypatch.setattr(attention, "MIN_CHUNK", 8)
    before = torch.get_num_threads()
    query = torch.randn(2, HKV * G, 1, D)
    key, value = torch.randn(2, HKV, 3, D), torch.randn(2, HKV, 3, D)
    pk, pv = torch.randn(HKV, 41, D), torch.randn(HKV, 41, D)
    group = [PrefixGroup(torch.tensor([0, 1]), [pk], [pv])]
    try:
        torch.set_num_threads(1)
        whole = prefix_attention(query, key, value, None, group, 0, None)
        torch.set_num_threads(threads)
        split = prefix_attention(query, key, value, None, group, 0, None)
    finally:
        torch.set_num_threads(before)
    ref = _reference(query[:1], torch.cat([pk[None], key[:1]], 2), torch.cat([pv[None], value[:1]], 2),
                     torch.ones(1, 44, dtype=torch.bool))
    assert torch.allclose(split, whole, atol=1e-5) and torch.allclose(split[:1], ref, atol=1e-5)


def test_prefix_attention_causal_without_mask() -> None:
    """No mask with several new positions = causal over them (how transformers passes a plain prompt)."""
    torch.manual_seed(1)
    query = torch.randn(1, HKV * G, 5, D)
    key, value = torch.randn(1, HKV, 5, D), torch.randn(1, HKV, 5, D)
    pk, pv = torch.randn(HKV, 9, D), torch.randn(HKV, 9, D)
    out = prefix_attention(query, key, value, None, [PrefixGroup(torch.tensor([0]), [pk], [pv])], 0, None)
    allowed = torch.cat([torch.ones(5, 9, dtype=torch.bool), torch.ones(5, 5, dtype=torch.bool).tril()], 1)
    ref = _reference(query, torch.cat([pk[None], key], 2), torch.cat([pv[None], value], 2), allowed)
    assert torch.allclose(out, ref, atol=1e-5)
    with pytest.raises(ValueError, match="needs a mask"):
        prefix_attention(query, torch.randn(1, HKV, 6, D), torch.randn(1, HKV, 6, D), None, [], 0, None)


def test_prefix_groups_only_with_the_server_attention_on_cpu() -> None:
    model = tiny_model()
    contexts, entries = [torch.arange(20)] * 2, [Entry(torch.arange(20), [torch.zeros(1, 20, 16)] * 2,
                                                       [torch.zeros(1, 20, 16)] * 2)] * 2
    assert prefix_groups(model, contexts, entries, [20, 20], 8)[1] == [0, 0]  # stock sdpa: no groups
    with server_attention_for(model):
        assert prefix_groups(model, contexts, entries, [20, 20], 8)[1] == [20, 20]
    meta = tiny_model().to("meta")  # stands in for a GPU: not the CPU kernel
    with server_attention_for(meta):
        assert attention.uses_server_attention(meta) and not attention.prefix_groups_supported(meta)
        assert prefix_groups(meta, contexts, entries, [20, 20], 8)[1] == [0, 0]


def test_group_rows_pays_for_sharing_only() -> None:
    base = torch.arange(100)
    sib = [torch.cat([base, torch.tensor([t])]) for t in (500, 501, 502)]
    stranger = torch.cat([base[:10], torch.arange(200, 290)])
    contexts = [sib[0], stranger, sib[1], sib[2]]
    groups = group_rows(contexts, [len(c) for c in contexts], min_shared=16)
    # The siblings share 100 tokens; the stranger shares 10 (< 16) and stands alone.
    assert groups == [([0, 2, 3], 100), ([1], 100)]
    assert group_rows(contexts, [len(c) for c in contexts], min_shared=0) == []
    assert group_rows(contexts, [50, 5, 101, 101], min_shared=16) == [([0, 2, 3], 50)]  # usable caps
    # A row sharing little with a large group does not shrink it: it starts its own group.
    big = [torch.cat([base, torch.tensor([t])]) for t in range(4)] + [torch.cat([base[:30], torch.arange(7, 77)])]
    assert group_rows(big, [101] * 4 + [100], min_shared=16) == [([0, 1, 2, 3], 100), ([4], 100)]


def _chain() -> tuple[Entry, Entry, Entry]:
    keys = torch.arange(2 * 10 * 1, dtype=torch.float32).reshape(2, 10, 1)  # (H, n, D) of positions 0..9
    root = Entry(torch.arange(10), [keys], [keys + 100])
    mid = Entry(torch.cat([torch.arange(6), torch.tensor([60, 61])]), [keys[:, :2] * -1], [keys[:, :2] * -1],
                parent=root, start=6)
    leaf = Entry(torch.cat([mid.tokens, torch.tensor([70])]), [keys[:, :1] * 0 + 7], [keys[:, :1] * 0 + 7],
                 parent=mid, start=8)
    return root, mid, leaf


def test_chained_entries_share_their_parents_storage() -> None:
    root, mid, leaf = _chain()
    assert leaf.root_span() == (root, 6)  # mid vouches only for root's first 6 positions
    assert [(pos, k[0].shape[1]) for pos, k, _ in leaf.pieces(0, len(leaf))] == [(0, 6), (6, 2), (8, 1)]
    assert leaf.pieces(0, 4)[0][1][0].data_ptr() == root.keys[0].data_ptr()  # a view, no copy
    keys, _ = leaf.materialize()
    assert keys[0][0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 0, -1, 7]
    buf_k, buf_v = [torch.zeros(1, 2, 12, 1)], [torch.zeros(1, 2, 12, 1)]
    leaf.write(buf_k, buf_v, 0, 3, 4, 9)  # positions 4..8 to buffer columns 3..7
    assert buf_k[0][0, 0, :, 0].tolist() == [0, 0, 0, 4, 5, 0, -1, 7, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="does not fit"):
        Entry(torch.arange(3), [torch.zeros(2, 3, 1)], [torch.zeros(2, 3, 1)], start=1)
    with pytest.raises(ValueError, match="positions"):
        Entry(torch.arange(12), [torch.zeros(2, 5, 1)], [torch.zeros(2, 5, 1)], parent=root, start=6)


def test_prefill_with_groups_equals_the_plain_path() -> None:
    """Rows reusing a shared stored prompt: same logits and key/values with groups as without."""
    model = tiny_model().eval()
    shape = KVShape.of(model.config, torch.float32)
    prompt = list(range(3, 50))
    with torch.no_grad(), server_attention_for(model):
        root, _ = prefill(model, shape, prompt, None, 0)
        items = [PrefillItem(prompt + [60, 61], root, len(prompt)), PrefillItem(prompt[:40] + [62] * 5, root, 40),
                 PrefillItem([7, 8, 9], None, 0), PrefillItem(prompt + [63], root, len(prompt))]
        grouped = prefill_padded(model, shape, items, min_shared=8)
        plain = prefill_padded(model, shape, items, min_shared=0)
        groups, shared = prefix_groups(model, [torch.tensor(it.tokens[:it.reuse]) for it in items],
                                       [it.entry for it in items], [it.reuse for it in items], 8)
    assert shared == [40, 40, 0, 40] and len(groups) == 1
    assert groups[0].keys[0].data_ptr() == root.keys[0].data_ptr()  # the prompt is read in place
    for it, (ge, gl), (pe, pl) in zip(items, grouped, plain):
        full = model(torch.tensor([it.tokens])).logits[0, -1]
        assert torch.allclose(gl, pl, atol=1e-5) and torch.allclose(gl, full, atol=1e-5)
        assert ge.parent is (it.entry if it.reuse else None)  # a link holding only the new tokens
        for a, b in zip(sum(ge.materialize(), []), sum(pe.materialize(), [])):
            assert torch.allclose(a, b, atol=1e-5)


def test_decode_with_groups_equals_the_plain_path() -> None:
    model = tiny_model().eval()
    shape = KVShape.of(model.config, torch.float32)
    prompt = list(range(3, 50))
    calls = []
    original = attention.prefix_attention

    def spy(*args, **kwargs):
        calls.append(len(args[4]))
        return original(*args, **kwargs)

    with torch.no_grad(), server_attention_for(model), pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention, "prefix_attention", spy)
        root, _ = prefill(model, shape, prompt, None, 0)
        rows = prefill_padded(model, shape, [PrefillItem(prompt + [60 + i], root, len(prompt)) for i in range(3)], 0)
        entries, first = [e for e, _ in rows], torch.stack([lg for _, lg in rows])
        greedy = (lambda lg, rows: lg.argmax(-1), lambda lg, t: torch.log_softmax(lg, -1).gather(1, t[:, None])[:, 0])
        outs = [decode(model, shape, entries, first, [5, 3, 5], *greedy, {2}, 0, min_shared=m) for m in (8, 0)]
    assert calls and all(n == 1 for n in calls)  # the grouped decode ran shared-prefix attention
    assert outs[0].tokens == outs[1].tokens
    for a, b in zip(outs[0].logprobs, outs[1].logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    for row, entry in zip(entries, outs[0].entries):
        assert entry.parent is row and entry.start == len(row)


@pytest.mark.parametrize("min_shared", [8, 0])
def test_dropping_finished_rows_changes_no_row(min_shared: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that stop early leave the decode batch (fewer row-steps); every row's tokens, log-probs
    and stored key/values equal those of a batch that carries its finished rows to the end."""
    model = tiny_model().eval()
    shape = KVShape.of(model.config, torch.float32)
    prompt = list(range(3, 50))
    greedy = (lambda lg, rows: lg.argmax(-1), lambda lg, t: torch.log_softmax(lg, -1).gather(1, t[:, None])[:, 0])
    outs = []
    with torch.no_grad(), server_attention_for(model):
        root, _ = prefill(model, shape, prompt, None, 0)
        items = [PrefillItem(prompt + [60 + i] * (i + 1), root, len(prompt)) for i in range(4)]
        items.append(PrefillItem([7, 8, 9], None, 0))  # in no group
        rows = prefill_padded(model, shape, items, min_shared)
        entries, first = [e for e, _ in rows], torch.stack([lg for _, lg in rows])
        for share in (kv_engine.DROP_FINISHED_SHARE, 2.0):  # 2.0: never drop
            monkeypatch.setattr(kv_engine, "DROP_FINISHED_SHARE", share)
            outs.append(decode(model, shape, entries, first, [2, 9, 4, 9, 3], *greedy, set(), 0, min_shared))
    dropped, carried = outs
    assert carried.row_steps == 5 * carried.steps and dropped.row_steps < carried.row_steps
    assert dropped.tokens == carried.tokens and [len(t) for t in dropped.tokens] == [2, 9, 4, 9, 3]
    for a, b in zip(dropped.logprobs, carried.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    for a, b in zip(dropped.entries, carried.entries):
        assert torch.equal(a.tokens, b.tokens) and a.parent is b.parent and a.start == b.start
        for x, y in zip(a.keys + a.values, b.keys + b.values):
            assert x.shape == y.shape and torch.allclose(x, y, atol=1e-5)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_server_shared_prefix_matches_shared_prefix_off(autocast: torch.dtype | None) -> None:
    """Through the server: episodes sharing a long prompt, first and follow-up calls, greedy; also
    under bf16 autocast (the trainer's setting: bf16 cache, query rotated in fp32)."""
    model = tiny_model()
    greedy = {"temperature": 0, "max_tokens": 6}
    prompt = list(range(3, 70))
    prompts = [prompt + [80], prompt + [81], prompt + [82, 83], [5, 6, 7]]
    answers, grouped_rows = [], []
    original = attention.prefix_attention

    def spy(*args, **kwargs):
        grouped_rows.append(sum(len(g.rows) for g in args[4]))
        return original(*args, **kwargs)

    for min_tokens in (16, 0):
        server = HFServerManager(model, _Tok(), autocast_dtype=autocast, shared_prefix_min_tokens=min_tokens)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(attention, "prefix_attention", spy)
            first = gather(server, prompts, greedy)
            follow = [p + o.token_ids + [90 + i] * (i + 1) for i, (p, o) in enumerate(zip(prompts, first))]
            answers.append(first + gather(server, follow, greedy))
        if min_tokens:
            assert max(grouped_rows) == 3  # the three siblings decoded as one group
            grouped_rows.clear()
    assert not grouped_rows  # shared_prefix_min_tokens=0 turns it off
    for a, b in zip(*answers):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4 if autocast is None else 2e-2)
    with pytest.raises(ValueError, match="shared_prefix_min_tokens"):
        HFServerManager(model, _Tok(), shared_prefix_min_tokens=-1)
