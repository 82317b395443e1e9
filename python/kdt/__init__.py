"""kdtree-engine from Python: the ops of libkdt.so on numpy arrays and torch CUDA tensors.

    import kdt
    tree = kdt.tree_build(scores, tokens, root_token, seq_len, budget=64)
    acc = kdt.tree_accept(tree.node_token, tree.node_parent, tree.num_nodes, target_pred)

See python/README.md for the conventions (backends, dtypes, out=, errors) and the SGLang layout.
The library is found through $KDT_LIB, else the copy installed inside this package, else the
source tree's build/libkdt.so; it is loaded on the first op call."""
from ._lib import KdtError, LibraryNotFound
from .ops import Result, kv_commit, tree_accept, tree_build, tree_sample_accept, verify_attn
from .sglang import sglang_verify_inputs
from .tokenizer import Tokenizer

__version__ = "0.1.0"
__all__ = ["tree_build", "verify_attn", "tree_accept", "tree_sample_accept", "kv_commit", "sglang_verify_inputs",
           "Result", "KdtError", "LibraryNotFound", "cuda_available", "library_path", "Tokenizer"]


def cuda_available():
    """True when libkdt.so was built with CUDA and a CUDA device is visible."""
    from ._lib import lib
    return bool(lib().kdt_cuda_available())


def library_path():
    """The path of the loaded libkdt.so (loading it if needed)."""
    from ._lib import lib
    return lib().path
