"""Runs llama.cpp's own convert_hf_to_gguf.py on one of our checkpoints, with one change: the
BPE pre-tokenizer is named "gpt-2".

Our tokenizer.json (python/train_small_model.py) is a byte-level BPE whose pre-tokenizer is
ByteLevel(use_regex=True), the GPT-2 split regex; the converter identifies pre-tokenizers by the
hash of a test string's token ids, which no model in its table shares with our 8192-token vocabulary,
so it stops with "BPE pre-tokenizer was not recognized". "gpt-2" is llama.cpp's name for that same
regex (LLAMA_VOCAB_PRE_TYPE_GPT2); prepare.sh checks that llama.cpp then tokenizes the held-out
prompts into the ids of heldout_prompts.ids.

    python3 convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf [converter flags, e.g. --outtype bf16]
"""
import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama, model, out, rest = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    sys.path[:0] = [str(llama / "gguf-py"), str(llama)]
    from conversion.base import TextModel  # llama.cpp's converter package, from LLAMA_CPP_DIR

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, *rest]
    runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
