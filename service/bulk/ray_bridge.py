"""Ray Data over the in-process engine: a column of a dataset translated on as many machines as the Ray cluster
has, the model package loaded once per actor (Ray's batch-inference pattern: a callable class for
`Dataset.map_batches` run by a fixed pool of actors), with `transerve translate`'s options and answers.

    from service.bulk.ray_bridge import translate_dataset
    ds = translate_dataset(ray.data.read_parquet("corpus/"), column="de", to_column="en", actors=4, beam_size=4)

    python -m service.bulk.ray_bridge corpus/ out/ --column de --to-column en --actors 4 --beam-size 4

The one module that imports ray (the `ray` extra; docs/ray.md). Each batch of rows goes through the bulk
command's InProcess translator (translators.py): split into sentences as the service splits them, sorted by
length into engine batches, the options checked and mapped as POST /translate's, so a row gets what the command
writes for the same line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import ray

from ..shared.schemas import SEARCH_FIELDS
from .options import BulkOptions, add_search_arguments, checked_search
from .translators import InProcess

# BulkOptions' fields that mean something to the engine in an actor; the reading and writing ones (input, format,
# chunk, resume, ...) are Ray Data's here, and --url has no place in an actor that runs the engine itself.
ENGINE_FIELDS = ("model", "source_lang", "target_lang", "batch_size", "batch_tokens")


def bulk_options(threads: int, options: dict[str, Any]) -> BulkOptions:
    """Keyword options -> the command's BulkOptions: ENGINE_FIELDS and POST /translate's search fields
    (beam_size=4, ...), checked as the command checks them; anything else is a TypeError, a refused value a
    ValueError, raised where translate_dataset is called rather than in every actor."""
    search = {k: v for k, v in options.items() if k in SEARCH_FIELDS}
    engine = {k: v for k, v in options.items() if k not in SEARCH_FIELDS}
    unknown = sorted(set(engine) - set(ENGINE_FIELDS))
    if unknown:
        raise TypeError(f"unknown options {', '.join(unknown)} (engine: {', '.join(ENGINE_FIELDS)}; "
                        f"search: {', '.join(SEARCH_FIELDS)})")
    out = BulkOptions(threads=threads, **engine)
    out.search = checked_search(search, out.source_lang, out.target_lang)
    return out


class Translate:
    """The callable class for map_batches: __init__ runs once per actor (the model loads there), __call__ once
    per batch. A batch is a dict of numpy arrays (batch_format="numpy") or a pandas DataFrame ("pandas"); the
    column's texts come back translated in `to_column` (default: in place), the other columns as they were.
    Missing values (None) and blank texts are written back as they are."""

    def __init__(self, column: str = "text", to_column: str | None = None, threads: int = 1, **options):
        self.column, self.to_column = column, to_column or column
        self.translator = InProcess(bulk_options(threads, options))

    def __call__(self, batch):
        texts = list(batch[self.column])
        todo = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
        out = list(texts)
        for i, text in zip(todo, self.translator.translate([texts[i] for i in todo])[0]):
            out[i] = text
        if hasattr(batch, "assign"):    # a DataFrame: a new frame, the batch Ray handed over left unchanged
            return batch.assign(**{self.to_column: out})
        return {**batch, self.to_column: _objects(out)}


def _objects(texts: list) -> Any:
    """A numpy array of Python strings (dtype object, as Ray Data hands string columns over in numpy batches)."""
    import numpy as np

    arr = np.empty(len(texts), dtype=object)
    arr[:] = texts
    return arr


def translate_dataset(ds: "ray.data.Dataset", column: str = "text", to_column: str | None = None, *,
                      actors: int = 1, cpus_per_actor: int = 1, batch_rows: int = 1024,
                      batch_format: str = "numpy", **options) -> "ray.data.Dataset":
    """ds with `column` translated by a pool of up to `actors` actors, each reserving `cpus_per_actor` CPUs
    and running onnxruntime on as many threads (more threads than reserved would oversubscribe a node where
    Ray packs actors). The pool starts with one actor and grows while rows wait: a fixed pool that takes every
    CPU at once (2 actors on 2 CPUs) left Parquet's file listing, which Ray Data gives a CPU of its own, waiting
    forever. batch_rows rows go to an actor at a time: the command's --chunk, the rows sorted by length within
    it. Lazy, as every Ray Data transform: nothing runs until the result is written or read."""
    bulk_options(cpus_per_actor, options)      # refused options fail here, not in each actor
    return ds.map_batches(
        Translate, fn_constructor_kwargs={"column": column, "to_column": to_column, "threads": cpus_per_actor,
                                          **options},
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors), num_cpus=cpus_per_actor,
        batch_size=batch_rows, batch_format=batch_format, udf_modifying_row_count=False)


# Reading and writing tasks reserve no CPU: Ray Data holds none back for them, so a pool whose actors take every
# CPU (2 actors of 1 CPU on a 2-CPU node) left the read task waiting for a CPU forever. They mostly wait on files.
IO_TASKS = {"num_cpus": 0}


def read(path: str, fmt: str) -> "ray.data.Dataset":
    """Parquet or JSON lines: a file, a directory of them, or a URI Ray's filesystems read (s3://, gs://, ...)."""
    if fmt == "jsonl":
        return ray.data.read_json(path, lines=True, **IO_TASKS)
    return ray.data.read_parquet(path, **IO_TASKS)


