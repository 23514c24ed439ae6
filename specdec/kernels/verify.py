"""Tree verification ops: ``verify_tree_greedy`` and ``tree_speculative_sampling_target_only``.

Both match sgl_kernel's ops (signature, dtypes, in-place writes). Each public op checks its inputs
and dispatches; ``*_ref`` is the specification (host loops, any device).

Glossary: bs = requests; N = num_draft_tokens = tree nodes per request (node 0 = root);
num_spec = accept_index.shape[1] = depth + 1 (the root plus at most depth accepted nodes);
accepted = draft tokens the target agrees with; bonus = the token the target emits after the last
accepted node. Tree links (``retrive_next_token`` / ``retrive_next_sibling``) are local node
indices; ``retrive_index`` maps a local node to its global index ``b*N + t``, which is what
``predicts``, ``accept_index`` and ``target_predict`` (flattened) use.

Outputs, per request:
  accept_index[b, 0..k]  global indices of the root and the k accepted nodes (rest untouched);
  accept_token_num[b]    = k;
  predicts[g]            for each g on the accepted path: the token emitted after node g (the next
                         accepted draft token, and the bonus token at the last one); other entries
                         untouched.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.kernels.residual import residual_draw_ref

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl


def _check_tree_inputs(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    links: dict[str, torch.Tensor],
) -> tuple[int, int, torch.device]:
    """Validate the tensors both ops share; returns (bs, N, device).

    NOTE: eager calls are launch bound, so valid input takes one pass of cheap comparisons; any
    mismatch reruns the checks one by one to raise the error that names the argument.
    """
    if (isinstance(candidates, torch.Tensor) and candidates.dim() == 2 and isinstance(accept_index, torch.Tensor)
            and accept_index.dim() == 2):
        (bs, n), device = candidates.shape, candidates.device
        if (matches(candidates, torch.int64, (bs, n), device)
                and matches(predicts, torch.int32, (bs * n,), device)
                and accept_index.shape[0] == bs and accept_index.shape[1] >= 1
                and matches(accept_index, torch.int32, accept_index.shape, device)
                and matches(accept_token_num, torch.int32, (bs,), device)
                and all(matches(t, torch.int64, (bs, n), device) for t in links.values())):
            return bs, n, device
    check_tensor("candidates", candidates, dtype=torch.int64, dim=2)
    (bs, n), device = candidates.shape, candidates.device
    check_tensor("predicts", predicts, dtype=torch.int32, shape=(bs * n,), device=device)
    check_tensor("accept_index", accept_index, dtype=torch.int32, dim=2, device=device)
    if accept_index.shape[0] != bs or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index: expected shape ({bs}, num_spec >= 1), got {tuple(accept_index.shape)}")
    check_tensor("accept_token_num", accept_token_num, dtype=torch.int32, shape=(bs,), device=device)
    for name, t in links.items():
        check_tensor(name, t, dtype=torch.int64, shape=(bs, n), device=device)
    return bs, n, device


def _check_sampling_inputs(
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
    *,
    bs: int,
    n: int,
    device: torch.device,
) -> None:
    """The sampling op's own inputs (fast path first, like ``_check_tree_inputs``)."""
    f32 = torch.float32
    if (matches(uniform_samples, f32, (bs, n), device)
            and matches(uniform_samples_for_final_sampling, f32, (bs,), device)
            and isinstance(target_probs, torch.Tensor) and target_probs.dim() == 3
            and target_probs.shape[:2] == (bs, n) and target_probs.shape[2] >= 1
            and matches(target_probs, f32, target_probs.shape, device)
            and matches(draft_probs, f32, target_probs.shape, device)
            and 0.0 <= float(threshold_single) <= 1.0 and 0.0 <= float(threshold_acc) <= 1.0):
        return
    check_tensor("uniform_samples", uniform_samples, dtype=f32, shape=(bs, n), device=device)
    check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling,
                 dtype=f32, shape=(bs,), device=device)
    check_tensor("target_probs", target_probs, dtype=f32, dim=3, device=device)
    if tuple(target_probs.shape[:2]) != (bs, n) or target_probs.shape[2] < 1:
        raise ValueError(f"target_probs: expected shape ({bs}, {n}, vocab), got {tuple(target_probs.shape)}")
    check_tensor("draft_probs", draft_probs, dtype=f32, shape=tuple(target_probs.shape), device=device)
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name}: expected a value in [0, 1], got {value}")


