"""SentencePiece tokenizer: training and loading, with fixed special-token ids.

One joint German+English vocabulary serves both translation directions, so source, target and
output embeddings can be tied. The ids of the special tokens are fixed for every model we train,
because the serving engine and `model.json` rely on them:

    <pad> = 0, <unk> = 1, <s> (bos) = 2, </s> (eos) = 3, then one `<2xx>` tag per language.

A `<2xx>` tag at the start of the source tells a multi-direction model which language to write
(Johnson et al., 2017); a single-direction model simply never sees one.

A back-translated source (its text machine-made, model/back_translate.py) gets the `<bt>` piece after that tag
(Caswell et al., 2019, tagged back-translation): the tag keeps position 0, where every source the model has
trained on has had it, and `<bt>` is one more piece after it. `<bt>` is a control symbol appended to a trained
vocabulary by model/vocab.py (the id is wherever it was appended): SentencePiece never matches it in text, so only
the trainer, by id, puts it anywhere, and the service never sees or writes it.
"""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
BT_PIECE = "<bt>"          # marks a back-translated (machine-made) source


def lang_tag(lang: str) -> str:
    """The source-side token that asks for output in `lang` (e.g. ``<2en>``)."""
    return f"<2{lang}>"


@dataclass(frozen=True)
class SpecialIds:
    pad: int = PAD_ID
    unk: int = UNK_ID
    bos: int = BOS_ID
    eos: int = EOS_ID


class Tokenizer:
    """A loaded SentencePiece model with our special ids and language tags."""

    def __init__(self, model_file: str | Path):
        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"{self.model_file}: special ids (pad, unk, bos, eos) are {ids}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train it with model.tokenizer.train_tokenizer"
            )
        self.special = SpecialIds()
        self.tag_ids = {self.sp.piece_to_id(lang_tag(lang)): lang for lang in self.languages()}

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def lang_id(self, lang: str) -> int:
        """Id of the `<2xx>` tag for `lang`; ValueError if this vocabulary has none."""
        piece = lang_tag(lang)
        i = self.sp.piece_to_id(piece)
        if i == UNK_ID:
            raise ValueError(f"tokenizer {self.model_file.name} has no language tag {piece}; "
                             f"it has {self.languages() or 'none'}")
        return i

    def languages(self) -> list[str]:
        """Languages that have a `<2xx>` tag in this vocabulary."""
        out = []
        for i in range(EOS_ID + 1, min(self.vocab_size, 64)):
            p = self.sp.id_to_piece(i)
            if p.startswith("<2") and p.endswith(">"):
                out.append(p[2:-1])
        return out

    def encode(self, text: str) -> list[int]:
        """Text to piece ids, without bos/eos."""
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Piece ids to text; special tokens and language tags are dropped."""
        keep = [i for i in ids if i > EOS_ID and i not in self.tag_ids]
        return self.sp.decode(keep)

    def bt_id(self) -> int:
        """Id of the `<bt>` piece; ValueError if this vocabulary has none."""
        i = self.sp.piece_to_id(BT_PIECE)
        if i == UNK_ID:
            raise ValueError(f"tokenizer {self.model_file} has no {BT_PIECE} piece for back-translated sources: "
                             f"extend the package first, python -m model.vocab PACKAGE --add '{BT_PIECE}' --out DIR, "
                             "and train from it (--init-from DIR)")
        return i

    def source_prefix(self, target_lang: str | None = None, synthetic: bool = False) -> list[int]:
        """What comes before a source's pieces: the `<2xx>` tag if any, then `<bt>` if the source is synthetic."""
        return ([self.lang_id(target_lang)] if target_lang else []) + ([self.bt_id()] if synthetic else [])

    def source_ids(self, text: str, target_lang: str | None = None, synthetic: bool = False) -> list[int]:
        """Encoder input: optional `<2xx>` tag, `<bt>` for a back-translated source, the pieces, then eos."""
        return self.source_prefix(target_lang, synthetic) + self.encode(text) + [EOS_ID]


def train_tokenizer(
    texts: Iterable[str],
    model_prefix: str | Path,
    *,
    vocab_size: int = 8000,
    languages: Sequence[str] = (),
    model_type: str = "unigram",
    character_coverage: float = 0.9999,
    input_sentence_size: int = 2_000_000,
    seed_sentencepiece_size: int = 1_000_000,
) -> Tokenizer:
    """Train a SentencePiece model on `texts` and return it loaded.

    `languages` adds one `<2xx>` tag each, right after the four fixed specials. Writes
    `<model_prefix>.model` and `<model_prefix>.vocab`.
    """
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    # Feed sentences from memory: no temporary corpus file, deterministic order.
    sentences = [t for t in texts if t.strip()]
    if not sentences:
        raise ValueError("train_tokenizer: no non-empty text to train on")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        user_defined_symbols=[lang_tag(lang) for lang in languages],
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        seed_sentencepiece_size=seed_sentencepiece_size,
        # Small corpora cannot always fill the vocabulary; shrink it instead of failing.
        hard_vocab_limit=False,
        # SentencePiece's default NMT normalisation (NFKC plus whitespace clean-up) also runs on
        # user input at serving time, so both sides see the same text.
        normalization_rule_name="nmt_nfkc",
        num_threads=2,
        minloglevel=2,
    )
    model_file = model_prefix.with_suffix(".model")
    model_file.write_bytes(buf.getvalue())
    tok = Tokenizer(model_file)
    model_prefix.with_suffix(".vocab").write_text(
        "".join(f"{tok.sp.id_to_piece(i)}\t{tok.sp.get_score(i)}\n" for i in range(tok.vocab_size)),
        encoding="utf-8",
    )
    return tok


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a joint SentencePiece model on a parallel TSV corpus.")
    p.add_argument("--data", required=True, help="train.tsv written by model.data (de<TAB>en<TAB>origin)")
    p.add_argument("--out", required=True, help="model prefix, e.g. runs/small/spm")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--langs", default="de,en", help="languages that get a <2xx> tag (comma-separated; '' for none)")
    args = p.parse_args(argv)
    texts = []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            texts.extend(cols[:2])
    langs = [x for x in args.langs.split(",") if x]
    tok = train_tokenizer(texts, args.out, vocab_size=args.vocab_size, languages=langs)
    print(f"wrote {tok.model_file} ({tok.vocab_size} pieces, tags {tok.languages()})")


if __name__ == "__main__":
    main()
