"""Import a Hugging Face Marian checkpoint (the OPUS-MT family) as a model package.

    python -m model.import_marian path/to/opus-mt-de-en --out models/opus-mt-de-en \
        [--quantize int8 --calibration data/de-en/dev.tsv | --quantize int8-rows] [--int8-weight-bits 7]
    python -m model.import_marian Helsinki-NLP/opus-mt-de-en --out models/opus-mt-de-en   # needs a network

SRC is a directory written by `save_pretrained` (config.json, the weights, source.spm, target.spm,
vocab.json) or a hub id, fetched with huggingface_hub. The weights go through our own Transformer
(model/transformer.py), so the package is exported by the very code that exports our checkpoints.

Marian differs from the paper's model in ways the config already names:

- sinusoidal positions with all sines first, then all cosines (`pe_layout="halves"`);
- embeddings scaled by sqrt(d_model) or not (`scale_embedding`), swish/gelu/relu feed-forward;
- a bias on the output projection (`final_logits_bias`), the embedding shared by encoder input,
  decoder input and output projection;
- its own id space: `vocab.json` maps the pieces of two SentencePiece models (source.spm,
  target.spm) to ids, with `</s>` = 0 and `<pad>` last, which is also the decoder start token.
  The package keeps vocab.json and both SentencePiece models; the engine looks pieces up in it.

int8 (model/quantize.py): `--quantize int8` sets constant activation scales from calibration text
(`--calibration`: source<TAB>target, or model.data's de/en/origin TSV read in the package's direction);
`--quantize int8-rows` scales each row at run time and needs none.

`transformers` is needed here only (the `marian` extra); the service reads the package alone.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from .calibrate import Calibration, read_calibration
from .export import write_package
from .quantize import SCHEMES, add_weight_bits_flag
from service.shared.package import INT8_DEFAULT_WEIGHT_BITS
from .transformer import Transformer, TransformerConfig

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SystemExit("model.import_marian needs transformers: pip install -e '.[marian]'") from None


def marian_config(hf) -> TransformerConfig:
    """Our config for a transformers MarianConfig; refuses what our Transformer cannot represent."""
    problems = []
    if hf.encoder_attention_heads != hf.decoder_attention_heads:
        problems.append(f"encoder/decoder heads differ ({hf.encoder_attention_heads} vs {hf.decoder_attention_heads})")
    if hf.encoder_ffn_dim != hf.decoder_ffn_dim:
        problems.append(f"encoder/decoder d_ff differ ({hf.encoder_ffn_dim} vs {hf.decoder_ffn_dim})")
    shared = getattr(hf, "share_encoder_decoder_embeddings", True)
    if not shared or (hf.decoder_vocab_size or hf.vocab_size) != hf.vocab_size:
        problems.append("separate source and target vocabularies (share_encoder_decoder_embeddings=false)")
    if hf.activation_function not in ACTIVATIONS:
        problems.append(f"activation {hf.activation_function!r} (supported: {', '.join(sorted(ACTIVATIONS))})")
    if problems:
        raise ValueError("unsupported Marian checkpoint: " + "; ".join(problems))
    return TransformerConfig(
        arch="encoder-decoder", vocab_size=hf.vocab_size, d_model=hf.d_model, h=hf.encoder_attention_heads,
        d_ff=hf.encoder_ffn_dim, n_encoder_layers=hf.encoder_layers, n_decoder_layers=hf.decoder_layers,
        dropout=0.0, max_len=hf.max_position_embeddings, pad_id=hf.pad_token_id,
        bos_id=hf.decoder_start_token_id, eos_id=hf.eos_token_id, scale_embedding=bool(hf.scale_embedding),
        activation=ACTIVATIONS[hf.activation_function], pe_layout="halves")


# Our parameter names -> Marian's, per layer ({i}); the attention and feed-forward blocks map one to one.
_ATTN = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}


def _layer_names(ours: str, theirs: str, blocks: dict[str, str]) -> dict[str, str]:
    names = {}
    for our_block, their_block in blocks.items():
        for a, b in _ATTN.items():
            for p in ("weight", "bias"):
                names[f"{ours}.{our_block}.{a}.{p}"] = f"{theirs}.{their_block}.{b}.{p}"
    return names


def marian_names(config: TransformerConfig) -> dict[str, str]:
    """Every parameter of our Transformer -> its name in a MarianMTModel state dict."""
    names = {"embed.weight": "model.shared.weight", "final_logits_bias": "final_logits_bias"}
    for i in range(config.n_encoder_layers):
        ours, theirs = f"encoder.{i}", f"model.encoder.layers.{i}"
        names |= _layer_names(ours, theirs, {"self_attn": "self_attn"})
        for p in ("weight", "bias"):
            names |= {f"{ours}.norm1.{p}": f"{theirs}.self_attn_layer_norm.{p}",
                      f"{ours}.ff.w_1.{p}": f"{theirs}.fc1.{p}", f"{ours}.ff.w_2.{p}": f"{theirs}.fc2.{p}",
                      f"{ours}.norm2.{p}": f"{theirs}.final_layer_norm.{p}"}
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.{i}", f"model.decoder.layers.{i}"
        names |= _layer_names(ours, theirs, {"self_attn": "self_attn", "cross_attn": "encoder_attn"})
        for p in ("weight", "bias"):
            names |= {f"{ours}.norm1.{p}": f"{theirs}.self_attn_layer_norm.{p}",
                      f"{ours}.norm2.{p}": f"{theirs}.encoder_attn_layer_norm.{p}",
                      f"{ours}.ff.w_1.{p}": f"{theirs}.fc1.{p}", f"{ours}.ff.w_2.{p}": f"{theirs}.fc2.{p}",
                      f"{ours}.norm3.{p}": f"{theirs}.final_layer_norm.{p}"}
    return names


def from_marian(hf_model) -> Transformer:
    """A transformers MarianMTModel -> our Transformer with the same weights."""
    config = marian_config(hf_model.config)
    model = Transformer(config)
    theirs = hf_model.state_dict()
    state = {}
    for ours, name in marian_names(config).items():
        if name not in theirs:
            raise ValueError(f"the Marian checkpoint has no {name}")
        state[ours] = theirs[name].reshape(model.state_dict()[ours].shape).float()
    # The output projection must be the shared embedding: our generator is tied to it.
    lm_head = theirs.get("lm_head.weight")
    if lm_head is not None and not torch.equal(lm_head, theirs["model.shared.weight"]):
        raise ValueError("unsupported Marian checkpoint: lm_head is not tied to the shared embedding")
    model.load_state_dict(state, strict=True)
    return model.eval()


def languages_of(src: str | Path, tokenizer_config: dict) -> tuple[str, str] | None:
    """(source, target) from tokenizer_config.json, or from an opus-mt-xx-yy name."""
    s, t = tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang")
    if isinstance(s, str) and isinstance(t, str) and s and t:
        return s, t
    m = re.search(r"opus-mt-([a-z]{2,3})-([a-z]{2,3})$", str(src).rstrip("/"))
    return (m.group(1), m.group(2)) if m else None


def resolve(src: str | Path) -> Path:
    """A local directory as is; otherwise a hub id downloaded with huggingface_hub."""
    path = Path(src)
    if path.is_dir():
        return path
    if path.exists() or str(src).startswith((".", "/")):
        raise SystemExit(f"{src}: not a directory with a Marian checkpoint")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SystemExit("downloading a hub id needs huggingface_hub (pip install -e '.[marian]')") from None
    return Path(snapshot_download(str(src), allow_patterns=["*.json", "*.spm", "*.safetensors", "*.bin"]))


def import_marian(src: str | Path, out: str | Path, *, source_lang: str | None = None, target_lang: str | None = None,
                  quantize: str | None = None, calibration: str | Path | Calibration | None = None,
                  fp16: bool = False, name: str | None = None,
                  weight_bits: int = INT8_DEFAULT_WEIGHT_BITS) -> Path:
    """Converts a Marian checkpoint into a model package; returns the model.json path. quantize "int8"
    needs `calibration`: a TSV path (see calibration_text) or model.calibrate's list of (source, target
    language); int8's weights in `weight_bits` (model/quantize.py)."""
    _require_transformers()
    from transformers import MarianMTModel

    path = resolve(src)
    for f in ("config.json", "source.spm", "target.spm", "vocab.json"):
        if not (path / f).is_file():
            raise SystemExit(f"{path / f}: missing (a Marian checkpoint has config.json, the weights, "
                             "source.spm, target.spm and vocab.json)")
    hf = MarianMTModel.from_pretrained(str(path)).eval()
    model = from_marian(hf)
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    if len(vocab) != model.config.vocab_size or sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{path / 'vocab.json'}: {len(vocab)} entries with ids that are not 0..{len(vocab) - 1}, "
                         f"the model has {model.config.vocab_size}")
    tk_path = path / "tokenizer_config.json"
    tk_config = json.loads(tk_path.read_text(encoding="utf-8")) if tk_path.is_file() else {}
    found = languages_of(src, tk_config)
    langs = (source_lang or (found and found[0]), target_lang or (found and found[1]))
    if not all(langs):
        raise SystemExit(f"cannot tell the languages of {src}: pass --source-lang and --target-lang")
    direction = f"{langs[0]}-{langs[1]}"
    if isinstance(calibration, (str, Path)):
        calibration = calibration_text(calibration, direction)
    c = model.config
    unk = vocab.get("<unk>", 1)
    return write_package(
        model, out, files={"source.spm": path / "source.spm", "target.spm": path / "target.spm",
                           "vocab.json": path / "vocab.json"},
        tokenizer={"source": "source.spm", "target": "target.spm", "vocab": "vocab.json"},
        special_ids={"pad": c.pad_id, "unk": unk, "bos": c.bos_id, "eos": c.eos_id},
        languages=sorted(set(langs)), directions=[direction], target_tags={},
        training={"imported_from": str(src), "format": "marian"}, model_card=path / "README.md",
        quantize=quantize, calibration=calibration, fp16=fp16, name=name or Path(out).name, weight_bits=weight_bits)