def verify_tree_greedy(
    predicts: torch.Tensor,  # [bs * N] int32, written on the accepted path
    accept_index: torch.Tensor,  # [bs, num_spec] int32, written at 0..k
    accept_token_num: torch.Tensor,  # [bs] int32
    candidates: torch.Tensor,  # [bs, N] int64 draft token of each node (root first)
    retrive_index: torch.Tensor,  # [bs, N] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64
    target_predict: torch.Tensor,  # [bs, N] int64 target argmax after each node
) -> None:
    """Greedy tree verification in place (see the ref)."""
    _, _, device = _check_tree_inputs(
        predicts, accept_index, accept_token_num, candidates,
        {"retrive_index": retrive_index, "retrive_next_token": retrive_next_token,
         "retrive_next_sibling": retrive_next_sibling, "target_predict": target_predict},
    )
    impl = select_impl("verify_tree_greedy", verify_tree_greedy_ref, device)
    impl(predicts, accept_index, accept_token_num, candidates, retrive_index,
         retrive_next_token, retrive_next_sibling, target_predict)


def verify_tree_greedy_ref(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Specification of ``verify_tree_greedy``.

    From the root, repeatedly scan the current node's children (first child, then siblings in
    order) and accept the first whose draft token equals the target argmax after the current
    node; stop when none matches or num_spec - 1 nodes are accepted. Example (N = 5, bs = 1)::

              0 (r)            candidates     [r, a, b, c, d]
             /     \\           target_predict [b, x, d, y, z]   (argmax after each node)
          1 (a)   2 (b)        root: child 1 (a) != b, sibling 2 (b) == b -> accept 2
            |       |          node 2: child 4 (d) == d -> accept 4; node 4 is a leaf -> stop
          3 (c)   4 (d)        accept_index [0, 2, 4, untouched], accept_token_num 2
                               predicts[0, 2, 4] = [b, d, z]  (z is the bonus)
    """
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    cand = candidates.tolist()
    target = target_predict.flatten().tolist()  # [bs * N], indexed by global node
    walks = _TreeWalk.per_request(retrive_index, retrive_next_token, retrive_next_sibling)
    predicts_writes: dict[int, int] = {}
    accept_writes: dict[int, int] = {}
    num_accepted = [0] * bs
    for b, walk in enumerate(walks):
        node, last = 0, walk.global_index(0)  # current local node, its global index
        path = [last]
        while len(path) < num_spec:
            node = next((c for c in walk.children(node) if cand[b][c] == target[last]), -1)
            if node == -1:
                break
            predicts_writes[last] = target[last]
            last = walk.global_index(node)
            path.append(last)
        predicts_writes[last] = target[last]  # the bonus token
        accept_writes.update({b * num_spec + j: g for j, g in enumerate(path)})
        num_accepted[b] = len(path) - 1
    _scatter(predicts, predicts_writes)
    _scatter(accept_index, accept_writes)
    accept_token_num.copy_(torch.tensor(num_accepted, dtype=torch.int32))


class _TreeWalk:
    """Bounds-checked reads of one request's tree links; a sibling scan stops after N - 1 children."""

    def __init__(self, b: int, bs: int, rindex: list[int], next_token: list[int], next_sibling: list[int]):
        self.b, self.n, self.bs = b, len(rindex), bs
        self.rindex, self.next_token, self.next_sibling = rindex, next_token, next_sibling

    @classmethod
    def per_request(
        cls, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor
    ) -> list["_TreeWalk"]:
        bs = retrive_index.shape[0]
        rows = zip(retrive_index.tolist(), retrive_next_token.tolist(), retrive_next_sibling.tolist())
        return [cls(b, bs, *row) for b, row in enumerate(rows)]

    def _link(self, links: list[int], node: int, what: str) -> int:
        nxt = links[node]
        if not -1 <= nxt < self.n:
            raise ValueError(f"invalid draft tree: request {self.b} node {node} has {what} {nxt} "
                             f"outside [-1, {self.n})")
        return nxt

    def children(self, node: int):
        """Children of ``node`` in link order: first child, then its next siblings."""
        child = self._link(self.next_token, node, "retrive_next_token")
        for _ in range(self.n - 1):  # a node has at most N - 1 children
            if child == -1:
                return
            yield child
            child = self._link(self.next_sibling, child, "retrive_next_sibling")
        if child != -1:
            raise ValueError(f"invalid draft tree: request {self.b} node {node} has a sibling cycle")

    def global_index(self, node: int) -> int:
        g = self.rindex[node]
        if not 0 <= g < self.bs * self.n:
            raise ValueError(f"invalid draft tree: request {self.b} node {node} has retrive_index {g} "
                             f"outside [0, {self.bs * self.n})")
        return g


