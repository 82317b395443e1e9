"""tree_build's outputs in the layout of SGLang's EAGLE verify path.

SGLang's `EagleVerifyInput` (python/sglang/srt/speculative/eagle_info.py) and the
`verify_tree_greedy` / `tree_speculative_sampling_target_only` kernels of sgl-kernel
(csrc/speculative/eagle_utils.cu) take, for bs requests of draft_token_num = Q rows each:

| SGLang field            | shape, dtype           | from tree_build                                  |
|-------------------------|------------------------|--------------------------------------------------|
| draft_token             | [bs * Q] int64         | node_token (row 0 is the root / verified id)      |
| custom_mask             | [bs * Q * Q] bool      | tree_mask (the QLEN_ONLY mode: tree columns only; |
|                         |                        | the prefix is always visible)                     |
| positions               | [bs * Q] int64         | positions (seq_len + depth)                       |
| retrive_index           | [bs, Q] int64          | b * Q + i: row of node i in the flattened batch   |
| retrive_next_token      | [bs, Q] int64          | first_child (lowest-index child; -1 none)         |
| retrive_next_sibling    | [bs, Q] int64          | next_sibling (next higher-index sibling; -1 end)  |

Both sides keep children in increasing index order, so SGLang's greedy walk and kdt.tree_accept
accept the same path. SGLang's accept_index holds retrive_index values (b * Q + i); kdt's holds i.

SGLang always verifies Q rows; a kdt tree may have fewer than budget nodes (num_nodes[b] < N), and
its fill slots hold -1. With pad=True (the default) each fill slot becomes a harmless extra row
that no walk reaches: the root's token and position, and a mask row that sees the root and
itself, so the target model can run every row."""
import numpy as np

from ._tensors import _is_torch
from .ops import Result


def sglang_verify_inputs(tree, pad=True):
    """The SGLang verify fields (table above) from a tree_build Result, numpy or torch alike."""
    tok, pos, mask = tree["node_token"], tree["positions"], tree["tree_mask"]
    nxt, sib = tree["first_child"], tree["next_sibling"]
    B, Q = tok.shape
    if _is_torch(tok):
        import torch
        i64 = torch.int64
        dev = tok.device
        cast = lambda x: x.to(i64)  # noqa: E731
        arange = torch.arange(B * Q, dtype=i64, device=dev).view(B, Q)
        eye = torch.eye(Q, dtype=torch.bool, device=dev)
        where, to_bool = torch.where, (lambda x: x.to(torch.bool))
    else:
        cast = lambda x: np.asarray(x).astype(np.int64)  # noqa: E731
        arange = np.arange(B * Q, dtype=np.int64).reshape(B, Q)
        eye = np.eye(Q, dtype=bool)
        where, to_bool = np.where, (lambda x: np.asarray(x).astype(bool))
    tok, pos, m = cast(tok), cast(pos), to_bool(mask)
    if pad:
        cols = arange[:1]                            # [1, Q]: 0 .. Q-1
        fill = cols > cast(tree["num_nodes"])[:, None]  # [B, Q]: slots past the last node
        tok = where(fill, tok[:, :1], tok)
        pos = where(fill, pos[:, :1], pos)
        root_col = eye[0][None, None, :]             # [1, 1, Q]: column 0
        fill_row = fill[:, :, None] & (eye[None] | root_col)
        m = m | fill_row
    return Result(draft_token=tok.reshape(B * Q), custom_mask=m.reshape(B * Q * Q),
                  positions=pos.reshape(B * Q), retrive_index=arange,
                  retrive_next_token=cast(nxt), retrive_next_sibling=cast(sib), draft_token_num=Q)
