"""Export one of our checkpoints in Hugging Face's Marian format, so it runs in `transformers` and,
through `ct2-transformers-converter`, in CTranslate2.

    python -m model.export_marian --checkpoint runs/small --out hf/small
    python -m model.export_marian --package models/de-en --out hf/de-en    # weights read from the graphs
    ct2-transformers-converter --model hf/small --output_dir ct2/small [--quantization int8]

The weights are the same function, rewritten for Marian's conventions:

- positions: Marian puts all sines first, then all cosines; ours interleave them. Permuting the
  d_model dimensions of every tensor on the residual stream (embedding columns, the inputs of the
  projections that read it, the outputs of those that write it, the LayerNorm parameters) turns one
  layout into the other exactly, since LayerNorm and the dot products do not care about the order.
- ids: Marian wants `</s>` = 0 and `<pad>` last, and starts decoding from `<pad>`. Our `<s>` (the
  decoder start) becomes that last `<pad>` entry, `</s>` and `<unk>` move to 0 and 1, the pieces
  keep their order; our own `<pad>` row (never read: padded source positions are masked) is dropped.
- tokens the model must never write (the decoder start, our language tags) get a -10,000 output
  bias, so every engine bans them without being told, as our engine does.

Both source.spm and target.spm are our one joint SentencePiece model; vocab.json maps its pieces to
the new ids. A multi-directional checkpoint expects its target tag (e.g. `<2en>`) at the start of
the source text. A model package (`--package`) gives its weights through model.upgrade, which reads
them back out of its ONNX graphs (int8 weights dequantized). `transformers` is needed here only (the
`marian` extra).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from .checkpoint import load_checkpoint
from .import_marian import marian_names
from .tokenizer import Tokenizer
from .transformer import Transformer, sinusoidal_positional_encoding

BANNED_BIAS = -1e4  # fits fp16; exp(-1e4) is 0 in every precision


def to_halves_layout(model: Transformer) -> Transformer:
    """Permutes the residual stream's dimensions so the model computes the same function with Marian's
    positional-encoding layout (pe_layout="halves"). In place; returns the model."""
    c = model.config
    if c.pe_layout == "halves":
        return model
    d = c.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # new dim m reads old dim perm[m]

    def reads(linear):    # input side on the residual stream: permute columns
        linear.weight.data = linear.weight.data[:, perm]

    def writes(linear):   # output side on the residual stream: permute rows and bias
        linear.weight.data = linear.weight.data[perm]
        linear.bias.data = linear.bias.data[perm]

    def norm(ln):
        ln.weight.data, ln.bias.data = ln.weight.data[perm], ln.bias.data[perm]

    def attention(a):
        for w in (a.w_q, a.w_k, a.w_v):
            reads(w)
        writes(a.w_o)

    with torch.no_grad():
        model.embed.weight.data = model.embed.weight.data[:, perm]
        for layer in list(model.encoder or []) + list(model.decoder):
            attention(layer.self_attn)
            if getattr(layer, "cross_attn", None) is not None:
                attention(layer.cross_attn)
            reads(layer.ff.w_1)
            writes(layer.ff.w_2)
            for name in ("norm1", "norm2", "norm3"):
                if getattr(layer, name, None) is not None:
                    norm(getattr(layer, name))
    c.pe_layout = "halves"
    model.pe = sinusoidal_positional_encoding(c.max_len, d, "halves").to(model.pe)
    return model


def marian_vocabulary(tok: Tokenizer) -> tuple[list[int], list[str]]:
    """Our ids in Marian's order, and the piece each new id has: </s>, <unk>, the pieces, then <s> as <pad>."""
    sp = tok.sp
    V = sp.get_piece_size()
    order = [3, 1, *range(4, V), 2]
    pieces = ["</s>", "<unk>", *(sp.id_to_piece(i) for i in range(4, V)), "<pad>"]
    return order, pieces


def write_marian_vocabulary(tok: Tokenizer, out: Path) -> list[str]:
    """source.spm and target.spm (our one joint model) and vocab.json in Marian's id order into `out`;
    -> the pieces by Marian id (<pad>, Marian's decoder start, last)."""
    _, pieces = marian_vocabulary(tok)
    for side in ("source", "target"):
        shutil.copy(tok.model_file, out / f"{side}.spm")
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False, indent=0))
    return pieces


def export_marian(checkpoint: str | Path, out: str | Path) -> Path:
    """One of our checkpoints (a run directory or .pt file) -> a Marian directory."""
    model, tok, info = load_checkpoint(checkpoint)
    langs = info.get("langs") or ["de", "en"]
    return write_marian(model, tok, out, directions=info.get("directions") or [f"{langs[0]}-{langs[1]}"])