def _scatter(out: torch.Tensor, writes: dict[int, int]) -> None:
    """out.view(-1)[i] = v for every (i, v) in writes."""
    if writes:
        idx = torch.tensor(list(writes.keys()), dtype=torch.int64, device=out.device)
        out.view(-1)[idx] = torch.tensor(list(writes.values()), dtype=out.dtype, device=out.device)


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,  # [bs * N] int32, written on the accepted path
    accept_index: torch.Tensor,  # [bs, num_spec] int32, written at 0..k
    accept_token_num: torch.Tensor,  # [bs] int32
    candidates: torch.Tensor,  # [bs, N] int64
    retrive_index: torch.Tensor,  # [bs, N] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64
    uniform_samples: torch.Tensor,  # [bs, N] fp32, one coin per node (decides among its children)
    uniform_samples_for_final_sampling: torch.Tensor,  # [bs] fp32
    target_probs: torch.Tensor,  # [bs, N, vocab] fp32 target distribution after each node
    draft_probs: torch.Tensor,  # [bs, N, vocab] fp32, caller-zeroed; rejected tokens written
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Tree speculative sampling in place (see the ref); lossless at thresholds 1.0."""
    bs, n, device = _check_tree_inputs(
        predicts, accept_index, accept_token_num, candidates,
        {"retrive_index": retrive_index, "retrive_next_token": retrive_next_token,
         "retrive_next_sibling": retrive_next_sibling},
    )
    _check_sampling_inputs(uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
                           threshold_single, threshold_acc, bs=bs, n=n, device=device)
    impl = select_impl("tree_speculative_sampling_target_only", tree_speculative_sampling_target_only_ref, device)
    impl(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
         retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
         draft_probs, threshold_single, threshold_acc, deterministic)


def tree_speculative_sampling_target_only_ref(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Specification of ``tree_speculative_sampling_target_only`` (fp32 arithmetic, like the kernel).

    Walk down from the root. At node p (its coin u = uniform_samples[b, p], q = target_probs[b, p])
    scan p's children c1 < c2 < ... keeping acc = q[tok(c1)] + ... + q[tok(ci)]:
      accept ci if u <= acc / threshold_acc or q[tok(ci)] >= threshold_single
        -> predicts[p] = tok(ci), continue from ci with its own coin and acc = 0;
      else reject ci: draft_probs[b, p, tok(ci)] = q[tok(ci)], try the next sibling.
    Stop when every child is rejected or num_spec - 1 nodes are accepted. At the last accepted
    node L, predicts[L] = a draw from relu(target_probs[b, L] - draft_probs[b, L]) (plain
    target_probs[b, L] when num_spec - 1 nodes were accepted) with coin
    uniform_samples_for_final_sampling[b], by ``residual_draw_ref`` (inverse-CDF in vocab order,
    in 2**-40 fixed point; target_probs[b, L] itself if the residual is all zero). At thresholds
    1.0 this is inverse-CDF sampling from q with the children's tokens first, so the emitted
    tokens follow the target exactly (sibling tokens must be distinct). Example, vocab 4::

              0          q(0) = [.1 .5 .3 .1]   children tokens: node 1 -> 1, node 2 -> 2
             / \\         coin(0) = 0.7: node 1: acc .5 < .7 reject (draft_probs[0,0,1] = .5)
            1   2                       node 2: acc .8 >= .7 accept; predicts[0] = 2
                         node 2 is a leaf: residual = q(2) - draft_probs[0, 2] = q(2) (zeros)

    ``deterministic`` only selects the GPU scan algorithm; the reference ignores it.
    """
    bs, n = candidates.shape
    vocab = target_probs.shape[2]
    num_spec = accept_index.shape[1]
    cand = candidates.tolist()
    q_host = target_probs.detach().cpu().numpy()  # [bs, N, vocab], read only
    coins = uniform_samples.cpu().numpy()  # [bs, N] float32
    th_single = np.float32(threshold_single)
    th_acc = np.float32(max(threshold_acc, 1e-9))  # NOTE: the kernel caps it the same way
    walks = _TreeWalk.per_request(retrive_index, retrive_next_token, retrive_next_sibling)
    predicts_writes: dict[int, int] = {}
    accept_writes: dict[int, int] = {}
    rejected: list[tuple[int, int, int]] = []  # (b, parent node, token) written into draft_probs
    last_node, last_global, num_accepted = [0] * bs, [0] * bs, [0] * bs
    for b, walk in enumerate(walks):
        node, last = 0, walk.global_index(0)
        path = [last]
        while len(path) < num_spec:
            coin, acc, accepted = coins[b, node], np.float32(0.0), -1
            for child in walk.children(node):
                tok = cand[b][child]
                if not 0 <= tok < vocab:
                    raise ValueError(f"candidates: request {b} node {child} has token {tok} outside [0, {vocab})")
                q_tok = q_host[b, node, tok]
                acc = np.float32(acc + q_tok)
                if coin <= acc / th_acc or q_tok >= th_single:
                    accepted = child
                    break
                rejected.append((b, node, tok))
            if accepted == -1:
                break
            predicts_writes[last] = cand[b][accepted]
            node, last = accepted, walk.global_index(accepted)
            path.append(last)
        accept_writes.update({b * num_spec + j: g for j, g in enumerate(path)})
        last_node[b], last_global[b], num_accepted[b] = node, last, len(path) - 1
    if rejected:
        b_idx, p_idx, t_idx = (torch.tensor(col, device=draft_probs.device) for col in zip(*rejected))
        draft_probs[b_idx, p_idx, t_idx] = target_probs[b_idx, p_idx, t_idx]
    bonus = _sample_residual(
        target_probs, draft_probs, last_node, num_accepted, num_spec, uniform_samples_for_final_sampling
    )
    predicts_writes.update(zip(last_global, bonus))
    _scatter(predicts, predicts_writes)
    _scatter(accept_index, accept_writes)
    accept_token_num.copy_(torch.tensor(num_accepted, dtype=torch.int32))


def _sample_residual(
    target_probs: torch.Tensor,  # [bs, N, vocab]
    draft_probs: torch.Tensor,  # [bs, N, vocab]
    last_node: list[int],
    num_accepted: list[int],
    num_spec: int,
    coins: torch.Tensor,  # [bs]
) -> list[int]:
    """One draw per request from relu(q - p) at its last accepted node (p = 0 after a full path)."""
    device = target_probs.device
    rows = torch.arange(len(last_node), device=device)
    nodes = torch.tensor(last_node, dtype=torch.int64, device=device)
    q = target_probs[rows, nodes]  # [bs, vocab]
    full_path = torch.tensor(num_accepted, device=device) == num_spec - 1
    p = torch.where(full_path[:, None], torch.zeros_like(q), draft_probs[rows, nodes])  # [bs, vocab]
    return residual_draw_ref(q, p, coins.to(device)).tolist()