def write(ds: "ray.data.Dataset", path: str, fmt: str) -> None:
    """A directory of files, one or more per block, written as the actors' batches end."""
    if fmt == "jsonl":
        ds.write_json(path, force_ascii=False, ray_remote_args=IO_TASKS)     # pandas' default escapes umlauts
    else:
        ds.write_parquet(path, ray_remote_args=IO_TASKS)


def parser() -> argparse.ArgumentParser:
    d = BulkOptions()
    p = argparse.ArgumentParser(prog="python -m service.bulk.ray_bridge", description="Translates a column of "
                                "Parquet or JSON-lines files on a Ray cluster (docs/ray.md).")
    p.add_argument("input", help="a file, a directory or a URI (s3://...)")
    p.add_argument("output", help="a directory (or URI) the translated files are written into")
    p.add_argument("--format", choices=("parquet", "jsonl"), help="default: jsonl for .jsonl/.json, else parquet")
    p.add_argument("--column", default=d.field, help="the column translated (default: text)")
    p.add_argument("--to-column", help="write the translation here, keeping the source (default: in place)")
    p.add_argument("--actors", type=int, default=1, help="actors, each with the model loaded once")
    p.add_argument("--cpus-per-actor", type=int, default=1, help="CPUs each actor reserves (its threads)")
    p.add_argument("--batch-rows", type=int, default=d.chunk, help="rows handed to an actor at a time")
    p.add_argument("--source-lang", "-s", default=d.source_lang)
    p.add_argument("--target-lang", "-t", default=d.target_lang)
    p.add_argument("--model", default=d.model, help="the model package, at this path on every node")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sentences per engine batch")
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="padded source tokens per engine batch")
    add_search_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    fmt = args.format or ("jsonl" if args.input.rstrip("/").endswith((".jsonl", ".json")) else "parquet")
    options = {name: getattr(args, name) for name in (*ENGINE_FIELDS, *SEARCH_FIELDS)
               if getattr(args, name) is not None}
    try:
        bulk_options(args.cpus_per_actor, options)      # before a cluster is joined
    except ValueError as e:
        p.error(str(e))
    if not ray.is_initialized():
        ray.init()      # the cluster RAY_ADDRESS names (a RayJob's entrypoint has it), else a local one
    ds = translate_dataset(read(args.input, fmt), args.column, args.to_column, actors=args.actors,
                           cpus_per_actor=args.cpus_per_actor, batch_rows=args.batch_rows, **options)
    write(ds, args.output, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