def export_package_marian(package: str | Path, out: str | Path, *, zero_bos: bool = False) -> Path:
    """A model package of ours -> a Marian directory, its weights read back out of its graphs."""
    from .upgrade import load_weights

    model, meta = load_weights(Path(package))
    return write_marian(model, Tokenizer(Path(package) / meta["tokenizer"]["source"]), out,
                        directions=meta["directions"], zero_bos=zero_bos)


def _marian_ready(model: Transformer, zero_bos: bool) -> Transformer:
    """Refuses what Marian cannot hold; zeroes (or warns about) a learned <s> embedding."""
    c = model.config
    if c.arch != "encoder-decoder":
        raise SystemExit("only translation checkpoints (arch encoder-decoder) have a Marian format")
    if (c.pad_id, c.bos_id, c.eos_id) != (0, 2, 3):
        raise SystemExit("expected our fixed special ids <pad>=0 <unk>=1 <s>=2 </s>=3")
    if model.embed.weight[c.bos_id].abs().max() > 0 and zero_bos:
        print("note: this model learned an embedding for <s> (trained before zero_bos_embedding); it is "
              "written as zeros, as CTranslate2 starts Marian decoders from a zero vector", file=sys.stderr)
        with torch.no_grad():
            model.embed.weight[c.bos_id].zero_()
    elif model.embed.weight[c.bos_id].abs().max() > 0:
        print("warning: this checkpoint learned an embedding for <s> (trained before zero_bos_embedding): "
              "transformers runs the export as we do, but CTranslate2 starts Marian decoders from a zero "
              "vector, so its translations will differ", file=sys.stderr)
    return model


def write_marian(model: Transformer, tok: Tokenizer, out: str | Path, *, directions: list[str],
                 zero_bos: bool = False) -> Path:
    """Writes `model` (ours, with tokenizer `tok`) as a Marian directory `out`; the tokenizer's languages
    are directions[0]'s. `zero_bos` sets a learned <s> embedding to zero, as CTranslate2 assumes, so
    that every engine runs the same function (off: it is kept, with a warning)."""
    try:
        from transformers import MarianConfig, MarianMTModel, MarianTokenizer
    except ImportError:
        raise SystemExit("model.export_marian needs transformers: pip install -e '.[marian]'") from None
    c = model.config
    model = to_halves_layout(_marian_ready(model, zero_bos).float().eval())
    order, pieces = marian_vocabulary(tok)
    V = len(order)
    pad = V - 1
    hf_config = MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=c.d_model, encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.h, decoder_attention_heads=c.h,
        encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, max_position_embeddings=c.max_len,
        activation_function={"relu": "relu", "swish": "swish", "gelu": "gelu"}[c.activation],
        scale_embedding=c.scale_embedding, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        bad_words_ids=[[pad]], share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        num_beams=4, max_length=c.max_len)
    hf = MarianMTModel(hf_config).eval()
    ours = model.state_dict()
    index = torch.tensor(order)
    state = {}
    for name, theirs in marian_names(c).items():
        value = ours[name]
        if name == "embed.weight":
            value = value[index]
        elif name == "final_logits_bias":
            value = value[index].clone()
            value[[pad] + [order.index(tok.lang_id(lang)) for lang in tok.languages()]] = BANNED_BIAS
            value = value[None]                                          # (1, V) in Marian
        state[theirs] = value
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # Left to Marian: its tied copies of the shared embedding and its own sinusoidal table.
    left = [k for k in missing if not k.endswith(("embed_tokens.weight", "embed_positions.weight", "lm_head.weight"))]
    if left or unexpected:
        raise RuntimeError(f"weights not mapped: missing {left}, unexpected {unexpected}")
    hf.tie_weights()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    write_marian_vocabulary(tok, out)
    s, t = directions[0].split("-")
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                    source_lang=s, target_lang=t).save_pretrained(out)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description="Write a checkpoint or model package of ours in Hugging Face's Marian format.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="run directory from model.train (best.pt is used)")
    src.add_argument("--package", help="a translation model package of ours (weights read from its graphs)")
    p.add_argument("--out", required=True,
                   help="directory to write (config.json, model.safetensors, *.spm, vocab.json)")
    args = p.parse_args(argv)
    out = (export_marian(args.checkpoint, args.out) if args.checkpoint
           else export_package_marian(args.package, args.out))
    print(f"wrote {out}: load it with MarianMTModel.from_pretrained, or convert it with "
          f"ct2-transformers-converter --model {out} --output_dir ...")


if __name__ == "__main__":
    main()