def calibration_text(path: str | Path, direction: str) -> Calibration:
    """Source sentences of a TSV for `direction`: model.data's de/en/origin file read in that direction, or
    source<TAB>target as is."""
    return read_calibration(path, {"task": "translation", "directions": [direction]})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Import a Hugging Face Marian (OPUS-MT) checkpoint as a model package.")
    p.add_argument("src", help="a save_pretrained directory, or a hub id such as Helsinki-NLP/opus-mt-de-en")
    p.add_argument("--out", required=True, help="package directory to write, e.g. models/opus-mt-de-en")
    p.add_argument("--source-lang", help="source language code (default: from tokenizer_config.json or the name)")
    p.add_argument("--target-lang", help="target language code (default: from tokenizer_config.json or the name)")
    p.add_argument("--quantize", choices=list(SCHEMES), default=None,
                   help="int8 weights and activations for CPU serving (model/quantize.py): int8 with constant "
                        "activation scales set from --calibration text (faster), int8-rows with each row's own "
                        "scale computed at run time (no calibration text)")
    p.add_argument("--calibration", default=None,
                   help="text that sets --quantize int8's activation scales: a TSV, source<TAB>target or "
                        "model.data's de/en/origin file (read in the package's direction), e.g. data/de-en/dev.tsv")
    add_weight_bits_flag(p)
    p.add_argument("--fp16", action="store_true", help="half-precision graphs (GPU serving)")
    p.add_argument("--name", default=None, help="model id shown by the service (default: the directory name)")
    args = p.parse_args(argv)
    path = import_marian(args.src, args.out, source_lang=args.source_lang, target_lang=args.target_lang,
                         quantize=args.quantize, calibration=args.calibration, fp16=args.fp16, name=args.name,
                         weight_bits=args.int8_weight_bits)
    meta = json.loads(path.read_text())
    sizes = ", ".join(f"{k} {v['bytes'] / 1e6:.1f} MB" for k, v in meta["files"].items())
    print(f"wrote {path.parent} ({meta['precision']}, {meta['directions'][0]}): {sizes}")


if __name__ == "__main__":
    main()
